"""The trial loop over any target and probe (docs/architecture.md, "The parts"): ask,
apply, measure, tell; then the finalists and the incumbent measured again, interleaved,
for the verdict.

Cancellation (Ctrl-C) propagates out of the trial in flight without telling the tuner:
the trial stays Running in the storage, which is exactly what a resumed run recognises
as interrupted and retries."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.tuner.interfaces import Probe, ServerDied, Target
from batchpilot.tuner.study import TrialRecord, Tuner

T = TypeVar("T")


@dataclass(frozen=True)
class TrialStart:
    number: int
    config: BatchingConfig
    params: dict[str, float | int]
    full: bool  # measured without pruning (baseline, rule of thumb)


@dataclass(frozen=True)
class TrialDone:
    record: TrialRecord
    result: CapacityResult | None  # None when the trial failed
    best: TrialRecord | None  # best so far, this trial included


async def run_trial(
    tuner: Tuner,
    target: Target,
    probe: Probe,
    *,
    full: Collection[BatchingConfig] = (),
    on_start: Callable[[TrialStart], None] = lambda _: None,
) -> TrialDone:
    """One trial. Configurations in `full` are measured to the end (never pruned): the
    run quotes its gain over them, which needs their real effective throughput."""
    number, config, params = tuner.ask()
    record = tuner.records()[-1]
    is_full = record.source == "baseline" or config in full
    on_start(TrialStart(number, config, params, is_full))
    try:
        await target.apply(config)
        result = await probe.measure(config, must_beat=None if is_full else tuner.must_beat())
    except ServerDied as exc:
        return TrialDone(tuner.tell_server_died(number, str(exc)), None, tuner.best())
    except TargetError as exc:
        return TrialDone(tuner.tell_failed(number, str(exc)), None, tuner.best())
    return TrialDone(tuner.tell(number, result), result, tuner.best())


async def run_trials(
    tuner: Tuner,
    target: Target,
    probe: Probe,
    *,
    trials: int,
    full: Collection[BatchingConfig] = (),
    on_start: Callable[[TrialStart], None] = lambda _: None,
    on_done: Callable[[TrialDone], Awaitable[None] | None] = lambda _: None,
    out_of_time: Callable[[], bool] = lambda: False,
) -> None:
    """Trials until `trials` have been measured (interrupted ones do not count) or,
    checked before each new trial, `out_of_time()` says the time budget is spent."""
    while tuner.measured_count() < trials and not out_of_time():
        done = await run_trial(tuner, target, probe, full=full, on_start=on_start)
        pending = on_done(done)
        if pending is not None:
            await pending


def interleaved_order(
    finalists: Sequence[BatchingConfig],
    incumbent: BatchingConfig,
    rounds: int,
    *,
    shuffle_seed: int | None = None,
) -> list[tuple[int, BatchingConfig]]:
    """(round, configuration) in measuring order: the finalists in the order given, then
    the incumbent, round after round (A B C I, A B C I, ...); with `shuffle_seed`, each
    round in its own seeded random order (`round_order`). A finalist equal to the
    incumbent or to an earlier finalist is measured once a round, as the earlier one."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    configs = [*dict.fromkeys([c for c in finalists if c != incumbent]), incumbent]
    return [(r, c) for r in range(rounds) for c in round_order(configs, r, shuffle_seed)]


def round_order(configs: Sequence[T], round_index: int, seed: int | None) -> list[T]:
    """The order of one round's measurements: as given without a seed, else a random
    permutation drawn from (seed, round). A fixed order puts each configuration at the
    same place in every round, so a drift within rounds (a neighbour that starts work
    every few minutes, a cache warming) favours the same one each time, an error the
    rounds cannot average out."""
    ordered = list(configs)
    if seed is not None:
        random.Random(f"{seed}/{round_index}").shuffle(ordered)
    return ordered


MeasureRound = Callable[[BatchingConfig, int], Awaitable[CapacityResult]]


@dataclass(frozen=True)
class RoundDone:
    round: int
    config: BatchingConfig
    result: CapacityResult


@dataclass
class Remeasured:
    """What the interleaved rounds measured: every configuration's results in round
    order, and the finalists the target refused (left out of every round)."""

    results: dict[BatchingConfig, list[CapacityResult]]
    refused: dict[BatchingConfig, str]

    def rounds(self) -> dict[BatchingConfig, list[float]]:
        """Effective req/s per round: the table `verdict.decide` judges. A round in which
        a rate below the capacity broke the SLA (`CapacityResult.light_load`) scores
        0 req/s, as one that met the SLA nowhere: what is written back must hold the SLA
        at every rate up to its figure, so that finalist cannot win."""
        return {
            c: [0.0 if r.light_load else r.effective_rps for r in rs]
            for c, rs in self.results.items()
        }

    def light_load(self) -> dict[BatchingConfig, str]:
        """Each configuration that broke the SLA at light load in some round: the
        first such round's reason (the rate, where it comes from, the p99)."""
        out: dict[BatchingConfig, str] = {}
        for config, results in self.results.items():
            why = next((r.light_load for r in results if r.light_load), "")
            if why:
                out[config] = why
        return out

    def completed_rounds(self) -> int:
        """Rounds in which every configuration still in the table was measured."""
        return min((len(rs) for rs in self.results.values()), default=0)


async def remeasure_interleaved(
    target: Target,
    measure: MeasureRound,
    finalists: Sequence[BatchingConfig],
    incumbent: BatchingConfig,
    *,
    rounds: int,
    max_rounds: int | None = None,
    undecided: Callable[[Remeasured], bool] = lambda _: False,
    on_done: Callable[[RoundDone], None] = lambda _: None,
    shuffle_seed: int | None = None,
) -> Remeasured:
    """Apply and measure the finalists and the incumbent interleaved (`interleaved_order`),
    so drift over the minutes this takes hits them all alike; with `shuffle_seed`, each
    round in its own random order (`round_order`). `measure(config, round)`
    scores what is live; it is given the round so that every configuration of a round
    can be offered the same schedule (the same seeds). A finalist the target refuses is
    dropped from every round; the incumbent ran before the study, so its refusal is the
    target's fault and raises TargetError.

    After `rounds` rounds, another whole round follows while `undecided(so far)` says
    the table cannot be judged yet, up to `max_rounds` (default: `rounds`, no more)."""
    cap = rounds if max_rounds is None else max_rounds
    if cap < rounds:
        raise ValueError(f"max_rounds ({cap}) must be >= rounds ({rounds})")
    out = Remeasured(results={}, refused={})
    one_round = [c for _, c in interleaved_order(finalists, incumbent, 1)]
    r = 0
    while r < rounds or (r < cap and undecided(out)):
        for config in round_order(one_round, r, shuffle_seed):
            if config in out.refused:
                continue
            try:
                await target.apply(config)
            except TargetError as exc:
                if config == incumbent:
                    raise
                out.refused[config] = str(exc)
                out.results.pop(config, None)
                continue
            result = await measure(config, r)
            out.results.setdefault(config, []).append(result)
            on_done(RoundDone(r, config, result))
        r += 1
    return out
