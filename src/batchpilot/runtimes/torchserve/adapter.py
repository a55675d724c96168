"""TorchServe 0.12 as a BatchPilot runtime: knobs `batch_size` (requests) and
`max_batch_delay` (whole milliseconds), fixed at registration, so applied live by a new
model version (register, set-default, delete the old) and verified by the management
API's description of the new version (its values, every worker READY); for a user's own
archive (`--model-archive`), also by a burst of the user's requests to that version."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import (
    ControlEndpoint,
    Launch,
    LocalServer,
    Persistence,
    Runtime,
    to_native,
)
from batchpilot.runtimes.http import HttpAccess
from batchpilot.runtimes.torchserve.archive import models_entry
from batchpilot.runtimes.torchserve.control import (
    KNOBS,
    MODEL,
    ArchiveStore,
    TorchServeControl,
    UserArchiveControl,
    request_body,
)
from batchpilot.runtimes.torchserve.process import TorchServeProcess
from batchpilot.runtimes.torchserve.user import USER_MODEL_ARCHIVE, load_user_archive

# TorchServe's own defaults: inference on 8080, management on 8081
_MANAGEMENT_PORT_OFFSET = 1


def management_url(url: str) -> str:
    """The management address of a TorchServe BatchPilot did not start: same host, the
    inference port + 1 (TorchServe's defaults are 8080 and 8081)."""
    parts = urlsplit(url.rstrip("/"))
    if parts.port is None:
        raise ValueError(f"{url!r} names no port: give TorchServe's inference address")
    netloc = f"{parts.hostname}:{parts.port + _MANAGEMENT_PORT_OFFSET}"
    return urlunsplit((parts.scheme, netloc, "", "", ""))


class TorchServeRuntime(Runtime[TorchServeControl, TorchServeProcess]):
    name = "torchserve"
    title = "TorchServe 0.12"
    knobs = KNOBS
    how_applied = "reload"
    metrics = Metrics(
        port_note="metrics_address (default :8082), /metrics with metrics_mode=prometheus",
        # TorchServe keeps running latency totals, no histogram: the client's p99 decides
        latency_histogram=None,
        latency_unit="us",
        ok_requests="Requests2XX",
        total_requests='{__name__=~"Requests(2|4|5)XX"}',
    )
    default_model = MODEL
    control_endpoint = ControlEndpoint(
        what="TorchServe's management API (management_address)",
        default="the inference URL's port + 1 on its host (TorchServe's 8080 and 8081)",
    )
    server_name = "TorchServe"
    serves = f"its bundled model {MODEL}"
    user_model_dir = USER_MODEL_ARCHIVE
    user_model_flag = "--model-archive"
    user_model_body = "TorchServe hands each request's body to the handler as it is"

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return RequestProtocol(
            "torchserve-json", f"/predictions/{model or MODEL}", request_body, JSON_HEADERS
        )

    def _control(
        self,
        url: str,
        model: str | None,
        server: LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> TorchServeControl:
        if isinstance(server, TorchServeProcess) and isinstance(server.store, ArchiveStore):
            return UserArchiveControl(
                url,
                management=control_url or server.management_url,
                store=server.store,
                handler_log=server.handler_error,
                access=access,
            )
        if isinstance(server, TorchServeProcess):
            return TorchServeControl(
                url,
                management=control_url or server.management_url,
                model=model or MODEL,
                store=server.store,
                access=access,
            )
        return TorchServeControl(
            url, management=control_url or management_url(url), model=model or MODEL, access=access
        )

    def _launch(self, launch: Launch) -> TorchServeProcess:
        return TorchServeProcess(launch.start, threads=launch.threads)

    def user_model(self, folder: Path) -> str:
        return load_user_archive(folder).name

    def _launch_user(self, folder: Path, threads: int | None) -> TorchServeProcess:
        archive = load_user_archive(folder)
        start = self.canonical(archive.baseline)
        return TorchServeProcess(start, threads=threads, archive=archive)

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str:
        # Checked on TorchServe 0.12 (frontend ModelManager, ManagementRequestHandler,
        # RegisterModelRequest): the version comes from the archive's manifest and
        # registration has no parameter for it, so registering the archive served again
        # answers 409; PUT /models/M?batch_size= scales workers and leaves the values;
        # unregistering then registering failed 40 of 443 requests sent by 16 clients
        # during the change and the 2 s after it (404)
        name = model or MODEL
        return (
            f"{self.title} fixes batch_size and max_batch_delay when a model version is "
            "registered, and takes the version from the archive's MAR-INF/MANIFEST.json "
            "(registration has no version parameter): registering the archive the server "
            'serves again answers HTTP 409 ("Model version ... is already registered"), '
            f"PUT /models/{name}?batch_size=... only scales its workers (the values stay) "
            "and unregistering it to register it again fails the requests that arrive in "
            "between. A change needs an archive of a new version where the server reads it "
            "(its model store, or a URL its allowed_urls admit) and the register and delete "
            "calls, which TorchServe 0.12 refuses unless started with --enable-model-api; "
            "BatchPilot has neither for a server it did not start, so it cannot be changed "
            "from here. Tune your archive on this machine with --local --runtime torchserve "
            "--model-archive FILE.mar --body-template BODY.json, tune the Deployment "
            "through the operator (apply.method: Env), or set the values yourself: put a "
            f"new version of the archive (e.g. {name}-v2.mar, another --version of "
            "torch-model-archiver) into the model store, POST /models?url="
            f"{name}-v2.mar&model_name={name}&batch_size=<requests>&max_batch_delay=<ms>"
            f"&initial_workers=1&synchronous=true, PUT /models/{name}/<new version>/"
            "set-default, and DELETE the old version once its queue is empty"
        )

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        native = to_native(KNOBS, config)
        name = model or MODEL
        entry = models_entry(name, "1.0", f"{name}.mar", native)
        snippet = (
            f"models={json.dumps(entry, separators=(',', ':'))}\n"
            f"# or at run time: POST /models?url={name}.mar&model_name={name}"
            f"&batch_size={int(native['batch_size'])}"
            f"&max_batch_delay={int(native['max_batch_delay'])}&initial_workers=1"
        )
        return Persistence(
            kind="recommend",
            where=(
                f"register model {name} with these values in config.properties (models=, "
                "with your archive's name and version) or through the management API"
            ),
            snippet=snippet,
        )
