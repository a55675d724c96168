"""`python -m batchpilot.runtimes.triton.serve`, the container command of a Triton pod:
Triton with the bundled model on the given address and ports, at the given batching,
stopped by SIGTERM to the command with its repository removed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from batchpilot.processes import free_ports
from batchpilot.runtimes.triton.install import VENV_NAME
from batchpilot.runtimes.triton.repository import MODEL_NAME

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(180)]

READY_TIMEOUT_S = 90.0


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _repositories() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("batchpilot-triton-*"))


def test_serve_runs_triton_at_the_given_batching_and_stops_on_sigterm() -> None:
    require_runtime(VENV_NAME, "python")
    http, grpc, metrics = free_ports(3)
    before = _repositories()
    command = [
        sys.executable,
        "-m",
        "batchpilot.runtimes.triton.serve",
        "--host=127.0.0.1",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--max-batch-size=6",
        "--max-queue-delay-us=1500",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _get(f"http://127.0.0.1:{http}/v2/health/ready")[0] != 200:
            assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
            assert time.monotonic() < deadline, "Triton was not ready in time"
            time.sleep(0.5)
        status, body = _get(f"http://127.0.0.1:{http}/v2/models/{MODEL_NAME}/config")
        assert status == 200
        config = json.loads(body)
        assert config["max_batch_size"] == 6
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1500
        assert _get(f"http://127.0.0.1:{metrics}/metrics")[0] == 200
        assert len(_repositories() - before) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert _repositories() - before == set()


def test_serve_refuses_a_batching_triton_cannot_take() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "batchpilot.runtimes.triton.serve", "--max-batch-size=0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "max_batch_size must be 1-4096" in result.stderr
