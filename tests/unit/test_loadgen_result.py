"""Reducing per-request records to a LoadResult; merging results of parallel runs."""

from __future__ import annotations

import pytest

from batchpilot.loadgen.result import (
    CANCELLED,
    OK,
    TIMEOUT,
    LoadResult,
    achieved_rate,
    merge_results,
    summarise,
)


def _result(
    outcomes: list[str | None],
    latencies: list[float],
    *,
    done_at: list[float] | None = None,
    window_s: float = 2.0,
    lags: list[float] | None = None,
) -> LoadResult:
    n = len(outcomes)
    offsets = [i * window_s / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=n / window_s,
        window_s=window_s,
        offsets=offsets,
        outcomes=outcomes,
        latencies_ms=latencies,
        lags_ms=lags or [0.0] * n,
        done_at=done_at or [o + 0.001 for o in offsets],
        elapsed_s=window_s,
        interrupted=False,
    )


def test_errors_by_kind_and_error_rate() -> None:
    result = _result([OK, OK, "503", TIMEOUT, "connection", OK], [1, 2, 0, 500, 0, 3])
    assert result.requests == 6
    assert result.ok == 3
    assert result.errors == {"503": 1, "connection": 1, "timeout": 1}
    assert result.timeouts == 1
    assert result.error_rate == pytest.approx(0.5)


def test_latency_counts_successes_and_timeouts_but_not_fast_rejections() -> None:
    result = _result([OK, "503", TIMEOUT], [10.0, 0.5, 1000.0])
    assert result.latency.count == 2
    assert result.latency.max_ms == pytest.approx(1000, rel=1e-3)
    assert result.latency.p50_ms == pytest.approx(10, rel=1e-3)


def test_latency_from_send_takes_the_generator_lag_out() -> None:
    result = _result([OK, OK], [30.0, 50.0], lags=[20.0, 0.0])
    assert result.latency.max_ms == pytest.approx(50, rel=1e-3)
    assert result.latency.p50_ms == pytest.approx(30, rel=1e-3)
    assert result.latency_from_send.p50_ms == pytest.approx(10, rel=1e-3)
    assert result.latency_from_send.max_ms == pytest.approx(50, rel=1e-3)


def test_unsent_and_cancelled_requests_are_not_counted_as_attempts() -> None:
    result = _result([OK, None, CANCELLED, OK], [1, 0, 0, 1])
    assert result.requests == 2
    assert result.error_rate == 0.0
    assert result.offered_rps == pytest.approx(3 / 2.0)  # sent, including the cancelled one


def test_timeline_buckets_by_scheduled_second() -> None:
    result = _result([OK, OK, "500", OK], [1, 3, 0, 7], window_s=2.0, lags=[0, 4, 0, 1])
    assert [(s.t_s, s.scheduled, s.ok, s.errors) for s in result.timeline] == [
        (0, 2, 2, 0),
        (1, 2, 1, 1),
    ]
    assert result.timeline[0].max_lag_ms == 4
    assert result.timeline[1].p99_ms == pytest.approx(7)
    assert result.max_lag_ms == 4


def test_achieved_rate_is_per_second_of_the_measured_window() -> None:
    # however late the responses trail: a server that falls behind is charged in its
    # latency, from each request's schedule, and in its timeouts
    assert achieved_rate(100, 10.0) == pytest.approx(10.0)
    assert achieved_rate(0, 1.0) == 0.0
    assert achieved_rate(5, 0.0) == 0.0


def test_merge_adds_rates_and_merges_histograms_exactly() -> None:
    a = _result([OK] * 4, [1, 2, 3, 4])
    b = _result([OK, OK, "503", OK], [100, 200, 0, 300])
    merged = merge_results([a, b])
    assert merged.requests == 8
    assert merged.ok == 7
    assert merged.errors == {"503": 1}
    assert merged.offered_rps == pytest.approx(a.offered_rps + b.offered_rps)
    assert merged.latency.count == 7
    assert merged.latency.max_ms == pytest.approx(300, rel=1e-3)
    assert merged.urls == a.urls + b.urls
    with pytest.raises(ValueError, match="at least one"):
        merge_results([])


def test_result_serialises_to_json_and_back() -> None:
    result = _result([OK, TIMEOUT], [5, 1000])
    again = LoadResult.model_validate_json(result.model_dump_json())
    assert again == result
    assert again.latency_histogram().count == 2
