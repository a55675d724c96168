"""The measurement slots: one trial at a time (or --max-concurrent-trials) across every
study of one operator process, given to each namespace in turn, and the workload a
study's trials run on (its canary, or the target itself), made ready once the study
holds a slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

from batchpilot.operator import metrics
from batchpilot.operator.studystate import StudyState


class Slots:
    """The measurement slot(s) shared by every study of one operator process, handed
    out in turn across namespaces: when a slot frees, the namespace that has waited
    longest for its turn gets it (first come, first served within one namespace), so a
    tenant with many studies cannot keep another's one study waiting behind all of
    them."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"measurement slots must be at least 1, got {slots}")
        self._free = slots
        # namespaces in their turn's order, each with its waiters in arrival order
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def busy(self) -> bool:
        """Whether a study asking now has to wait."""
        return self._free == 0 or bool(self._queues)

    async def acquire(self, namespace: str) -> None:
        if not self.busy():
            self._free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._queues.setdefault(namespace, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed over as it was cancelled: pass it on
            else:
                self._leave(namespace, turn)
            raise

    def release(self) -> None:
        while self._queues:
            namespace, waiters = self._queues.popitem(last=False)
            turn = waiters.popleft()
            if waiters:
                self._queues[namespace] = waiters  # its next waiter's turn comes last
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _leave(self, namespace: str, turn: asyncio.Future[None]) -> None:
        waiters = self._queues.get(namespace)
        if waiters is None:
            return
        with contextlib.suppress(ValueError):
            waiters.remove(turn)
        if not waiters:
            del self._queues[namespace]


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
        slots = self._slots
        if slots.busy():
            message = (
                "waiting: other studies are being measured (the operator's measurement "
                "slots go to each namespace in turn)"
            )
            state.condition("Measuring", "False", "WaitingForSlot", message)
            await state.save(message=message)
            metrics.WAITING.inc()
            try:
                await slots.acquire(state.namespace)
            finally:
                metrics.WAITING.dec()
        else:
            await slots.acquire(state.namespace)
        try:
            await self._prepare()
            yield
        finally:
            slots.release()
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
