"""The verdict after a study: which configuration the interleaved rounds prove best."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from batchpilot.models import BatchingConfig
from batchpilot.tuner.verdict import Verdict, decide, gain_over_incumbent

INC = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
A = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
B = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0)
C = BatchingConfig(max_batch_size=64, max_queue_time_ms=0.0)


def noisy(
    truth: dict[BatchingConfig, float],
    rng: random.Random,
    *,
    rounds: int = 3,
    noise: float = 0.1,
    drift: list[float] | None = None,
) -> dict[BatchingConfig, list[float]]:
    """Multiplicative noise per measurement, times a drift shared by a round."""
    drift = drift or [1.0] * rounds
    return {
        c: [v * drift[r] * math.exp(rng.gauss(0.0, noise)) for r in range(rounds)]
        for c, v in truth.items()
    }


def test_a_clear_winner_is_significant_and_chosen() -> None:
    rounds = {
        A: [131.0, 128.0, 133.0],
        B: [101.0, 99.0, 103.0],
        INC: [100.0, 98.0, 102.0],
    }
    verdict = decide(rounds, INC)
    assert verdict.significant
    assert verdict.chosen == A
    assert verdict.winner.config == A
    assert verdict.ranking[0].config == A
    assert 25.0 < verdict.gain_percent < 35.0
    assert 5.0 <= verdict.gain_low_percent < verdict.gain_percent < verdict.gain_high_percent
    assert verdict.reason == ""
    assert verdict.incumbent.config == INC
    assert verdict.incumbent.rounds == [100.0, 98.0, 102.0]


def test_equal_configurations_under_noise_are_rarely_significant() -> None:
    truth = {A: 100.0, B: 100.0, C: 100.0, INC: 100.0}
    significant = 0
    for seed in range(300):
        verdict = decide(noisy(truth, random.Random(seed)), INC)
        significant += verdict.significant
        if not verdict.significant:
            assert verdict.chosen == INC
            assert verdict.reason.startswith("NoSignificantGain: ")
    # No configuration is better: a significant gain is a false one. Each comparison
    # errs upwards 2.5 % of the time at most, the 5 % margin lowers that, the choice of
    # the best of three raises it: together well within 5 %.
    assert significant / 300 <= 0.05


def test_a_truly_worse_finalist_is_almost_never_written_back() -> None:
    truth = {A: 95.0, B: 95.0, C: 95.0, INC: 100.0}
    written = sum(decide(noisy(truth, random.Random(seed)), INC).significant for seed in range(300))
    assert written / 300 <= 0.01


def test_drift_hitting_all_alike_does_not_create_a_gain() -> None:
    # The machine halves its speed over the rounds; the finalists measured right after
    # the incumbent within each round see the same drop.
    drift = [1.0, 0.7, 0.5]
    rounds = {c: [100.0 * d for d in drift] for c in (A, B, INC)}
    verdict = decide(rounds, INC)
    assert not verdict.significant
    assert verdict.chosen == INC
    assert verdict.gain_percent == pytest.approx(0.0, abs=1e-9)


def test_a_real_gain_survives_a_drift_larger_than_itself() -> None:
    drift = [1.0, 0.6, 1.3, 0.8]
    rng = random.Random(7)
    rounds = noisy({A: 120.0, INC: 100.0}, rng, rounds=4, noise=0.02, drift=drift)
    verdict = decide(rounds, INC)
    assert verdict.significant
    assert verdict.chosen == A
    assert verdict.gain_low_percent <= 20.0 <= verdict.gain_high_percent


def test_the_incumbent_winning_keeps_the_incumbent() -> None:
    rounds = {A: [90.0, 88.0, 91.0], B: [80.0, 82.0, 79.0], INC: [100.0, 99.0, 101.0]}
    verdict = decide(rounds, INC)
    assert verdict.winner.config == INC
    assert verdict.chosen == INC
    assert not verdict.significant
    assert verdict.gain_percent == 0.0
    assert "incumbent batch=8 wait=5ms measured best" in verdict.reason
    assert verdict.reason.startswith("NoSignificantGain: ")


def test_a_gain_below_the_required_margin_is_not_significant_and_says_the_figures() -> None:
    rounds = {A: [104.0, 103.0, 105.0], INC: [100.0, 100.5, 99.5]}
    verdict = decide(rounds, INC, min_gain_percent=5.0)
    assert verdict.winner.config == A
    assert not verdict.significant
    assert verdict.chosen == INC
    assert "batch=32 wait=10ms" in verdict.reason
    assert f"{verdict.gain_percent:+.1f} %" in verdict.reason
    assert "5 % required" in verdict.reason
    # The same rounds clear a smaller margin.
    assert decide(rounds, INC, min_gain_percent=0.2).significant


def test_method_and_level_are_named_and_the_level_sets_the_width() -> None:
    rng = random.Random(3)
    rounds = noisy({A: 130.0, B: 110.0, INC: 100.0}, rng)
    narrow = decide(rounds, INC, level=0.8)
    wide = decide(rounds, INC, level=0.99)
    assert narrow.level == 0.8
    assert wide.level == 0.99
    assert "t with 4 dof" in narrow.method  # (3 configurations - 1) x (3 rounds - 1)
    assert "two-sided 80% intervals" in narrow.method
    assert "3 interleaved rounds" in narrow.method
    assert wide.gain_low_percent < narrow.gain_low_percent
    assert wide.gain_high_percent > narrow.gain_high_percent
    assert narrow.gain_percent == pytest.approx(wide.gain_percent)
    for estimate in narrow.ranking:
        assert estimate.low < estimate.estimate < estimate.high
    lows = [e.low for e in narrow.ranking]
    assert lows == sorted(lows, reverse=True)


def test_one_finalist_is_the_paired_t_on_log_ratios() -> None:
    a, inc = [120.0, 95.0, 131.0, 110.0], [100.0, 90.0, 104.0, 101.0]
    verdict = decide({A: a, INC: inc}, INC, level=0.9)
    ratios = [math.log(x / y) for x, y in zip(a, inc, strict=True)]
    n = len(ratios)
    mean = sum(ratios) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1))
    half = float(stats.t.ppf(0.95, n - 1)) * sd / math.sqrt(n)
    assert verdict.gain_percent == pytest.approx(100 * (math.exp(mean) - 1))
    assert verdict.gain_low_percent == pytest.approx(100 * (math.exp(mean - half) - 1))
    assert verdict.gain_high_percent == pytest.approx(100 * (math.exp(mean + half) - 1))


def test_the_gain_interval_covers_the_true_gain_at_about_its_level() -> None:
    truth = {A: 115.0, B: 100.0, INC: 100.0}
    covered = 0
    trials = 400
    for seed in range(trials):
        rounds = noisy(
            truth, random.Random(seed), rounds=5, noise=0.08, drift=[1, 0.9, 1.1, 1, 0.8]
        )
        # The gain of A specifically: compare A alone with the incumbent, same rounds.
        verdict = decide({A: rounds[A], B: rounds[B], INC: rounds[INC]}, INC)
        if verdict.winner.config == A:
            covered += verdict.gain_low_percent <= 15.0 <= verdict.gain_high_percent
        else:
            covered += 1  # not a statement about A's gain
    assert covered / trials >= 0.9


def test_a_finalist_that_failed_a_round_cannot_win_nor_hide_another_gain() -> None:
    flaky = {A: [300.0, 0.0, 310.0], INC: [100.0, 101.0, 99.0]}
    verdict = decide(flaky, INC)
    assert verdict.chosen == INC
    assert verdict.winner.config == INC
    assert "no finalist met the SLA in every round" in verdict.reason
    assert verdict.ranking[-1].config == A

    rounds = {**flaky, B: [130.0, 131.0, 129.0]}
    verdict = decide(rounds, INC)
    assert verdict.significant
    assert verdict.chosen == B
    assert [e.config for e in verdict.ranking] == [B, INC, A]


def test_an_incumbent_that_never_met_the_sla_loses_to_one_that_always_did() -> None:
    verdict = decide({A: [50.0, 52.0, 49.0], INC: [0.0, 0.0, 0.0]}, INC)
    assert verdict.significant
    assert verdict.chosen == A
    assert verdict.gain_low_percent > 1000.0
    assert verdict.model_dump_json()  # finite figures: valid JSON


def test_nothing_met_the_sla_keeps_the_incumbent() -> None:
    verdict = decide({A: [0.0, 0.0], INC: [0.0, 0.0]}, INC)
    assert not verdict.significant
    assert verdict.chosen == INC
    assert verdict.reason == "NoSignificantGain: no configuration met the SLA in any round"


def test_the_verdict_round_trips_through_json() -> None:
    verdict = decide(noisy({A: 130.0, B: 110.0, INC: 100.0}, random.Random(1)), INC)
    assert Verdict.model_validate_json(verdict.model_dump_json()) == verdict


@pytest.mark.parametrize(
    ("rounds", "kwargs", "message"),
    [
        ({A: [1.0, 2.0]}, {}, "the incumbent batch=8 wait=5ms has no rounds"),
        ({A: [1.0, 2.0], INC: [1.0]}, {}, "at least 2 rounds"),
        ({A: [1.0, 2.0, 3.0], INC: [1.0, 2.0]}, {}, "every configuration must be measured"),
        ({A: [1.0, -2.0], INC: [1.0, 2.0]}, {}, "finite req/s >= 0"),
        ({A: [1.0, math.nan], INC: [1.0, 2.0]}, {}, "finite req/s >= 0"),
        ({INC: [1.0, 2.0]}, {"level": 1.0}, "level must be between 0 and 1"),
        ({INC: [1.0, 2.0]}, {"min_gain_percent": -1.0}, "min_gain_percent must be"),
    ],
)
def test_tables_it_cannot_judge_are_refused_with_the_reason(
    rounds: dict[BatchingConfig, list[float]], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        decide(rounds, INC, **kwargs)  # type: ignore[arg-type]


def test_the_incumbent_alone_is_kept_with_its_own_spread() -> None:
    verdict = decide({INC: [100.0, 110.0, 90.0]}, INC)
    assert verdict.chosen == INC
    assert not verdict.significant
    assert verdict.incumbent.low < verdict.incumbent.estimate < verdict.incumbent.high
    assert verdict.reason == "NoSignificantGain: no finalist was measured besides the incumbent"


def test_every_finalist_has_a_gain_by_the_same_method() -> None:
    verdict = decide(noisy({A: 130.0, B: 110.0, INC: 100.0}, random.Random(2)), INC)
    winner = gain_over_incumbent(verdict, verdict.winner)
    assert winner == pytest.approx(
        (verdict.gain_percent, verdict.gain_low_percent, verdict.gain_high_percent)
    )
    assert gain_over_incumbent(verdict, verdict.incumbent) == (0.0, 0.0, 0.0)
    b = next(e for e in verdict.ranking if e.config == B)
    gain, low, high = gain_over_incumbent(verdict, b)
    assert low < gain < high


def test_ten_identical_finalists_judged_at_four_looks_are_rarely_significant() -> None:
    # The best of ten identical finalists, with up to four looks of an adaptive
    # confirmation: per-comparison intervals (the 95 % level left whole for each
    # finalist at each look) call a gain far more often than their level says;
    # simultaneous ones keep the false write-backs within 5 %.
    finalists = [BatchingConfig(max_batch_size=2**k, max_queue_time_ms=1.0) for k in range(10)]
    truth = {**{c: 100.0 for c in finalists}, INC: 100.0}
    per_comparison_level = 1.0 - 0.05 * len(finalists)  # undoes the split over finalists

    def false_gain(seed: int, *, simultaneous: bool) -> bool:
        rng = random.Random(seed)
        table = noisy(truth, rng, rounds=3, noise=0.2)
        for _ in range(4):
            verdict = (
                decide(table, INC, min_gain_percent=0.0, looks=4)
                if simultaneous
                else decide(table, INC, min_gain_percent=0.0, level=per_comparison_level)
            )
            if verdict.significant:
                return True
            more = noisy(truth, rng, rounds=1, noise=0.2)
            table = {c: [*v, *more[c]] for c, v in table.items()}
        return False

    runs = 300
    joint = sum(false_gain(seed, simultaneous=True) for seed in range(runs))
    naive = sum(false_gain(seed, simultaneous=False) for seed in range(runs))
    assert joint / runs <= 0.05, (joint, naive)
    assert naive / runs > 0.05, (joint, naive)  # what per-comparison intervals did


def test_the_intervals_widen_with_the_finalists_and_the_looks() -> None:
    rounds = {A: [112.0, 109.0, 115.0], INC: [100.0, 98.0, 102.0]}
    one = decide(rounds, INC)
    peeked = decide(rounds, INC, looks=4)
    assert peeked.gain_percent == pytest.approx(one.gain_percent)
    assert peeked.gain_low_percent < one.gain_low_percent
    assert "simultaneous over 4 comparison(s)" in peeked.method
    three = decide({**rounds, B: [100.0, 99.0, 101.0], C: [99.0, 97.0, 103.0]}, INC)
    assert "simultaneous over 3 comparison(s)" in three.method
