"""A target and probe that watch the server process they tune (local mode): a trial
during which the process exits, or after which the server answers nothing at all, is
reported as `ServerDied`, and the server is started again so the study can go on.

The rule for "answers nothing at all": every request of the capacity search's lowest
step failed (nothing achieved, error rate 100 %) and the server's admin endpoint does
not answer either. A configuration that is merely too slow still answers its admin
endpoint, so it stays an ordinary infeasible trial.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.tuner.interfaces import Probe, ServerDied, Target

log = logging.getLogger(__name__)

# How long to let the event loop notice that the child process has exited.
_EXIT_GRACE_S = 0.2


class Supervised(Protocol):
    """The server process (`ServerProcess`)."""

    async def exit_code(self, grace_s: float) -> int | None: ...

    async def restart(self) -> None: ...

    def stderr_tail(self, limit: int = ...) -> str: ...


def answered_nothing(result: CapacityResult) -> bool:
    """Every request of the lowest-rate step failed: nothing achieved, all errors."""
    if not result.steps or result.feasible:
        return False
    lowest = min(result.steps, key=lambda s: s.offered_rps)
    return lowest.achieved_rps == 0.0 and lowest.error_rate >= 1.0


class Watch:
    """Shared by the watched target and probe: turns a dead server into `ServerDied`
    and starts it again (at its start-up configuration; the next trial applies its own)."""

    def __init__(self, server: Supervised, target: Target) -> None:
        self.server = server
        self.target = target

    async def _alive(self) -> bool:
        try:
            await self.target.current()
        except TargetError:
            return False
        return True

    async def check(self, config: BatchingConfig, *, suspect: bool) -> None:
        """Raise ServerDied when the process has exited, or (when `suspect`) when it
        no longer answers its admin endpoint."""
        code = await self.server.exit_code(_EXIT_GRACE_S)
        if code is not None:
            why = f"the server process exited with code {code}"
        elif suspect and not await self._alive():
            why = "the server stopped answering (every request and its admin endpoint failed)"
        else:
            return
        tail = self.server.stderr_tail(300).strip().splitlines()
        detail = f"{why} at {config.label()}" + (f"; last log line: {tail[-1]}" if tail else "")
        log.warning("%s; starting it again", detail)
        with contextlib.suppress(Exception):
            await self.server.restart()
        raise ServerDied(detail)


class WatchedTarget:
    def __init__(self, target: Target, watch: Watch) -> None:
        self._target = target
        self._watch = watch

    async def current(self) -> BatchingConfig:
        return await self._target.current()

    async def apply(self, config: BatchingConfig) -> None:
        try:
            await self._target.apply(config)
        except TargetError:
            # a server that died while warming up at a new batch size, or only failing?
            await self._watch.check(config, suspect=True)
            raise
        await self._watch.check(config, suspect=False)


class WatchedProbe:
    def __init__(self, probe: Probe, watch: Watch) -> None:
        self._probe = probe
        self._watch = watch

    async def measure(self, config: BatchingConfig, *, must_beat: float | None) -> CapacityResult:
        try:
            result = await self._probe.measure(config, must_beat=must_beat)
        except (TimeoutError, OSError):
            await self._watch.check(config, suspect=True)
            raise
        await self._watch.check(config, suspect=answered_nothing(result))
        return result
