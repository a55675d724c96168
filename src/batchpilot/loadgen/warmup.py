"""Closed-loop warm-up: keeps a fixed number of requests in flight for a while.

It warms the target (first requests after start are slow) and, as a by-product, gives
a rough lower bound on its capacity to start the capacity search from. It is never used
to measure latency: a closed loop slows down with the server and hides its tail."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

import aiohttp

from batchpilot.loadgen.endpoints import endpoint_url, normalise_urls
from batchpilot.loadgen.protocols import (
    JSON_HEADERS,
    client_server_name,
    client_tls,
    in_force,
    synthetic_body,
)
from batchpilot.loadgen.streaming import stream_bodies
from batchpilot.models import RequestMix


class RejectedError(ValueError):
    """The target refused the warm-up's requests before it accepted any (a wrong path,
    a body it does not understand, a model it does not serve): measuring on would only
    find 100 % errors. The message gives the status, the URL and the body's first line."""


def rejection(status: int, url: str, body: bytes) -> RejectedError:
    lines = body.decode("utf-8", errors="replace").strip().splitlines()
    first = lines[0][:300] if lines else "(empty body)"
    return RejectedError(f"the target answered HTTP {status} to POST {url}: {first}")


# What the warm-up keeps of an answer: the start of a refusal, for the message. The rest
# is read and dropped, as the load generator's own requests do, so that a server streaming
# without end costs time (each request is bounded by its timeout), never memory.
_KEPT_BODY_BYTES = 4096


async def _head_of_body(response: aiohttp.ClientResponse) -> bytes:
    kept = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        if len(kept) < _KEPT_BODY_BYTES:
            kept += chunk[: _KEPT_BODY_BYTES - len(kept)]
    return bytes(kept)


async def closed_loop_rate(
    urls: str | Sequence[str],
    *,
    concurrency: int,
    duration_s: float,
    mix: RequestMix,
    timeout_s: float = 10.0,
    path: str = "/v1/predict",
    seed: int = 0,
    max_rps: float | None = None,
) -> float:
    """Successful responses per second with `concurrency` requests always in flight.
    A request protocol in force (`loadgen.protocols.speaking`) decides path, body and
    headers. An HTTP error answer before any success raises RejectedError at once; after
    one, errors count as load (an overloaded server may shed some). With `max_rps` the
    sends are paced to at most that rate (a load budget), and so is the estimate."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be ≥ 1, got {concurrency}")
    if not duration_s > 0:
        raise ValueError(f"warm-up duration must be > 0 s, got {duration_s:g}")
    if max_rps is not None and not max_rps > 0:
        raise ValueError(f"warm-up rate cap must be > 0 req/s, got {max_rps:g}")
    body_for_size: Callable[[int], bytes] = synthetic_body
    headers = dict(JSON_HEADERS)
    if (protocol := in_force()) is not None:
        path, body_for_size, headers = protocol.path, protocol.body, dict(protocol.headers)
    server_name = client_server_name()
    targets = itertools.cycle([endpoint_url(base, path) for base in normalise_urls(urls)])
    sizes = mix.sampler(seed)

    def sized_body() -> bytes:
        return body_for_size(sizes.draw(1)[0])

    next_body = sized_body
    if protocol is not None and protocol.stream is not None:
        next_body = stream_bodies(protocol.stream, seed)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    ok = 0
    refused: list[RejectedError] = []
    next_send = loop.time()  # the pacer's next free slot, with max_rps

    async def paced() -> None:
        nonlocal next_send
        if max_rps is None:
            return
        now = loop.time()
        slot = max(next_send, now)
        next_send = slot + 1.0 / max_rps
        if slot > now:
            await asyncio.sleep(slot - now)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok
        while loop.time() < deadline and not refused:
            await paced()
            if loop.time() >= deadline:
                break
            body = next_body()
            url = next(targets)
            try:
                async with (
                    asyncio.timeout(timeout_s),
                    session.post(
                        url, data=body, headers=headers, server_hostname=server_name
                    ) as response,
                ):
                    answer = await _head_of_body(response)
                    if 200 <= response.status < 300:
                        ok += 1
                    elif ok == 0:
                        refused.append(rejection(response.status, str(url), answer))
                    else:
                        await asyncio.sleep(0.01)  # do not spin on a rejecting server
            except (TimeoutError, aiohttp.ClientError, OSError):
                await asyncio.sleep(0.01)

    started = loop.time()
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=client_tls())
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    if refused:
        raise refused[0]
    return ok / max(loop.time() - started, 1e-9)
