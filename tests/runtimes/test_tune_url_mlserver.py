"""`batchpilot tune --url` against a real MLServer BatchPilot did not start: its batching
cannot be changed over the network (the repository API's load takes settings from disk
only), so the run is refused before any request, and the server is left as it was."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.mlserver import MODEL, VENV, MLServerProcess, MLServerRuntime

from .support import require_runtime

pytestmark = [
    pytest.mark.runtimes,
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="module"),
]

START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mlserver() -> AsyncIterator[MLServerProcess]:
    require_runtime(VENV, "mlserver")
    async with MLServerRuntime().launcher(START) as server:
        yield server


def _tune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchpilot", "tune", *args, "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_tune_url_is_refused_before_any_request_and_the_server_is_untouched(
    mlserver: MLServerProcess,
) -> None:
    control = MLServerRuntime().control(mlserver.url)
    before = (await control.burst(1)).one("model_version")
    # a full endpoint URL of a server that answers: still refused, and up front
    endpoint = f"{mlserver.url}/v2/models/{MODEL}/infer"
    done = await asyncio.to_thread(_tune, "--url", endpoint, "--runtime", "mlserver")
    assert done.returncode == 2
    assert "--url with --runtime mlserver: " in done.stderr
    assert "cannot be changed from here" in done.stderr
    assert "found at" not in done.stderr
    assert (await control.burst(1)).one("model_version") == before
    assert await control.current() == START


async def test_a_load_ignores_settings_sent_with_it(mlserver: MLServerProcess) -> None:
    """Why `tune --url` is refused: MLServer 1.7.1 answers 2xx to a repository load that
    carries batching settings and keeps the ones on disk. If a later MLServer honours
    them, this test says so."""
    control = MLServerRuntime().control(mlserver.url)
    settings = {"max_batch_size": 2, "max_batch_time": 0.05}
    body = {**settings, "parameters": settings}
    url = f"{mlserver.url}/v2/repository/models/{MODEL}/load"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert 200 <= response.status < 300, await response.text()
    assert await control.current() == START
