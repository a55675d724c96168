"""HDR histograms: percentiles, exact merging, encoding."""

from __future__ import annotations

import random

import pytest

from batchpilot.loadgen.histogram import LatencyHistogram, merge_encoded


def _histogram(values: list[float]) -> LatencyHistogram:
    h = LatencyHistogram()
    for v in values:
        h.record_ms(v)
    return h


def test_percentiles_within_hdr_precision() -> None:
    values = [float(i) for i in range(1, 1001)]  # 1..1000 ms
    summary = _histogram(values).summary()
    assert summary.count == 1000
    assert summary.p50_ms == pytest.approx(500, rel=1e-3)
    assert summary.p99_ms == pytest.approx(990, rel=1e-3)
    assert summary.p999_ms == pytest.approx(999, rel=1e-3)
    assert summary.max_ms == pytest.approx(1000, rel=1e-3)
    assert summary.mean_ms == pytest.approx(500.5, rel=1e-3)


def test_merging_encoded_parts_equals_recording_everything_in_one() -> None:
    rng = random.Random(5)
    values = [rng.lognormvariate(3, 1) for _ in range(5000)]
    parts = [values[i::3] for i in range(3)]
    merged = merge_encoded(_histogram(p).encode() for p in parts)
    whole = _histogram(values)
    assert merged.count == whole.count
    assert merged.summary() == whole.summary()


def test_merging_is_not_averaging_percentiles() -> None:
    fast = _histogram([1.0] * 99 + [2.0])
    slow = _histogram([100.0] * 100)
    merged = merge_encoded([fast.encode(), slow.encode()])
    # Half the samples are 100 ms: the merged p99 is 100 ms, not the mean of 2 and 100.
    assert merged.percentile_ms(99) == pytest.approx(100, rel=1e-3)
    assert merged.percentile_ms(40) == pytest.approx(1, rel=1e-3)


def test_round_trip_through_encoding() -> None:
    h = _histogram([0.25, 3.5, 12000.0])
    again = LatencyHistogram.decode(h.encode())
    assert again.summary() == h.summary()


def test_empty_histogram_summarises_to_zero_count() -> None:
    summary = LatencyHistogram().summary()
    assert summary.count == 0
    assert summary.p99_ms == 0.0


def test_values_out_of_range_are_clamped_not_lost() -> None:
    h = _histogram([0.0, 10_000_000_000.0])
    assert h.count == 2
    assert h.percentile_ms(100) == pytest.approx(3_600_000, rel=1e-3)
