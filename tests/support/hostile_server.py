"""A real HTTP server on loopback that answers as a hostile or broken address would: a
body streamed without end, a huge declared length, a body dripped a byte at a time. It
counts what it sent, so a test can show the reader hung up early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

CHUNK = b" " * (64 * 1024)
# what an endless answer would send if nobody hung up: far past any cap
ENDLESS_BYTES = 1024 * 1024 * 1024


@dataclass
class Hostile:
    """Where it listens and what it sent on each path."""

    port: int = 0
    sent: dict[str, int] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _endless(hostile: Hostile, request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    hostile.sent[request.path] = 0
    try:
        await response.write(b'{"max_batch_size": 8, "pad": "')
        while hostile.sent[request.path] < ENDLESS_BYTES:
            await response.write(CHUNK)
            hostile.sent[request.path] += len(CHUNK)
    except (ConnectionError, RuntimeError):
        pass  # the client hung up
    return response


async def _declared(hostile: Hostile, request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "application/json", "Content-Length": str(ENDLESS_BYTES)}
    )
    await response.prepare(request)
    hostile.sent[request.path] = 1
    try:
        await response.write(b"{")
        for _ in range(600):  # the rest never comes; held open until the client leaves
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(0.05)
    except (ConnectionError, RuntimeError):
        pass
    return response


async def _drip(hostile: Hostile, request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    hostile.sent[request.path] = 0
    try:
        while hostile.sent[request.path] < 10_000:
            await response.write(b" ")
            hostile.sent[request.path] += 1
            await asyncio.sleep(0.05)
    except (ConnectionError, RuntimeError):
        pass
    return response


Handler = Callable[[Hostile, web.Request], Awaitable[web.StreamResponse]]


def _bound(
    hostile: Hostile, handler: Handler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(hostile, request)

    return handle


def hostile_app(hostile: Hostile, also: Mapping[str, str] | None = None) -> web.Application:
    """Serves any method on /endless, /declared and /drip, and on each path of `also` as
    the answer it names (one of those three words), counting into `hostile`."""
    handlers: dict[str, Handler] = {"endless": _endless, "declared": _declared, "drip": _drip}
    app = web.Application()
    routes = {f"/{name}": name for name in handlers} | dict(also or {})
    for path, name in routes.items():
        app.router.add_route("*", path, _bound(hostile, handlers[name]))
    return app


@asynccontextmanager
async def hostile_server(also: Mapping[str, str] | None = None) -> AsyncIterator[Hostile]:
    """`hostile_app` on 127.0.0.1 at a free port, in the caller's event loop."""
    hostile = Hostile()
    runner = web.AppRunner(hostile_app(hostile, also))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hostile.port = runner.addresses[0][1]
    try:
        yield hostile
    finally:
        await runner.cleanup()
