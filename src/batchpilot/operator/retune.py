"""Re-tuning a converged study (`tuning.retune`): on its schedule, or when production
traffic breaks the SLA (OnSLABreach, judged by Prometheus over `tuning.retuneWindow`),
a new study starts from what the target runs now."""

from __future__ import annotations

import logging
from datetime import datetime

from batchpilot.operator import decisions, schedule, specdiff
from batchpilot.operator.kube import KubeError
from batchpilot.operator.slots import StudySlot
from batchpilot.operator.spec import duration_seconds
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.world import TargetProblem

log = logging.getLogger(__name__)


class Retune:
    def __init__(self, state: StudyState, slot: StudySlot) -> None:
        self._state = state
        self._slot = slot

    async def step(self) -> bool:
        """The step of a study with nothing left to do: True when a re-tune started."""
        state = self._state
        now = state.clock()
        step = schedule.retune_step(state.spec, state.status, now)
        if step.action == "none":
            return False
        if step.action == "schedule":
            await state.save(next_retune_at=step.at, retune_key=schedule.retune_key(state.spec))
            return False
        why = step.why
        if step.action == "check":
            window = state.spec.tuning.retune_window
            verdict = await self._production_verdict(float(duration_seconds(window)))
            held = state.status.retune_held
            if verdict is not None and verdict.breach is not None:
                why = f"SLA breached over the last {window}: {verdict.breach}"
                if state.spec.tuning.strategy == "InPlace":
                    await self._hold(why, step.at)
                    return False
            elif held and verdict is not None:
                why = f"{held}; production kept the SLA again over the last {window}"
            else:
                # kept, or nothing could be read (a monitoring outage is no reason to
                # re-tune, nor proof of a recovery): the next check is one window later
                await state.save(next_retune_at=step.at)
                return False
        await self._retune(why, now)
        return True

    async def _production_verdict(self, window_s: float) -> decisions.ProductionVerdict | None:
        """Whether the target kept the SLA over the window; None when nothing could be
        read."""
        state = self._state
        try:
            return await state.world.target.production_verdict(window_s)
        except (OSError, TimeoutError, KubeError, TargetProblem) as exc:
            log.warning("%s/%s: re-tune check read nothing: %s", state.namespace, state.name, exc)
            return None

    async def _hold(self, why: str, next_check: datetime | None) -> None:
        """An InPlace re-tune waits for production to keep the SLA again: its trials
        would add load to the very pods whose users the breach already hurts."""
        state = self._state
        first = not state.status.retune_held
        message = (
            f"{why}; the InPlace re-tune waits until production keeps the SLA over a whole "
            "window: its trials would add load to the target that breaches"
        )
        await state.save(next_retune_at=next_check, retune_held=why, message=message)
        if first:
            state.event("Warning", "RetuneHeld", message)

    async def _retune(self, why: str, now: datetime) -> None:
        """A new study for the same generation; the old one's best and the count of
        re-tunes stay in status. The new baseline is what the target runs now: the
        configuration the last study wrote back."""
        state = self._state
        previous = state.status
        generation = previous.observed_generation
        assert generation is not None  # a Converged study has one
        count = previous.retunes + 1
        message = f"re-tune {count}: {why}; a new study starts from the target's configuration"
        state.status = decisions.new_study(previous, generation).model_copy(
            update={
                "study_fingerprint": specdiff.study_fingerprint(state.spec),
                "retunes": count,
                "last_retune_at": now,
                "last_retune_reason": why,
                "previous_best": previous.best,
                "message": message,
            }
        )
        self._slot.forget_workload()
        state.condition("Ready", "False", "Retuning", message)
        await state.save()
        state.event("Normal", "Retune", message)
