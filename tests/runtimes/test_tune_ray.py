"""`batchpilot tune --local --runtime ray --quick --json` end to end: a single-node Ray
cluster with the bundled Serve app, the app's JSON protocol, configurations changed live
through the deployment's user_config, the result also in Ray Serve's own names and
units."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchpilot.runtimes.rayserve.process import VENV

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(420)]


def test_tune_local_runtime_ray_gives_the_knobs_in_ray_serves_terms(tmp_path: Path) -> None:
    require_runtime(VENV, "ray")
    config = tmp_path / "tune.yaml"
    # a few timeouts on a loaded machine say nothing of the flow under test
    config.write_text(
        "sla:\n  p99_ms: 500\n  max_error_rate: 0.05\ntuning:\n  confirm: false\n",
        encoding="utf-8",
    )
    # This test is about Ray Serve's names and units, not its speed: on a loaded 2-core
    # machine Ray's HTTP proxy, replica and the load generator share the cores, and one CI
    # run measured p99 above the default 100 ms SLA at the search's lowest step, which
    # made the only trial Infeasible. A loose SLA keeps the trial's outcome off the load.
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "batchpilot", "tune", "--local", "--runtime", "ray", "--quick"),
            *("--trials", "1", "--p99-ms", "500", "--config", str(config), "--json"),
            # Ray serves a few dozen requests per second here, fewer when the machine is
            # busy: a quick step stretched to its limit then held fewer than 100 requests,
            # was judged on an unbounded p99 and made the only trial Infeasible (one run
            # of the suite). 0 judges each step on its own p99, which is what a test of
            # names and units needs.
            *("--min-requests", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert [t["state"] for t in out["trials"]] == ["Complete"], [
        (t["state"], t.get("reason")) for t in out["trials"]
    ]
    assert out["best"]["effective_rps"] > 0
    figures = out["runtime"]
    assert figures["name"] == "ray"
    assert figures["how_applied"] == "live"
    assert figures["knobs"] == {
        "max_batch_size": "max_batch_size (requests)",
        "max_queue_time_ms": "batch_wait_timeout_s (s)",
    }
    assert figures["baseline"] == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    best = out["best"]
    assert figures["best"]["max_batch_size"] == best["max_batch_size"]
    assert figures["best"]["batch_wait_timeout_s"] == pytest.approx(
        best["max_queue_time_ms"] / 1000
    )
    assert figures["persist_kind"] == "recommend"
    assert "serveConfigV2" in figures["persist_where"]
    assert "batch_wait_timeout_s:" in figures["persist_snippet"]
    assert figures["verified_by"].startswith("Serve REST API: user_config read back")
    assert "(same replica processes)" in figures["verified_by"]
