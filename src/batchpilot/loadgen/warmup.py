"""Closed-loop warm-up: keeps a fixed number of requests in flight for a while.

It warms the target (first requests after start are slow) and, as a by-product, gives
a rough lower bound on its capacity to start the capacity search from. It is never used
to measure latency: a closed loop slows down with the server and hides its tail."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import aiohttp

from batchpilot.loadgen.endpoints import endpoint_url, normalise_urls
from batchpilot.loadgen.generator import synthetic_body
from batchpilot.models import RequestMix


async def closed_loop_rate(
    urls: str | Sequence[str],
    *,
    concurrency: int,
    duration_s: float,
    mix: RequestMix,
    timeout_s: float = 10.0,
    path: str = "/v1/predict",
    seed: int = 0,
) -> float:
    """Successful responses per second with `concurrency` requests always in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be ≥ 1, got {concurrency}")
    if not duration_s > 0:
        raise ValueError(f"warm-up duration must be > 0 s, got {duration_s:g}")
    targets = itertools.cycle([endpoint_url(base, path) for base in normalise_urls(urls)])
    sizes = mix.sampler(seed)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    ok = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok
        while loop.time() < deadline:
            body = synthetic_body(sizes.draw(1)[0])
            try:
                async with (
                    asyncio.timeout(timeout_s),
                    session.post(
                        next(targets), data=body, headers={"Content-Type": "application/json"}
                    ) as response,
                ):
                    await response.read()
                    if 200 <= response.status < 300:
                        ok += 1
                    else:
                        await asyncio.sleep(0.01)  # do not spin on a rejecting server
            except (TimeoutError, aiohttp.ClientError, OSError):
                await asyncio.sleep(0.01)

    started = loop.time()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok / max(loop.time() - started, 1e-9)
