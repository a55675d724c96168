"""Arrival processes: their rates, their burstiness, trace replay and trace errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from batchpilot.simulator.arrivals import MMPP, Poisson, TraceError, load_trace


def _dispersion(times: np.ndarray, window_s: float) -> float:
    """Variance over mean of counts per window: 1 for Poisson, more for bursty traffic."""
    counts = np.bincount((times // window_s).astype(np.int64))[:-1]
    return float(counts.var() / counts.mean())


def test_poisson_rate_and_dispersion() -> None:
    times = Poisson().times(200_000, 500.0, np.random.default_rng(1))
    assert np.all(np.diff(times) >= 0)
    assert times.size / times[-1] == pytest.approx(500.0, rel=0.02)
    assert _dispersion(times, 0.1) == pytest.approx(1.0, abs=0.1)


def test_mmpp_keeps_the_mean_rate_and_is_bursty() -> None:
    process = MMPP(burst_factor=5.0, high_fraction=0.2, mean_burst_s=0.5)
    times = process.times(200_000, 500.0, np.random.default_rng(2))
    assert times.size == 200_000
    assert np.all(np.diff(times) >= 0)
    assert times.size / times[-1] == pytest.approx(500.0, rel=0.1)
    assert _dispersion(times, 0.1) > 5.0


def test_same_seed_same_arrivals() -> None:
    for process in (Poisson(), MMPP()):
        a = process.times(1000, 100.0, np.random.default_rng(7))
        b = process.times(1000, 100.0, np.random.default_rng(7))
        c = process.times(1000, 100.0, np.random.default_rng(8))
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)


def test_trace_replays_its_gaps_scaled_to_the_rate(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("# seconds\n10.0\n10.1\n10.3\n\n10.4\n")
    trace = load_trace(path)
    assert trace.gaps_s == pytest.approx((0.1, 0.2, 0.1))
    assert trace.native_rate == pytest.approx(7.5)  # 3 gaps in 0.4 s
    times = trace.times(7, 15.0, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0.0], times]))
    # at twice the native rate every gap halves; the order of gaps is the trace's, cycled
    assert sorted(set(np.round(gaps, 9))) == pytest.approx([0.05, 0.1])
    assert times.size == 7
    json_path = tmp_path / "trace.json"
    json_path.write_text("[0, 0.5, 1.5]")
    assert load_trace(json_path).gaps_s == pytest.approx((0.5, 1.0))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("1.0\n", "at least 2 timestamps"),
        ("1.0\nabc\n", "not a list of timestamps"),
        ("2.0\n1.0\n", "must not decrease"),
        ("1.0\n1.0\n", "positive time"),
        ('{"a": 1}', "not a list of timestamps"),
        ("1.0\ninf\n", "finite"),
    ],
)
def test_bad_traces_are_rejected_with_the_reason(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "trace"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_missing_trace_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "absent.txt")
