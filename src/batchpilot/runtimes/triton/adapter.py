"""Triton Inference Server as a BatchPilot runtime: `max_batch_size` and
`dynamic_batching.max_queue_delay_microseconds` (whole µs) changed live through explicit
model control, verified by Triton's configuration read back and the model READY, with the
batch sizes Triton executes right after the change as an extra check where its metrics
are reachable; kept by the exact `config.pbtxt` lines (recommend-only). Requests are
built from the model's own metadata (`loadgen.v2model`), so a model of the user's own
is sent the inputs it declares."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from typing_extensions import Unpack

from batchpilot.capacity.promql import Metrics, with_matchers
from batchpilot.errors import RequestShapeError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, error_message, text_capped
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol, v2_path
from batchpilot.loadgen.v2model import (
    REQUEST_FLAGS,
    MetadataError,
    fetch_v2_model,
    given_by,
    v2_model_protocol,
)
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import (
    ControlEndpoint,
    ControlOptions,
    Launch,
    LocalServer,
    NativeValues,
    Persistence,
    Runtime,
    Verification,
    batch_knob,
    representable,
    wait_knob,
)
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.runtimes.triton.control import (
    TritonControl,
    TritonCounters,
    TritonError,
    batches_since,
    effective_preferred,
    parse_counters,
)
from batchpilot.runtimes.triton.install import TRITON_VERSION
from batchpilot.runtimes.triton.process import TritonProcess
from batchpilot.runtimes.triton.repository import (
    INPUT_NAME,
    MODEL_NAME,
    TritonBatching,
    batching_pbtxt,
)

log = logging.getLogger(__name__)

# Triton's default metrics port, for a server BatchPilot did not start.
DEFAULT_METRICS_PORT = 8002
# Requests sent at once right after a change to see the batches Triton forms: twice
# the cap fills at least one batch to the cap when Triton can; bounded so a large cap
# does not turn verification into a load test.
_VERIFY_MAX_REQUESTS = 64
_VERIFY_TIMEOUT_S = 30.0
_VERIFY_BURSTS = 2

BATCH_KNOB = batch_knob("max_batch_size")
DELAY_KNOB = wait_knob("max_queue_delay_microseconds", "us", integer=True)


def row_body(size: int, input_name: str = INPUT_NAME) -> bytes:
    """A v2 inference request holding one FP32 row of `size` values (shape [1, size]).
    One row per request keeps Triton's `max_batch_size`, which counts rows along the
    batch dimension, a count of requests as BatchPilot's knob is."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    tensor = {"name": input_name, "shape": [1, size], "datatype": "FP32", "data": [1.0] * size}
    return json.dumps({"inputs": [tensor]}).encode()


def triton_protocol(model: str, input_name: str = INPUT_NAME) -> RequestProtocol:
    """The KServe v2 / Triton HTTP inference protocol, one row per request."""
    row_body(1, input_name)

    def body(size: int) -> bytes:
        return row_body(size, input_name)

    return RequestProtocol("v2", v2_path(model), body, JSON_HEADERS)


def metrics_endpoint(url: str) -> str:
    """Triton's metrics URL from a base URL; one that already names a path is kept."""
    trimmed = url.rstrip("/")
    return trimmed if urlsplit(trimmed).path else f"{trimmed}/metrics"


def to_batching(values: NativeValues) -> TritonBatching:
    return TritonBatching(
        max_batch_size=int(values[BATCH_KNOB.native]),
        max_queue_delay_microseconds=int(values[DELAY_KNOB.native]),
    )


def native_of(batching: TritonBatching) -> NativeValues:
    return {
        BATCH_KNOB.native: batching.max_batch_size,
        DELAY_KNOB.native: batching.max_queue_delay_microseconds,
    }


def check_batches(
    cap: int, batches: dict[int, int], counters: TritonCounters
) -> tuple[str, str | None]:
    """What the batches executed after a change say: (how it was verified, the reason it
    failed or None). Triton never forms a batch above its cap, so one above the new cap
    means the old configuration still serves."""
    if batches:
        largest = max(batches)
        if largest > cap:
            return "", f"Triton executed batches of {largest} requests above the new cap {cap}"
        return f"executed batch sizes {batches} (Triton's statistics)", None
    mean = counters.mean_batch
    if math.isnan(mean):
        # the requests were answered, so these metrics are not this model's on this
        # server (another server's port, a metrics endpoint elsewhere): nothing to check
        return "executed batches not seen in the metrics (not this server's?)", None
    if mean > cap:
        return "", f"Triton's mean executed batch {mean:.2f} is above the new cap {cap}"
    return f"mean executed batch {mean:.2f} (nv_inference_count/exec_count)", None


def refused_requests(
    failed: list[tuple[int | None, str]], model: str, given: str | None = None
) -> str | None:
    """What to tell the user when the server refused the requests with a 4xx (the
    request, not the server, is wrong): its message and the flags that set the requests
    (`given`: the flags that gave these); None when no answer was a 4xx."""
    what = "built" if given is None else f"{given} gave"
    for status, text in failed:
        if status is not None and 400 <= status < 500:
            return (
                f"Triton refused the requests {what} for model {model!r} (HTTP {status}: "
                f"{error_message(text)}); give requests it accepts: {REQUEST_FLAGS}"
            )
    return None


def failure_text(status: int | None, text: str) -> str:
    """One failed request of a burst, for people."""
    return text if status is None else f"HTTP {status}: {text}"


@dataclass(frozen=True)
class _Readings:
    """One look at what Triton counted: batches by size from its statistics, its metrics
    text (inference and execution counters); `unread` says why neither could be read."""

    stats: dict[int, float] | None
    metrics: str | None
    unread: str


class TritonRuntimeControl:
    """The tuner's Target for one model on one Triton: live change by explicit model
    control, verified by read-back and READY, and by the batches executed after the
    change where Triton's metrics are reachable. Requests follow `protocol`, or the
    model's own metadata when it is None."""

    def __init__(
        self,
        url: str,
        *,
        model: str,
        metrics_url: str,
        protocol: RequestProtocol | None = None,
        access: HttpAccess = DIRECT,
    ) -> None:
        self.control = TritonControl(url, metrics_url, model, access=access)
        self.url = self.control.url
        self.access = access
        self.protocol = protocol
        # the flags that gave the user's own requests (None: built from the metadata)
        self._given = None if protocol is None else given_by(protocol)
        self.last_verification: Verification | None = None

    async def request_protocol(self, override: RequestProtocol | None = None) -> RequestProtocol:
        """The requests the model takes: `override` when given (the user's own body),
        else built once from the model's metadata. TritonError says why none can be
        built (metadata unreadable, an input such as BYTES that needs a sample)."""
        if override is not None:
            self.protocol = override
            self._given = given_by(override)
        if self.protocol is None:
            try:
                model = await fetch_v2_model(
                    self.url,
                    self.control.model,
                    triton_config=True,
                    headers=self.access.headers,
                    tls=self.access.tls(),
                )
                self.protocol = self.access.applied_to(v2_model_protocol(model))
            except MetadataError as exc:
                raise TritonError(str(exc)) from None
        return self.protocol

    async def native(self) -> NativeValues:
        return native_of(await self.control.batching())

    async def current(self) -> BatchingConfig:
        return TritonRuntime().canonical(await self.native())

    async def apply(self, config: BatchingConfig) -> None:
        runtime = TritonRuntime()
        try:
            wanted = to_batching(runtime.native(config))
        except ValueError as exc:
            raise TritonError(str(exc)) from None
        protocol = await self.request_protocol()
        started = time.monotonic()
        change = await self.control.apply(wanted)
        live = runtime.canonical(native_of(change.live))
        if live != representable(runtime.knobs, config):
            raise TritonError(f"asked for {config.label()}, Triton runs {live.label()}")
        batches, how = await self._executed(wanted.max_batch_size, protocol)
        self.last_verification = Verification(
            requested=config,
            live=live,
            native=native_of(change.live),
            batch_sizes=batches or None,
            verified_by=(
                f"config read-back (preferred_batch_size {list(change.preferred)}), "
                f"model READY; {how}"
            ),
            change_s=time.monotonic() - started,
        )

    async def persistence(self, config: BatchingConfig) -> Persistence:
        """The `config.pbtxt` lines of `config` with the preferred batch sizes it ran
        with, decided from the model's original configuration as every trial's were."""
        batching = to_batching(TritonRuntime().native(config))
        preferred = effective_preferred(await self.control.original(), batching.max_batch_size)
        return recommended(self.control.model, batching_pbtxt(batching, preferred))

    async def _executed(self, cap: int, protocol: RequestProtocol) -> tuple[dict[int, int], str]:
        """Send a burst of requests and read the batches Triton executed meanwhile. The
        old instance may still finish a batch it held when the load returned: a batch
        above the cap is looked at again with a second burst before the change fails.
        Requests refused with a 4xx stop at once (RequestShapeError): they are shaped
        wrong for this model, which no retry changes. Metrics that cannot be read leave
        the batches unchecked: the read-back has verified the change."""
        problem = ""
        for _ in range(_VERIFY_BURSTS):
            before = await self._readings()
            failed = await self._burst(min(2 * cap, _VERIFY_MAX_REQUESTS), protocol)
            if failed:
                refused = refused_requests(failed, self.control.model, self._given)
                if refused is not None:
                    raise RequestShapeError(refused)
                raise TritonError(
                    f"{len(failed)} requests failed right after the change: "
                    + failure_text(*failed[0])
                )
            after = await self._readings()
            if before.unread and after.unread:
                return {}, f"executed batches not checked ({before.unread})"
            model = self.control.model
            batches = {}
            if before.stats is not None and after.stats is not None:
                batches = batches_since(after.stats, before.stats)
            counters = TritonCounters()
            if before.metrics is not None and after.metrics is not None:
                counters = parse_counters(after.metrics, model).since(
                    parse_counters(before.metrics, model)
                )
            how, found = check_batches(cap, batches, counters)
            if found is None:
                return batches, how
            problem = found
        raise TritonError(problem)

    async def _readings(self) -> _Readings:
        """The model's batch statistics and Triton's metrics text, each None (with why in
        `unread`) when it cannot be read."""
        unread: list[str] = []
        try:
            stats: dict[int, float] | None = await self.control.batch_stats()
        except TritonError as exc:
            stats = None
            unread.append(str(exc))
        try:
            metrics: str | None = await self.control.metrics_text()
        except TritonError as exc:
            metrics = None
            unread.append(str(exc))
        if unread:
            log.info("executed batches partly unread: %s", "; ".join(unread))
        return _Readings(stats, metrics, "; ".join(unread) if len(unread) == 2 else "")

    async def _burst(self, n: int, protocol: RequestProtocol) -> list[tuple[int | None, str]]:
        """`n` requests at once; for those that did not answer 2xx, (HTTP status, the
        answer's body) or (None, what went wrong)."""
        url = self.url + protocol.path
        body = protocol.body(1)
        timeout = aiohttp.ClientTimeout(total=_VERIFY_TIMEOUT_S)
        async with self.access.session(timeout) as session:

            async def one() -> tuple[int | None, str] | None:
                try:
                    async with session.post(
                        url, data=body, headers=dict(protocol.headers)
                    ) as response:
                        text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                        if 200 <= response.status < 300:
                            return None
                        return response.status, text[:200]
                except (aiohttp.ClientError, TimeoutError, BodyTooLarge) as exc:
                    return None, f"{type(exc).__name__}: {exc}"

            results = await asyncio.gather(*(one() for _ in range(n)))
        return [r for r in results if r is not None]


def recommended(model: str, snippet: str) -> Persistence:
    return Persistence(
        kind="recommend",
        where=(
            f"replace these lines in config.pbtxt of model {model!r} (in its model "
            "repository or the ConfigMap holding it; a live change does not survive a "
            "restart)"
        ),
        snippet=snippet,
    )


class TritonRuntime(Runtime[TritonRuntimeControl, TritonProcess]):
    name = "triton"
    title = f"Triton Inference Server {TRITON_VERSION}"
    knobs = (BATCH_KNOB, DELAY_KNOB)
    how_applied = "live"
    metrics = Metrics(
        port_note=f":{DEFAULT_METRICS_PORT}/metrics (--metrics-port)",
        # duration counters and per-pod summaries: no histogram in Triton 2.51
        latency_histogram=None,
        latency_unit="us",
        ok_requests="nv_inference_request_success",
        total_requests='{__name__=~"nv_inference_request_success|nv_inference_request_failure"}',
        batch_size="sum(rate(nv_inference_count[1m])) / sum(rate(nv_inference_exec_count[1m]))",
        latency_summary="nv_inference_request_summary_us",
    )
    default_model = MODEL_NAME
    # model control is on the inference port; the verification reads the metrics port
    control_endpoint = ControlEndpoint(
        what="Triton's metrics endpoint (http://HOST:PORT, /metrics is added)",
        default=f"port {DEFAULT_METRICS_PORT} on the host of the inference URL",
    )
    server_name = "Triton"
    serves = f"one bundled model ({MODEL_NAME})"

    def metrics_for(self, model: str | None = None) -> Metrics:
        """Triton labels every series with `model`."""
        matcher = f'model="{model or MODEL_NAME}"'
        metrics = self.metrics
        return metrics.model_copy(
            update={
                "latency_matchers": matcher,
                "ok_requests": with_matchers(metrics.ok_requests, matcher),
                "total_requests": with_matchers(metrics.total_requests, matcher),
            }
        )

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return triton_protocol(model or MODEL_NAME)

    def control(
        self,
        url: str,
        *,
        metrics_url: str | None = None,
        **options: Unpack[ControlOptions],
    ) -> TritonRuntimeControl:
        """`metrics_url` (or `control_url`, its base) defaults to the local server's,
        else port 8002 on the URL's host."""
        if metrics_url is not None:
            options["control_url"] = metrics_url
        return super().control(url, **options)

    def _control(
        self,
        url: str,
        model: str | None,
        server: LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> TritonRuntimeControl:
        if control_url is not None:
            metrics_url = metrics_endpoint(control_url)
        elif isinstance(server, TritonProcess):
            metrics_url = server.metrics_url
        else:
            host = urlsplit(url).hostname or "127.0.0.1"
            metrics_url = f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"
        return TritonRuntimeControl(
            url, model=model or MODEL_NAME, metrics_url=metrics_url, access=access
        )

    def _launch(self, launch: Launch) -> TritonProcess:
        return TritonProcess(to_batching(launch.native), threads=launch.threads)

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        """Without the model's original configuration at hand, the preferred batch size
        is the cap (a model that pins none); a control knows the original
        (`TritonRuntimeControl.persistence`)."""
        return recommended(model or MODEL_NAME, batching_pbtxt(to_batching(self.native(config))))
