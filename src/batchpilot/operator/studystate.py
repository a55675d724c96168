"""One study's state and how it is told: its spec, its status (kept in memory and
written to the API server after every change), its conditions and events, and the
deadlines of the writes it makes to its target. Every flow of a study (`study` names
them) reads and changes the study through one `StudyState`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Literal

from batchpilot.operator import decisions, kstatus
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import InferenceServiceStatus
from batchpilot.operator.world import TargetProblem, World

EventType = Literal["Normal", "Warning"]
EventSink = Callable[[EventType, str, str], None]
StatusWriter = Callable[[InferenceServiceStatus], Awaitable[None]]
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


class RecoverableError(RuntimeError):
    """A step could not finish; the daemon retries it after a backoff."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class StudyState:
    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        spec: InferenceServiceSpec,
        status: InferenceServiceStatus,
        world: World,
        write_status: StatusWriter,
        event: EventSink,
        clock: Clock,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.spec = spec
        self.status = status
        self.world = world
        self.event = event
        self.clock = clock
        self._write = write_status

    async def save(self, **changes: object) -> None:
        status = self.status.model_copy(update=changes)
        status = kstatus.with_summary(status, self.spec, self.world.trials.measured_pods)
        self.status = kstatus.with_kstatus(status, self.clock())
        await self._write(self.status)

    def stop_with(self, problem: TargetProblem) -> None:
        """End the study with `problem` once the measurement that met it is recorded:
        kept in status (written with that record), so a restart in between still ends
        it."""
        self.status = self.status.model_copy(
            update={"stopping": f"{problem.reason}: {problem.message}"}
        )

    def condition(
        self, type: str, status: Literal["True", "False", "Unknown"], reason: str, message: str
    ) -> None:
        self.status = self.status.model_copy(
            update={
                "conditions": decisions.set_condition(
                    self.status.conditions,
                    type=type,
                    status=status,
                    reason=reason,
                    message=message,
                    generation=self.status.observed_generation,
                    now=self.clock(),
                )
            }
        )

    async def timed(
        self, work: Coroutine[Any, Any, None], what: Literal["write-back", "restore"]
    ) -> None:
        """A write-back or restore bounded by its own deadline (tuning.
        writeBackDeadlineSeconds, restoreDeadlineSeconds): past it, a TargetProblem that
        the step turns into a condition, instead of a wait without end."""
        tuning = self.spec.tuning
        if what == "write-back":
            limit, field_name, reason = (
                tuning.write_back_deadline_seconds,
                "tuning.writeBackDeadlineSeconds",
                "WriteBackTimedOut",
            )
        else:
            limit, field_name, reason = (
                tuning.restore_deadline_seconds,
                "tuning.restoreDeadlineSeconds",
                "RestoreTimedOut",
            )
        try:
            async with asyncio.timeout(limit):
                await work
        except TimeoutError:
            raise TargetProblem(
                reason,
                f"the {what} on {self.spec.target.kind} {self.spec.target.name} did not "
                f"finish within {limit} s ({field_name})",
            ) from None
