"""`batchpilot tune --url URL` end to end against a real reference server BatchPilot did
not start: the study runs through the server's control and protocol, the result carries
the knobs in the runtime's names, and the server is left at the configuration it was
found at, or at the recommended one with --keep-winner; with --prometheus every step is
decided on the server's own metrics. Clear errors for nothing at the URL. Assertions are
about behaviour, never speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.registry import get_runtime
from batchpilot.server.process import ServerProcess, free_port
from support.prometheus_process import PrometheusProcess

# Bounds against a hang, not timing assertions: a quick run takes 2-4 minutes on 2 cores.
pytestmark = [pytest.mark.component, pytest.mark.timeout(540)]

TUNE = [sys.executable, "-m", "batchpilot", "tune"]
# deliberately not the --local start-up default, so the restore is seen
FOUND = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


def _tune(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TUNE, *args], capture_output=True, text=True, timeout=480, check=False)


async def test_tune_url_tunes_a_running_server_and_puts_its_configuration_back() -> None:
    server = ServerProcess(
        max_batch_size=FOUND.max_batch_size, max_queue_time_ms=FOUND.max_queue_time_ms, threads=1
    )
    async with server:
        control = get_runtime("reference").control(server.url)
        # a full endpoint URL is cut back to the server's base URL
        args = ["--url", f"{server.url}/v1/predict", "--runtime", "reference", "--quick"]
        args += ["--trials", "2", "--finalists", "1", "--seed", "5", "--sla-p99-ms", "1000"]
        # the restore is under test, not the figures: steps of 200 requests, not --quick's 500
        args += ["--min-requests", "200", "--json"]
        done = await asyncio.to_thread(_tune, args)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
        assert out["trials"][0]["label"] == "baseline"
        baseline = out["baseline"]
        assert (baseline["max_batch_size"], baseline["max_queue_time_ms"]) == (4, 2.0)
        # (whether anything met the SLA is this machine's business; see test_tune_local)
        assert out["runtime"]["name"] == "reference"
        assert out["runtime"]["baseline"] == {"max_batch_size": 4, "max_queue_time_ms": 2.0}
        assert await control.current() == FOUND
        assert f"Put the starting {FOUND.label()} back" in done.stderr


def test_tune_url_with_nothing_there_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _tune(["--url", url, "--runtime", "triton", "--quick"])
    assert done.returncode == 2
    assert f"--url {url}: nothing answers there" in done.stderr
    assert "Triton" in done.stderr


def test_model_and_keep_winner_belong_to_url_runs() -> None:
    done = _tune(["--local", "--keep-winner"])
    assert done.returncode == 2
    assert "--keep-winner applies to --url runs" in done.stderr


async def test_tune_url_with_prometheus_decides_steps_on_the_servers_metrics_and_keeps(
    tmp_path: Path,
) -> None:
    # The interleaved re-measurement of a --url run is the first test's (and the runtime
    # tier's); here the steps' source and --keep-winner are under test, so the study
    # recommends its best trial without it (a third of the time).
    config = tmp_path / "no-confirm.yaml"
    config.write_text("tuning:\n  confirm: false\n")
    server = ServerProcess(
        max_batch_size=START.max_batch_size, max_queue_time_ms=START.max_queue_time_ms, threads=1
    )
    # --quick steps are 1.2 s: four scrapes fit in one at 0.25 s
    async with server, PrometheusProcess([server.url], scrape_interval_s=0.25) as prometheus:
        await prometheus.wait_for_scrape()
        args = ["--url", server.url, "--prometheus", prometheus.url, "--quick", "--json"]
        args += ["--prometheus-selector", f'job="{prometheus.job}"', "--trials", "2"]
        args += ["--config", str(config), "--seed", "5", "--sla-p99-ms", "1000", "--keep-winner"]
        done = await asyncio.to_thread(_tune, args)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
        steps = [s for m in out["measurements"].values() for s in m["steps"]]
        assert steps
        assert {s["source"] for s in steps} == {"prometheus"}
        # --keep-winner: the recommendation stays live (the found one when there is none)
        recommended = out["recommended"]
        expected = BatchingConfig.model_validate(recommended) if recommended else START
        assert await get_runtime("reference").control(server.url).current() == expected
        # a Prometheus that scrapes too seldom for the steps is refused before any load
        async with PrometheusProcess([server.url], scrape_interval_s=1.0) as slow:
            refused = await asyncio.to_thread(
                _tune, ["--url", server.url, "--prometheus", slow.url, "--quick"]
            )
        assert refused.returncode == 2
        assert "shorter than 4 scrape intervals" in refused.stderr
