"""Keeping a winner written live (Triton, Ray Serve through their own APIs). Such a
write-back lives in the servers' processes only: a pod that restarts, or a new one an
autoscaler adds, starts from the model's own configuration. While the study stands
Converged with its winner applied, the target's pods are read every few polls and any
that runs other values is set to the winner again, verified as a trial's change is, with
an event that names the pods and says how to make the winner survive restarts."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from batchpilot.operator import decisions
from batchpilot.operator.kube import KubeError
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.world import TargetProblem

log = logging.getLogger(__name__)


class LiveGuard:
    def __init__(self, state: StudyState, every_s: float) -> None:
        self._state = state
        self._every = timedelta(seconds=every_s)
        self._next: datetime | None = None

    async def step(self) -> None:
        """Check the target's pods when a check is due; a pod set again is reported once,
        a pod that cannot be checked now is left to the next check."""
        state = self._state
        if not decisions.keeps_live_winner(state.spec, state.status):
            self._next = None
            return
        now = state.clock()
        if self._next is not None and now < self._next:
            return
        self._next = now + self._every
        params = decisions.chosen_params(state.spec, state.status)
        if params is None:
            return
        try:
            async with asyncio.timeout(state.spec.tuning.write_back_deadline_seconds):
                kept = await state.world.target.keep_live(params)
        except (TargetProblem, KubeError, OSError, TimeoutError) as exc:
            where = f"{state.namespace}/{state.name}"
            log.warning("%s: the live winner was not checked: %s", where, exc)
            return
        if not kept:
            return
        persist = state.status.persist
        where = f": {persist.where}" if persist is not None else ""
        message = (
            f"re-applied {decisions.describe_params(params)} live on {', '.join(kept)}: a "
            "live write-back does not survive a pod restart; to keep it, commit "
            f"status.persist.snippet{where}"
        )
        await state.save(live_reapplied=state.status.live_reapplied + len(kept), message=message)
        state.event("Warning", "LiveReapplied", message)
