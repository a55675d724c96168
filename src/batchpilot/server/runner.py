"""The server's life: start listening, warm up, serve, and on SIGTERM drain what is in
flight before exiting 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from dataclasses import dataclass

from aiohttp import web

from batchpilot.server.app import ServerOptions, ServerState, build_app
from batchpilot.server.engine import InferenceEngine

log = logging.getLogger(__name__)

# Every PyTorch op releases the GIL and must take it back to return. While the event loop
# is busy, Python hands the GIL over only every switch interval (5 ms by default), so a
# forward pass of a few ops could wait longer than it computes. 0.5 ms keeps the worker's
# waits short (measured: compute slowed 2.4x beside a busy loop at 5 ms, 1.5x at 0.5 ms).
GIL_SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class ServeSettings:
    host: str
    port: int
    model: str
    device: str
    threads: int
    options: ServerOptions
    drain_timeout_s: float = 30.0


class ServeError(RuntimeError):
    """The server could not start; the message is meant for the person who ran it."""


async def serve(settings: ServeSettings) -> None:
    """Run until SIGTERM or SIGINT, then stop accepting, drain and return."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        engine = InferenceEngine(settings.model, settings.device, settings.threads)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    state = ServerState(engine, settings.options)
    runner = web.AppRunner(
        build_app(state),
        handler_cancellation=True,  # a client that hangs up cancels its request
        access_log=None,
        shutdown_timeout=settings.drain_timeout_s,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        try:
            await site.start()
        except OSError as exc:
            raise ServeError(
                f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
            ) from None
        log.info(
            "serving %s on %s (http://%s:%d), %d torch thread(s), queue limit %d, %s",
            engine.model,
            engine.device,
            settings.host,
            settings.port,
            settings.threads,
            settings.options.queue_limit,
            settings.options.batching.label(),
        )
        state.batcher.start()
        await _run_until_signal(state)
    finally:
        state.draining = True
        in_flight = state.batcher.depth
        log.info("stopping: no new requests; draining %d queued request(s)", in_flight)
        # The batcher flushes its queue without waiting for batches to fill while the
        # runner waits for in-flight handlers (which wait on the batcher).
        closing = asyncio.create_task(state.batcher.close())
        await runner.cleanup()
        await closing
        engine.close()
        log.info("drained; %d batches served", state.batcher.stats.batches)


async def _run_until_signal(state: ServerState) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    warm_up = asyncio.create_task(state.warm_up())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({warm_up, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if warm_up.done() and warm_up.exception() is not None:
            raise ServeError(f"warm-up failed: {warm_up.exception()}")
        await stopped
    finally:
        for task in (warm_up, stopped):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
