"""The study runner: one InferenceService's study, one step at a time.

Each step reads nothing but its own status (kept in memory, written to the API server
after every change) and the world, asks `decisions.plan` what comes next and hands it
to the flow that does it: `studystart` (a new study, an adopted edit, the original
recorded), `trials`, `confirmation`, `finish` with `writeback` (the write-back, its
verification and rollback), `pause` (suspend, maintenance windows), `retune` and
`cleanup` (failure, early stop), and once converged `liveguard` (a winner written live
kept on pods that restart). The tuner is rebuilt from the trial history for every
trial, so a resumed operator takes exactly the path an uninterrupted one would (the
status is the study's only persistent state: `operator.status`).
"""

from __future__ import annotations

from batchpilot.operator import decisions
from batchpilot.operator.cleanup import Cleanup, WorldFor
from batchpilot.operator.confirmation import ConfirmationRounds
from batchpilot.operator.finish import Finish
from batchpilot.operator.kube import KubeError
from batchpilot.operator.liveguard import LiveGuard
from batchpilot.operator.pause import Pause
from batchpilot.operator.retune import Retune
from batchpilot.operator.slots import Slots, StudySlot
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import InferenceServiceStatus
from batchpilot.operator.studystart import StudyStart
from batchpilot.operator.studystate import (
    Clock,
    EventSink,
    RecoverableError,
    StatusWriter,
    StudyState,
    utcnow,
)
from batchpilot.operator.trials import Trials
from batchpilot.operator.world import TargetProblem, World
from batchpilot.operator.writeback import WriteBack


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
        live_check_s: float = 15.0,
    ) -> None:
        self._state = state = StudyState(
            namespace=namespace,
            name=name,
            spec=spec,
            status=status,
            world=world,
            write_status=write_status,
            event=event,
            clock=clock,
        )
        slot = StudySlot(state, slots)
        self._cleanup = cleanup = Cleanup(state, world_for)
        finish = Finish(state, WriteBack(state), cleanup)
        self._start = StudyStart(state, slot, cleanup)
        self._trials = Trials(state, slot, cleanup)
        self._confirmation = ConfirmationRounds(state, slot, finish, cleanup)
        self._finish = finish
        self._pause = Pause(state, slot, cleanup)
        self._retune = Retune(state, slot)
        self._live_guard = LiveGuard(state, live_check_s)
        self._in_flight: str | None = None  # the plan's kind while a step runs

    @property
    def brakes_on_suspend(self) -> bool:
        """Whether spec.suspend stops the step in flight at once: a trial or a
        confirmation round (load on the target or its canary), cut short and run again
        on resume. A write-back finishes: its verification and rollback are the way
        back, and it adds no load."""
        return self._in_flight in ("trial", "confirm")

    @property
    def spec(self) -> InferenceServiceSpec:
        return self._state.spec

    @property
    def status(self) -> InferenceServiceStatus:
        return self._state.status

    async def step(self, generation: int) -> bool:
        """Do the next step; False when the study of this generation is over."""
        state = self._state
        plan = decisions.plan(state.spec, state.status, generation)
        try:
            held = await self._held(plan)
            if held is not None:
                return held
            self._in_flight = plan.kind
            if plan.kind == "idle":
                return False
            if plan.kind == "new-study":
                await self._start.new_study(generation)
            elif plan.kind == "adopt-spec":
                await self._start.adopt_spec(generation)
            elif plan.kind == "record-original":
                await self._start.record_original()
            elif plan.kind == "trial":
                await self._trials.run()
            elif plan.kind == "confirm":
                await self._confirmation.step(plan.reason)
            elif plan.kind == "finish":
                await self._finish.run(plan.reason)
            elif plan.kind == "write-back":
                await self._finish.write_adopted()
            else:
                await self._cleanup.fail(plan.reason)
        except TargetProblem as exc:
            await self.report_problem(exc.reason, exc.message)
            raise RecoverableError(exc.reason, exc.message) from exc
        except KubeError as exc:
            message = f"Kubernetes API: {exc}"
            state.event("Warning", "APIError", message)
            raise RecoverableError("APIError", message) from exc
        finally:
            self._in_flight = None
        return True

    async def _held(self, plan: decisions.Plan) -> bool | None:
        """What spec.suspend, tuning.window and tuning.retune make of the plan: None to
        go on with it, else the step's result. A window that shuts is checked between
        steps, so a trial in flight finishes (or meets its deadline) first; a suspend
        has already cut a trial or confirmation round short (`brakes_on_suspend`)."""
        status = self._state.status
        if plan.kind in ("new-study", "adopt-spec"):
            return None
        if self._state.spec.suspend:
            if status.phase not in ("Failed", "RolledBack"):
                await self._pause.suspend()
            return False
        # a new study (a restarting edit) starts unsuspended but inherits the conditions
        paused = any(c.type == "Suspended" and c.status == "True" for c in status.conditions)
        if status.suspended or paused:
            await self._pause.resume()
            return True
        if plan.kind == "idle":
            await self._live_guard.step()
            return await self._retune.step()
        writes = plan.kind == "write-back" or (
            plan.kind == "finish" and self._state.spec.tuning.write_back == "Apply"
        )
        if plan.kind in ("trial", "confirm") or writes:
            return await self._pause.window_gate()
        return None

    async def report_problem(self, reason: str, message: str) -> None:
        """A target problem that the study waits out or retries: condition + event.
        The event is posted when the problem is new, not on every retry."""
        state = self._state
        known = any(
            c.type == "TargetReady"
            and (c.status, c.reason, c.message) == ("False", reason, message)
            for c in state.status.conditions
        )
        state.condition("TargetReady", "False", reason, message)
        await state.save(message=message)
        if not known:
            state.event("Warning", reason, message)

    async def report_pod_problem(self, problem: decisions.PodProblem) -> None:
        await self.report_problem(problem.reason, problem.message)

    async def stop_early(self, why: str) -> None:
        """Undo what the study changed, under the spec it started with (`cleanup`)."""
        await self._cleanup.stop_early(why)

    async def fail_unexpected(self, error: BaseException, attempts: int) -> None:
        await self._cleanup.fail_unexpected(error, attempts)

    async def cleanup_failed(self, why: str, error: Exception) -> None:
        await self._cleanup.cleanup_failed(why, error)
