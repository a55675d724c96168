"""The confirmation after a study, shared by every driver that has a target to measure
(`tune --local`, the decision-quality benchmark): the finalists and the incumbent
re-measured interleaved (`runner.remeasure_interleaved`), then the verdict
(`verdict.decide`).

Each round's capacity search starts near `BRACKET_START` of the configuration's study
figure (`bracket_start`, jittered so that equal configurations do not share one grid):
the first step passes on all but the worst drift, the next (twice as high) brackets the
capacity, and the bisection has no far ramp to climb. That search never
visits light load, so each finalist's first round also measures a few rates below the
capacity it finds (`probes_light_load`, capacity.lightload); one that breaks the SLA
there scores 0 req/s for that round and cannot be written back (`Remeasured.rounds`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchpilot.models import BatchingConfig
from batchpilot.tuner.interfaces import Target
from batchpilot.tuner.runner import MeasureRound, Remeasured, RoundDone, remeasure_interleaved
from batchpilot.tuner.study import TrialRecord
from batchpilot.tuner.summary import finalists
from batchpilot.tuner.verdict import Verdict, decide, undecided

BRACKET_START = 0.8
# Each round's start is moved by up to this share either way, drawn per configuration
# and round: from one fixed start, configurations of equal figures bisect on the same
# grid of rates, and the grid's coarseness becomes an error they share, which the
# verdict's noise estimate (the spread across rounds) never sees.
BRACKET_JITTER = 0.1


def bracket_start(figure: float, config: BatchingConfig, round_index: int, seed: int) -> float:
    """Where a confirmation round's capacity search starts: `BRACKET_START` of the
    configuration's study figure, jittered by `BRACKET_JITTER` (seeded by the
    configuration, the round and `seed`, so a resumed run starts where it did)."""
    draw = random.Random(f"{seed}/{config.label()}/{round_index}").uniform(-1.0, 1.0)
    return BRACKET_START * figure * (1.0 + BRACKET_JITTER * draw)


def probes_light_load(config: BatchingConfig, incumbent: BatchingConfig, round_index: int) -> bool:
    """Whether this measurement of the confirmation also measures light load: a
    finalist's first round, once, before anything can be written back. The incumbent is
    not: it is what runs already, and the verdict only keeps it or replaces it."""
    return round_index == 0 and config != incumbent


def looks_of(rounds: int, max_rounds: int | None) -> int:
    """How many times an adaptive confirmation may judge its table: after `rounds`
    rounds, then after each extra one up to `max_rounds`."""
    return 1 + max(0, (max_rounds if max_rounds is not None else rounds) - rounds)


@dataclass(frozen=True)
class Confirmed:
    finalists: list[BatchingConfig]
    remeasured: Remeasured
    verdict: Verdict


def study_figures(records: Sequence[TrialRecord]) -> dict[BatchingConfig, float]:
    """Each configuration's effective req/s in the study (its first complete trial)."""
    return {
        r.config(): r.effective_rps
        for r in reversed(records)
        if r.state == "Complete" and r.effective_rps
    }


async def confirm_study(
    records: Sequence[TrialRecord],
    incumbent: BatchingConfig,
    target: Target,
    measure: MeasureRound,
    *,
    finalists_wanted: int,
    rounds: int,
    max_rounds: int | None = None,
    min_gain_percent: float,
    seed: int = 0,
    on_start: Callable[[list[BatchingConfig]], None] = lambda _: None,
    on_done: Callable[[RoundDone], None] = lambda _: None,
) -> Confirmed | None:
    """Re-measure the study's top `finalists_wanted` and the incumbent interleaved and
    judge them: `rounds` rounds, then more while the verdict is `undecided`, up to
    `max_rounds` (default `rounds`: a fixed number). None when no configuration besides
    the incumbent met the SLA in the study (nothing to confirm)."""
    chosen = finalists(records, incumbent, finalists_wanted)
    if not chosen:
        return None
    on_start(chosen)

    def judge(so_far: Remeasured) -> Verdict:
        return decide(
            so_far.rounds(),
            incumbent,
            min_gain_percent=min_gain_percent,
            seed=seed,
            looks=looks_of(rounds, max_rounds),
        )

    remeasured = await remeasure_interleaved(
        target,
        measure,
        chosen,
        incumbent,
        rounds=rounds,
        max_rounds=max_rounds,
        undecided=lambda so_far: undecided(judge(so_far)),
        on_done=on_done,
        shuffle_seed=seed,
    )
    verdict = judge(remeasured)
    return Confirmed(finalists=chosen, remeasured=remeasured, verdict=verdict)
