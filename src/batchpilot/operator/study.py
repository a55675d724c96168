"""The study runner: one InferenceService's study, one step at a time.

Each step reads nothing but its own status (kept in memory, written to the API server
after every change) and the world, asks `decisions.plan` what comes next and does it.
The tuner is rebuilt from the trial history for every trial, so a resumed operator
takes exactly the path an uninterrupted one would (the status is the study's only
persistent state: `operator.status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator import (
    adopt,
    decisions,
    kstatus,
    metrics,
    schedule,
    scope,
    specdiff,
    workerfleet,
)
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kube import KubeError
from batchpilot.operator.spec import (
    InferenceServiceSpec,
    Params,
    batching_config,
    duration_seconds,
)
from batchpilot.operator.status import (
    INTERRUPTED_REASON,
    TRIALS_KEPT,
    Confirmation,
    InferenceServiceStatus,
    Result,
    RoundMeasurement,
    TrialEntry,
)
from batchpilot.operator.world import TargetProblem, World
from batchpilot.tuner.confirm import probes_light_load
from batchpilot.tuner.edges import space_edges
from batchpilot.tuner.space import ParameterSpec, SearchSpace
from batchpilot.tuner.study import INTERRUPTED, INVALID, TrialRecord, Tuner
from batchpilot.tuner.verdict import Estimate

log = logging.getLogger(__name__)

# a confirmation measurement disturbed by an autoscaler is taken again at most this
# often in a row; past it the round scores 0 like any failure (the fleet never held still)
MAX_DISTURBED_ROUNDS = 3
# problems of a write-back that a restore cannot cure: retried as the step, not rolled back
NOT_ROLLED_BACK = frozenset({"TargetNotFound", "ContainerNotFound", "ApplyFailed"})

EventType = Literal["Normal", "Warning"]
EventSink = Callable[[EventType, str, str], None]
StatusWriter = Callable[[InferenceServiceStatus], Awaitable[None]]
Clock = Callable[[], datetime]
# the World of another spec: the one a study started with, for its cleanup
WorldFor = Callable[[InferenceServiceSpec], World]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Slots:
    """The measurement slot(s) shared by every study of one operator process."""

    semaphore: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))


class RecoverableError(RuntimeError):
    """A step could not finish; the daemon retries it after a backoff."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def search_space(spec: InferenceServiceSpec) -> SearchSpace:
    p = spec.parameters
    return SearchSpace.from_bounds(
        max_batch_size=(p.max_batch_size.min, p.max_batch_size.max),
        max_queue_time_ms=(p.max_queue_time_ms.min, p.max_queue_time_ms.max),
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


class StudyRunner:
    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        spec: InferenceServiceSpec,
        status: InferenceServiceStatus,
        world: World,
        write_status: StatusWriter,
        event: EventSink,
        slots: Slots,
        clock: Clock = utcnow,
        world_for: WorldFor | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.spec = spec
        self.status = status
        self._world = world
        self._write = write_status
        self._event = event
        self._slots = slots
        self._clock = clock
        self._world_for = world_for
        self._prepared = False
        # a problem that ends the study once its trial is recorded
        self._stopping: TargetProblem | None = None
        # confirmation measurements in a row that an autoscaler disturbed
        self._disturbed_rounds = 0

    # --- bookkeeping ------------------------------------------------------------------

    async def _save(self, **changes: object) -> None:
        status = self.status.model_copy(update=changes)
        # the World of a real cluster counts the pods it measured; a fake one need not
        pods = getattr(self._world, "measured_pods", None)
        status = kstatus.with_summary(status, self.spec, pods if isinstance(pods, int) else None)
        self.status = kstatus.with_kstatus(status, self._clock())
        await self._write(self.status)

    async def _timed(
        self, work: Coroutine[Any, Any, None], what: Literal["write-back", "restore"]
    ) -> None:
        """A write-back or restore bounded by its own deadline (tuning.
        writeBackDeadlineSeconds, restoreDeadlineSeconds): past it, a TargetProblem that
        the step turns into a condition, instead of a wait without end."""
        tuning = self.spec.tuning
        if what == "write-back":
            limit, field_name, reason = (
                tuning.write_back_deadline_seconds,
                "tuning.writeBackDeadlineSeconds",
                "WriteBackTimedOut",
            )
        else:
            limit, field_name, reason = (
                tuning.restore_deadline_seconds,
                "tuning.restoreDeadlineSeconds",
                "RestoreTimedOut",
            )
        try:
            async with asyncio.timeout(limit):
                await work
        except TimeoutError:
            raise TargetProblem(
                reason,
                f"the {what} on {self.spec.target.kind} {self.spec.target.name} did not "
                f"finish within {limit} s ({field_name})",
            ) from None

    def _condition(
        self, type: str, status: Literal["True", "False", "Unknown"], reason: str, message: str
    ) -> None:
        self.status = self.status.model_copy(
            update={
                "conditions": decisions.set_condition(
                    self.status.conditions,
                    type=type,
                    status=status,
                    reason=reason,
                    message=message,
                    generation=self.status.observed_generation,
                    now=self._clock(),
                )
            }
        )

    async def report_problem(self, reason: str, message: str) -> None:
        """A target problem that the study waits out or retries: condition + event.
        The event is posted when the problem is new, not on every retry."""
        known = any(
            c.type == "TargetReady"
            and (c.status, c.reason, c.message) == ("False", reason, message)
            for c in self.status.conditions
        )
        self._condition("TargetReady", "False", reason, message)
        await self._save(message=message)
        if not known:
            self._event("Warning", reason, message)

    async def report_pod_problem(self, problem: decisions.PodProblem) -> None:
        await self.report_problem(problem.reason, problem.message)

    def _tuner(self) -> Tuner:
        original = self.status.original
        baseline: BatchingConfig | None = None
        if original is not None and original.params:
            baseline = batching_config(decisions.clamp_params(original.params, self.spec))
        warm = batching_config(decisions.rule_of_thumb(self.spec))
        return Tuner(
            search_space(self.spec),
            sampler=self.spec.tuning.sampler,
            seed=self.spec.tuning.seed,
            baseline=baseline,
            warm_start=[warm],
            history=[to_record(t) for t in self.status.trials],
            clock=self._clock,
        )

    # --- the steps --------------------------------------------------------------------

    async def step(self, generation: int) -> bool:
        """Do the next step; False when the study of this generation is over."""
        plan = decisions.plan(self.spec, self.status, generation)
        try:
            held = await self._held(plan)
            if held is not None:
                return held
            if plan.kind == "idle":
                return False
            if plan.kind == "new-study":
                await self._new_study(generation)
            elif plan.kind == "adopt-spec":
                await self._adopt_spec(generation)
            elif plan.kind == "record-original":
                await self._record_original()
            elif plan.kind == "trial":
                await self._trial()
            elif plan.kind == "confirm":
                await self._confirm(plan.reason)
            elif plan.kind == "finish":
                await self._finish(plan.reason)
            else:
                await self._fail(plan.reason)
        except TargetProblem as exc:
            await self.report_problem(exc.reason, exc.message)
            raise RecoverableError(exc.reason, exc.message) from exc
        except KubeError as exc:
            message = f"Kubernetes API: {exc}"
            self._event("Warning", "APIError", message)
            raise RecoverableError("APIError", message) from exc
        return True

    async def _new_study(self, generation: int) -> None:
        if self.status.observed_generation is not None:
            await self.stop_early("a new spec generation replaces this study")
        self.status = decisions.new_study(self.status, generation).model_copy(
            update={
                "study_fingerprint": specdiff.study_fingerprint(self.spec),
                "started_with": scope.scope_of(self.spec),
            }
        )
        self._prepared = False
        if any(c.type == "Degraded" for c in self.status.conditions):
            self._condition("Degraded", "False", "StudyStarted", "a new study replaces it")
        self._condition("Ready", "False", "StudyStarted", self.status.message)
        self._condition("SpecValid", "True", "Valid", f"spec generation {generation} is valid")
        await self._save()
        self._event("Normal", "StudyStarted", self.status.message)

    async def _adopt_spec(self, generation: int) -> None:
        """Take over an edit that leaves the study's measurements comparable: a
        converged study reopens when there are trials left to run, or applies or
        withholds its result when writeBack changed; a running one just goes on."""
        self.status = self.status.model_copy(update={"observed_generation": generation})
        self._condition("SpecValid", "True", "Valid", f"spec generation {generation} is valid")
        note = f"spec generation {generation} adopted by the running study (no restart)"
        if adopt.reopens(self.spec, self.status):
            self.status = adopt.reopened(self.status)
            note = f"spec generation {generation}: more trials allowed, the study continues"
            await self._save(message=note)
            self._event("Normal", "StudyResumed", note)
            return
        action = adopt.write_back_action(self.spec, self.status)
        if action == "apply":
            chosen = adopt.chosen_params(self.spec, self.status)
            assert chosen is not None  # write_back_action checked it
            await self._timed(self._world.write_back(chosen), "write-back")
            shown = decisions.describe_params(chosen)
            await self._save(applied=True, restored=False)
            self._event("Normal", "Applied", f"wrote {shown} to {self.spec.target.name}")
            note += f"; writeBack Apply: wrote {shown}"
        elif action == "withhold" and self.status.original is not None:
            await self._timed(self._world.restore(self.status.original), "restore")
            await self._save(applied=False, restored=True)
            self._event("Normal", "Restored", "writeBack Recommend: original configuration back")
            note += "; writeBack Recommend: the original configuration is back on the target"
        await self._save()
        self._event("Normal", "SpecAdopted", note)

    async def _record_original(self) -> None:
        original = await self._world.record_original(self._clock())
        shown = decisions.describe_params(original.params) if original.params else "unset"
        message = f"recorded the original configuration ({shown}); measuring the baseline"
        self._condition("TargetReady", "True", "TargetFound", f"{self.spec.target.name} found")
        await self._save(original=original, phase="Baseline", message=message)
        self._event("Normal", "Baseline", message)

    async def _prepare(self) -> None:
        if self._prepared:
            return
        canary = await self._world.prepare(self.status.canary)
        self._prepared = True
        autoscalers = getattr(self._world, "autoscalers", None)
        if autoscalers:
            how = (
                "an InPlace trial during which the replicas change is measured again"
                if self.spec.tuning.strategy == "InPlace"
                else "the canary is not scaled by it"
            )
            self._condition(
                "Autoscaled",
                "True",
                "AutoscalerDetected",
                f"HorizontalPodAutoscaler {', '.join(autoscalers)} scales "
                f"{self.spec.target.name}: {how}",
            )
            await self._save()
        if canary != self.status.canary:
            await self._save(canary=canary)
            if canary is not None:
                self._event("Normal", "CanaryCreated", f"trials run on canary {canary}")

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """Hold the measurement slot. Taken before the canary is created, so a study
        queued behind another holds no canary (and none of its GPUs) while it waits."""
        semaphore = self._slots.semaphore
        if semaphore.locked():
            message = "waiting: another study is being measured (one trial at a time)"
            self._condition("Measuring", "False", "WaitingForSlot", message)
            await self._save(message=message)
            metrics.WAITING.inc()
            try:
                await semaphore.acquire()
            finally:
                metrics.WAITING.dec()
        else:
            await semaphore.acquire()
        try:
            yield
        finally:
            semaphore.release()
            self._condition("Measuring", "False", "Idle", "no trial is being measured")

    async def _trial(self) -> None:
        async with self._slot():
            await self._prepare()
            await self._measured_trial()
        if self._stopping is not None:
            problem, self._stopping = self._stopping, None
            await self._fail(f"{problem.reason}: {problem.message}")

    async def _measured_trial(self) -> None:
        tuner = self._tuner()
        number, config, params = tuner.ask()
        records = tuner.records()
        entries = [to_entry(r) for r in records]
        label = decisions.describe_params(params)
        await self._save(
            trials=entries,
            phase=decisions.phase_for(entries),
            message=f"trial {number}: measuring {label}",
        )
        self._event("Normal", "TrialStarted", f"Trial {number}: {label}")
        started = time.monotonic()
        record = await self._run_trial(tuner, number, config, params)
        duration = time.monotonic() - started
        metrics.TRIAL_SECONDS.observe(duration)
        metrics.TRIALS.labels(self.namespace, self.name, record.state).inc()
        await self._record(tuner, record)
        await self._note_load_workers(number)

    async def _note_load_workers(self, trial: int) -> None:
        """Say in status which load workers sent the trial (with load.workers.max > 1)."""
        noted = workerfleet.trial_entry(getattr(self._world, "load_workers", None), trial)
        if noted is None:
            return
        kept = [*self.status.load_workers, noted][-TRIALS_KEPT:]
        await self._save(load_workers=kept)

    async def _run_trial(
        self, tuner: Tuner, number: int, config: BatchingConfig, params: dict[str, float | int]
    ) -> TrialRecord:
        asked = next(r for r in tuner.records() if r.number == number)
        started = asked.started_at or self._clock()
        self._condition("Measuring", "True", "Measuring", f"trial {number}")
        await self._save()
        deadline = self.spec.tuning.trial_deadline_seconds
        try:
            async with asyncio.timeout(deadline):
                await self._world.apply(params)
                self._condition("TargetReady", "True", "Applied", "configuration is live")
                result: CapacityResult = await self._world.measure(
                    config, must_beat=tuner.must_beat(), since=started
                )
        except TargetProblem as exc:
            if exc.invalid:
                # no verdict on this configuration: asked again, not a failure
                self._event("Normal", exc.reason, exc.message)
                return tuner.tell_failed(number, f"{INVALID}{exc.reason}: {exc.message}")
            self._condition("TargetReady", "False", exc.reason, exc.message)
            self._event("Warning", exc.reason, exc.message)
            if exc.stops_study:
                self._stopping = exc
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
            self._condition("TargetReady", "False", "Unreachable", message)
            self._event("Warning", "Unreachable", message)
            return tuner.tell_failed(number, message)
        except (TargetError, KubeError, ValueError) as exc:
            return tuner.tell_failed(number, str(exc)[:500])
        return tuner.tell(number, result)

    async def _record(self, tuner: Tuner, record: TrialRecord) -> None:
        entries = [to_entry(r) for r in tuner.records()]
        kept, summary = decisions.bound_trials(entries, self.status.trials_summary)
        generation = self.status.observed_generation
        best = decisions.best_trial(kept)
        baseline = decisions.baseline_trial(kept)
        entry = to_entry(record)
        message = decisions.trial_message(entry, self.spec.sla.to_sla())
        if best is not None and best.effective_rps is not None:
            metrics.BEST_RPS.labels(self.namespace, self.name).set(best.effective_rps)
        await self._save(
            trials=kept,
            trials_summary=summary,
            best=decisions.result_of(best, generation) if best else None,
            baseline=decisions.result_of(baseline, generation) if baseline else None,
            phase="Tuning",
            message=message,
        )
        self._event("Warning" if entry.state == "Failed" else "Normal", "Trial", message)

    async def _confirm(self, reason: str) -> None:
        """One step of the confirmation phase: start it, or take its next measurement.
        A measurement that fails (the target refused, a pod restarted, the deadline
        passed) scores 0 req/s for that round, so that configuration cannot win."""
        confirmation = self.status.confirmation
        if confirmation is None:
            confirmation = decisions.start_confirmation(self.spec, self.status.trials, reason)
            if confirmation is None:  # plan() only confirms when there is something to
                await self._finish(reason)
                return
            finalists = ", ".join(decisions.describe_params(p) for p in confirmation.finalists)
            message = (
                f"{reason}; confirming: the finalists ({finalists}) and the incumbent "
                f"{decisions.describe_params(confirmation.incumbent)} measured again, "
                f"interleaved, {confirmation.rounds} rounds"
            )
            await self._save(confirmation=confirmation, phase="Confirming", message=message)
            self._event("Normal", "Confirming", message)
            return
        upcoming = decisions.next_measurement(confirmation, self.spec)
        if upcoming is None:
            return
        round_index, params = upcoming
        seed = self.spec.tuning.seed + decisions.ROUND_SEED_STRIDE * (round_index + 1)
        rps, why = 0.0, ""
        async with self._slot():
            await self._prepare()
            started = self._clock()
            self._condition("Measuring", "True", "Confirming", f"round {round_index + 1}")
            await self._save()
            deadline = self.spec.tuning.trial_deadline_seconds
            try:
                async with asyncio.timeout(deadline):
                    await self._world.apply(params)
                    config = batching_config(params)
                    incumbent = batching_config(confirmation.incumbent)
                    result = await self._world.measure(
                        config,
                        must_beat=None,
                        since=started,
                        seed=seed,
                        light_load=probes_light_load(config, incumbent, round_index),
                    )
                rps = result.effective_rps
                if result.light_load:
                    # broke the SLA below its capacity: it cannot be written back
                    rps, why = 0.0, result.light_load
            except TargetProblem as exc:
                why = f"{exc.reason}: {exc.message}"
                if exc.stops_study:
                    self._stopping = exc
                if exc.invalid and self._disturbed_rounds < MAX_DISTURBED_ROUNDS:
                    # an autoscaler changed the fleet under it: the round is measured
                    # again, a few times at most, before it scores 0 like a failure
                    self._disturbed_rounds += 1
                    self._event("Normal", exc.reason, f"{exc.message} (confirmation round)")
                    return
            except TimeoutError:
                why = f"deadline of {deadline} s passed"
            except (OSError, TargetError, ValueError) as exc:
                why = str(exc)
        self._disturbed_rounds = 0
        measured = RoundMeasurement(
            round=round_index, params=params, effective_rps=round(rps, 1), reason=why[:500]
        )
        confirmation = confirmation.model_copy(
            update={"measurements": [*confirmation.measurements, measured]}
        )
        extra = round_index >= confirmation.rounds  # an adaptive round: still undecided
        text = (
            f"confirming, round {round_index + 1}"
            + (
                f" (undecided after {confirmation.rounds}, up to {confirmation.max_rounds})"
                if extra
                else f"/{confirmation.rounds}"
            )
            + ": "
            f"{decisions.describe_params(params)} → {rps:.0f} req/s"
            + (f" (failed: {why[:200]})" if why else "")
        )
        await self._save(confirmation=confirmation, phase="Confirming", message=text)
        self._event("Warning" if why else "Normal", "Confirmation", text)
        if self._stopping is not None:
            problem, self._stopping = self._stopping, None
            await self._fail(f"{problem.reason}: {problem.message}")

    async def _finish(self, reason: str) -> None:
        self._report_edges()
        if self.status.confirmation is not None:
            await self._finish_confirmed(self.status.confirmation)
            return
        best = decisions.best_trial(self.status.trials)
        if best is None:
            await self._fail(f"{reason}, and no configuration met the SLA")
            return
        if decisions.incumbent_unbeaten(self.spec, self.status.trials, best):
            await self._keep_incumbent(reason, best)
            return
        shortfall = decisions.study_gain_shortfall(self.spec, self.status.trials, best)
        if shortfall is not None:
            await self._keep_incumbent(reason, best, shortfall)
            return
        await self._remove_canary()
        if self.spec.tuning.write_back == "Apply":
            if not await self._write_back(dict(best.params)):
                return
        elif self.spec.tuning.write_back == "Recommend":
            await self._restore_in_place()
        message = (
            f"{reason}: best {decisions.describe_params(best.params)} → "
            f"{best.effective_rps or 0.0:.0f} req/s (trial {best.number})"
        )
        if self.spec.tuning.write_back == "Recommend":
            message += "; recommended only (writeBack: Recommend)"
        self._condition("Ready", "True", "Converged", message)
        self._condition("TargetReady", "True", "Done", "study finished")
        persist = operator_runtimes.persist_advice(self.spec, best.params)
        await self._save(phase="Converged", message=message, persist=persist)
        self._event("Normal", "Converged", message)

    def _report_edges(self) -> None:
        """An event per knob of the study's best at an end of its searched range: the
        optimum may lie beyond it, and the event says which field widens it."""
        best = decisions.best_trial(self.status.trials)
        if best is None:
            return
        edges = space_edges(batching_config(best.params), search_space(self.spec), operator=True)
        for edge in edges:
            self._event("Normal", "EdgeOfSpace", edge)

    async def _keep_incumbent(self, reason: str, best: TrialEntry, why: str = "") -> None:
        """The study's best is the configuration the target already runs, or (`why`) an
        unconfirmed best short of the gain gate: nothing is written (not even the same
        values, which would take the fields over), and the study ends as a confirmation
        that found no gain would."""
        await self._remove_canary()
        await self._restore_in_place()
        message = f"{reason}: the incumbent stays. NoSignificantGain: " + (
            why
            or "no other configuration measured above the incumbent "
            f"{decisions.describe_params(best.params)} → {best.effective_rps or 0.0:.0f} "
            f"req/s (trial {best.number}), nothing to confirm"
        )
        self._condition("Ready", "True", "NoSignificantGain", message)
        self._condition("TargetReady", "True", "Done", "study finished")
        await self._save(phase="Converged", message=message)
        self._event("Normal", "NoSignificantGain", message)

    async def _write_back(self, params: Params) -> bool:
        """Write `params` onto the target and watch it for `tuning.verifySeconds`; False
        when it broke the target and the original configuration was put back. Safe to
        repeat after a restart: a write-back already done is only verified again, and a
        rollback under way is finished."""
        rolling_back = next(
            (
                c
                for c in self.status.conditions
                if c.type == "Degraded" and c.reason == "RollingBack"
            ),
            None,
        )
        try:
            if rolling_back is not None:
                raise TargetProblem("RollingBack", rolling_back.message)
            if not self.status.applied:
                await self._timed(self._world.write_back(params), "write-back")
                await self._save(applied=True)
                self._event(
                    "Normal",
                    "Applied",
                    f"wrote {decisions.describe_params(params)} to {self.spec.target.name}",
                )
            await self._world.verify(float(self.spec.tuning.verify_seconds))
        except TargetProblem as problem:
            if problem.reason in NOT_ROLLED_BACK:
                raise
            await self._roll_back(params, problem, resumed=rolling_back is not None)
            return False
        return True

    async def _roll_back(self, params: Params, problem: TargetProblem, *, resumed: bool) -> None:
        """Put the incumbent back after a write-back that broke the target: one
        Degraded/RolledBack condition and one event, and the study ends RolledBack."""
        original = self.status.original
        assert original is not None  # recorded before any trial
        if resumed:
            message = problem.message
        else:
            message = (
                f"rolled back {decisions.describe_params(params)} on "
                f"{self.spec.target.name}: {problem.reason}: {problem.message}; the original "
                "configuration is restored"
            )
            # said before the restore, so a restart in between finishes the rollback
            self._condition("Degraded", "True", "RollingBack", message)
            await self._save(message=message)
        await self._timed(self._world.restore(original), "restore")
        self._condition("Degraded", "True", "RolledBack", message)
        self._condition("Ready", "False", "RolledBack", message)
        self._condition("TargetReady", "True", "Restored", "original configuration restored")
        await self._save(phase="RolledBack", applied=False, restored=True, message=message)
        self._event("Warning", "RolledBack", message)

    async def _restore_in_place(self) -> None:
        """An InPlace target gets its original configuration back when nothing is
        written onto it."""
        if (
            self.spec.tuning.strategy == "InPlace"
            and not self.status.restored
            and self.status.original is not None
        ):
            await self._timed(self._world.restore(self.status.original), "restore")
            await self._save(restored=True)

    async def _finish_confirmed(self, confirmation: Confirmation) -> None:
        """Write back the winner only when the verdict proves its gain; otherwise keep
        the incumbent and say why (NoSignificantGain)."""
        verdict = decisions.verdict_of(confirmation, self.spec)
        generation = self.status.observed_generation
        trials = self.status.trials

        def result(estimate: Estimate) -> Result:
            params = decisions.params_of(confirmation, estimate.config)
            return decisions.estimate_result(
                verdict, estimate, params, generation, decisions.trial_of(trials, params)
            )

        best, baseline = result(verdict.winner), result(verdict.incumbent)
        await self._save(
            best=best,
            baseline=baseline,
            confirmation=confirmation.model_copy(update={"method": verdict.method}),
        )
        await self._remove_canary()
        chosen = decisions.params_of(confirmation, verdict.chosen)
        reason = confirmation.reason
        if verdict.significant:
            apply = self.spec.tuning.write_back == "Apply"
            if apply:
                if not await self._write_back(chosen):
                    return
            else:
                await self._restore_in_place()
            message = (
                f"{reason}: best {decisions.describe_params(chosen)} → "
                f"{verdict.winner.estimate:.0f} req/s, {verdict.gain_percent:+.1f} % over the "
                f"incumbent (lower bound {verdict.gain_low_percent:+.1f} % ≥ "
                f"{verdict.min_gain_percent:g} %)"
            )
            if not apply:
                message += "; recommended only (writeBack: Recommend)"
            condition_reason, event_reason = "Converged", "Converged"
            await self._save(persist=operator_runtimes.persist_advice(self.spec, chosen))
        else:
            await self._restore_in_place()
            message = f"{reason}: the incumbent stays. {verdict.reason}"
            condition_reason, event_reason = "NoSignificantGain", "NoSignificantGain"
        self._condition("Ready", "True", condition_reason, message)
        self._condition("TargetReady", "True", "Done", "study finished")
        await self._save(phase="Converged", message=message)
        self._event("Normal", event_reason, message)

    async def _fail(self, reason: str) -> None:
        await self.stop_early(reason)
        message = f"study failed: {reason}"
        if self.status.restored:
            message += "; original configuration restored"
        self._condition("Ready", "False", "StudyFailed", message)
        await self._save(phase="Failed", message=message)
        self._event("Warning", "StudyFailed", message)

    async def _remove_load_workers(self) -> None:
        remove = getattr(self._world, "remove_load_workers", None)
        if remove is not None:
            await remove()

    async def _remove_canary(self) -> None:
        await self._remove_load_workers()
        if self.status.canary is not None:
            name = self.status.canary
            await self._world.remove_canary(name)
            await self._save(canary=None)
            self._event("Normal", "CanaryDeleted", f"deleted canary {name}")

    def _started(self) -> tuple[InferenceServiceSpec, World]:
        """The spec the study started with (its target, runtime, apply method and
        strategy) and a World for it: cleanup undoes what that study did, whatever the
        spec says now."""
        try:
            started = scope.cleanup_spec(self.spec, self.status.started_with)
        except scope.ScopeUnreadable as exc:
            log.warning(
                "%s/%s: %s; cleaning up under the current spec", self.namespace, self.name, exc
            )
            return self.spec, self._world
        if started is self.spec or self._world_for is None:
            return self.spec, self._world
        return started, self._world_for(started)

    async def stop_early(self, why: str) -> None:
        """Undo what the study changed: the canary goes, an InPlace target gets its
        original configuration back (failure, cancellation, deletion, new spec), under
        the spec the study started with."""
        spec, world = self._started()
        delete_canary, restore = decisions.needs_cleanup(self.status, spec.tuning.strategy)
        await self._remove_load_workers()
        if delete_canary and self.status.canary is not None:
            name = self.status.canary
            await world.remove_canary(name)
            await self._save(canary=None)
            self._event("Normal", "CanaryDeleted", f"deleted canary {name}")
        if restore and self.status.original is not None:
            await self._timed(world.restore(self.status.original), "restore")
            await self._save(restored=True)
            self._event("Normal", "Restored", f"original configuration restored: {why}")
        if any(c.type == "CleanedUp" and c.status == "False" for c in self.status.conditions):
            self._condition("CleanedUp", "True", "CleanedUp", f"cleaned up: {why}")
            await self._save()

    async def fail_unexpected(self, error: BaseException, attempts: int) -> None:
        """An error no rule expects, met `attempts` times in a row: the study stops
        (Failed, so kstatus Stalled) with the error's text and releases what it holds.
        A cleanup that fails too is reported and retried before the next study; the
        study is Failed either way, so it stops retrying and an edit reruns it."""
        why = f"UnexpectedError ({attempts} times in a row): {type(error).__name__}: {error}"
        why = why[:900]
        try:
            await self._fail(why)
        except Exception as cleanup_error:
            await self.cleanup_failed(why, cleanup_error)
            message = f"study failed: {why}"
            self._condition("Ready", "False", "StudyFailed", message)
            with contextlib.suppress(KubeError):
                await self._save(phase="Failed", message=message)
            self._event("Warning", "StudyFailed", message)

    async def cleanup_failed(self, why: str, error: Exception) -> None:
        """A cleanup that could not finish (it is tried again before the next study
        starts): a condition and one event, and status keeps what is left to undo."""
        reason = error.reason if isinstance(error, TargetProblem | RecoverableError) else "Error"
        detail = (
            error.message if isinstance(error, TargetProblem | RecoverableError) else str(error)
        )
        message = f"cleanup after {why} failed ({reason}: {detail}); retried before the next study"
        self._condition("CleanedUp", "False", "CleanupFailed", message[:1024])
        self._event("Warning", "CleanupFailed", message)
        with contextlib.suppress(KubeError):
            await self._save(message=message)

    # --- suspend, maintenance windows, re-tuning ----------------------------------------

    async def _held(self, plan: decisions.Plan) -> bool | None:
        """What spec.suspend, tuning.window and tuning.retune make of the plan: None to
        go on with it, else the step's result. Checked between steps only, so a trial
        in flight finishes (or meets its deadline) before a pause takes effect."""
        if plan.kind in ("new-study", "adopt-spec"):
            return None
        if self.spec.suspend:
            if self.status.phase not in ("Failed", "RolledBack"):
                await self._suspend()
            return False
        # a new study (a restarting edit) starts unsuspended but inherits the conditions
        paused = any(c.type == "Suspended" and c.status == "True" for c in self.status.conditions)
        if self.status.suspended or paused:
            await self._resume()
            return True
        if plan.kind == "idle":
            return await self._retune_step()
        if plan.kind in ("trial", "confirm"):
            return await self._window_gate()
        return None

    async def _undo_for_pause(self) -> str:
        """Free what a paused study holds: the canary goes (and its GPUs with it), an
        InPlace target runs its original configuration again. Says what was undone."""
        delete_canary, restore = decisions.needs_cleanup(self.status, self.spec.tuning.strategy)
        if delete_canary:
            await self._remove_canary()
        if restore and self.status.original is not None:
            await self._timed(self._world.restore(self.status.original), "restore")
            await self._save(restored=True)
        self._prepared = False
        undone = [
            what
            for what, done in (
                ("the canary deleted", delete_canary),
                ("the original configuration restored", restore),
            )
            if done
        ]
        return ", ".join(undone)

    def _unpaused_restored(self) -> bool:
        # a restore done for a pause is undone by the next trial: a later failure must
        # restore again
        return self.status.restored and self.status.phase not in decisions.ACTIVE_PHASES

    async def _suspend(self) -> None:
        if self.status.suspended:
            return
        undone = await self._undo_for_pause()
        message = "suspended (spec.suspend)" + (f": {undone}" if undone else "")
        self._condition("Suspended", "True", "Suspended", message)
        await self._save(suspended=True, message=message)
        self._event("Normal", "Suspended", message)

    async def _resume(self) -> None:
        message = "resumed (spec.suspend false): the study goes on from its status"
        self._condition("Suspended", "False", "Resumed", message)
        await self._save(suspended=False, restored=self._unpaused_restored(), message=message)
        self._event("Normal", "Resumed", message)

    async def _window_gate(self) -> bool | None:
        gate = schedule.trial_gate(self.spec, self._clock())
        current = next((c for c in self.status.conditions if c.type == "InWindow"), None)
        waiting = current is not None and current.status == "False"
        if gate.may_start:
            if waiting:
                self._condition("InWindow", "True", "InsideWindow", gate.message)
                await self._save(
                    waiting_until=None, restored=self._unpaused_restored(), message=gate.message
                )
                self._event("Normal", "WindowOpen", gate.message)
            return None
        if not waiting or self.status.waiting_until != gate.until:
            # no canary holds its GPUs, and production does not run a trial's values,
            # until the next window
            undone = "" if waiting else await self._undo_for_pause()
            message = gate.message + (f"; {undone}" if undone else "")
            self._condition("InWindow", "False", "OutsideWindow", message)
            await self._save(waiting_until=gate.until, message=message)
            self._event("Normal", "OutsideWindow", message)
        return False

    async def _retune_step(self) -> bool:
        now = self._clock()
        step = schedule.retune_step(self.spec, self.status, now)
        if step.action == "none":
            return False
        if step.action == "schedule":
            await self._save(next_retune_at=step.at, retune_key=schedule.retune_key(self.spec))
            return False
        why = step.why
        if step.action == "check":
            window = self.spec.tuning.retune_window
            breach = await self._production_breach(float(duration_seconds(window)))
            if breach is None:
                await self._save(next_retune_at=step.at)
                return False
            why = f"SLA breached over the last {window}: {breach}"
        await self._retune(why, now)
        return True

    async def _production_breach(self, window_s: float) -> str | None:
        """The SLA breach Prometheus saw on the target over the window; None when it
        kept the SLA or nothing could be read (a monitoring outage is no reason to
        re-tune: the next check is one window later)."""
        if not isinstance(self._world, schedule.BreachReader):
            return None
        try:
            return await self._world.production_breach(window_s)
        except (OSError, TimeoutError, KubeError, TargetProblem) as exc:
            log.warning("%s/%s: re-tune check read nothing: %s", self.namespace, self.name, exc)
            return None

    async def _retune(self, why: str, now: datetime) -> None:
        """A new study for the same generation; the old one's best and the count of
        re-tunes stay in status. The new baseline is what the target runs now: the
        configuration the last study wrote back."""
        previous = self.status
        generation = previous.observed_generation
        assert generation is not None  # a Converged study has one
        count = previous.retunes + 1
        message = f"re-tune {count}: {why}; a new study starts from the target's configuration"
        self.status = decisions.new_study(previous, generation).model_copy(
            update={
                "study_fingerprint": specdiff.study_fingerprint(self.spec),
                "retunes": count,
                "last_retune_at": now,
                "last_retune_reason": why,
                "previous_best": previous.best,
                "message": message,
            }
        )
        self._prepared = False
        self._condition("Ready", "False", "Retuning", message)
        await self._save()
        self._event("Normal", "Retune", message)
