"""`batchpilot tune --local --runtime vllm` end to end: vLLM's CPU engine from its own
environment serving the tiny model it writes, streamed completions as the load, each
configuration applied by a restart and verified on the server (its configuration read
back from /server_info, the running gauge under a burst), each trial's TTFT p99, TPOT p99,
goodput and output tokens/s in the JSON, the token-level simulator's proposal measured,
and the result in vLLM's own names. Short answers and steps keep the engine restarts in
the suite's time; the assertions are about behaviour, never speed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchpilot.runtimes.vllm.process import engine_dir

from .support import require_engine

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(1500)]

# quick's steps and precision without --quick (whose 75 s study budget would hold two
# trials), no confirmation, and a study budget that holds the simulator's proposal
CONFIG = """\
measurement: {step_duration_s: 2, warmup_s: 0.5, precision: 0.15}
tuning: {confirm: false, time_budget_s: 1200}
"""


def test_tune_local_vllm_reports_token_tails_per_trial(tmp_path: Path) -> None:
    require_engine(engine_dir() / "bin" / "python")
    config = tmp_path / "tune.yaml"
    config.write_text(CONFIG)
    done = subprocess.run(
        [
            sys.executable, "-m", "batchpilot", "tune", "--local", "--runtime", "vllm",
            "--trials", "3", "--batch-range", "2..16", "--seed", "3",
            "--prompt-tokens", "fixed:16", "--output-tokens", "fixed:32",
            "--config", str(config), "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    assert "max_queue_time_ms stays 0 in every trial" in done.stderr
    # each trial's progress line shows the tails a token study is judged on
    assert re.search(r"TTFT p99 +[\d.]+ ms +TPOT p99 +[\d.]+ ms +\d+ tok/s", done.stderr)

    trials = out["trials"]
    # the token-level simulator, fitted to the baseline, proposed the third trial
    assert [t["label"] for t in trials] == ["baseline", "rule of thumb", "simulator"]
    assert "warm start skipped" not in done.stderr
    assert (trials[0]["params"]["max_batch_size"], trials[0]["params"]["max_queue_time_ms"]) == (
        8,
        0.0,
    )
    assert all(t["params"]["max_queue_time_ms"] == 0.0 for t in trials)
    assert trials[1]["params"]["max_batch_size"] != 8  # a restart, not the baseline again
    # what each change cost is in its trial: the baseline only read back, the next a restart
    assert all(t["change_s"] is not None for t in trials)
    measured = [t for t in trials if t["effective_rps"]]
    assert measured, trials
    for trial in measured:
        assert trial["ttft_p99_ms"] > 0
        assert trial["tpot_p99_ms"] > 0
        assert trial["output_tokens_per_s"] > 0
    baseline = out["baseline"]
    assert baseline["effective_rps"] is not None
    assert baseline["ttft_p99_ms"] == trials[0]["ttft_p99_ms"]
    assert out["best"]["output_tokens_per_s"] > 0

    runtime = out["runtime"]
    assert runtime["name"] == "vllm"
    assert runtime["how_applied"] == "restart"
    assert runtime["knobs"]["max_batch_size"] == "max_num_seqs (requests)"
    assert runtime["knobs"]["max_queue_time_ms"] == "none (continuous batching): pinned at 0"
    assert runtime["baseline"] == {"max_num_seqs": 8.0, "max_num_batched_tokens": 2048.0}
    # the last change was a restart, read back and watched on the engine's own gauge
    verified = runtime["verified_by"]
    assert "read-back (GET /server_info)" in verified
    assert "vllm:num_requests_running" in verified
