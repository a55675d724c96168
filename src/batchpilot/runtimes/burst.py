"""Verification bursts: concurrent single-row requests to a bundled model whose every
answer reports the batch it ran in (MLServer, TorchServe, Ray Serve), and what they show;
to a user's model, whose answers count only by their status (`send`)."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, text_capped
from batchpilot.runtimes.http import DIRECT, HttpAccess

# this many concurrent requests per unit of batch cap, between BURST_MIN and BURST_MAX:
# enough for batches to fill to the cap if batching is on, not a load test
BURST_PER_BATCH = 2
BURST_MIN = 8
BURST_MAX = 64


def burst_size(cap: int) -> int:
    """How many requests a verification burst sends for a batch cap of `cap`."""
    return min(max(BURST_PER_BATCH * cap, BURST_MIN), BURST_MAX)


def batch_counts(sizes: Iterable[int]) -> dict[int, int]:
    """Batch size -> batches, from the batch size each request reports: every request of
    a batch of n reports n (a burst's batches are whole when all its requests are in)."""
    counts = Counter(sizes)
    return {n: math.ceil(count / n) for n, count in sorted(counts.items())}


class Observed:
    """What one verification burst saw: the record of every answer; `batch_key` is the
    record's field holding the size of the batch the request ran in."""

    batch_key: ClassVar[str]

    def __init__(self, answers: Sequence[Mapping[str, Any]]) -> None:
        self.answers = list(answers)

    def one(self, key: str) -> set[Any]:
        return {a.get(key) for a in self.answers}

    def batch_sizes(self) -> dict[int, int]:
        return batch_counts(int(a[self.batch_key]) for a in self.answers)


async def burst(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    n: int,
    *,
    timeout_s: float,
    record: Callable[[Any], Mapping[str, Any] | None],
    bundled: str,
    error: type[TargetError] = TargetError,
    access: HttpAccess = DIRECT,
) -> list[Mapping[str, Any]]:
    """`n` concurrent POSTs of `body` to `url`; the record `record` finds in each answer's
    JSON. `error` on a non-2xx answer, on one without a record (not the `bundled` one?)
    and when a request fails."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def one(session: aiohttp.ClientSession) -> Mapping[str, Any]:
        async with session.post(url, data=body, headers=dict(headers)) as response:
            text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
            if not 200 <= response.status < 300:
                raise error(f"POST {url} answered HTTP {response.status}: {text[:200]}")
        found = record(json.loads(text))
        if found is None:
            raise error(f"{url} does not report its batches (not the {bundled}?): {text[:200]}")
        return found

    try:
        async with access.session(timeout) as session:
            return list(await asyncio.gather(*(one(session) for _ in range(n))))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise error(f"inference on {url} failed: {exc or type(exc).__name__}") from exc


async def send(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    n: int,
    *,
    timeout_s: float,
    refused: Callable[[int, str], TargetError],
    access: HttpAccess = DIRECT,
) -> None:
    """`n` concurrent POSTs of `body` to `url` whose answers matter only by their status:
    `refused(status, words)` is raised for the first that is not 2xx, TargetError when a
    request fails. For a user's model, whose answers say nothing BatchPilot reads."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(url, data=body, headers=dict(headers)) as response:
            if not 200 <= response.status < 300:
                text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                raise refused(response.status, text)
            # a 2xx answer is left unread: only its status counts, whatever its size

    try:
        async with access.session(timeout) as session:
            await asyncio.gather(*(one(session) for _ in range(n)))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise TargetError(f"inference on {url} failed: {exc or type(exc).__name__}") from exc
