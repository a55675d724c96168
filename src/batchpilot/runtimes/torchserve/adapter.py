"""TorchServe 0.12 as a BatchPilot runtime: knobs `batch_size` (requests) and
`max_batch_delay` (whole milliseconds), fixed at registration, so applied live by a new
model version (register, set-default, delete the old) and verified by the management
API's description of the new version (its values, every worker READY)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import (
    ControlEndpoint,
    LocalServer,
    NativeValues,
    Persistence,
    Runtime,
    to_native,
)
from batchpilot.runtimes.torchserve.archive import models_entry
from batchpilot.runtimes.torchserve.control import KNOBS, MODEL, TorchServeControl, request_body
from batchpilot.runtimes.torchserve.process import TorchServeProcess

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

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return RequestProtocol(
            "torchserve-json", f"/predictions/{model or MODEL}", request_body, JSON_HEADERS
        )

    def _control(
        self, url: str, model: str | None, server: LocalServer | None, control_url: str | None
    ) -> TorchServeControl:
        if isinstance(server, TorchServeProcess):
            return TorchServeControl(
                url,
                management=control_url or server.management_url,
                model=model or MODEL,
                store=server.store,
            )
        return TorchServeControl(
            url, management=control_url or management_url(url), model=model or MODEL
        )

    def _launch(
        self, start: BatchingConfig, native: NativeValues, threads: int | None, workload: str | None
    ) -> TorchServeProcess:
        return TorchServeProcess(start, threads=threads)

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str:
        # Checked on TorchServe 0.12: registering the archive it serves again answers
        # 409, and unregistering then registering it failed 40 of 443 requests sent by 16
        # clients during the change and the 2 s after it (404)
        name = model or MODEL
        return (
            f"{self.title} fixes batch_size and max_batch_delay when a model version is "
            "registered, and an archive (.mar) names its version: the archive the server "
            'serves cannot be registered again (HTTP 409 "Model version ... is already '
            'registered"), and unregistering it to register it again fails the requests '
            "that arrive in between. A change needs a new version of the archive in the "
            "server's model store, which is not on this machine, so a server BatchPilot "
            "did not start cannot be changed from here. Tune the bundled model with "
            "--local --runtime torchserve, tune the Deployment through the operator "
            "(apply.method: Env), or set the values yourself: put a new version of the "
            f"archive (e.g. {name}-v2.mar) into the model store, POST /models?url="
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
