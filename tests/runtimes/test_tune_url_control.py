"""`batchpilot tune --url URL --runtime triton --control-url URL2` against a real Triton
BatchPilot did not start, whose metrics port (where every change is verified) is not
Triton's default 8002: the run finds it through --control-url, tunes through it, and
puts the configuration it found back at the end."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.triton.adapter import DEFAULT_METRICS_PORT, TritonRuntime
from batchpilot.runtimes.triton.install import VENV_NAME
from batchpilot.runtimes.triton.process import TritonProcess

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(420)]

START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


@pytest.fixture
async def triton() -> AsyncIterator[TritonProcess]:
    require_runtime(VENV_NAME, "python")
    async with TritonRuntime().launcher(START) as server:
        yield server


def _tune(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            *("-m", "batchpilot", "tune", "--runtime", "triton", "--quick"),
            *("--trials", "1", "--config", str(config), "--json", *args),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


async def test_a_triton_with_its_metrics_elsewhere_is_tuned_through_control_url(
    triton: TritonProcess, tmp_path: Path
) -> None:
    assert triton.metrics_port != DEFAULT_METRICS_PORT
    config = tmp_path / "tune.yaml"
    config.write_text("tuning:\n  confirm: false\n", encoding="utf-8")
    control = f"http://127.0.0.1:{triton.metrics_port}"
    # the load and the model control go to --url, the verification to --control-url; a
    # loose SLA keeps the one trial's outcome off the loaded machine's speed
    done = await asyncio.to_thread(
        _tune, config, "--url", triton.url, "--control-url", control, "--p99-ms", "500"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Tuning the {TritonRuntime.title} running at {triton.url}" in done.stderr
    out = json.loads(done.stdout)
    assert [t["state"] for t in out["trials"]] == ["Complete"], out["trials"]
    figures = out["runtime"]
    assert figures["name"] == "triton"
    assert figures["baseline"] == {"max_batch_size": 8, "max_queue_delay_microseconds": 5000}
    # each change was verified by the batches Triton reported on the metrics port
    assert "executed batch" in figures["verified_by"]
    # no --keep-winner: the configuration found running is live again
    live = await TritonRuntime().control(triton.url, control_url=control).current()
    assert live == START
