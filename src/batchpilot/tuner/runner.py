"""The trial loop over any target and probe (DESIGN.md §2): ask, apply, measure, tell.

Cancellation (Ctrl-C) propagates out of the trial in flight without telling the tuner:
the trial stays Running in the storage, which is exactly what a resumed run recognises
as interrupted and retries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.tuner.interfaces import Probe, ServerDied, Target, TargetError
from batchpilot.tuner.study import TrialRecord, Tuner


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


async def remeasure(
    target: Target,
    probe: Probe,
    configs: Sequence[BatchingConfig],
    *,
    on_done: Callable[[BatchingConfig, CapacityResult], None] = lambda _c, _r: None,
) -> dict[BatchingConfig, CapacityResult]:
    """Measure `configs` again, one after the other, outside the study (full ramps, no
    pruning). A configuration the target refuses is left out."""
    results: dict[BatchingConfig, CapacityResult] = {}
    for config in configs:
        try:
            await target.apply(config)
        except TargetError:
            continue
        results[config] = await probe.measure(config, must_beat=None)
        on_done(config, results[config])
    return results
