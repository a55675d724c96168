"""How a study starts and takes in a spec edit: a new study for a spec generation that
restarts it (the previous one undone first), an edit the running study adopts without a
restart (more trials, a changed writeBack applied or withheld), and the target's
original configuration recorded before anything is changed."""

from __future__ import annotations

from batchpilot.operator import adopt, decisions, scope, specdiff
from batchpilot.operator.cleanup import Cleanup
from batchpilot.operator.slots import StudySlot
from batchpilot.operator.studystate import StudyState


class StudyStart:
    def __init__(self, state: StudyState, slot: StudySlot, cleanup: Cleanup) -> None:
        self._state = state
        self._slot = slot
        self._cleanup = cleanup

    async def new_study(self, generation: int) -> None:
        state = self._state
        if state.status.observed_generation is not None:
            await self._cleanup.stop_early("a new spec generation replaces this study")
        state.status = decisions.new_study(state.status, generation).model_copy(
            update={
                "study_fingerprint": specdiff.study_fingerprint(state.spec),
                "started_with": scope.scope_of(state.spec),
            }
        )
        self._slot.forget_workload()
        if any(c.type == "Degraded" for c in state.status.conditions):
            state.condition("Degraded", "False", "StudyStarted", "a new study replaces it")
        state.condition("Ready", "False", "StudyStarted", state.status.message)
        state.condition("SpecValid", "True", "Valid", f"spec generation {generation} is valid")
        await state.save()
        state.event("Normal", "StudyStarted", state.status.message)

    async def adopt_spec(self, generation: int) -> None:
        """Take over an edit that leaves the study's measurements comparable: a
        converged study reopens when there are trials left to run, or applies or
        withholds its result when writeBack changed; a running one just goes on."""
        state = self._state
        spec = state.spec
        state.status = state.status.model_copy(update={"observed_generation": generation})
        state.condition("SpecValid", "True", "Valid", f"spec generation {generation} is valid")
        note = f"spec generation {generation} adopted by the running study (no restart)"
        if adopt.reopens(spec, state.status):
            state.status = adopt.reopened(state.status)
            note = f"spec generation {generation}: more trials allowed, the study continues"
            await state.save(message=note)
            state.event("Normal", "StudyResumed", note)
            return
        action = decisions.write_back_action(spec, state.status)
        if action == "apply":
            # written by the next step, through the study's own gates
            note += "; writeBack Apply: the result is written back and verified next"
        elif action == "withhold" and state.status.original is not None:
            await state.timed(state.world.target.restore(state.status.original), "restore")
            await state.save(applied=False, restored=True)
            state.event("Normal", "Restored", "writeBack Recommend: original configuration back")
            note += "; writeBack Recommend: the original configuration is back on the target"
        await state.save()
        state.event("Normal", "SpecAdopted", note)

    async def record_original(self) -> None:
        state = self._state
        original = await state.world.target.record_original(state.clock())
        shown = decisions.describe_params(original.params) if original.params else "unset"
        message = f"recorded the original configuration ({shown}); measuring the baseline"
        state.condition("TargetReady", "True", "TargetFound", f"{state.spec.target.name} found")
        await state.save(original=original, phase="Baseline", message=message)
        state.event("Normal", "Baseline", message)
