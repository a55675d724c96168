"""`batchpilot simulate`: the capacity JSON shape, grids, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from batchpilot.cli import main
from batchpilot.simulator.cost import LinearCost


@pytest.fixture
def cost_file(tmp_path: Path) -> Path:
    path = tmp_path / "cost.json"
    path.write_text(LinearCost(fixed_ms=2.0, per_row_ms=0.1).model_dump_json())
    return path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_single_configuration_prints_the_capacity_json(cost_file: Path) -> None:
    code, out, _ = _run(
        "--p99-ms", "100", "--max-batch-size", "8", "--max-queue-time-ms", "5",
        "--cost-model", str(cost_file), "--requests", "2000", "--json",
    )  # fmt: skip
    assert code == 0
    data: dict[str, Any] = json.loads(out)
    assert data["source"] == "simulator"
    assert data["feasible"] is True
    assert data["effective_rps"] > 0
    assert data["sla"] == {"p99_ms": 100.0, "max_error_rate": 0.001}
    assert data["config"] == {"max_batch_size": 8, "max_queue_time_ms": 5.0}
    assert all(step["source"] == "simulator" for step in data["steps"])
    assert data["cost_model"]["per_row_ms"] == 0.1


def test_a_saved_profile_is_fitted(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "model": "mlp",
                "device": "cpu",
                "batches": [
                    {"batch_size": b, "count": 10, "mean_compute_ms": 2 + 0.1 * b, "mean_rows": b}
                    for b in (1, 2, 4, 8)
                ],
            }
        )
    )
    code, out, _ = _run(
        "--p99-ms", "100", "--max-batch-size", "4", "--max-queue-time-ms", "1",
        "--cost-model", str(profile), "--overhead-ms", "0.5", "--requests", "1000", "--json",
    )  # fmt: skip
    assert code == 0
    model = json.loads(out)["cost_model"]
    assert model["fixed_ms"] == pytest.approx(2.0)
    assert model["per_row_ms"] == pytest.approx(0.1)
    assert model["overhead_ms"] == 0.5


def test_grid_ranks_configurations_best_first(cost_file: Path) -> None:
    code, out, _ = _run(
        "--p99-ms", "50", "--grid", "--batch-bounds", "1:8", "--wait-bounds", "0:2",
        "--cost-model", str(cost_file), "--requests", "1000", "--arrival", "mmpp", "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    rates = [r["effective_rps"] for r in data["results"]]
    assert rates == sorted(rates, reverse=True)
    assert len(rates) == 6 * 3  # batch sizes 1, 2, 3, 4, 6, 8 x waits 0, 1, 2 ms
    assert data["best"]["effective_rps"] == rates[0]
    assert data["scenario"]["arrival"]["kind"] == "mmpp"


def test_server_options_reach_the_scenario(cost_file: Path) -> None:
    code, out, _ = _run(
        "--p99-ms", "100", "--max-batch-size", "4", "--max-queue-time-ms", "2",
        "--cost-model", str(cost_file), "--requests", "1000", "--ahead", "1",
        "--jitter", "0.2", "--queue-limit", "64", "--json",
    )  # fmt: skip
    assert code == 0
    scenario = json.loads(out)["scenario"]
    assert (scenario["ahead"], scenario["jitter"], scenario["queue_limit"]) == (1, 0.2, 64)


def test_human_output_has_a_verdict(cost_file: Path) -> None:
    code, out, _ = _run(
        "--p99-ms", "100", "--max-batch-size", "4", "--max-queue-time-ms", "2",
        "--cost-model", str(cost_file), "--requests", "1000",
    )  # fmt: skip
    assert code == 0
    assert "effective throughput" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--p99-ms", "0", "--grid"], "--p99-ms"),
        (["--p99-ms", "x", "--grid"], "not a valid float"),
        (["--p99-ms", "100"], "--grid"),
        (["--p99-ms", "100", "--max-batch-size", "4", "--grid"], "--grid"),
        (["--p99-ms", "100", "--grid", "--arrival", "weird"], "poisson, constant, mmpp"),
        (["--p99-ms", "100", "--grid", "--mix", "1:x"], "--mix"),
        (["--p99-ms", "100", "--grid", "--replicas", "0"], "--replicas"),
        (["--p99-ms", "100", "--grid", "--ahead", "-1"], "--ahead"),
        (["--p99-ms", "100", "--grid", "--queue-limit", "0"], "--queue-limit"),
        (["--p99-ms", "100", "--grid", "--jitter", "-0.5"], "--jitter"),
        (["--p99-ms", "100", "--grid", "--batch-bounds", "9:2"], "LOW:HIGH"),
        (["--p99-ms", "100", "--grid", "--precision", "2"], "--precision"),
        (["--p99-ms", "100", "--grid", "--no-such-flag"], "No such option"),
        (["--p99-ms", "100", "--max-batch-size", "0", "--max-queue-time-ms", "1"], "batch-size"),
    ],
)
def test_bad_input_is_one_line_on_stderr(cost_file: Path, args: list[str], message: str) -> None:
    code, out, err = _run(*args, "--cost-model", str(cost_file))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("batchpilot simulate: error: ")
    assert message in lines[0]
    assert "Traceback" not in err


def test_cost_source_is_required_once(cost_file: Path, tmp_path: Path) -> None:
    code, _, err = _run("--p99-ms", "100", "--grid")
    assert code == 2
    assert "exactly one of --cost-model" in err
    code, _, err = _run(
        "--p99-ms", "100", "--grid", "--cost-model", str(cost_file), "--profile-url", "http://x"
    )
    assert code == 2
    assert "exactly one of --cost-model" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = _run("--p99-ms", "100", "--grid", "--cost-model", str(bad))
    assert code == 2
    assert "is not JSON" in err


def test_a_trace_is_replayed_and_summarised_not_echoed(cost_file: Path, tmp_path: Path) -> None:
    trace = tmp_path / "arrivals.txt"
    trace.write_text("\n".join(f"{0.01 * i + 0.004 * (i % 3):.4f}" for i in range(500)))
    code, out, _ = _run(
        "--p99-ms", "100", "--max-batch-size", "4", "--max-queue-time-ms", "2",
        "--cost-model", str(cost_file), "--arrival", f"trace:{trace}", "--requests", "1000",
        "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["feasible"] is True
    assert data["scenario"]["arrival"]["kind"] == "trace"
    assert data["scenario"]["arrival"]["recorded_requests"] == 500
    assert "gaps_s" not in data["scenario"]["arrival"]
