"""The study's view of the cluster: read and change the target, run a canary, measure.

`World` is what the study's flows need, in three parts: `target` (the production
target: its original configuration, the write-back, the restore, the watch after a
write-back, its traffic's SLA), `canary` (the workload trials run on made ready, the
canary removed) and `trials` (a configuration applied to the measured workload and
measured). `kubeworld.KubeWorld` implements it against the API server and the pods
themselves; tests give the runner a fake world instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from batchpilot.errors import TargetError
from batchpilot.operator import decisions
from batchpilot.operator.spec import Params
from batchpilot.operator.status import OriginalConfig

if TYPE_CHECKING:
    from batchpilot.models import BatchingConfig, CapacityResult
    from batchpilot.operator.workerfleet import LoadWorkers

ProblemSink = Callable[[decisions.PodProblem], Awaitable[None]]


class TargetProblem(TargetError):
    """The target cannot be used now; `reason` is CamelCase for conditions and events."""

    def __init__(
        self, reason: str, message: str, *, stops_study: bool = False, invalid: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        # retrying cannot help and the study holds what others wait for (the slot, a
        # canary's GPUs): the study fails instead of its next trial trying again
        self.stops_study = stops_study
        # something outside disturbed the measurement (an autoscaler): no verdict on the
        # configuration, whose trial is asked again without counting as a failure
        self.invalid = invalid


class TargetWorld(Protocol):
    """The target as production runs it."""

    async def record_original(self, now: datetime) -> OriginalConfig:
        """The target's configuration before anything is changed."""
        ...

    async def write_back(self, params: Params) -> None:
        """Write `params` onto the target's pod template (server-side apply), or, for a
        runtime applied live, onto every pod of the target."""
        ...

    async def keep_live(self, params: Params) -> list[str]:
        """For a winner written live through the runtime's API: every pod of the target
        that runs other values (a restarted or new pod starts from the model's own
        configuration) set to `params` again and verified; one "POD (ran LABEL)" per pod
        set. [] when every pod runs them, or the write-back went to the pod template."""
        ...

    async def restore(self, original: OriginalConfig) -> None:
        """Put the original configuration back on the target."""
        ...

    async def verify(self, seconds: float) -> None:
        """Watch the target for `seconds` after a write-back; a TargetProblem when its
        pods crash, restart or stay unready, or (load.source prometheus) when its
        traffic over the window broke the SLA."""
        ...

    async def production_verdict(self, window_s: float) -> decisions.ProductionVerdict | None:
        """Whether the target's traffic over the last `window_s` kept the SLA (re-tune
        OnSLABreach); None when nothing could be judged (no Prometheus source, no
        traffic, or Prometheus did not answer)."""
        ...


class CanaryWorld(Protocol):
    """The workload trials run on: a canary beside the target, or the target itself."""

    @property
    def autoscalers(self) -> list[str]:
        """HorizontalPodAutoscalers that scale the target, found by `prepare`."""
        ...

    async def prepare(self, canary: str | None) -> str | None:
        """Make the workload that trials run on ready (create the canary for strategy
        Canary; `canary` is the name in status if one was created before a restart).
        Returns the canary's name, or None when trials run on the target itself."""
        ...

    async def remove(self, name: str) -> None:
        """Delete the canary `name` if this InferenceService owns it."""
        ...


class TrialWorld(Protocol):
    """A trial's configuration on the measured workload, and its measurement."""

    @property
    def measured_pods(self) -> int | None:
        """The pods the latest measurement spread its load over (None: none yet)."""
        ...

    @property
    def load_workers(self) -> LoadWorkers | None:
        """The load-worker pods, when load.workers.max allows more than the operator."""
        ...

    async def apply(self, params: Params) -> None:
        """Bring the measured workload to `params`; return once every pod runs them."""
        ...

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        since: datetime,
        seed: int | None = None,
        light_load: bool | None = None,
    ) -> CapacityResult:
        """Score what is live. `since` is the trial's start: a container that exited
        after it (a crash, an OOM kill) spoils the trial, raised as TargetProblem.
        `seed` is the load's (default: the study's); the confirmation rounds set it.
        `light_load`: whether rates below the capacity found are measured too
        (capacity.lightload); by default when the wait is a large share of the SLA."""
        ...

    async def remove_load_workers(self) -> None:
        """Delete the study's load workers (none: a no-op)."""
        ...


class World(Protocol):
    @property
    def target(self) -> TargetWorld: ...

    @property
    def canary(self) -> CanaryWorld: ...

    @property
    def trials(self) -> TrialWorld: ...
