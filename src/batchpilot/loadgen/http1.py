"""The generator's HTTP/1.1 client: keep-alive connections, one request on a connection at a
time, requests prepared as bytes before the run, responses parsed by httptools (llhttp).

Why not aiohttp here: on the hot path a general client builds every request anew and hands
each response through several coroutines before the caller sees it. Against a 3 ms Triton
that cost the measured p50 0.4 ms over NVIDIA's Perf Analyzer from the same send, and
twice its CPU a request (benchmarks/loadgen_accuracy.py --target triton). Here a send is
one `transport.write` of bytes made before the run, and a response is timed in the
protocol callback that completes it, before any task wakes up. Control calls (reachability,
warm-up) still use aiohttp: only the load's own requests come through here.

The connection limit is the client's: a request that finds every connection busy waits,
first come first served, for one to be freed, and the wait is reported (`on_wait`)."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import httptools
from yarl import URL

__all__ = ["BadResponseError", "BodySink", "Http1Client", "Origin", "Prepared", "prepare"]

_USER_AGENT = "batchpilot"
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class BadResponseError(Exception):
    """The server's answer was not a valid HTTP/1.1 response."""


class BodySink(Protocol):
    """Takes a response's body as it arrives (a token stream read as it is timed)."""

    def feed(self, data: bytes, at: float) -> None:
        """Body bytes received at loop time `at`."""

    def finish(self, at: float) -> None:
        """The response completed at loop time `at`."""


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int


class Prepared(NamedTuple):
    """One request ready to go: where to, and its bytes on the wire."""

    origin: Origin
    data: bytes


def prepare(url: URL, body: bytes, headers: Mapping[str, str]) -> Prepared:
    """POST `body` to `url` with `headers` (Host, Content-Length and the connection's own
    headers are set here). Raises ValueError for a URL that is not absolute http(s) or a
    header that would break the request."""
    if url.scheme not in ("http", "https") or not url.raw_host:
        raise ValueError(f"request URL must be absolute http:// or https://, got {str(url)!r}")
    port = url.port
    if port is None:
        raise ValueError(f"request URL has no port and no default one: {str(url)!r}")
    host = url.raw_host
    host_header = f"[{host}]" if ":" in host else host
    if url.explicit_port is not None:
        host_header += f":{url.explicit_port}"
    lines = [
        f"POST {url.raw_path_qs or '/'} HTTP/1.1",
        f"Host: {host_header}",
        f"User-Agent: {_USER_AGENT}",
    ]
    for name, value in headers.items():
        if not name or any(c in name for c in ":\r\n ") or any(c in value for c in "\r\n"):
            raise ValueError(f"header {name!r}: {value!r} is not a valid HTTP header")
        if name.lower() in _RESERVED_HEADERS:
            continue  # set here, from the body and the connection
        lines.append(f"{name}: {value}")
    lines += [f"Content-Length: {len(body)}", "", ""]
    try:
        head = "\r\n".join(lines).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"request headers must be latin-1 text: {exc}") from exc
    return Prepared(Origin(url.scheme, host, port), head + body)


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the response it is waiting for."""

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: Origin) -> None:
        self.loop = loop
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.on_close: Callable[[_Connection], None] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, float]] | None = None
        self._sink: BodySink | None = None
        self._headers_done = False
        self._framed = False
        self._keep_alive = True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponseError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(BadResponseError(f"invalid HTTP response: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._headers_done and not self._framed:
                # a body delimited by the end of the connection (no length, not chunked)
                self._complete()
            else:
                waiter.set_exception(
                    ConnectionResetError("the server closed the connection before answering")
                    if exc is None
                    else exc
                )
        if self.on_close is not None:
            self.on_close(self)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink.feed(body, self.loop.time())

    def on_message_complete(self) -> None:
        self._complete()

    # the client's side

    @property
    def idle_usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes, sink: BodySink | None = None) -> asyncio.Future[tuple[int, float]]:
        """Write one request; the future gets (status, loop time the response completed).
        `sink` (if any) takes the response's body as it arrives."""
        assert self.transport is not None
        self._waiter = waiter = self.loop.create_future()
        self._sink = sink
        self._headers_done = self._framed = False
        self.transport.write(data)
        return waiter

    @property
    def reusable(self) -> bool:
        return self._keep_alive and self.idle_usable

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()  # connection_lost follows on the next loop pass
        self.closed = True

    def _complete(self) -> None:
        done = self.loop.time()
        waiter, self._waiter = self._waiter, None
        sink, self._sink = self._sink, None
        if sink is not None and waiter is not None and not waiter.done():
            sink.finish(done)
        self._keep_alive = self._parser.should_keep_alive()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), done))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self._sink = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()


class Http1Client:
    """At most `limit` connections over all origins; `request` sends one prepared request
    and returns (status, loop time its response completed). https is verified with `tls`
    (True: the system's trust store) against `server_name`, or each origin's host when None.
    `on_wait(queued_at)` is called when a request starts waiting for a free connection and
    `on_waited(ms)` when it gets one. Close with `close()` (or `async with`)."""

    def __init__(
        self,
        *,
        limit: int,
        tls: ssl.SSLContext | bool = True,
        server_name: str | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"connection limit must be ≥ 1, got {limit}")
        self.limit = limit
        self._tls = tls
        self._server_name = server_name
        self._context: ssl.SSLContext | None = None
        self._open = 0  # connections open or opening: the slots taken
        self._idle: dict[Origin, list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.on_close = None
                conn.close()
        self._idle.clear()
        for conn in self._busy:
            conn.on_close = None
            conn.close()
        self._busy.clear()
        self._open = 0

    def send_now(
        self, prepared: Prepared, sink: BodySink | None = None
    ) -> asyncio.Future[tuple[int, float]] | None:
        """Send on an idle connection to the request's origin at once, without a task: the
        future gets (status, loop time the response completed); cancelling it abandons the
        request and its connection. None when no connection to that origin is idle
        (`request` then connects or waits). `sink` takes the response's body as it
        arrives."""
        conn = self._idle_connection(prepared.origin)
        return None if conn is None else self._send(conn, prepared.data, sink)

    async def request(
        self,
        prepared: Prepared,
        *,
        on_wait: Callable[[float], None] | None = None,
        on_waited: Callable[[float], None] | None = None,
        sink: BodySink | None = None,
    ) -> tuple[int, float]:
        """Send one request, connecting or waiting for a free connection as needed;
        returns (status, loop time its response completed). `sink` takes the response's
        body as it arrives."""
        conn = await self._acquire(prepared.origin, on_wait, on_waited)
        return await self._send(conn, prepared.data, sink)

    def _send(
        self, conn: _Connection, data: bytes, sink: BodySink | None = None
    ) -> asyncio.Future[tuple[int, float]]:
        self._busy.add(conn)
        sent = conn.send(data, sink)
        sent.add_done_callback(lambda done: self._after(conn, done))
        return sent

    def _after(self, conn: _Connection, sent: asyncio.Future[tuple[int, float]]) -> None:
        """A request on `conn` ended: keep the connection for the next one if it finished
        well, else close it (cancelled or failed mid-request, its state is unknown)."""
        self._busy.discard(conn)
        if not sent.cancelled() and sent.exception() is None and conn.reusable:
            self._release(conn)
        else:
            conn.on_close = None
            conn.close()
            self._free_slot()

    async def _acquire(
        self,
        origin: Origin,
        on_wait: Callable[[float], None] | None,
        on_waited: Callable[[float], None] | None,
    ) -> _Connection:
        if (conn := self._idle_connection(origin)) is not None:
            return conn
        if self._open >= self.limit and not self._waiters and self._evict_idle():
            self._open -= 1
        if self._open < self.limit:
            self._open += 1
            return await self._connect_in_slot(origin)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_Connection | None] = loop.create_future()
        self._waiters.append(waiter)
        queued_at = loop.time()
        if on_wait is not None:
            on_wait(queued_at)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # handed a slot in the same pass as the cancellation: pass it on
                if (got := waiter.result()) is not None:
                    self._release(got)
                else:
                    self._free_slot()
            elif waiter in self._waiters:
                # else a release in the same pass already popped it and skipped it as done
                self._waiters.remove(waiter)
            raise
        if on_waited is not None:
            on_waited((loop.time() - queued_at) * 1000.0)
        if handed is not None and handed.origin == origin and handed.idle_usable:
            return handed
        if handed is not None:  # a connection to another origin: replaced in its slot
            handed.on_close = None
            handed.close()
        return await self._connect_in_slot(origin)

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.idle_usable:
                return conn
            conn.on_close = None
            self._free_slot()
        return None

    async def _connect_in_slot(self, origin: Origin) -> _Connection:
        """Open a connection in a slot already counted; the slot is freed if it fails."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(loop, origin),
                origin.host,
                origin.port,
                ssl=self._ssl_for(origin),
                server_hostname=(
                    (self._server_name or origin.host) if origin.scheme == "https" else None
                ),
            )
        except BaseException:
            self._free_slot()
            raise
        conn.on_close = self._lost_while_idle
        return conn

    def _ssl_for(self, origin: Origin) -> ssl.SSLContext | None:
        if origin.scheme != "https":
            return None
        if isinstance(self._tls, ssl.SSLContext):
            return self._tls
        if self._context is None:  # https is always verified: the system's trust store
            self._context = ssl.create_default_context()
        return self._context

    def _release(self, conn: _Connection) -> None:
        """A connection finished a request and can take another."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.setdefault(conn.origin, []).append(conn)

    def _free_slot(self) -> None:
        """A slot's connection is gone: the next waiter opens its own, or the slot frees."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._open -= 1

    def _evict_idle(self) -> bool:
        """Close one idle connection (to another origin: none is idle for this one)."""
        for conns in self._idle.values():
            while conns:
                conn = conns.pop()
                conn.on_close = None
                conn.close()
                return True
        return False

    def _lost_while_idle(self, conn: _Connection) -> None:
        """The server closed a connection we kept for later."""
        conns = self._idle.get(conn.origin)
        if conns is not None and conn in conns:
            conns.remove(conn)
            conn.on_close = None
            self._free_slot()
