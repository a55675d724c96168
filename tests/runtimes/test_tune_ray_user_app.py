"""`batchpilot tune --url --runtime ray` on a Serve app written here, not shipped in
`src/`: a `@serve.batch` deployment whose `reconfigure(user_config)` passes the keys
BatchPilot writes to the batcher, and whose answers say nothing about its batching. It
tunes, its requests sent under the route prefix Serve reports for it, every change
verified by Ray Serve's REST API, and the configuration it found is put back at the
end."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.runtimes.rayserve.adapter import RayServeRuntime
from batchpilot.runtimes.rayserve.config import ServeApp
from batchpilot.runtimes.rayserve.process import VENV, RayServeProcess

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(420), pytest.mark.asyncio]

USER_APP = """
from ray import serve
from starlette.requests import Request


@serve.deployment
class Ranker:
    def reconfigure(self, user_config: dict) -> None:
        self.rank.set_max_batch_size(int(user_config["max_batch_size"]))
        self.rank.set_batch_wait_timeout_s(float(user_config["batch_wait_timeout_s"]))

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=0.0)
    async def rank(self, sizes: list[int]) -> list[dict]:
        return [{"score": size * 0.5} for size in sizes]

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        return await self.rank(int(body["size"]))


app = Ranker.bind()
"""
# served under a route of its own: the requests go where Serve says the app is
APP = ServeApp(
    import_path="user_ranker:app", name="ranker", deployment="Ranker", route_prefix="/rank"
)
START = {"max_batch_size": 4, "batch_wait_timeout_s": 0.002}


@pytest_asyncio.fixture
async def ray(tmp_path: Path) -> AsyncIterator[RayServeProcess]:
    require_runtime(VENV, "ray")
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "user_ranker.py").write_text(USER_APP, encoding="utf-8")
    async with RayServeProcess(START, app=APP, app_dir=folder) as server:
        yield server


async def test_a_users_app_that_does_not_report_its_batching_tunes(
    ray: RayServeProcess, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(ray.url + "/rank", json={"size": 3}) as response:
            assert await response.json() == {"score": 1.5}, "the app reports nothing else"
        async with session.post(ray.url + "/", json={"size": 3}) as response:
            assert response.status == 404, "nothing answers at the root"
    config = tmp_path / "tune.yaml"
    # a few timeouts on a loaded machine say nothing of the flow under test
    config.write_text(
        "sla:\n  p99_ms: 500\n  max_error_rate: 0.05\ntuning:\n  confirm: false\n",
        encoding="utf-8",
    )
    tune = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "batchpilot", "tune", "--url", ray.url, "--runtime", "ray"),
        *("--model", APP.model, "--control-url", ray.dashboard_url),
        # the flow is under test, not the app's speed on a shared machine
        *("--quick", "--trials", "2", "--p99-ms", "500", "--config", str(config), "--json"),
        # a few dozen requests per second: quick steps judged on 100 requests, not on a
        # p99 bound that fewer than 299 leave infinite
        *("--min-requests", "100"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(tune.communicate(), timeout=380)
    assert tune.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    trials = result["trials"]
    # every change was applied and verified on the server: each trial carries what its
    # verified change cost, whatever the shared machine made of the measurement after it
    # (a verdict, Infeasible, or a client too slow to judge a step)
    assert len(trials) == 2, trials
    for trial in trials:
        assert trial.get("change_s", 0) > 0, trial
        assert trial["state"] in ("Complete", "Infeasible") or (
            trial["state"] == "Failed" and trial["reason"].startswith("ClientBound")
        ), trial
    if any(trial["state"] == "Complete" for trial in trials):
        assert result["best"]["effective_rps"] > 0
    verified = result["runtime"]["verified_by"]
    assert verified.startswith("Serve REST API: user_config read back, deployment HEALTHY")
    assert "replica(s) RUNNING" in verified
    # the configuration found running is put back
    runtime = RayServeRuntime()
    control = runtime.control(ray.url, model=APP.model, control_url=ray.dashboard_url)
    assert await control.native() == START
