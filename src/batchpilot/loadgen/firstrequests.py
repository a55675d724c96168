"""A few requests before any load, to learn whether the server takes them at all.

A request the server refuses with a 4xx is shaped wrong for its model (an input's name,
a datatype, a path): every step of a capacity search would fail the same way and the
search would call the configuration infeasible. Sending a handful first turns that into
one clear error carrying the server's own words. Anything else (an answer, a 5xx, a 408
or 429 about the server's state, a connection that fails) says nothing about the
request's shape and is left to the measurement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, error_message, text_capped
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.loadgen.streaming import stream_bodies

FIRST_REQUESTS = 3
FIRST_REQUESTS_TIMEOUT_S = 30.0
# 4xx answers about the server's state, not the request: a timeout, too many requests
NOT_ABOUT_THE_REQUEST = frozenset({408, 429})


@dataclass(frozen=True)
class Refusal:
    """A 4xx answer to one of the first requests: where it went, the status and the
    server's message."""

    url: str
    status: int
    message: str

    def __str__(self) -> str:
        return f"POST {self.url} answered HTTP {self.status}: {self.message}"


def first_bodies(protocol: RequestProtocol, sizes: Sequence[int], *, seed: int = 0) -> list[bytes]:
    """The bodies of the first requests: the smallest and the largest size's (one when
    they are the same body), a token stream's first drawn requests."""
    if protocol.stream is not None:
        next_body = stream_bodies(protocol.stream, seed)
        return [next_body() for _ in range(FIRST_REQUESTS)]
    chosen = sorted({min(sizes), max(sizes)}) if sizes else [1]
    # a sample body sent for every size is sent once
    return list(dict.fromkeys(protocol.body(size) for size in chosen))[:FIRST_REQUESTS]


async def first_refusal(
    base_url: str,
    protocol: RequestProtocol,
    sizes: Sequence[int],
    *,
    timeout_s: float = FIRST_REQUESTS_TIMEOUT_S,
    seed: int = 0,
) -> Refusal | None:
    """Send the first requests of `protocol` to `base_url`, one at a time; the first 4xx
    answer, None when none was one."""
    url = base_url.rstrip("/") + protocol.path
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for body in first_bodies(protocol, sizes, seed=seed):
                async with session.post(
                    url,
                    data=body,
                    headers=dict(protocol.headers),
                    ssl=protocol.tls(),
                    server_hostname=protocol.server_name,
                ) as response:
                    if (
                        400 <= response.status < 500
                        and response.status not in NOT_ABOUT_THE_REQUEST
                    ):
                        try:
                            text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                        except BodyTooLarge as exc:
                            text = str(exc)
                        return Refusal(url, response.status, error_message(text))
    except (TimeoutError, aiohttp.ClientError):
        return None
    return None
