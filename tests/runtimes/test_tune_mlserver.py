"""`batchpilot tune --local --runtime mlserver --quick --json` end to end: MLServer from
its own environment, the v2 protocol, configurations changed by versioned reloads, the
result also in MLServer's own names and units."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from batchpilot.runtimes.mlserver import VENV

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(660)]


def test_quick_tune_of_mlserver_reports_native_knobs() -> None:
    require_runtime(VENV, "mlserver")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchpilot",
            "tune",
            "--local",
            "--runtime",
            "mlserver",
            "--quick",
            "--trials",
            "2",
            "--finalists",
            "1",
            "--seed",
            "3",
            # generous: the suite runs beside the e2e tier, and the flow is under test
            "--p99-ms",
            "500",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert [t["label"] for t in out["trials"]][:2] == ["baseline", "rule of thumb"]
    assert (out["baseline"]["max_batch_size"], out["baseline"]["max_queue_time_ms"]) == (8, 5.0)
    assert out["best"]["effective_rps"] > 0
    assert out["best"]["effective_rps"] >= (out["baseline"]["effective_rps"] or 0.0)
    runtime = out["runtime"]
    assert runtime["name"] == "mlserver"
    assert runtime["how_applied"] == "reload"
    assert runtime["knobs"]["max_queue_time_ms"] == "max_batch_time (s)"
    assert runtime["baseline"] == {"max_batch_size": 8.0, "max_batch_time": 0.005}
    best = out["best"]
    assert runtime["best"] == {
        "max_batch_size": float(best["max_batch_size"]),
        "max_batch_time": pytest.approx(best["max_queue_time_ms"] / 1000.0),
    }
    assert runtime["verified_by"].startswith("model read-back (version ")
    snippet = json.loads(runtime["persist_snippet"])
    assert snippet["max_batch_size"] == out["recommended"]["max_batch_size"]
    assert "Starting the MLServer 1.7.1" in done.stderr
    assert "In mlserver's terms: max_batch_size=" in done.stderr
