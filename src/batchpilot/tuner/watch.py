"""A target and probe that watch the server process they tune (local mode): a trial
during which the process exits, or after which the server answers nothing at all, is
reported as `ServerDied`, and the server is started again so the study can go on. So is
a trial during which the server's model process died (the reference server answers 500
while it starts a new one, and reports the deaths on /healthz).

The rule for "answers nothing at all": every request of the capacity search's lowest
step failed (nothing achieved, error rate 100 %) and the server's admin endpoint does
not answer either. A configuration that is merely too slow still answers its admin
endpoint, so it stays an ordinary infeasible trial.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol, runtime_checkable

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.tuner.interfaces import Probe, ServerDied, Target

log = logging.getLogger(__name__)

# How long to let the event loop notice that the child process has exited.
_EXIT_GRACE_S = 0.2


class Crashes(Protocol):
    deaths: int
    last: str


@runtime_checkable
class ReportsCrashes(Protocol):
    """A server that outlives its model process and says so (the reference server): it
    answers 500 while a new one starts, which would otherwise read as a slow
    configuration."""

    async def model_crashes(self) -> Crashes | None: ...


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


def crashed(result: CapacityResult) -> CapacityResult:
    """A measurement during which the server or its model process died, as a round of
    the confirmation scores it: no rate met the SLA, so the configuration cannot win
    (what is written back must hold in every round)."""
    return result.model_copy(
        update={"effective_rps": 0.0, "feasible": False, "p99_ms": None, "pruned": False}
    )


class Watch:
    """Shared by the watched target and probe: turns a dead server into `ServerDied`
    and starts it again (at its start-up configuration; the next trial applies its own)."""

    def __init__(self, server: Supervised, target: Target) -> None:
        self.server = server
        self.target = target
        self._crashes_seen = 0  # model-process deaths already reported

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
            await self._check_model_process(config)
            return
        tail = self.server.stderr_tail(300).strip().splitlines()
        detail = f"{why} at {config.label()}" + (f"; last log line: {tail[-1]}" if tail else "")
        log.warning("%s; starting it again", detail)
        with contextlib.suppress(Exception):
            await self.server.restart()
        self._crashes_seen = 0  # a new server counts from 0
        raise ServerDied(detail)

    async def _check_model_process(self, config: BatchingConfig) -> None:
        """Raise ServerDied when a model process died under a server that lives on: the
        trial measured a crash (out of memory once batches filled, a killed worker),
        not a configuration that is merely slow."""
        if not isinstance(self.server, ReportsCrashes):
            return
        crashes = await self.server.model_crashes()
        if crashes is None or crashes.deaths <= self._crashes_seen:
            return
        died = crashes.deaths - self._crashes_seen
        self._crashes_seen = crashes.deaths
        detail = (
            f"the model process {crashes.last} at {config.label()}"
            + (f" ({died} deaths during the trial)" if died > 1 else "")
            + "; the server started a new one"
        )
        log.warning("%s", detail)
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
