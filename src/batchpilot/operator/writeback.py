"""Writing a study's winner onto its target: the write-back, the watch that verifies
it (`tuning.verifySeconds`), the rollback to the original configuration when it broke
the target, and the restore of an InPlace target that gets nothing written."""

from __future__ import annotations

from batchpilot.operator import decisions
from batchpilot.operator.spec import Params
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.world import TargetProblem

# problems of a write-back that a restore cannot cure: retried as the step, not rolled back
NOT_ROLLED_BACK = frozenset({"TargetNotFound", "ContainerNotFound", "ApplyFailed"})


class WriteBack:
    def __init__(self, state: StudyState) -> None:
        self._state = state

    async def write(self, params: Params) -> bool:
        """Write `params` onto the target and watch it for `tuning.verifySeconds`; False
        when it broke the target and the original configuration was put back. Safe to
        repeat after a restart: a write-back already done is only verified again, and a
        rollback under way is finished."""
        state = self._state
        rolling_back = next(
            (
                c
                for c in state.status.conditions
                if c.type == "Degraded" and c.reason == "RollingBack"
            ),
            None,
        )
        try:
            if rolling_back is not None:
                raise TargetProblem("RollingBack", rolling_back.message)
            if not state.status.applied:
                await state.timed(state.world.target.write_back(params), "write-back")
                await state.save(applied=True)
                state.event(
                    "Normal",
                    "Applied",
                    f"wrote {decisions.describe_params(params)} to {state.spec.target.name}",
                )
            await state.world.target.verify(float(state.spec.tuning.verify_seconds))
        except TargetProblem as problem:
            if problem.reason in NOT_ROLLED_BACK:
                raise
            await self._roll_back(params, problem, resumed=rolling_back is not None)
            return False
        return True

    async def _roll_back(self, params: Params, problem: TargetProblem, *, resumed: bool) -> None:
        """Put the incumbent back after a write-back that broke the target: one
        Degraded/RolledBack condition and one event, and the study ends RolledBack."""
        state = self._state
        original = state.status.original
        assert original is not None  # recorded before any trial
        if resumed:
            message = problem.message
        else:
            message = (
                f"rolled back {decisions.describe_params(params)} on "
                f"{state.spec.target.name}: {problem.reason}: {problem.message}; the original "
                "configuration is restored"
            )
            # said before the restore, so a restart in between finishes the rollback
            state.condition("Degraded", "True", "RollingBack", message)
            await state.save(message=message)
        await state.timed(state.world.target.restore(original), "restore")
        state.condition("Degraded", "True", "RolledBack", message)
        state.condition("Ready", "False", "RolledBack", message)
        state.condition("TargetReady", "True", "Restored", "original configuration restored")
        await state.save(phase="RolledBack", applied=False, restored=True, message=message)
        state.event("Warning", "RolledBack", message)

    async def restore_in_place(self) -> None:
        """An InPlace target gets its original configuration back when nothing is
        written onto it."""
        state = self._state
        if (
            state.spec.tuning.strategy == "InPlace"
            and not state.status.restored
            and state.status.original is not None
        ):
            await state.timed(state.world.target.restore(state.status.original), "restore")
            await state.save(restored=True)
