"""The tuner's Target for one Ray Serve deployment: a change is a PUT of the running
deploy configuration with the deployment's user_config changed (Serve calls each
replica's reconfigure(), no restart), verified by Ray Serve itself through its REST API:
the user_config read back, the deployment HEALTHY and every replica RUNNING once the
rollout of that user_config is over. The app's answers play no part, so an app that does
not report its batching tunes the same; `burst` reads the bundled app's reports for the
tests that check the server-side verification against them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from batchpilot.errors import TargetError
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import burst
from batchpilot.runtimes.base import Knob, NativeValues, Verification, from_native, to_native
from batchpilot.runtimes.http import DIRECT, ControlClient, HttpAccess
from batchpilot.runtimes.rayserve.config import (
    RECORD_KEYS,
    DeploymentState,
    RayServeError,
    deployment_state,
    native_of,
    redeploy_config,
    route_prefix,
    same_values,
    split_model,
    under_prefix,
)

APPLICATIONS_PATH = "/api/serve/applications/"
_POLL_S = 0.1


def _record(answer: Any) -> dict[str, Any] | None:
    """The bundled app's record: its answer, when it holds every key of one."""
    if isinstance(answer, dict) and all(key in answer for key in RECORD_KEYS):
        return answer
    return None


class RayServeControl:
    """Changes, reads and verifies one deployment's batching knobs through the
    dashboard's Serve REST API (`dashboard_url`); `url` is the app's."""

    def __init__(
        self,
        url: str,
        *,
        dashboard_url: str,
        model: str,
        knobs: tuple[Knob, Knob],
        protocol: RequestProtocol,
        timeout_s: float = 30.0,
        settle_timeout_s: float = 60.0,
        access: HttpAccess = DIRECT,
    ) -> None:
        self.access = access
        self._app = ControlClient(url, timeout_s=timeout_s, access=access)
        self._dashboard = ControlClient(dashboard_url, timeout_s=timeout_s, access=access)
        # A PUT that timed out may still be under way: never sent twice.
        self._deployer = ControlClient(
            dashboard_url, timeout_s=timeout_s, attempts=1, access=access
        )
        self.url = self._app.url
        self.dashboard_url = self._dashboard.url
        self.model = model
        self.knobs = knobs
        # paths relative to the application's root until `request_protocol` puts them
        # under the route prefix Serve reports
        self._relative = protocol
        self.protocol = protocol
        self._timeout_s = timeout_s
        self._settle_timeout_s = settle_timeout_s
        self.last_verification: Verification | None = None

    async def details(self) -> dict[str, Any]:
        data = await self._dashboard.call("GET", APPLICATIONS_PATH)
        if not isinstance(data, dict):
            raise RayServeError(f"GET {APPLICATIONS_PATH} did not answer a JSON object")
        return data

    async def state(self) -> DeploymentState:
        return deployment_state(await self.details(), self.model)

    async def native(self) -> NativeValues:
        state = await self.state()
        return native_of(state.user_config, f"deployment {state.app}/{state.deployment}")

    async def current(self) -> BatchingConfig:
        return from_native(self.knobs, await self.native())

    async def request_protocol(self, override: RequestProtocol | None = None) -> RequestProtocol:
        """The requests under the route prefix Serve reports for the application (a
        user's app is seldom at '/'): the app's own, or `override` (the user's body or
        protocol, its path relative to the app's root)."""
        if override is not None:
            self._relative = override
        app, _ = split_model(self.model)
        prefix = route_prefix(await self.details(), app)
        self.protocol = dataclasses.replace(
            self._relative, path=under_prefix(prefix, self._relative.path)
        )
        return self.protocol

    async def burst(self, n: int) -> list[Mapping[str, Any]]:
        """`n` concurrent requests to the app; the answers' records. TargetError on any
        non-2xx answer or an answer without the bundled app's record."""
        return await burst.burst(
            self.url + self.protocol.path,
            self.protocol.body(1),
            self.protocol.headers,
            n,
            timeout_s=self._timeout_s,
            record=_record,
            bundled="bundled app",
            error=RayServeError,
            access=self.access,
        )

    async def apply(self, config: BatchingConfig) -> None:
        try:
            native = to_native(self.knobs, config)
        except ValueError as exc:
            raise RayServeError(str(exc)) from None
        started = time.monotonic()
        details = await self.details()
        before = deployment_state(details, self.model)
        try:
            await self._deployer.call(
                "PUT", APPLICATIONS_PATH, redeploy_config(details, before, native), empty_ok=True
            )
        except TargetError as exc:
            raise RayServeError(f"Ray Serve refused the new user_config: {exc}") from None
        after = await self._settled(native)
        same = bool(before.replica_pids) and after.replica_pids == before.replica_pids
        self.last_verification = Verification(
            requested=config,
            live=from_native(self.knobs, native_of(after.user_config, "the deployment")),
            native=native,
            verified_by=(
                f"Serve REST API: user_config read back, deployment {after.status}, "
                f"its {len(after.replica_states)} replica(s) RUNNING"
                + (" (same replica processes)" if same else " (replicas replaced)")
            ),
            change_s=time.monotonic() - started,
        )

    async def _settled(self, native: Mapping[str, float]) -> DeploymentState:
        """Poll the REST API until the deployment reports the new user_config and Serve
        has rolled it out: healthy, every replica RUNNING (a replica reports UPDATING
        while its reconfigure() runs with the new user_config)."""
        deadline = time.monotonic() + self._settle_timeout_s
        while True:
            state = await self.state()
            reported = state.user_config
            if (
                state.settled
                and all(k in reported for k in native)
                and same_values(native_of(reported, "the deployment"), native)
            ):
                return state
            if time.monotonic() >= deadline:
                raise RayServeError(
                    f"deployment {state.app}/{state.deployment} did not settle on "
                    f"{dict(native)} within {self._settle_timeout_s:g} s: {state.describe()}, "
                    f"user_config {reported}"
                )
            await asyncio.sleep(_POLL_S)
