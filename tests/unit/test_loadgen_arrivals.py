"""Arrival schedules: rate, inter-arrival distribution, reproducibility."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from batchpilot.loadgen.arrival_option import arrival_option
from batchpilot.loadgen.arrivals import (
    MMPP,
    ArrivalKind,
    Constant,
    Poisson,
    Trace,
    TraceError,
    arrival_times,
    describe_arrival,
    parse_arrival,
    schedule,
)
from batchpilot.models import RequestMix
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.scenario import Scenario, Traffic, measured_from


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
        (10.0, 1.0, "bursty", "arrival 'bursty' is not one of: poisson, constant, mmpp"),
    ],
)
def test_bad_arguments_are_rejected(
    rate: float, duration: float, arrival: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(rate, duration, arrival, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("poisson", Poisson()),
        ("constant", Constant()),
        (" mmpp ", MMPP()),
        ("mmpp:6,0.1,2", MMPP(burst_factor=6.0, high_fraction=0.1, mean_burst_s=2.0)),
        ("mmpp:factor=3", MMPP(burst_factor=3.0)),
        (
            "mmpp:burst_s=0.25, fraction=0.5",
            MMPP(high_fraction=0.5, mean_burst_s=0.25),
        ),
    ],
)
def test_arrival_syntax(text: str, expected: ArrivalKind) -> None:
    assert parse_arrival(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bursty", "is not one of: poisson, constant, mmpp"),
        ("poisson:3", "is not one of"),
        ("trace:", "is not one of"),
        ("mmpp:4,0.2", "mmpp takes three numbers FACTOR,FRACTION,BURST_S"),
        ("mmpp:4,fraction=0.2,1", "mmpp takes three numbers"),
        ("mmpp:speed=2", "unknown mmpp key 'speed'; the keys are factor, fraction, burst_s"),
        ("mmpp:a,b,c", "mmpp values must be numbers"),
        ("mmpp:factor=0.5", "factor input should be greater than or equal to 1"),
        ("mmpp:1,1.5,1", "fraction input should be less than 1"),
        ("mmpp:factor=2,burst_s=0", "burst_s input should be greater than 0"),
    ],
)
def test_bad_arrival_syntax_says_what_is_wrong_and_allowed(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_arrival(text)


def test_trace_syntax_reads_the_file_and_reports_its_problems(tmp_path: Path) -> None:
    good = tmp_path / "t.txt"
    good.write_text("0\n0.5\n1.5\n")
    trace = parse_arrival(f"trace:{good}")
    assert isinstance(trace, Trace)
    assert trace.gaps_s == pytest.approx((0.5, 1.0))
    bad = tmp_path / "bad.txt"
    bad.write_text("2\n1\n")
    with pytest.raises(TraceError, match="must not decrease"):
        parse_arrival(f"trace:{bad}")
    with pytest.raises(TraceError, match="cannot read trace"):
        parse_arrival(f"trace:{tmp_path / 'missing.txt'}")


def test_arrival_option_gives_commands_a_process_and_usage_errors() -> None:
    import click

    @click.command()
    @arrival_option()
    def show(arrival: ArrivalKind) -> None:
        click.echo(describe_arrival(arrival))

    runner = CliRunner()
    assert runner.invoke(show, []).output.strip() == "poisson"
    ok = runner.invoke(show, ["--arrival", "mmpp:4,0.2,0.5"])
    assert ok.output.strip() == "mmpp:factor=4,fraction=0.2,burst_s=0.5"
    bad = runner.invoke(show, ["--arrival", "mmpp:9"])
    assert bad.exit_code == 2
    assert "Invalid value for '--arrival'" in bad.output
    assert "allowed: poisson, constant, mmpp" in bad.output


@pytest.mark.parametrize("process", [Poisson(), Constant(), MMPP(), Trace(gaps_s=(0.1, 0.3, 0.2))])
def test_every_process_offers_exactly_the_rate_within_the_window(process: ArrivalKind) -> None:
    offsets = schedule(250.0, 4.0, process, seed=5)
    assert len(offsets) == 1000
    assert offsets[0] == 0.0
    assert offsets == sorted(offsets)
    assert offsets[-1] == pytest.approx(999 / 250.0)
    assert offsets[-1] < 4.0


@pytest.mark.parametrize("process", [Poisson(), MMPP(), Trace(gaps_s=(0.1, 0.3, 0.2, 0.05))])
def test_generator_and_simulator_share_one_schedule(process: ArrivalKind) -> None:
    # The simulator's traffic is the generator's schedule for the same process and seed,
    # only scaled so that its measured window (after the warm-up share) is at the rate.
    rate, requests, seed = 400.0, 2000, 9
    generator = np.asarray(schedule(rate, requests / rate, process, seed))
    scenario = Scenario(
        cost=LinearCost(fixed_ms=1.0, per_row_ms=0.1),
        mix=RequestMix.uniform(1),
        arrival=process,
        requests=requests,
        seed=seed,
    )
    simulator = Traffic(scenario).arrivals(rate)
    assert simulator.size == generator.size
    ratio = simulator[1:] / generator[1:]
    assert ratio == pytest.approx(np.full(ratio.size, ratio[0]), rel=1e-9)
    assert 0.8 < ratio[0] < 1.25  # only the rate of the warm-up share tells them apart
    first = measured_from(requests)
    assert (requests - 1 - first) / (simulator[-1] - simulator[first]) == pytest.approx(rate)


def test_mmpp_schedule_has_bursts_of_the_asked_factor_and_share() -> None:
    process = MMPP(burst_factor=5.0, high_fraction=0.2, mean_burst_s=2.0)
    rate = 200.0
    offsets = np.asarray(schedule(rate, 2000.0, process, seed=3))
    counts = np.bincount(offsets.astype(np.int64))[:-1]
    # Counts per second: quiet seconds near rate / (0.8 + 0.2 x 5) = 111, bursts near 556.
    quiet_rate = rate / (0.8 + 0.2 * 5.0)
    burst = counts > 3.0 * quiet_rate
    assert burst.mean() == pytest.approx(0.2, abs=0.05)
    assert np.median(counts[burst]) / np.median(counts[~burst]) == pytest.approx(5.0, rel=0.15)
    assert counts.var() / counts.mean() > 20.0  # far from Poisson's 1
    assert counts.mean() == pytest.approx(rate, rel=0.01)


def test_mmpp_bursts_keep_their_length_in_seconds_at_every_rate() -> None:
    process = MMPP(burst_factor=8.0, high_fraction=0.25, mean_burst_s=1.0)

    def burst_share(rate: float) -> float:
        offsets = np.asarray(schedule(rate, 1000.0, process, seed=4))
        counts = np.bincount(offsets.astype(np.int64))[:-1]
        return float((counts > 3.0 * rate / (0.75 + 0.25 * 8.0)).mean())

    # Seconds that straddle a burst's edge count as burst too: a little over the 25 %.
    slow, fast = burst_share(100.0), burst_share(1000.0)
    assert slow == pytest.approx(0.27, abs=0.05)
    assert fast == pytest.approx(slow, abs=0.03)


def test_trace_replay_scales_its_gaps_to_each_rate() -> None:
    trace = Trace(gaps_s=(0.1, 0.3, 0.2, 0.4))  # 4 gaps in 1 s: recorded at 4 req/s
    slow = np.diff(arrival_times(trace, 41, 4.0, seed=1))
    fast = np.diff(arrival_times(trace, 41, 40.0, seed=1))
    # At the recorded rate the gaps are the trace's, cycled from a seeded start ...
    start = int(np.argmin(np.abs(slow[0] - np.array(trace.gaps_s))))
    expected = np.tile(trace.gaps_s, 12)[start : start + 40]
    assert slow == pytest.approx(expected)
    # ... and ten times the rate plays the same sequence ten times faster.
    assert fast == pytest.approx(slow / 10.0)


def test_same_seed_same_schedule_for_every_process() -> None:
    for process in (MMPP(), Trace(gaps_s=(0.1, 0.3, 0.2))):
        assert schedule(100.0, 5.0, process, 1) == schedule(100.0, 5.0, process, 1)
        # a trace differs between seeds by where its replay starts: some seeds agree
        assert len({tuple(schedule(100.0, 5.0, process, s)) for s in range(6)}) > 1


def test_arrival_times_rejects_what_it_cannot_schedule() -> None:
    with pytest.raises(ValueError, match="count must be at least 1"):
        arrival_times(Poisson(), 0, 10.0, 0)
    with pytest.raises(ValueError, match="window_from must be in"):
        arrival_times(Poisson(), 10, 10.0, 0, window_from=10)
    with pytest.raises(ValueError, match="rate must be a positive"):
        arrival_times(Poisson(), 10, -1.0, 0)
