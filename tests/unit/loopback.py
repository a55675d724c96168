"""An aiohttp application served on an ephemeral loopback port, for the unit tests of a
client layer that need a real HTTP exchange."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestServer


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` on 127.0.0.1 at a free port while the block runs; its base URL."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
