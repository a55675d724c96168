"""The generator's HTTP/1.1 client against raw loopback servers that answer as told:
keep-alive, closing, chunked and close-delimited bodies, garbage, silence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from yarl import URL

from batchpilot.loadgen.http1 import BadResponseError, Http1Client, Origin, prepare

pytestmark = pytest.mark.timeout(60)

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[bool]]


def ok(body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Server:
    """Counts connections and requests; `answer` replies to one request and says whether
    to keep the connection for the next one."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self._changed = asyncio.Condition()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), 10)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        await self._notify()
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(head + await reader.readexactly(length))
                await self._notify()
                if not await self.answer(reader, writer, self):
                    return
        finally:
            self.open_now -= 1
            writer.close()
            await self._notify()


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[tuple[Server, str]]:
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}/v1/predict"
    finally:
        listener.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(listener.wait_closed(), 2)


def answering(reply: bytes, *, keep: bool) -> Answer:
    """A server that writes `reply` to every request, then keeps the connection or not."""

    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: Server) -> bool:
        w.write(reply)
        await w.drain()
        return keep

    return answer


keep_alive = answering(ok(), keep=True)


def test_a_request_carries_host_length_and_the_protocols_headers() -> None:
    prepared = prepare(
        URL("http://127.0.0.1:8000/v2/models/m/infer?x=1"),
        b'{"a": 1}',
        {"Content-Type": "application/json", "Content-Length": "999", "Authorization": "t"},
    )
    assert prepared.origin == Origin("http", "127.0.0.1", 8000)
    head, body = prepared.data.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v2/models/m/infer?x=1 HTTP/1.1"
    assert b"Host: 127.0.0.1:8000" in lines
    assert b"Content-Length: 8" in lines
    assert b"Content-Length: 999" not in lines
    assert b"Content-Type: application/json" in lines
    assert b"Authorization: t" in lines
    assert body == b'{"a": 1}'


def test_default_ports_and_ipv6_hosts_are_written_as_http_expects() -> None:
    assert b"Host: example.test\r\n" in prepare(URL("https://example.test/p"), b"", {}).data
    assert prepare(URL("https://example.test/p"), b"", {}).origin.port == 443
    assert b"Host: [::1]:81\r\n" in prepare(URL("http://[::1]:81/p"), b"", {}).data


@pytest.mark.parametrize(
    ("url", "headers", "message"),
    [
        ("ftp://h/p", {}, "http:// or https://"),
        ("/v1/predict", {}, "http:// or https://"),
        ("http://h/p", {"X-A": "b\r\nInjected: 1"}, "not a valid HTTP header"),
        ("http://h/p", {"Bad Name": "v"}, "not a valid HTTP header"),
        ("http://h/p", {"X-A": "ünïcödé ✓"}, "latin-1"),
    ],
)
def test_requests_that_would_break_on_the_wire_are_refused(
    url: str, headers: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        prepare(URL(url), b"", headers)


async def test_requests_reuse_one_kept_alive_connection() -> None:
    async with serving(keep_alive) as (server, url), Http1Client(limit=4) as client:
        prepared = prepare(URL(url), b"{}", {})
        for _ in range(20):
            status, done = await client.request(prepared)
            assert status == 200
            assert done <= asyncio.get_running_loop().time()
    assert len(server.requests) == 20
    assert server.connections == 1


async def test_a_server_that_closes_after_each_answer_gets_a_new_connection_each_time() -> None:
    closing = answering(ok(extra=b"Connection: close\r\n"), keep=False)
    async with serving(closing) as (server, url), Http1Client(limit=1) as client:
        prepared = prepare(URL(url), b"{}", {})
        statuses = [(await client.request(prepared))[0] for _ in range(5)]
    assert statuses == [200] * 5
    assert server.connections == 5


async def test_chunked_and_close_delimited_bodies_complete() -> None:
    chunked = answering(
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
        keep=True,
    )
    until_close = answering(b"HTTP/1.0 200 OK\r\n\r\nbody until the end", keep=False)

    async with Http1Client(limit=2) as client:
        async with serving(chunked) as (server, url):
            prepared = prepare(URL(url), b"{}", {})
            assert [(await client.request(prepared))[0] for _ in range(3)] == [503] * 3
            assert server.connections == 1
        async with serving(until_close) as (_, url):
            assert (await client.request(prepare(URL(url), b"{}", {})))[0] == 200


async def test_a_server_that_hangs_up_or_answers_garbage_fails_the_request() -> None:
    async def hang_up(_: asyncio.StreamReader, __: asyncio.StreamWriter, ___: Server) -> bool:
        return False

    garbage = answering(b"SMTP ready\r\n\r\n", keep=True)

    async with Http1Client(limit=1) as client:
        async with serving(hang_up) as (_, url):
            with pytest.raises(ConnectionResetError, match="closed the connection"):
                await client.request(prepare(URL(url), b"{}", {}))
        async with serving(garbage) as (_, url):
            with pytest.raises(BadResponseError, match="invalid HTTP response"):
                await client.request(prepare(URL(url), b"{}", {}))
        # the failed requests gave their slot back: the one connection can be opened again
        async with serving(keep_alive) as (_, url):
            assert (await client.request(prepare(URL(url), b"{}", {})))[0] == 200


async def test_a_refused_connection_is_an_os_error_and_frees_its_slot() -> None:
    async with serving(keep_alive) as (_, url):
        pass  # closed: nothing listens on that port any more
    async with Http1Client(limit=1) as client:
        for _ in range(2):
            with pytest.raises(ConnectionRefusedError):
                await client.request(prepare(URL(url), b"{}", {}))


async def test_the_limit_holds_and_waiters_are_served_first_come_first_served() -> None:
    release = asyncio.Event()

    async def slow(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: Server) -> bool:
        await release.wait()
        w.write(ok())
        await w.drain()
        return True

    queued: list[int] = []
    waited: list[float] = []
    three_waiting = asyncio.Event()

    def on_wait(k: int) -> None:
        queued.append(k)
        if len(queued) == 3:
            three_waiting.set()

    async with serving(slow) as (server, url), Http1Client(limit=2) as client:
        prepared = prepare(URL(url), b"{}", {})
        order: list[int] = []

        async def one(k: int) -> None:
            await client.request(prepared, on_wait=lambda _: on_wait(k), on_waited=waited.append)
            order.append(k)

        tasks = [asyncio.create_task(one(k)) for k in range(5)]
        await asyncio.wait_for(three_waiting.wait(), 10)
        release.set()
        await asyncio.gather(*tasks)
    assert queued == [2, 3, 4]
    assert len(waited) == 3
    assert all(ms >= 0 for ms in waited)
    assert server.most_open == 2
    assert server.connections == 2  # the waiters got the freed connections, not new ones
    assert order.index(2) < order.index(3) < order.index(4)


@pytest.mark.parametrize("waiter_first", [True, False])
async def test_a_cancelled_request_closes_its_connection_and_frees_the_slot(
    waiter_first: bool,
) -> None:
    async def never(r: asyncio.StreamReader, _: asyncio.StreamWriter, __: Server) -> bool:
        await r.read()  # until the client goes away
        return False

    async with Http1Client(limit=1) as client:
        async with serving(never) as (server, url):
            stuck = asyncio.create_task(client.request(prepare(URL(url), b"{}", {})))
            waiting = asyncio.create_task(client.request(prepare(URL(url), b"{}", {})))
            await server.until(lambda: len(server.requests) == 1)
            # a waiter that gives up leaves the queue; cancelled after the request in
            # flight, the freed slot skips it before its task runs (the reaper's order
            # when both ran out of time in the same pass)
            for task in (waiting, stuck) if waiter_first else (stuck, waiting):
                task.cancel()
            for task in (stuck, waiting):
                with pytest.raises(asyncio.CancelledError):
                    await task
            await server.until(lambda: server.open_now == 0)  # the client hung up
        async with serving(keep_alive) as (_, url):
            assert (await client.request(prepare(URL(url), b"{}", {})))[0] == 200


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    once = answering(ok(), keep=False)  # keep-alive by the headers, yet it hangs up

    async with serving(once) as (server, url), Http1Client(limit=1) as client:
        prepared = prepare(URL(url), b"{}", {})
        for _ in range(3):
            assert (await client.request(prepared))[0] == 200
            await server.until(lambda: server.open_now == 0)
            await asyncio.sleep(0.01)  # the client's side sees the hang-up
    assert server.connections == 3


async def test_a_connection_to_another_origin_is_replaced_when_the_limit_is_reached() -> None:
    async with (
        serving(keep_alive) as (first, url_a),
        serving(keep_alive) as (second, url_b),
        Http1Client(limit=1) as client,
    ):
        for url in (url_a, url_b, url_a):
            assert (await client.request(prepare(URL(url), b"{}", {})))[0] == 200
    assert first.connections == 2
    assert second.connections == 1
