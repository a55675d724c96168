"""`batchpilot tune --url` against a real MLServer BatchPilot did not start: a model it
does not serve, and a server whose model repository is not on this machine, each stop
before any load with an error that names the cause."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.mlserver import MODEL, VENV, MLServerProcess, MLServerRuntime

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(240)]

START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


@pytest.fixture
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


async def test_a_model_the_server_does_not_serve_is_named(mlserver: MLServerProcess) -> None:
    done = await asyncio.to_thread(
        _tune, "--url", mlserver.url, "--runtime", "mlserver", "--model", "nope"
    )
    assert done.returncode == 1
    assert "cannot read the batching configuration of model 'nope'" in done.stderr
    assert "Model nope not found" in done.stderr


async def test_a_server_whose_repository_is_elsewhere_cannot_be_tuned_from_here(
    mlserver: MLServerProcess,
) -> None:
    # a full endpoint URL is cut back to the base URL
    endpoint = f"{mlserver.url}/v2/models/{MODEL}/infer"
    done = await asyncio.to_thread(_tune, "--url", endpoint, "--runtime", "mlserver")
    assert done.returncode == 1
    assert f"found at {START.label()}" in done.stderr
    assert "cannot be changed through the mlserver control" in done.stderr
    assert "model repository is not on this machine" in done.stderr
    assert "trial 0" not in done.stderr
