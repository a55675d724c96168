"""Adaptive confirmation: more interleaved rounds while the verdict cannot decide, the
same rule for `tune --local` (tuner/confirm.py) and the operator (decisions)."""

from __future__ import annotations

import math

import pytest

from batchpilot.models import SLA, BatchingConfig, CapacityResult
from batchpilot.tuner.confirm import BRACKET_START, confirm_study, study_figures
from batchpilot.tuner.runner import Remeasured, remeasure_interleaved
from batchpilot.tuner.study import SearchSpace, TrialRecord
from batchpilot.tuner.verdict import decide, undecided

INC = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
A = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
B = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0)
SLA_ = SLA(p99_ms=100.0)


def result(rps: float) -> CapacityResult:
    return CapacityResult(
        effective_rps=rps,
        p99_ms=50.0 if rps > 0 else None,
        sla=SLA_,
        feasible=rps > 0,
        precision=0.05,
        steps=[],
    )


# Residual noise of about 3 % in logs, alternating so that every round mean is the same.
WOBBLE = [1.03, 0.97, 1.0, 1.03, 0.97, 1.0, 1.03, 0.97, 1.0, 1.03]


def table(gains: dict[BatchingConfig, float], rounds: int) -> dict[BatchingConfig, list[float]]:
    """Round r of configuration c: 100 x (1 + gain) with a wobble that differs between
    configurations (so the block model sees residual noise)."""
    out = {}
    for i, (config, g) in enumerate(gains.items()):
        out[config] = [
            100.0 * (1.0 + g) * (WOBBLE[(r + i) % 3] if i % 2 else 2.0 - WOBBLE[(r + i) % 3])
            for r in range(rounds)
        ]
    return out


def test_a_gain_interval_across_the_margin_is_undecided() -> None:
    verdict = decide(table({A: 0.07, INC: 0.0}, 3), INC)
    assert verdict.gain_low_percent < 5.0 <= verdict.gain_high_percent
    assert not verdict.significant
    assert undecided(verdict)


def test_a_proven_gain_and_a_clear_loser_are_decided() -> None:
    proven = decide(table({A: 0.40, INC: 0.0}, 3), INC)
    assert proven.significant
    assert not undecided(proven)
    loser = decide(table({A: -0.30, INC: 0.0}, 3), INC)
    assert not loser.significant
    assert not undecided(loser)


def test_a_finalist_that_failed_a_round_is_no_reason_to_go_on() -> None:
    rounds = table({A: 0.07, INC: 0.0}, 3)
    rounds[A][1] = 0.0  # cannot win whatever follows
    assert not undecided(decide(rounds, INC))


async def test_the_runner_adds_whole_rounds_while_undecided_up_to_the_cap() -> None:
    class Target:
        async def current(self) -> BatchingConfig:
            return INC

        async def apply(self, config: BatchingConfig) -> None:
            return None

    taken: list[tuple[BatchingConfig, int]] = []

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        taken.append((config, round_index))
        return result(100.0 + round_index)

    looked: list[int] = []

    def never_sure(so_far: Remeasured) -> bool:
        looked.append(so_far.completed_rounds())
        return True

    out = await remeasure_interleaved(
        Target(), measure, [A, B], INC, rounds=3, max_rounds=5, undecided=never_sure
    )
    assert taken == [(c, r) for r in range(5) for c in (A, B, INC)]
    assert out.completed_rounds() == 5
    # asked after each complete round from the third on, not once the cap is reached
    assert looked == [3, 4]

    taken.clear()
    fixed = await remeasure_interleaved(Target(), measure, [A], INC, rounds=3)
    assert fixed.completed_rounds() == 3  # no cap: exactly `rounds`
    with pytest.raises(ValueError, match="max_rounds"):
        await remeasure_interleaved(Target(), measure, [A], INC, rounds=4, max_rounds=3)


def record(number: int, config: BatchingConfig, rps: float, source: str = "sampler") -> TrialRecord:
    return TrialRecord(
        number=number,
        params=SearchSpace.params_of(config),
        source=source,  # type: ignore[arg-type]
        state="Complete",
        effective_rps=rps,
    )


class RoundTarget:
    def __init__(self) -> None:
        self.live = INC

    async def current(self) -> BatchingConfig:
        return self.live

    async def apply(self, config: BatchingConfig) -> None:
        self.live = config


async def test_confirmation_goes_on_until_a_close_gain_is_proven() -> None:
    """A finalist truly 9 % better, measured with a few per cent of noise: three rounds
    leave its interval across the 5 % margin, more rounds prove it."""
    records = [record(0, INC, 100.0, "baseline"), record(1, A, 112.0), record(2, B, 95.0)]
    truth = {INC: 100.0, A: 109.0, B: 96.0}
    wobble = [1.04, 0.96, 1.0, 0.98, 1.02, 1.0, 1.01, 0.99, 1.0, 1.0]

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        sign = 1 if config == A else -1 if config == INC else 0
        return result(truth[config] * wobble[(round_index + sign) % len(wobble)])

    fixed = await confirm_study(
        records, INC, RoundTarget(), measure, finalists_wanted=2, rounds=3, min_gain_percent=5
    )
    assert fixed is not None
    assert fixed.finalists == [A, B]
    assert fixed.remeasured.completed_rounds() == 3
    assert not fixed.verdict.significant
    assert undecided(fixed.verdict)

    adaptive = await confirm_study(
        records,
        INC,
        RoundTarget(),
        measure,
        finalists_wanted=2,
        rounds=3,
        max_rounds=10,
        min_gain_percent=5,
    )
    assert adaptive is not None
    assert 3 < adaptive.remeasured.completed_rounds() <= 10
    assert adaptive.verdict.significant
    assert adaptive.verdict.chosen == A


async def test_nothing_to_confirm_without_a_finalist() -> None:
    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        raise AssertionError("nothing is measured")

    only_incumbent = [record(0, INC, 100.0, "baseline")]
    assert (
        await confirm_study(
            only_incumbent,
            INC,
            RoundTarget(),
            measure,
            finalists_wanted=3,
            rounds=3,
            min_gain_percent=5,
        )
        is None
    )


def test_study_figures_are_each_configurations_first_complete_trial() -> None:
    records = [record(0, INC, 100.0, "baseline"), record(1, A, 120.0), record(2, A, 90.0)]
    assert study_figures(records) == {INC: 100.0, A: 120.0}
    assert 0.5 < BRACKET_START < 1.0
    assert math.isclose(BRACKET_START * 120.0, 96.0)
