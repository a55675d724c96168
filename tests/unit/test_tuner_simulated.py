"""`batchpilot tune --simulator`: the whole tuner against the simulator, through the CLI
(same TuneSummary JSON as `tune --local`), and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot.tuner.cli import tune
from batchpilot.tuner.summary import TuneSummary

COST = {"kind": "linear", "fixed_ms": 1.85, "per_row_ms": 0.28}


@pytest.fixture
def cost_file(tmp_path: Path) -> Path:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(COST))
    return path


def run_json(*args: str) -> TuneSummary:
    result = CliRunner().invoke(tune, list(args))
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    return TuneSummary.model_validate_json(last)


def test_tunes_a_simulated_service_and_prints_the_local_summary(cost_file: Path) -> None:
    summary = run_json(
        "--simulator", str(cost_file), "--p99-ms", "100", "--max-trials", "12", "--seed", "1",
        "--json",
    )  # fmt: skip
    assert len(summary.trials) == 12
    sources = [t.source for t in summary.trials]
    assert sources[:3] == ["baseline", "warm-start", "warm-start"]
    assert "refine" in sources
    assert summary.best is not None
    assert summary.baseline is not None
    assert (summary.best.effective_rps or 0.0) >= (summary.baseline.effective_rps or 0.0) > 0
    assert summary.sla.p99_ms == 100.0


def test_same_seed_same_study_and_options_change_it(cost_file: Path) -> None:
    args = ["--simulator", str(cost_file), "--p99-ms", "50", "--max-trials", "6", "--json"]
    first = run_json(*args, "--seed", "3")
    again = run_json(*args, "--seed", "3")
    assert [t.params for t in first.trials] == [t.params for t in again.trials]
    two = run_json(*args, "--seed", "3", "--replicas", "2")
    bursty = run_json(*args, "--seed", "3", "--arrival", "mmpp:4,0.2,0.5")
    rps = [(s.baseline.effective_rps or 0.0) if s.baseline else 0.0 for s in (first, two, bursty)]
    # two replicas serve more than one; bursts of 4x the mean rate less than Poisson
    assert rps[1] > rps[0] > rps[2] > 0


def test_a_best_at_the_top_of_a_narrow_range_says_how_to_widen_it(
    tmp_path: Path, cost_file: Path
) -> None:
    # a fixed cost per batch: the bigger the batch the more req/s, up to the range's top
    # (the baseline inside the range, so that it is not the best from outside it)
    config = tmp_path / "tune.json"
    config.write_text(json.dumps({"server": {"max_batch_size": 2, "max_queue_time_ms": 5}}))
    narrow = run_json(
        "--simulator", str(cost_file), "--config", str(config), "--max-trials", "8",
        "--seed", "1", "--batch-range", "1..4", "--wait-range-ms", "0..20", "--json",
    )  # fmt: skip
    assert narrow.best is not None
    assert narrow.best.max_batch_size == 4
    assert narrow.space.startswith("max_batch_size 1..4")
    top = "max_batch_size 4 is the top of the searched range 1..4"
    assert any(e.startswith(top) for e in narrow.edges)
    assert all("--batch-range" in e or "--wait-range-ms" in e for e in narrow.edges)
    wide = run_json("--simulator", str(cost_file), "--max-trials", "8", "--seed", "1", "--json")
    assert wide.best is not None
    assert wide.best.max_batch_size < 64
    assert not any(e.startswith("max_batch_size") for e in wide.edges)


def test_a_saved_profile_is_fitted(tmp_path: Path) -> None:
    profile = {
        "batches": [
            {"batch_size": 1, "count": 100, "mean_compute_ms": 2.1, "mean_rows": 1},
            {"batch_size": 8, "count": 50, "mean_compute_ms": 4.1, "mean_rows": 8},
        ]
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    summary = run_json("--simulator", str(path), "--max-trials", "4", "--json")
    assert summary.best is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "--simulator", "COST"], "--local and --simulator exclude each other"),
        (["--simulator", "COST", "--profile-url", "http://x"], "exclude each other"),
        (["--local", "--replicas", "2"], "--replicas applies to simulated runs"),
        (["--simulator", "COST", "--storage", "j.journal"], "--storage applies to --local"),
        (["--simulator", "COST", "--workers", "2"], "--workers applies to --local"),
        (["--local", "--workers", "0"], "--workers"),
        (["--simulator", "COST", "--max-connections", "2"], "--max-connections applies to"),
        (["--local", "--max-connections", "0"], "--max-connections"),
        (["--simulator", "COST", "--arrival", "bursty"], "'bursty' is not one of"),
        (["--simulator", "COST", "--replicas", "0"], "--replicas"),
        (["--simulator", "COST", "--p99-ms", "-1"], "--p99-ms"),
        (["--simulator", "COST", "--max-trials", "0"], "--max-trials"),
        (["--simulator", "no-such.json"], "--simulator no-such.json: cannot read cost model"),
        (["--simulator", "BAD"], "invalid cost model"),
        (["--simulator", "NOTJSON"], "is not JSON"),
        (["--profile-url", "ftp://x"], "must start with http:// or https://"),
        (["--simulator", "COST", "--batch-range", "8..4"], "MIN 8 must be <= MAX 4"),
        (["--simulator", "COST", "--batch-range", "64"], "--batch-range '64': give MIN..MAX"),
        (["--simulator", "COST", "--batch-range", "0..4"], "1 <= min <= max"),
        (["--simulator", "COST", "--wait-range-ms", "a..b"], "--wait-range-ms 'a..b'"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, cost_file: Path, args: list[str], message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "linear", "fixed_ms": -1, "per_row_ms": 0.1}))
    notjson = tmp_path / "notjson.json"
    notjson.write_text("fixed_ms: 2")
    files = {"COST": str(cost_file), "BAD": str(bad), "NOTJSON": str(notjson)}
    result = CliRunner().invoke(tune, [files.get(a, a) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
