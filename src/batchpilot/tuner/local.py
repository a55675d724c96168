"""The probe of local mode: the built-in load generator scores what a server reached over
HTTP runs now, speaking the request protocol of its runtime. (The targets, which apply a
configuration, are the runtime adapters' controls: `batchpilot.runtimes`.)"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from batchpilot.errors import TargetError
from batchpilot.loadgen.protocols import RequestProtocol, speaking
from batchpilot.loadgen.warmup import RejectedError
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    SLA,
    BatchingConfig,
    CapacityResult,
    RequestMix,
)

if TYPE_CHECKING:
    from batchpilot.capacity.http import StepSource
    from batchpilot.loadgen.arrivals import ArrivalKind


def start_rate(must_beat: float | None) -> float | None:
    """Where a ramp starts. With something to beat, at half of it: the second step is
    then at the rate to beat itself, which decides at once whether the configuration
    can win (failing there prunes it). Without, the capacity search starts at half the
    rate its closed-loop warm-up reached."""
    if must_beat is not None and must_beat > 0:
        return must_beat * 0.5
    return None


class LocalProbe:
    """Effective throughput of what the server at `url` runs now, by the open-loop
    load generator and the capacity search, sending `protocol`'s requests (default: the
    reference server's synthetic ones). A target that refuses the warm-up's first
    requests stops the run (RejectedError) unless it accepted those of an earlier
    measurement: then only this configuration fails (TargetError)."""

    def __init__(
        self,
        url: str,
        *,
        sla: SLA,
        mix: RequestMix,
        precision: float,
        step_duration_s: float,
        warmup_s: float,
        timeout_s: float | None = None,
        seed: int = 0,
        min_requests: int = DEFAULT_MIN_REQUESTS,
        arrival: ArrivalKind | str = "poisson",
        protocol: RequestProtocol | None = None,
        workers: int = 1,
        source: StepSource | None = None,
        max_connections: int | None = None,
        production_rps: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # where steps are decided: None, the client's own figures; else e.g. Prometheus
        self.source = source
        self.protocol = protocol
        # set once a measurement got past the warm-up: the target accepts our requests
        self.accepted = False
        self.workers = workers
        self.max_connections = max_connections
        self.min_requests = min_requests
        self.arrival = arrival
        self.sla = sla
        self.mix = mix
        self.precision = precision
        self.step_duration_s = step_duration_s
        self.warmup_s = warmup_s
        self.timeout_s = timeout_s
        self.seed = seed
        # the rate the service runs at, when known: one more light-load rate
        self.production_rps = production_rps

    def at(
        self, *, step_duration_s: float, warmup_s: float, precision: float, min_requests: int
    ) -> LocalProbe:
        """This probe measuring at another fidelity (the same server, requests, SLA and
        load); whether the server accepted our requests is carried over."""
        other = copy.copy(self)
        other.step_duration_s = step_duration_s
        other.warmup_s = warmup_s
        other.precision = precision
        other.min_requests = min_requests
        return other

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        start_rps: float | None = None,
        light_load: bool | None = None,
    ) -> CapacityResult:
        """`start_rps` overrides where the ramp starts (the interleaved re-measurement
        brackets a configuration's known figure); by default see `start_rate`.
        `light_load` says whether rates below the capacity found are measured too
        (`capacity.lightload`); by default when the configuration's wait is a large share
        of the SLA (`wait_needs_light_load`)."""
        from batchpilot.capacity.http import measure_capacity
        from batchpilot.capacity.lightload import LightLoad, wait_needs_light_load

        if light_load is None:
            light_load = wait_needs_light_load(config, self.sla)

        with speaking(self.protocol):
            try:
                result = await measure_capacity(
                    [self.url],
                    sla=self.sla,
                    mix=self.mix,
                    precision=self.precision,
                    step_duration_s=self.step_duration_s,
                    warmup_s=self.warmup_s,
                    start_rps=start_rps if start_rps is not None else start_rate(must_beat),
                    must_beat=must_beat,
                    timeout_s=self.timeout_s,
                    seed=self.seed,
                    min_requests=self.min_requests,
                    arrival=self.arrival,
                    workers=self.workers,
                    source=self.source,
                    max_connections=self.max_connections,
                    light_load=LightLoad(production_rps=self.production_rps)
                    if light_load
                    else None,
                )
            except RejectedError as exc:
                if not self.accepted:
                    raise  # it never took a request: a wrong URL, path or body
                # it served earlier configurations: this one makes it fail
                raise TargetError(f"at {config.label()} {exc}") from None
        self.accepted = True
        return result
