"""A study's trials: the tuner rebuilt from the trial history, the next configuration
it asks for applied and measured under the trial's deadline (on the canary or the
target), the outcome told to the tuner and recorded in status, with the load workers
that sent it."""

from __future__ import annotations

import asyncio
import time

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator import decisions, metrics, workerfleet
from batchpilot.operator.cleanup import Cleanup
from batchpilot.operator.kube import KubeError
from batchpilot.operator.slots import StudySlot
from batchpilot.operator.spec import InferenceServiceSpec, batching_config
from batchpilot.operator.status import INTERRUPTED_REASON, TRIALS_KEPT, TrialEntry
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.world import TargetProblem
from batchpilot.tuner.space import ParameterSpec, SearchSpace
from batchpilot.tuner.study import INTERRUPTED, INVALID, TrialRecord, Tuner


def search_space(spec: InferenceServiceSpec) -> SearchSpace:
    p = spec.parameters
    return SearchSpace.from_bounds(
        max_batch_size=(p.max_batch_size.min, p.max_batch_size.max),
        max_queue_time_ms=spec.queue_bounds(),
        extra=[
            ParameterSpec(name=e.name, kind=e.kind, low=e.min, high=e.max, log=e.log)
            for e in p.extra
        ],
    )


def to_record(entry: TrialEntry) -> TrialRecord:
    """The tuner's view: an Interrupted trial is its Failed "interrupted", which it
    retries before asking anything new and leaves out of its budget."""
    data = entry.model_dump()
    if entry.state == "Interrupted":
        data.update(state="Failed", reason=INTERRUPTED)
    return TrialRecord.model_validate(data)


def to_entry(record: TrialRecord) -> TrialEntry:
    """The status's view: a trial the tuner marked interrupted is shown as Interrupted,
    so neither a person nor tuning.maxFailures takes it for a failed configuration."""
    data = record.model_dump()
    if record.state == "Failed" and record.reason == INTERRUPTED:
        data.update(state="Interrupted", reason=INTERRUPTED_REASON)
    return TrialEntry.model_validate(data)


class Trials:
    def __init__(self, state: StudyState, slot: StudySlot, cleanup: Cleanup) -> None:
        self._state = state
        self._slot = slot
        self._cleanup = cleanup

    async def run(self) -> None:
        async with self._slot.measuring():
            await self._next_trial()
        await self._cleanup.fail_if_stopping()

    def _tuner(self) -> Tuner:
        state = self._state
        spec = state.spec
        original = state.status.original
        baseline: BatchingConfig | None = None
        if original is not None and original.params:
            baseline = batching_config(decisions.clamp_params(original.params, spec))
        warm = batching_config(decisions.rule_of_thumb(spec))
        return Tuner(
            search_space(spec),
            sampler=spec.tuning.sampler,
            seed=spec.tuning.seed,
            baseline=baseline,
            warm_start=[warm],
            history=[to_record(t) for t in state.status.trials],
            clock=state.clock,
        )

    async def _next_trial(self) -> None:
        state = self._state
        tuner = self._tuner()
        number, config, params = tuner.ask()
        records = tuner.records()
        entries = [to_entry(r) for r in records]
        label = decisions.describe_params(params)
        await state.save(
            trials=entries,
            phase=decisions.phase_for(entries),
            message=f"trial {number}: measuring {label}",
        )
        state.event("Normal", "TrialStarted", f"Trial {number}: {label}")
        started = time.monotonic()
        record = await self._run_trial(tuner, number, config, params)
        duration = time.monotonic() - started
        metrics.TRIAL_SECONDS.observe(duration)
        metrics.TRIALS.labels(state.namespace, state.name, record.state).inc()
        await self._record(tuner, record)
        await self._note_load_workers(number)

    async def _note_load_workers(self, trial: int) -> None:
        """Say in status which load workers sent the trial (with load.workers.max > 1)."""
        state = self._state
        noted = workerfleet.trial_entry(state.world.trials.load_workers, trial)
        if noted is None:
            return
        kept = [*state.status.load_workers, noted][-TRIALS_KEPT:]
        await state.save(load_workers=kept)

    async def _run_trial(
        self, tuner: Tuner, number: int, config: BatchingConfig, params: dict[str, float | int]
    ) -> TrialRecord:
        state = self._state
        asked = next(r for r in tuner.records() if r.number == number)
        started = asked.started_at or state.clock()
        state.condition("Measuring", "True", "Measuring", f"trial {number}")
        await state.save()
        deadline = state.spec.tuning.trial_deadline_seconds
        try:
            async with asyncio.timeout(deadline):
                await state.world.trials.apply(params)
                state.condition("TargetReady", "True", "Applied", "configuration is live")
                result: CapacityResult = await state.world.trials.measure(
                    config, must_beat=tuner.must_beat(), since=started
                )
        except TargetProblem as exc:
            earlier = (r.reason for r in tuner.records() if r.number != number)
            if exc.invalid and decisions.disturbed_trial_is_retried(earlier):
                # no verdict on this configuration: asked again, not a failure
                state.event("Normal", exc.reason, f"{exc.message}; measured again")
                return tuner.tell_failed(number, f"{INVALID}{exc.reason}: {exc.message}")
            if exc.invalid:
                message = decisions.disturbed_trial_failure(exc.message)
                state.condition("TargetReady", "False", exc.reason, message)
                state.event("Warning", exc.reason, message)
                return tuner.tell_failed(number, message)
            state.condition("TargetReady", "False", exc.reason, exc.message)
            state.event("Warning", exc.reason, exc.message)
            if exc.stops_study:
                state.stop_with(exc)
            if exc.reason == "Crashed":
                # told to the sampler as a constraint violation, retried once to tell a
                # transient crash from this batch size's (Tuner.tell_server_died)
                return tuner.tell_server_died(number, f"{exc.reason}: {exc.message}")
            return tuner.tell_failed(number, f"{exc.reason}: {exc.message}")
        except TimeoutError:
            return tuner.tell_failed(number, f"trial deadline of {deadline} s passed")
        except OSError as exc:
            # refused or reset connections to the pods: the load generator's view
            message = f"pods did not answer: {exc}"[:500]
            state.condition("TargetReady", "False", "Unreachable", message)
            state.event("Warning", "Unreachable", message)
            return tuner.tell_failed(number, message)
        except (TargetError, KubeError, ValueError) as exc:
            return tuner.tell_failed(number, str(exc)[:500])
        return tuner.tell(number, result)

    async def _record(self, tuner: Tuner, record: TrialRecord) -> None:
        state = self._state
        entries = [to_entry(r) for r in tuner.records()]
        kept, summary = decisions.bound_trials(entries, state.status.trials_summary)
        generation = state.status.observed_generation
        best = decisions.best_trial(kept)
        baseline = decisions.baseline_trial(kept)
        entry = to_entry(record)
        message = decisions.trial_message(entry, state.spec.sla.to_sla())
        if best is not None and best.effective_rps is not None:
            metrics.BEST_RPS.labels(state.namespace, state.name).set(best.effective_rps)
        await state.save(
            trials=kept,
            trials_summary=summary,
            best=decisions.result_of(best, generation) if best else None,
            baseline=decisions.result_of(baseline, generation) if baseline else None,
            phase="Tuning",
            message=message,
        )
        state.event("Warning" if entry.state == "Failed" else "Normal", "Trial", message)
