"""Which configuration to run after a study, decided from interleaved re-measurements.

The finalists and the incumbent (what ran before the study) are measured in rounds,
A B C I, A B C I, ...: round r of every configuration ran within minutes of the others,
so whatever the machine did in that round (a neighbour stealing CPU, a slow drift) hit
them all alike. The decision therefore compares configurations *within* rounds.

Method (named in every verdict): a two-way model on log throughput,
``log x[c, r] = level[c] + round[r] + noise``, the randomised complete block design with
rounds as blocks. Round effects cancel out of every comparison between configurations;
the noise is estimated from the residuals pooled over the configurations, with
``(C - 1)(R - 1)`` degrees of freedom, and intervals use Student's t at the verdict's
two-sided `level`. With one finalist it is exactly the paired t-test on the log ratios
finalist/incumbent with ``R - 1`` degrees of freedom. Logs because noise on a shared
machine is multiplicative (a neighbour costs a share of the CPU, not a number of req/s),
and gains are ratios. A t-interval rather than a bootstrap: at 3 to 5 rounds a bootstrap
over rounds has 27 to 3,125 resamples, whose spread understates the uncertainty; the t
quantile pays for the few rounds honestly (4.30 at 2 degrees of freedom against 1.96).
The intervals are simultaneous (Bonferroni) over the finalists, since the winner is the
best of them, and over the looks of an adaptive confirmation, since it stops as soon as
a gain looks proven; the written-back gain must then clear `min_gain_percent` at its
lower bound.

A round in which no rate met the SLA measured 0 req/s, which has no logarithm: it counts
as 1 % of the best round in the table (a finite stand-in for "failed outright"). A
finalist with such a round cannot win (what is written back must have met the SLA every
time) and stays out of the pooled noise, so one erratic finalist does not hide another's
real gain; the incumbent always stays in (it is the reference every gain is taken over).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict
from scipy import stats

from batchpilot.models import BatchingConfig

# A round at 0 req/s counts as this share of the best round (see the module docstring).
FAILED_ROUND_SHARE = 0.01
MIN_ROUNDS = 2


class Estimate(BaseModel):
    """One configuration's effective throughput over the rounds.

    `estimate` is the geometric mean of its rounds (the model's level for it);
    `low`/`high` its two-sided interval at the verdict's level: how precisely this run
    pins the configuration's level down once the rounds' common swings are removed."""

    model_config = ConfigDict(frozen=True)

    config: BatchingConfig
    rounds: list[float]  # effective req/s per round, round order
    estimate: float
    low: float
    high: float


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    method: str
    level: float
    min_gain_percent: float
    ranking: list[Estimate]  # best lower bound first; finalists with a failed round last
    incumbent: Estimate
    chosen: BatchingConfig  # what to run: the winner when significant, else the incumbent
    winner: Estimate  # the best-ranked configuration (may be the incumbent)
    gain_percent: float  # winner over incumbent, and its interval
    gain_low_percent: float
    gain_high_percent: float
    # gain_low_percent >= min_gain_percent, and the winner is not the incumbent
    significant: bool
    reason: str  # "" or "NoSignificantGain: ..." with the figures


def decide(
    rounds: Mapping[BatchingConfig, Sequence[float]],
    incumbent: BatchingConfig,
    *,
    min_gain_percent: float = 5.0,
    level: float = 0.95,
    seed: int = 0,
    looks: int = 1,
) -> Verdict:
    """The verdict on `rounds[c][r]`: configuration c's effective req/s in interleaved
    round r (the same r for every configuration is the same A B C I pass).

    The intervals are simultaneous over the choice and the peeking: the error budget
    `1 - level` is split (Bonferroni) over the eligible finalists, since the winner is
    the best of them, and over `looks`, the number of times an adaptive confirmation
    may judge the table before it stops (its extra rounds included). Per-comparison
    intervals at one look wrote back identical configurations in about a fifth of runs
    once ten finalists and six looks were allowed (benchmarks/decision_quality.py).

    `seed` is part of the interface for methods that resample; the t method used here
    is deterministic and does not draw. Raises ValueError on tables it cannot judge."""
    del seed  # deterministic method; see the docstring
    _check(rounds, incumbent, min_gain_percent, level)
    configs = list(rounds)
    n_rounds = len(rounds[incumbent])
    best_round = max(max(values) for values in rounds.values())
    if best_round <= 0.0:
        return _nothing_met_the_sla(rounds, incumbent, min_gain_percent, level)
    floor = FAILED_ROUND_SHARE * best_round
    logs = {c: [math.log(max(v, floor)) for v in rounds[c]] for c in configs}
    eligible = [c for c in configs if c == incumbent or min(rounds[c]) > 0.0]
    sigma, dof = _pooled_noise(logs, eligible, incumbent)
    comparisons = max(1, len([c for c in eligible if c != incumbent])) * max(1, looks)
    joint = 1.0 - (1.0 - level) / comparisons
    t = float(stats.t.ppf(0.5 + joint / 2.0, dof))
    half = t * sigma / math.sqrt(n_rounds)

    def estimate(config: BatchingConfig) -> Estimate:
        mean = sum(logs[config]) / n_rounds
        return Estimate(
            config=config,
            rounds=[float(v) for v in rounds[config]],
            estimate=math.exp(mean),
            low=math.exp(mean - half),
            high=math.exp(mean + half),
        )

    estimates = {c: estimate(c) for c in configs}
    # Equal interval widths in logs: ranking by the lower bound is ranking by the level.
    # Ties go to the incumbent, then to the earlier finalist (the study's order).
    order = {c: i for i, c in enumerate(configs)}
    ranking = sorted(
        estimates.values(),
        key=lambda e: (
            e.config not in eligible,
            -e.low,
            e.config != incumbent,
            order[e.config],
        ),
    )
    winner = ranking[0]
    inc = estimates[incumbent]
    method = (
        f"two-way rounds x configurations model on log throughput "
        f"(randomised complete block, rounds as blocks; paired t on log ratios when one "
        f"finalist), pooled residual t with {dof} dof over {n_rounds} interleaved rounds, "
        f"two-sided {level:.0%} intervals simultaneous over {comparisons} comparison(s) "
        f"(Bonferroni: finalists x looks)"
    )
    if winner.config == incumbent:
        return Verdict(
            method=method,
            level=level,
            min_gain_percent=min_gain_percent,
            ranking=ranking,
            incumbent=inc,
            chosen=incumbent,
            winner=winner,
            gain_percent=0.0,
            gain_low_percent=0.0,
            gain_high_percent=0.0,
            significant=False,
            reason=_incumbent_best_reason(ranking, inc, eligible, dof),
        )
    diff = math.log(winner.estimate) - math.log(inc.estimate)
    spread = t * sigma * math.sqrt(2.0 / n_rounds)
    gain = _percent(diff)
    gain_low = _percent(diff - spread)
    gain_high = _percent(diff + spread)
    significant = gain_low >= min_gain_percent
    reason = ""
    if not significant:
        reason = (
            f"NoSignificantGain: the best finalist {winner.config.label()} measured "
            f"{winner.estimate:.0f} req/s against the incumbent's {inc.estimate:.0f} "
            f"({gain:+.1f} %, {level:.0%} interval {gain_low:+.1f} % to "
            f"{gain_high:+.1f} %); the lower bound is below the "
            f"{min_gain_percent:g} % required"
        )
    return Verdict(
        method=method,
        level=level,
        min_gain_percent=min_gain_percent,
        ranking=ranking,
        incumbent=inc,
        chosen=winner.config if significant else incumbent,
        winner=winner,
        gain_percent=gain,
        gain_low_percent=gain_low,
        gain_high_percent=gain_high,
        significant=significant,
        reason=reason,
    )


def gain_over_incumbent(verdict: Verdict, estimate: Estimate) -> tuple[float, float, float]:
    """(gain, low, high) in percent of any ranked configuration over the incumbent, by the
    verdict's method: the intervals share one width in logs, and a difference of two
    levels is sqrt(2) times as uncertain as one level."""
    inc = verdict.incumbent
    if estimate.config == inc.config or estimate.estimate <= 0.0 or inc.estimate <= 0.0:
        return (0.0, 0.0, 0.0)
    diff = math.log(estimate.estimate / inc.estimate)
    spread = math.sqrt(2.0) * math.log(estimate.high / estimate.estimate)
    return (_percent(diff), _percent(diff - spread), _percent(diff + spread))


def undecided(verdict: Verdict) -> bool:
    """Whether more rounds could change the verdict: some finalist that met the SLA in
    every round has a gain interval reaching across the margin (its lower bound below
    `min_gain_percent`, its upper bound at or above it), and none is proven yet. Adaptive
    confirmation measures another round while this holds (up to its cap): more rounds
    narrow every interval by the square root of their number and move t towards its
    limit, so a real gain near the margin is proven and a lucky one falls back."""
    if verdict.significant:
        return False
    for estimate in verdict.ranking:
        if estimate.config == verdict.incumbent.config or min(estimate.rounds) <= 0.0:
            continue
        _, low, high = gain_over_incumbent(verdict, estimate)
        if low < verdict.min_gain_percent <= high:
            return True
    return False


def _percent(log_ratio: float) -> float:
    return 100.0 * (math.exp(log_ratio) - 1.0)


def _check(
    rounds: Mapping[BatchingConfig, Sequence[float]],
    incumbent: BatchingConfig,
    min_gain_percent: float,
    level: float,
) -> None:
    if incumbent not in rounds:
        raise ValueError(f"the incumbent {incumbent.label()} has no rounds to compare against")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1 (exclusive), got {level}")
    if not math.isfinite(min_gain_percent) or min_gain_percent < 0.0:
        raise ValueError(f"min_gain_percent must be a finite number >= 0, got {min_gain_percent}")
    n_rounds = len(rounds[incumbent])
    if n_rounds < MIN_ROUNDS:
        raise ValueError(
            f"an interval needs at least {MIN_ROUNDS} rounds per configuration, got {n_rounds}"
        )
    for config, values in rounds.items():
        if len(values) != n_rounds:
            raise ValueError(
                f"{config.label()} has {len(values)} rounds, the incumbent {n_rounds}: "
                "every configuration must be measured in every round"
            )
        if any(not math.isfinite(v) or v < 0.0 for v in values):
            raise ValueError(
                f"{config.label()}: rounds must be finite req/s >= 0, got {list(values)}"
            )


def _pooled_noise(
    logs: Mapping[BatchingConfig, Sequence[float]],
    eligible: Sequence[BatchingConfig],
    incumbent: BatchingConfig,
) -> tuple[float, int]:
    """Residual standard deviation of the block model and its degrees of freedom, over
    the eligible configurations; over all of them when the incumbent is the only eligible
    one (the intervals are then shown, not used to decide); over the incumbent's own
    rounds when it is the only configuration."""
    pool = list(eligible) if len(eligible) >= 2 else list(logs)
    if len(pool) < 2:
        values = logs[incumbent]
        n = len(values)
        mean = sum(values) / n
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)), n - 1
    n_rounds = len(logs[pool[0]])
    row = {c: sum(logs[c]) / n_rounds for c in pool}
    col = [sum(logs[c][r] for c in pool) / len(pool) for r in range(n_rounds)]
    grand = sum(row.values()) / len(pool)
    sse = sum((logs[c][r] - row[c] - col[r] + grand) ** 2 for c in pool for r in range(n_rounds))
    dof = (len(pool) - 1) * (n_rounds - 1)
    return math.sqrt(sse / dof), dof


def _incumbent_best_reason(
    ranking: Sequence[Estimate],
    inc: Estimate,
    eligible: Sequence[BatchingConfig],
    dof: int,
) -> str:
    runner_up = next((e for e in ranking if e.config != inc.config), None)
    if runner_up is None:
        return "NoSignificantGain: no finalist was measured besides the incumbent"
    if runner_up.config not in eligible:
        return (
            f"NoSignificantGain: no finalist met the SLA in every round; the incumbent "
            f"{inc.config.label()} measured {inc.estimate:.0f} req/s"
        )
    ratio = _percent(math.log(runner_up.estimate) - math.log(inc.estimate))
    return (
        f"NoSignificantGain: the incumbent {inc.config.label()} measured best, "
        f"{inc.estimate:.0f} req/s against {runner_up.estimate:.0f} for the best finalist "
        f"{runner_up.config.label()} ({ratio:+.1f} %, {dof} dof)"
    )


def _nothing_met_the_sla(
    rounds: Mapping[BatchingConfig, Sequence[float]],
    incumbent: BatchingConfig,
    min_gain_percent: float,
    level: float,
) -> Verdict:
    estimates = [
        Estimate(config=c, rounds=[float(v) for v in vs], estimate=0.0, low=0.0, high=0.0)
        for c, vs in rounds.items()
    ]
    inc = next(e for e in estimates if e.config == incumbent)
    ranking = [inc, *(e for e in estimates if e.config != incumbent)]
    return Verdict(
        method="none: no configuration met the SLA in any round",
        level=level,
        min_gain_percent=min_gain_percent,
        ranking=ranking,
        incumbent=inc,
        chosen=incumbent,
        winner=inc,
        gain_percent=0.0,
        gain_low_percent=0.0,
        gain_high_percent=0.0,
        significant=False,
        reason="NoSignificantGain: no configuration met the SLA in any round",
    )
