"""A study that pauses: `spec.suspend`, and trials held outside the maintenance window
(`tuning.window`). A paused study frees what it holds (the canary and its GPUs; an
InPlace target runs its original configuration again) and goes on from its status
when it resumes."""

from __future__ import annotations

from batchpilot.operator import decisions, schedule
from batchpilot.operator.cleanup import Cleanup
from batchpilot.operator.slots import StudySlot
from batchpilot.operator.studystate import StudyState


class Pause:
    def __init__(self, state: StudyState, slot: StudySlot, cleanup: Cleanup) -> None:
        self._state = state
        self._slot = slot
        self._cleanup = cleanup

    async def suspend(self) -> None:
        state = self._state
        if state.status.suspended:
            return
        # a trial the suspend stopped mid-measurement is run again on resume
        cut = [
            f"trial {t.number} stopped mid-measurement (run again on resume)"
            for t in state.status.trials
            if t.state == "Running"
        ]
        undone = ", ".join(part for part in (*cut, await self._undo()) if part)
        message = "suspended (spec.suspend)" + (f": {undone}" if undone else "")
        state.condition("Suspended", "True", "Suspended", message)
        await state.save(suspended=True, message=message)
        state.event("Normal", "Suspended", message)

    async def resume(self) -> None:
        state = self._state
        message = "resumed (spec.suspend false): the study goes on from its status"
        state.condition("Suspended", "False", "Resumed", message)
        await state.save(suspended=False, restored=self._unpaused_restored(), message=message)
        state.event("Normal", "Resumed", message)

    async def window_gate(self) -> bool | None:
        """None when a trial may start now; False (the step's result) while the study
        waits for its window."""
        state = self._state
        gate = schedule.trial_gate(state.spec, state.clock())
        current = next((c for c in state.status.conditions if c.type == "InWindow"), None)
        waiting = current is not None and current.status == "False"
        if gate.may_start:
            if waiting:
                state.condition("InWindow", "True", "InsideWindow", gate.message)
                await state.save(
                    waiting_until=None, restored=self._unpaused_restored(), message=gate.message
                )
                state.event("Normal", "WindowOpen", gate.message)
            return None
        if not waiting or state.status.waiting_until != gate.until:
            # no canary holds its GPUs, and production does not run a trial's values,
            # until the next window
            undone = "" if waiting else await self._undo()
            message = gate.message + (f"; {undone}" if undone else "")
            state.condition("InWindow", "False", "OutsideWindow", message)
            await state.save(waiting_until=gate.until, message=message)
            state.event("Normal", "OutsideWindow", message)
        return False

    async def _undo(self) -> str:
        """Free what a paused study holds: the canary goes (and its GPUs with it), an
        InPlace target runs its original configuration again. Says what was undone."""
        state = self._state
        delete_canary, restore = decisions.needs_cleanup(state.status, state.spec.tuning.strategy)
        if delete_canary:
            await self._cleanup.remove_canary()
        if restore and state.status.original is not None:
            await state.timed(state.world.target.restore(state.status.original), "restore")
            await state.save(restored=True)
        self._slot.forget_workload()
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
        state = self._state
        return state.status.restored and state.status.phase not in decisions.ACTIVE_PHASES
