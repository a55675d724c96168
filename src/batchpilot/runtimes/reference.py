"""The reference server (`batchpilot serve`): knobs set live through its admin endpoint,
verified by reading them back; persisted as two environment variables."""

from __future__ import annotations

import time
from typing import Any

from typing_extensions import Unpack

from batchpilot.capacity.promql import Metrics
from batchpilot.errors import TargetError
from batchpilot.extras import torch_missing
from batchpilot.loadgen.protocols import REFERENCE, RequestProtocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import base
from batchpilot.runtimes.http import ClientOptions, ControlClient, HttpAccess

ADMIN_PATH = "/admin/batching"
PROFILE_PATH = "/admin/profile"
ENV_MAX_BATCH_SIZE = "MAX_BATCH_SIZE"
ENV_MAX_QUEUE_TIME_MS = "MAX_QUEUE_TIME_MS"
WORKLOADS = ("mlp", "encoder")


class ReferenceControl:
    """`PUT /admin/batching`, then `GET` it back: the configuration is live when the
    server says it runs it. Connection errors, timeouts and 5xx are retried with
    exponential backoff and jitter; a 4xx is the server refusing the values, final."""

    def __init__(self, url: str, **client: Unpack[ClientOptions]) -> None:
        # ControlClient's generous timeout: growing the batch cap makes the server warm
        # the model up at the new size before it answers.
        self._client = ControlClient(url, **client)
        self.url = self._client.url
        self.last_verification: base.Verification | None = None

    async def current(self) -> BatchingConfig:
        data = await self._client.call("GET", ADMIN_PATH)
        try:
            return BatchingConfig.model_validate(data)
        except ValueError as exc:
            raise TargetError(f"GET {ADMIN_PATH} answered an unexpected body: {data!r}") from exc

    async def native(self) -> base.NativeValues:
        live = await self.current()
        return ReferenceRuntime().native(live)

    async def apply(self, config: BatchingConfig) -> None:
        started = time.monotonic()
        await self._client.call("PUT", ADMIN_PATH, config.model_dump(mode="json"))
        live = await self.current()
        if live != config:
            raise TargetError(f"asked for {config.label()}, the server runs {live.label()}")
        self.last_verification = base.Verification(
            requested=config,
            live=live,
            native=ReferenceRuntime().native(live),
            verified_by="read-back",
            change_s=time.monotonic() - started,
        )

    async def profile(self) -> dict[str, Any]:
        """The server's per-batch-size compute statistics (GET /admin/profile)."""
        data = await self._client.call("GET", PROFILE_PATH)
        if not isinstance(data, dict):
            raise TargetError(f"GET {PROFILE_PATH} did not answer a JSON object")
        return data


class ReferenceRuntime(base.Runtime[ReferenceControl, base.LocalServer]):
    name = "reference"
    title = "BatchPilot reference server"
    knobs = (base.batch_knob("max_batch_size"), base.wait_knob("max_queue_time_ms", "ms"))
    how_applied = "live"
    metrics = Metrics(
        port_note="the serving port, /metrics",
        latency_histogram="batchpilot_request_latency_seconds",
        latency_unit="s",
        ok_requests='batchpilot_requests_total{outcome="ok"}',
        total_requests="batchpilot_requests_total",
    )
    default_model = None
    control_endpoint = base.ControlEndpoint(
        what=f"the reference server's admin endpoint (base URL of {ADMIN_PATH})",
        default="the inference URL itself",
    )
    server_name = "the reference server"
    serves = " or ".join(WORKLOADS)
    workloads = WORKLOADS

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return REFERENCE

    def _control(
        self,
        url: str,
        model: str | None,
        server: base.LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> ReferenceControl:
        return ReferenceControl(control_url or url, access=access)

    def _launch(self, launch: base.Launch) -> base.LocalServer:
        from batchpilot.server.process import ServerProcess

        missing = torch_missing("the reference server")
        if missing is not None:
            raise base.LaunchError(missing)
        return ServerProcess(
            model=launch.workload or WORKLOADS[0],
            max_batch_size=launch.start.max_batch_size,
            max_queue_time_ms=launch.start.max_queue_time_ms,
            threads=launch.threads,
        )

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> base.Persistence:
        wait = config.max_queue_time_ms
        wait_text = str(int(wait)) if float(wait).is_integer() else f"{wait:g}"
        return base.Persistence(
            kind="env",
            where="set the serving container's environment",
            snippet=(
                f'env:\n- name: {ENV_MAX_BATCH_SIZE}\n  value: "{config.max_batch_size}"\n'
                f'- name: {ENV_MAX_QUEUE_TIME_MS}\n  value: "{wait_text}"\n'
            ),
        )
