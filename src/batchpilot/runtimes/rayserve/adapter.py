"""Ray Serve as a BatchPilot runtime: `@serve.batch`'s `max_batch_size` (requests) and
`batch_wait_timeout_s` (seconds), carried by the deployment's `user_config` and applied
live (Serve calls the replica's reconfigure(), which sets them on the batcher); verified
by the Serve REST API (the user_config read back, every replica RUNNING after its
rollout); kept by the RayService's serveConfigV2 snippet (recommend-only)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from typing_extensions import Unpack

from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import (
    ControlEndpoint,
    ControlOptions,
    Knob,
    Launch,
    LaunchError,
    LocalServer,
    Persistence,
    Runtime,
    batch_knob,
    wait_knob,
)
from batchpilot.runtimes.http import HttpAccess
from batchpilot.runtimes.rayserve.config import (
    APP_NAME,
    BATCH_KEY,
    DEPLOYMENT,
    WAIT_KEY,
    service_snippet,
    split_model,
)
from batchpilot.runtimes.rayserve.control import RayServeControl
from batchpilot.runtimes.rayserve.process import RAY_VERSION, RayServeProcess

# Ray's default dashboard port (the Serve REST API), for a cluster BatchPilot did not start.
DEFAULT_DASHBOARD_PORT = 8265
APP_PATH = "/"

KNOBS: tuple[Knob, Knob] = (batch_knob(BATCH_KEY), wait_knob(WAIT_KEY, "s"))


def app_body(size: int) -> bytes:
    """The bundled app's request: {"size": N}."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return json.dumps({"size": size}).encode()


def ray_protocol(path: str = APP_PATH) -> RequestProtocol:
    return RequestProtocol("ray-json", path, app_body, JSON_HEADERS)


def app_metrics(app: str) -> Metrics:
    """Serve's HTTP proxy figures for application `app` (verified against Ray 2.60's
    export: histogram in ms, labels application, route, method, status_code)."""
    return Metrics(
        port_note=":8080/metrics on every node (ray start --metrics-export-port), ~10 s late",
        latency_histogram="ray_serve_http_request_latency_ms",
        latency_unit="ms",
        latency_matchers=f'application="{app}"',
        ok_requests=f'ray_serve_num_http_requests_total{{application="{app}",status_code=~"2.."}}',
        total_requests=f'ray_serve_num_http_requests_total{{application="{app}"}}',
        batch_size="sum(rate(ray_serve_actual_batch_size_sum[1m])) / "
        "sum(rate(ray_serve_actual_batch_size_count[1m]))",
        # the proxy pushes its figures to the node's exporter every 10 s
        export_delay_s=10.0,
    )


class RayServeRuntime(Runtime[RayServeControl, RayServeProcess]):
    name = "ray"
    title = f"Ray Serve {RAY_VERSION}"
    knobs = KNOBS
    how_applied = "live"
    metrics = app_metrics(APP_NAME)
    # APP or APP/DEPLOYMENT
    default_model = f"{APP_NAME}/{DEPLOYMENT}"
    control_endpoint = ControlEndpoint(
        what="Ray's dashboard (the Serve REST API, /api/serve/applications/)",
        default=f"port {DEFAULT_DASHBOARD_PORT} on the host of the inference URL",
    )
    server_name = "Ray Serve"
    serves = f"one bundled app ({APP_NAME})"

    def protocol(self, model: str | None = None) -> RequestProtocol:
        """The bundled app's JSON at its route prefix; the model names a deployment, not
        a path, so it does not change the requests."""
        return ray_protocol()

    def metrics_for(self, model: str | None = None) -> Metrics:
        app, _ = split_model(model or f"{APP_NAME}/{DEPLOYMENT}")
        return app_metrics(app)

    def control(
        self,
        url: str,
        *,
        dashboard_url: str | None = None,
        **options: Unpack[ControlOptions],
    ) -> RayServeControl:
        """`dashboard_url` (the Serve REST API; `control_url` is the same) defaults to
        the local cluster's, else port 8265 on the URL's host."""
        if dashboard_url is not None:
            options["control_url"] = dashboard_url
        return super().control(url, **options)

    def _control(
        self,
        url: str,
        model: str | None,
        server: LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> RayServeControl:
        dashboard_url = control_url
        if dashboard_url is None:
            if isinstance(server, RayServeProcess):
                dashboard_url = server.dashboard_url
            else:
                host = urlsplit(url).hostname or "127.0.0.1"
                dashboard_url = f"http://{host}:{DEFAULT_DASHBOARD_PORT}"
        name = model or f"{APP_NAME}/{DEPLOYMENT}"
        try:
            split_model(name)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        return RayServeControl(
            url,
            dashboard_url=dashboard_url,
            model=name,
            knobs=self.knobs,
            protocol=access.applied_to(self.protocol(name)),
            access=access,
        )

    def _launch(self, launch: Launch) -> RayServeProcess:
        return RayServeProcess(launch.native, threads=launch.threads)

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        app, deployment = split_model(model or f"{APP_NAME}/{DEPLOYMENT}")
        return Persistence(
            kind="recommend",
            where=(
                f"set the user_config of deployment {deployment or DEPLOYMENT!r} in "
                f"application {app!r} in the RayService's spec.serveConfigV2 (or the "
                "config file `serve deploy` takes; a live change is lost when the cluster "
                "restarts)"
            ),
            snippet=service_snippet(
                self.native(config), app=app, deployment=deployment or DEPLOYMENT
            ),
        )
