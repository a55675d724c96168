"""An API gateway in front of one server, as a user's model server often sits: an
http(s) reverse proxy on 127.0.0.1 that answers 401 to every request without the
credentials it wants and forwards the others, counting both by path."""

from __future__ import annotations

import ssl
from collections import Counter
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web

# hop-by-hop and per-connection headers are the proxy's own, never forwarded
_NOT_FORWARDED = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",  # the body is forwarded decoded
}


class Gateway:
    """`async with Gateway(upstream, header=(name, value))`: its `url` takes what the
    upstream server takes, from clients that send `name: value`."""

    def __init__(
        self,
        upstream: str,
        *,
        header: tuple[str, str],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.header = header
        self._ssl_context = ssl_context
        self.forwarded: Counter[str] = Counter()  # path -> requests forwarded
        self.refused: Counter[str] = Counter()  # path -> requests without the credentials
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl_context)
        await site.start()
        scheme = "https" if self._ssl_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        name, value = self.header
        if request.headers.get(name) != value:
            self.refused[request.path] += 1
            return web.json_response({"error": f"missing or wrong {name}"}, status=401)
        self.forwarded[request.path] += 1
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            data=await request.read(),
            headers=headers,
        ) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_FORWARDED}
            return web.Response(status=answer.status, body=body, headers=kept)
