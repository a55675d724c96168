"""MLServer 1.7.1 as a BatchPilot runtime: `max_batch_size` (requests) and
`max_batch_time` (seconds) in model-settings.json, changed by loading a new model version
and verified by what the bundled model reports in its answers, or, for a user's own
model folder (`--model-dir`), by MLServer's repository index, the settings it loaded and
its own request counters (recommend-only persistence)."""

from __future__ import annotations

import json
from pathlib import Path

from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.protocols import RequestProtocol, kserve_v2
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import base
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.runtimes.mlserver.control import (
    FEATURES,
    INPUT_NAME,
    KNOBS,
    MODEL,
    MLServerControl,
    UserModelControl,
)
from batchpilot.runtimes.mlserver.process import MLServerProcess
from batchpilot.runtimes.mlserver.user import SETTINGS_FILE, USER_MODEL_DIR, load_user_model

# MLServer labels its HTTP figures with the route's template, the same for every model
INFER_PATH = 'path="/v2/models/{model_name}/infer"'


class MLServerRuntime(base.Runtime[MLServerControl, MLServerProcess]):
    name = "mlserver"
    title = "MLServer 1.7.1"
    knobs = KNOBS
    how_applied = "reload"
    metrics = Metrics(
        port_note="metrics_port (default 8082), /metrics",
        latency_histogram="rest_server_request_duration_seconds",
        latency_unit="s",
        latency_matchers=INFER_PATH,
        # the HTTP layer's counters, not model_infer_request_*: those miss what never
        # reached the model (a 404 while it reloads, a request given up on)
        ok_requests=f'rest_server_requests_total{{{INFER_PATH},status_code=~"2.."}}',
        total_requests=f"rest_server_requests_total{{{INFER_PATH}}}",
    )
    default_model = MODEL
    # MLServer has no management port: its repository API shares the inference port
    control_endpoint = base.ControlEndpoint(
        what="MLServer's model repository API (/v2/repository/models/M/load)",
        default="the inference URL itself",
    )
    server_name = "MLServer"
    serves = f"its bundled model {MODEL}"
    user_model_dir = USER_MODEL_DIR

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return kserve_v2(model or MODEL, input_name=INPUT_NAME, features=FEATURES)

    def _control(
        self,
        url: str,
        model: str | None,
        server: base.LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> MLServerControl:
        if access != DIRECT:
            # only a server BatchPilot started is changed, and it is reached directly
            raise base.LaunchError(self.unchangeable_from_elsewhere(model))
        repository = server.repository if isinstance(server, MLServerProcess) else None
        if isinstance(server, MLServerProcess) and repository is not None and repository.user:
            return UserModelControl(url, repository=repository, metrics_url=server.metrics_url)
        return MLServerControl(
            url, model=model or MODEL, repository=repository, control_url=control_url
        )

    def _launch(self, launch: base.Launch) -> MLServerProcess:
        return MLServerProcess(launch.start, threads=launch.threads)

    def user_model(self, folder: Path) -> str:
        return load_user_model(folder).name

    def _launch_user(self, folder: Path, threads: int | None) -> MLServerProcess:
        user = load_user_model(folder)
        start = base.from_native(KNOBS, user.baseline)
        return MLServerProcess(start, threads=threads, user=user)

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str:
        # MLServer 1.7.1's repository load (REST and gRPC) takes a model name and nothing
        # else; the settings come from the model-settings.json files it finds on disk
        name = model or MODEL
        return (
            f"{self.title} reads max_batch_size and max_batch_time only from the model's "
            f"{SETTINGS_FILE} when it loads the model (its repository API's load takes a "
            "model name and no settings, over HTTP and gRPC alike), so a server BatchPilot "
            "did not start cannot be changed from here. Tune the bundled model with "
            "--local --runtime mlserver, tune the Deployment through the operator "
            "(apply.method: Env), or set the values yourself: write "
            f'{{"name": "{name}", "max_batch_size": <requests>, "max_batch_time": '
            f'<seconds>, "parameters": {{"version": "<a new version>"}}}} into the '
            f"{SETTINGS_FILE} of a new version folder of model {name}, remove the serving "
            f"version's folder, and POST /v2/repository/models/{name}/load (a load of the "
            "version already loaded turns adaptive batching off)"
        )

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> base.Persistence:
        native = base.to_native(KNOBS, config)
        name = model or MODEL
        snippet = json.dumps(
            {
                "name": name,
                "max_batch_size": int(native["max_batch_size"]),
                "max_batch_time": float(native["max_batch_time"]),
            },
            indent=2,
        )
        return base.Persistence(
            kind="recommend",
            where=f"write model-settings.json of model {name} with these keys",
            snippet=snippet,
        )
