"""The measurement slot: one trial at a time across every study of one operator
process, and the workload a study's trials run on (its canary, or the target itself),
made ready once the study holds the slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from batchpilot.operator import metrics
from batchpilot.operator.studystate import StudyState


@dataclass
class Slots:
    """The measurement slot(s) shared by every study of one operator process."""

    semaphore: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))


class StudySlot:
    """One study's turn at the slots, and whether its measured workload is ready."""

    def __init__(self, state: StudyState, slots: Slots) -> None:
        self._state = state
        self._slots = slots
        self._prepared = False

    def forget_workload(self) -> None:
        """The measured workload is made ready again before the next measurement: a new
        study, or a pause that deleted the canary."""
        self._prepared = False

    @contextlib.asynccontextmanager
    async def measuring(self) -> AsyncIterator[None]:
        """Hold the measurement slot, with the measured workload ready. The slot is
        taken before the canary is created, so a study queued behind another holds no
        canary (and none of its GPUs) while it waits."""
        state = self._state
        semaphore = self._slots.semaphore
        if semaphore.locked():
            message = "waiting: another study is being measured (one trial at a time)"
            state.condition("Measuring", "False", "WaitingForSlot", message)
            await state.save(message=message)
            metrics.WAITING.inc()
            try:
                await semaphore.acquire()
            finally:
                metrics.WAITING.dec()
        else:
            await semaphore.acquire()
        try:
            await self._prepare()
            yield
        finally:
            semaphore.release()
            state.condition("Measuring", "False", "Idle", "no trial is being measured")

    async def _prepare(self) -> None:
        if self._prepared:
            return
        state = self._state
        canary = await state.world.canary.prepare(state.status.canary)
        self._prepared = True
        autoscalers = state.world.canary.autoscalers
        if autoscalers:
            how = (
                "an InPlace trial during which the replicas change is measured again"
                if state.spec.tuning.strategy == "InPlace"
                else "the canary is not scaled by it"
            )
            state.condition(
                "Autoscaled",
                "True",
                "AutoscalerDetected",
                f"HorizontalPodAutoscaler {', '.join(autoscalers)} scales "
                f"{state.spec.target.name}: {how}",
            )
            await state.save()
        if canary != state.status.canary:
            await state.save(canary=canary)
            if canary is not None:
                state.event("Normal", "CanaryCreated", f"trials run on canary {canary}")
