"""The MLServer adapter's decisions: native units, the versioned model repository, what
proves a change live, and `apply` against a fake MLServer (in-process, loopback) that
loads from the repository the way MLServer does, or misbehaves as scripted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.mlserver import (
    MODEL,
    MLServerControl,
    MLServerRuntime,
    ModelRepository,
    Observed,
    batching_on,
    check_observed,
)
from batchpilot.runtimes.registry import get_runtime


def test_queue_wait_is_max_batch_time_in_seconds() -> None:
    runtime = get_runtime("mlserver")
    assert isinstance(runtime, MLServerRuntime)
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.5)
    assert runtime.native(config) == {"max_batch_size": 16, "max_batch_time": 0.0025}
    assert runtime.canonical({"max_batch_size": 16, "max_batch_time": 0.0025}) == config
    assert runtime.protocol().path == f"/v2/models/{MODEL}/infer"


def test_batching_is_on_only_when_both_knobs_allow_it() -> None:
    assert batching_on({"max_batch_size": 2, "max_batch_time": 0.001})
    assert not batching_on({"max_batch_size": 1, "max_batch_time": 0.001})
    assert not batching_on({"max_batch_size": 16, "max_batch_time": 0.0})


def test_persistence_is_the_model_settings_keys() -> None:
    persisted = MLServerRuntime().persistence(
        BatchingConfig(max_batch_size=8, max_queue_time_ms=10), model="m"
    )
    assert persisted.kind == "recommend"
    assert json.loads(persisted.snippet) == {
        "name": "m",
        "max_batch_size": 8,
        "max_batch_time": 0.01,
    }
    assert persisted.where == "write model-settings.json of model m with these keys"


def test_launcher_refuses_a_workload() -> None:
    with pytest.raises(LaunchError, match="bundled model batchpilot-mlp, not 'encoder'"):
        MLServerRuntime().launcher(
            BatchingConfig(max_batch_size=8, max_queue_time_ms=5), workload="encoder"
        )


def test_repository_keeps_only_the_newest_version(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    assert repo.write({"max_batch_size": 8, "max_batch_time": 0.005}) == 1
    assert repo.write({"max_batch_size": 4, "max_batch_time": 0.02}) == 2
    assert repo.versions() == [2]
    settings = json.loads((tmp_path / MODEL / "v2" / "model-settings.json").read_text())
    assert settings["max_batch_size"] == 4
    assert settings["max_batch_time"] == 0.02
    assert settings["parameters"] == {"version": "2"}
    assert settings["implementation"].endswith("BatchRecordingMLP")


def _answers(n: int, rows: int, **params: Any) -> list[dict[str, Any]]:
    base = {
        "model_version": "2",
        "max_batch_size": 8,
        "max_batch_time": 0.005,
        "adaptive_batching": True,
        "batch_rows": rows,
    }
    return [{**base, **params} for _ in range(n)]


NATIVE = {"max_batch_size": 8, "max_batch_time": 0.005}


def test_batches_are_counted_from_the_rows_each_answer_reports() -> None:
    observed = Observed(_answers(16, 8) + _answers(3, 3) + _answers(1, 1))
    assert observed.batch_sizes() == {1: 1, 3: 1, 8: 2}
    assert check_observed(observed, NATIVE, "2") == []


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        (_answers(4, 1, model_version="1"), "versions ['1'], expected only 2"),
        (_answers(4, 1, max_batch_size=4), "max_batch_size [4]"),
        (_answers(4, 1, max_batch_time=0.5), "max_batch_time [0.5]"),
        (_answers(4, 1, adaptive_batching=False), "adaptive batching is off"),
        (_answers(9, 9), "a batch of 9 rows was served, above the cap of 8"),
    ],
)
def test_what_is_wrong_is_named(answers: list[dict[str, Any]], problem: str) -> None:
    problems = check_observed(Observed(answers), NATIVE, "2")
    assert any(problem in p for p in problems), problems


class FakeMLServer:
    """Loads the newest version in the repository on POST .../load, like MLServer's
    versioned load; `reload_turns_batching_off` mimics the reload path's trap."""

    def __init__(self, repo: ModelRepository) -> None:
        self.repo = repo
        self.settings: dict[str, Any] = {}
        self.version = "0"
        self.batching_off_after_load = False
        self.load_status = 200
        self.loads = 0

    def load_newest(self) -> None:
        version = self.repo.versions()[-1]
        path = self.repo.dir / f"v{version}" / "model-settings.json"
        self.settings = json.loads(path.read_text())
        self.version = str(version)

    async def load(self, request: web.Request) -> web.Response:
        self.loads += 1
        if self.load_status != 200:
            return web.json_response({"error": "scripted refusal"}, status=self.load_status)
        self.load_newest()
        return web.Response(status=200)

    async def infer(self, request: web.Request) -> web.Response:
        rows = (await request.json())["inputs"][0]["shape"][0]
        on = (
            self.settings["max_batch_size"] > 1
            and self.settings["max_batch_time"] > 0
            and not self.batching_off_after_load
        )
        params = {
            "batch_rows": rows,
            "max_batch_size": self.settings["max_batch_size"],
            "max_batch_time": self.settings["max_batch_time"],
            "adaptive_batching": on,
        }
        return web.json_response(
            {
                "model_name": MODEL,
                "model_version": self.version,
                "outputs": [],
                "parameters": params,
            }
        )


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeMLServer, MLServerControl]]:
    repo = ModelRepository(tmp_path)
    repo.write({"max_batch_size": 8, "max_batch_time": 0.005})
    server = FakeMLServer(repo)
    server.load_newest()
    app = web.Application()
    app.router.add_post(f"/v2/repository/models/{MODEL}/load", server.load)
    app.router.add_post(f"/v2/models/{MODEL}/infer", server.infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    control = MLServerControl(f"http://127.0.0.1:{port}", repository=repo, timeout_s=5.0)
    try:
        yield server, control
    finally:
        await runner.cleanup()


async def test_current_reads_what_the_serving_model_reports(
    fake: tuple[FakeMLServer, MLServerControl],
) -> None:
    _, control = fake
    assert await control.current() == BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


async def test_apply_writes_a_new_version_loads_and_verifies(
    fake: tuple[FakeMLServer, MLServerControl],
) -> None:
    server, control = fake
    config = BatchingConfig(max_batch_size=4, max_queue_time_ms=20)
    await control.apply(config)
    assert server.version == "2"
    verification = control.last_verification
    assert verification is not None
    assert verification.live == config
    assert verification.native == {"max_batch_size": 4, "max_batch_time": 0.02}
    assert verification.verified_by.startswith("model read-back (version 2), adaptive batching on")
    assert verification.batch_sizes == {1: 8}  # the fake serves every request alone


async def test_apply_refuses_when_batching_came_back_off(
    fake: tuple[FakeMLServer, MLServerControl],
) -> None:
    server, control = fake
    server.batching_off_after_load = True
    with pytest.raises(TargetError, match="did not take batch=4 wait=20ms: adaptive batching"):
        await control.apply(BatchingConfig(max_batch_size=4, max_queue_time_ms=20))


async def test_a_refused_load_puts_the_previous_values_back(
    fake: tuple[FakeMLServer, MLServerControl],
) -> None:
    server, control = fake
    server.load_status = 400
    with pytest.raises(TargetError, match="HTTP 400: scripted refusal"):
        await control.apply(BatchingConfig(max_batch_size=4, max_queue_time_ms=20))
    newest = control.repository.versions()[-1] if control.repository else None
    settings = json.loads((server.repo.dir / f"v{newest}" / "model-settings.json").read_text())
    assert (settings["max_batch_size"], settings["max_batch_time"]) == (8, 0.005)


async def test_without_the_repository_the_control_only_recommends(
    fake: tuple[FakeMLServer, MLServerControl],
) -> None:
    _, control = fake
    remote = MLServerControl(control.url)
    assert await remote.current() == BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    with pytest.raises(TargetError, match="can only recommend"):
        await remote.apply(BatchingConfig(max_batch_size=4, max_queue_time_ms=20))
