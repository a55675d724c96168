"""The step decision from a client measurement, the JSON with its cost line, the plot,
and the PromQL the Prometheus source asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchpilot.capacity.plot import plot_capacity
from batchpilot.capacity.prometheus import PrometheusStepSource
from batchpilot.capacity.report import capacity_json
from batchpilot.capacity.steps import step_from_load
from batchpilot.loadgen.result import OK, LoadResult, summarise
from batchpilot.models import SLA, CapacityResult, StepResult


def _load(outcomes: list[str], latency_ms: float, *, trailing_s: float = 0.0) -> LoadResult:
    n = len(outcomes)
    offsets = [i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=float(n),
        window_s=1.0,
        offsets=offsets,
        outcomes=outcomes,
        latencies_ms=[latency_ms] * n,
        lags_ms=[0.0] * n,
        # With trailing_s, completions stretch past the window (a saturated server).
        done_at=[o * (1 + trailing_s) + 0.001 for o in offsets],
        elapsed_s=1.0 + trailing_s,
        interrupted=False,
    )


def test_a_step_within_the_sla_passes() -> None:
    step = step_from_load(_load([OK] * 100, 20.0), SLA(p99_ms=50))
    assert step.passed
    assert step.reason == ""
    assert step.offered_rps == pytest.approx(100)
    assert step.source == "client"


def test_a_slow_step_fails_on_p99() -> None:
    step = step_from_load(_load([OK] * 100, 80.0), SLA(p99_ms=50))
    assert not step.passed
    assert "p99" in step.reason


def test_errors_above_the_bound_fail_the_step() -> None:
    step = step_from_load(_load([OK] * 98 + ["503"] * 2, 10.0), SLA(p99_ms=50, max_error_rate=0.01))
    assert not step.passed
    assert "error rate 0.0200" in step.reason


def test_a_growing_queue_fails_the_step_within_a_generous_sla() -> None:
    # 3 % over capacity: every request waits 30 ms longer per second of the window
    n = 400
    offsets = [4.0 * i / n for i in range(n)]
    latencies = [20.0 + 30.0 * o for o in offsets]
    load = summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=100.0,
        window_s=4.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=latencies,
        lags_ms=[0.0] * n,
        done_at=[o + lat / 1000 for o, lat in zip(offsets, latencies, strict=True)],
        elapsed_s=4.2, interrupted=False, warmup_s=0.5,
    )  # fmt: skip
    step = step_from_load(load, SLA(p99_ms=1000))
    assert not step.passed
    assert "median latency rose steadily" in step.reason


def test_a_step_with_no_completed_request_fails() -> None:
    load = _load(["cancelled"], 0.0)
    step = step_from_load(load, SLA(p99_ms=50))
    assert not step.passed
    assert step.reason == "no request completed"


def _result(effective: float) -> CapacityResult:
    steps = [
        StepResult(offered_rps=r, achieved_rps=min(r, 150), p50_ms=5,
                   p99_ms=20 if r <= 150 else 400, error_rate=0, requests=100,
                   passed=r <= 150, duration_s=1)
        for r in (50.0, 100.0, 200.0, 150.0)
    ]  # fmt: skip
    return CapacityResult(
        effective_rps=effective,
        p99_ms=20 if effective else None,
        sla=SLA(p99_ms=100),
        feasible=effective > 0,
        precision=0.05,
        steps=steps,
    )


def test_json_carries_the_cost_line() -> None:
    data = capacity_json(_result(150.0), urls=["u"], replicas=2, accelerators_per_replica=4)
    # 2 * 4 accelerators / (150 req/s * 3600 s/h) * 1e6 requests
    assert data["accelerator_hours_per_million"] == pytest.approx(8 / (150 * 3600) * 1e6)
    assert data["effective_rps"] == 150.0
    assert len(data["steps"]) == 4
    assert {"p99_ms", "sla", "steps", "effective_rps"} <= set(data)


def test_json_cost_is_null_when_infeasible() -> None:
    data = capacity_json(_result(0.0), urls=["u"], replicas=1, accelerators_per_replica=1)
    assert data["accelerator_hours_per_million"] is None


def test_plot_writes_an_image_with_several_configs(tmp_path: Path) -> None:
    out = plot_capacity({"a": _result(150.0), "b": _result(0.0)}, tmp_path / "sub" / "cap.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_capacity({}, tmp_path / "x.png")


def test_promql_uses_histogram_quantile_over_the_window_and_the_selector() -> None:
    source = PrometheusStepSource("http://127.0.0.1:9", selector='job="x"')
    queries = source.queries(5.0)
    assert queries["p99"] == (
        "histogram_quantile(0.99, sum by (le) "
        '(rate(batchpilot_request_latency_seconds_bucket{job="x"}[5000ms])))'
    )
    assert queries["ok_rps"] == 'sum(rate(batchpilot_requests_total{job="x",outcome="ok"}[5000ms]))'
    assert queries["total_rps"] == 'sum(rate(batchpilot_requests_total{job="x"}[5000ms]))'
    bare = PrometheusStepSource("http://127.0.0.1:9").queries(2.0)
    assert bare["total_rps"] == "sum(rate(batchpilot_requests_total[2000ms]))"
