"""Arrival schedules: rate, inter-arrival distribution, reproducibility."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from batchpilot.loadgen.arrivals import schedule


def test_constant_arrivals_are_evenly_spaced_at_the_rate() -> None:
    offsets = schedule(200.0, 2.0, "constant", seed=0)
    assert len(offsets) == 400
    gaps = {round(b - a, 9) for a, b in itertools.pairwise(offsets)}
    assert gaps == {0.005}
    assert offsets[0] == 0.0
    assert offsets[-1] < 2.0


def test_poisson_offers_exactly_the_rate_within_the_window() -> None:
    offsets = schedule(1234.0, 3.0, "poisson", seed=7)
    assert len(offsets) == round(1234.0 * 3.0)
    assert offsets == sorted(offsets)
    assert offsets[0] >= 0.0
    assert offsets[-1] < 3.0


def test_poisson_inter_arrivals_are_exponential() -> None:
    rate = 500.0
    offsets = schedule(rate, 40.0, "poisson", seed=3)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = statistics.fmean(gaps)
    # Exponential: mean = standard deviation = 1/rate; CDF 1 - exp(-rate t).
    assert mean == pytest.approx(1.0 / rate, rel=0.02)
    assert statistics.stdev(gaps) == pytest.approx(1.0 / rate, rel=0.03)
    for quantile in (0.25, 0.5, 0.9, 0.99):
        t = -math.log(1.0 - quantile) / rate
        observed = sum(g <= t for g in gaps) / len(gaps)
        assert observed == pytest.approx(quantile, abs=0.01)


def test_counts_per_second_vary_like_poisson() -> None:
    # Poisson counts have variance equal to their mean; constant arrivals have none.
    offsets = schedule(300.0, 60.0, "poisson", seed=11)
    counts = [0] * 60
    for t in offsets:
        counts[int(t)] += 1
    assert statistics.pvariance(counts) == pytest.approx(300.0, rel=0.5)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    assert schedule(100.0, 5.0, "poisson", 1) == schedule(100.0, 5.0, "poisson", 1)
    assert schedule(100.0, 5.0, "poisson", 1) != schedule(100.0, 5.0, "poisson", 2)


@pytest.mark.parametrize(
    ("rate", "duration", "arrival", "message"),
    [
        (0.0, 1.0, "poisson", "rate must be a positive"),
        (-5.0, 1.0, "constant", "rate must be a positive"),
        (math.inf, 1.0, "poisson", "rate must be a positive"),
        (10.0, 0.0, "poisson", "duration must be a positive"),
        (10.0, 1.0, "bursty", "arrival must be one of poisson, constant"),
    ],
)
def test_bad_arguments_are_rejected(
    rate: float, duration: float, arrival: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(rate, duration, arrival, 0)  # type: ignore[arg-type]
