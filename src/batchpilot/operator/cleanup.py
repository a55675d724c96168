"""A study that ends without a result, and what it leaves behind: a failed study,
the early stop (a new spec generation, a deletion, a restarting edit) that deletes the
canary and the load workers and gives an InPlace target its original configuration
back, and a cleanup that itself failed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from batchpilot.operator import decisions, scope
from batchpilot.operator.kube import KubeError
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.studystate import RecoverableError, StudyState
from batchpilot.operator.world import TargetProblem, World

log = logging.getLogger(__name__)

# the World of another spec: the one a study started with, for its cleanup
WorldFor = Callable[[InferenceServiceSpec], World]


class Cleanup:
    def __init__(self, state: StudyState, world_for: WorldFor | None) -> None:
        self._state = state
        self._world_for = world_for

    async def fail(self, reason: str) -> None:
        state = self._state
        await self.stop_early(reason)
        message = f"study failed: {reason}"
        if state.status.restored:
            message += "; original configuration restored"
        state.condition("Ready", "False", "StudyFailed", message)
        await state.save(phase="Failed", message=message, stopping=None)
        state.event("Warning", "StudyFailed", message)

    async def fail_if_stopping(self) -> None:
        """Fail the study on a problem met during a measurement that retrying cannot
        cure (`TargetProblem.stops_study`), once that measurement is recorded."""
        stopping = self._state.status.stopping
        if stopping is not None:
            await self.fail(stopping)

    async def remove_canary(self) -> None:
        state = self._state
        await state.world.trials.remove_load_workers()
        if state.status.canary is not None:
            name = state.status.canary
            await state.world.canary.remove(name)
            await state.save(canary=None)
            state.event("Normal", "CanaryDeleted", f"deleted canary {name}")

    def _started(self) -> tuple[InferenceServiceSpec, World]:
        """The spec the study started with (its target, runtime, apply method and
        strategy) and a World for it: cleanup undoes what that study did, whatever the
        spec says now."""
        state = self._state
        try:
            started = scope.cleanup_spec(state.spec, state.status.started_with)
        except scope.ScopeUnreadable as exc:
            log.warning(
                "%s/%s: %s; cleaning up under the current spec", state.namespace, state.name, exc
            )
            return state.spec, state.world
        if started is state.spec or self._world_for is None:
            return state.spec, state.world
        return started, self._world_for(started)

    async def stop_early(self, why: str) -> None:
        """Undo what the study changed: the canary goes, an InPlace target gets its
        original configuration back (failure, cancellation, deletion, new spec), under
        the spec the study started with."""
        state = self._state
        spec, world = self._started()
        delete_canary, restore = decisions.needs_cleanup(state.status, spec.tuning.strategy)
        await state.world.trials.remove_load_workers()
        if delete_canary and state.status.canary is not None:
            name = state.status.canary
            await world.canary.remove(name)
            await state.save(canary=None)
            state.event("Normal", "CanaryDeleted", f"deleted canary {name}")
        if restore and state.status.original is not None:
            await state.timed(world.target.restore(state.status.original), "restore")
            await state.save(restored=True)
            state.event("Normal", "Restored", f"original configuration restored: {why}")
        if any(c.type == "CleanedUp" and c.status == "False" for c in state.status.conditions):
            state.condition("CleanedUp", "True", "CleanedUp", f"cleaned up: {why}")
            await state.save()

    async def fail_unexpected(self, error: BaseException, attempts: int) -> None:
        """An error no rule expects, met `attempts` times in a row: the study stops
        (Failed, so kstatus Stalled) with the error's text and releases what it holds.
        A cleanup that fails too is reported and retried before the next study; the
        study is Failed either way, so it stops retrying and an edit reruns it."""
        state = self._state
        why = f"UnexpectedError ({attempts} times in a row): {type(error).__name__}: {error}"
        why = why[:900]
        try:
            await self.fail(why)
        except Exception as cleanup_error:
            await self.cleanup_failed(why, cleanup_error)
            message = f"study failed: {why}"
            state.condition("Ready", "False", "StudyFailed", message)
            with contextlib.suppress(KubeError):
                await state.save(phase="Failed", message=message, stopping=None)
            state.event("Warning", "StudyFailed", message)

    async def cleanup_failed(self, why: str, error: Exception) -> None:
        """A cleanup that could not finish (it is tried again before the next study
        starts): a condition and one event, and status keeps what is left to undo."""
        state = self._state
        reason = error.reason if isinstance(error, TargetProblem | RecoverableError) else "Error"
        detail = (
            error.message if isinstance(error, TargetProblem | RecoverableError) else str(error)
        )
        message = f"cleanup after {why} failed ({reason}: {detail}); retried before the next study"
        state.condition("CleanedUp", "False", "CleanupFailed", message[:1024])
        state.event("Warning", "CleanupFailed", message)
        with contextlib.suppress(KubeError):
            await state.save(message=message)
