"""The HTTP API of the reference server (aiohttp): predict, admin, health and metrics.

Handlers are thin: bodies are checked in `api`, batching decisions live in `batcher`,
model work in `engine`. Every refusal is a JSON `{"error": ...}` with a 4xx status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic_core import to_json

from batchpilot.models import BatchingConfig
from batchpilot.server.api import ApiError, BatchingUpdate, PredictRequest, parse_body
from batchpilot.server.batcher import (
    Batcher,
    BatcherClosed,
    BatchFailed,
    BatchRecord,
    QueueFull,
)
from batchpilot.server.engine import InferenceEngine
from batchpilot.server.inputs import InputError, ModelInput
from batchpilot.server.metrics import ServerMetrics
from batchpilot.server.profile import BatchProfile

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServerOptions:
    batching: BatchingConfig
    queue_limit: int = 1024
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class ServerState:
    """What the handlers share: the engine, the batcher, metrics, profile, readiness."""

    def __init__(self, engine: InferenceEngine, options: ServerOptions) -> None:
        self.engine = engine
        self.options = options
        self.profile = BatchProfile()
        # The model process runs batches in the order it gets them, so one full batch
        # can wait at its door while another computes.
        self.batcher: Batcher[ModelInput, list[int]] = Batcher(
            engine.run_batch,
            options.batching,
            queue_limit=options.queue_limit,
            observer=self,
            ahead=1,
        )
        self.metrics = ServerMetrics(queue_depth=lambda: self.batcher.depth)
        self.metrics.show_config(options.batching)
        self.ready = False
        self.draining = False
        self._config_lock = asyncio.Lock()
        rules = engine.rules
        # What a predict body may be, for error messages; built once, not per request.
        self.predict_allowed = (
            f'{{"inputs": {rules.schema}}} or {{"synthetic": {{"size": 1 to '
            f"{rules.max_size}}}}} ({rules.unit})"
        )

    def batch_done(self, record: BatchRecord[ModelInput]) -> None:
        size = len(record.items)
        self.metrics.batch_size.observe(size)
        self.metrics.batch_compute.observe(record.compute_s)
        for wait in record.queue_waits_s:
            self.metrics.queue_wait.observe(wait)
        if record.error is None:
            rows = sum(x.size for x in record.items)
            self.profile.record(size, record.compute_s, rows)

    async def warm_up(self) -> None:
        await self.engine.warm_up(self.batcher.config.max_batch_size)
        self.ready = True
        log.info("ready: %s", self.batcher.config.label())

    async def reconfigure(self, update: BatchingUpdate) -> BatchingConfig:
        async with self._config_lock:
            old = self.batcher.config
            new = update.merged(old)
            if new == old:
                return old
            # A larger cap is warmed up before it is used, so the first big batch does
            # not pay the allocation cost inside a measurement.
            await self.engine.warm_up(new.max_batch_size)
            self.batcher.set_config(new)
            self.metrics.show_config(new)
            self.metrics.config_changes.inc()
            log.info("batching changed: %s -> %s", old.label(), new.label())
            return new


STATE = web.AppKey("state", ServerState)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (404, 405, 413) become JSON like ours; anything unexpected
    is logged and answered 500 without killing the worker."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == 404:
            message = (
                f"no such endpoint {request.path}: "
                "see docs/runtimes/reference-server.md for the API"
            )
        elif exc.status == 405:
            allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ())))
            message = f"{request.method} is not allowed on {request.path}: use {allowed}"
        return error_response(exc.status, message)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return error_response(500, "internal server error (see the server log)")


async def _read_body(request: web.Request) -> bytes:
    limit = request.app[STATE].options.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            413, f"the body is {request.content_length} bytes: at most {limit} bytes are allowed"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the body is larger than the limit of {limit} bytes") from None


async def _parse_predict(request: web.Request, state: ServerState) -> ModelInput:
    allowed = state.predict_allowed
    body = await _read_body(request)
    payload = parse_body(PredictRequest, body, allowed)
    rules = state.engine.rules
    try:
        if payload.synthetic is not None:
            return rules.synthetic_input(payload.synthetic.size)
        return rules.parse(payload.inputs)
    except InputError as exc:
        raise ApiError(400, str(exc)) from None


async def predict(request: web.Request) -> web.Response:
    state = request.app[STATE]
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        inputs = await _parse_predict(request, state)
    except ApiError as exc:
        state.metrics.count("bad_request")
        return error_response(exc.status, exc.message)
    try:
        done = await state.batcher.submit(inputs)
    except (QueueFull, BatcherClosed) as exc:
        state.metrics.count("rejected")
        return error_response(
            503, f"{exc}: retry later", headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    except BatchFailed as exc:
        state.metrics.count("error")
        return error_response(500, str(exc))
    except asyncio.CancelledError:
        state.metrics.count("cancelled")
        raise
    state.metrics.request_latency.observe(loop.time() - started)
    state.metrics.count("ok")
    # pydantic-core's serializer: a seventh of json.dumps's CPU, on every request.
    body = to_json(
        {
            "model": state.engine.model,
            "size": inputs.size,
            "classes": done.value,
            "batch_size": done.batch_size,
            "queue_ms": round(done.queue_wait_s * 1000.0, 3),
            "compute_ms": round(done.compute_s * 1000.0, 3),
        }
    )
    return web.Response(body=body, content_type="application/json")


def _config_body(config: BatchingConfig) -> dict[str, object]:
    return config.model_dump(mode="json")


async def get_batching(request: web.Request) -> web.Response:
    return web.json_response(_config_body(request.app[STATE].batcher.config))


async def put_batching(request: web.Request) -> web.Response:
    state = request.app[STATE]
    allowed = (
        '{"max_batch_size": integer, "max_queue_time_ms": number}, either field may be '
        "left out to keep its value"
    )
    body = await _read_body(request)
    update = parse_body(BatchingUpdate, body, allowed)
    config = await state.reconfigure(update)
    return web.json_response(_config_body(config))


async def get_profile(request: web.Request) -> web.Response:
    state = request.app[STATE]
    report = state.profile.report(state.engine.model, str(state.engine.device))
    return web.json_response(report.model_dump(mode="json"))


async def delete_profile(request: web.Request) -> web.Response:
    request.app[STATE].profile.reset()
    return await get_profile(request)


async def healthz(request: web.Request) -> web.Response:
    """Alive, and how many model processes died under the server: it answers 500 while
    one is replaced, which a tuner must not read as a slow configuration."""
    engine = request.app[STATE].engine
    return web.json_response(
        {
            "status": "ok",
            "model_process": {"crashes": engine.crashes, "last": engine.last_crash},
        }
    )


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        return web.json_response({"status": "draining"}, status=503)
    if not state.ready:
        return web.json_response({"status": "warming up"}, status=503)
    return web.json_response(
        {
            "status": "ready",
            "model": state.engine.model,
            "device": str(state.engine.device),
            **_config_body(state.batcher.config),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(state: ServerState) -> web.Application:
    # The body limit is enforced by _read_body with a JSON answer; aiohttp's own limit
    # sits just above it as a backstop.
    app = web.Application(
        middlewares=[json_errors], client_max_size=state.options.max_body_bytes + 1
    )
    app[STATE] = state
    app.router.add_post("/v1/predict", predict)
    app.router.add_get("/admin/batching", get_batching)
    app.router.add_put("/admin/batching", put_batching)
    app.router.add_get("/admin/profile", get_profile)
    app.router.add_delete("/admin/profile", delete_profile)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
