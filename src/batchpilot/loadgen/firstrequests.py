"""A few requests before any load, to learn whether the server takes them at all.

A request the server refuses with a 4xx is shaped wrong for its model (an input's name,
a datatype, a path): every step of a capacity search would fail the same way and the
search would call the configuration infeasible. Sending a handful first turns that into
one clear error carrying the server's own words. Some servers answer a model that
raises on its input with a 5xx (TorchServe: 503 "Prediction failed"), so a 5xx to every
one of the first requests is a refusal too, once the same holds a second time a moment
later (a server busy for a moment answers then). Anything else (an answer, a 408 or 429
about the server's state, a 5xx beside an answer, a connection that fails) says nothing
about the request's shape and is left to the measurement."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, error_message, text_capped
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.loadgen.streaming import stream_bodies

FIRST_REQUESTS = 3
FIRST_REQUESTS_TIMEOUT_S = 30.0
# a 5xx to every first request is asked about once more after this pause
SERVER_ERRORS_RETRY_S = 2.0
# 4xx answers about the server's state, not the request: a timeout, too many requests
NOT_ABOUT_THE_REQUEST = frozenset({408, 429})


@dataclass(frozen=True)
class Refusal:
    """A 4xx answer to one of the first requests, or a 5xx to all of them: where it
    went, the status and the server's message."""

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
    retry_after_s: float = SERVER_ERRORS_RETRY_S,
) -> Refusal | None:
    """Send the first requests of `protocol` to `base_url`, one at a time; the first 4xx
    answer, or the last 5xx when every request got one, twice `retry_after_s` apart;
    None otherwise."""
    url = base_url.rstrip("/") + protocol.path
    bodies = first_bodies(protocol, sizes, seed=seed)
    refusal, failed = await _send(url, protocol, bodies, timeout_s)
    if refusal is not None or failed is None:
        return refusal
    await asyncio.sleep(retry_after_s)
    refusal, failed = await _send(url, protocol, bodies, timeout_s)
    if refusal is not None or failed is None:
        return refusal
    return Refusal(
        url,
        failed.status,
        f"{failed.message} (every one of the {len(bodies)} first requests, twice "
        f"{retry_after_s:g} s apart: the server answered none of them)",
    )


async def _send(
    url: str, protocol: RequestProtocol, bodies: Sequence[bytes], timeout_s: float
) -> tuple[Refusal | None, Refusal | None]:
    """The first 4xx refusal of `bodies` sent one at a time (the rest unsent), else the
    last 5xx answer when every request got a 5xx; (None, None) when none was refused and
    some request was answered or got a 408 or 429, or a request failed to connect."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    server_error: Refusal | None = None
    answered = False  # some request got something other than a 5xx
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for body in bodies:
                async with session.post(
                    url,
                    data=body,
                    headers=dict(protocol.headers),
                    ssl=protocol.tls(),
                    server_hostname=protocol.server_name,
                ) as response:
                    status = response.status
                    about_request = 400 <= status < 500 and status not in NOT_ABOUT_THE_REQUEST
                    if not (about_request or status >= 500):
                        answered = True
                        continue
                    try:
                        text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                    except BodyTooLarge as exc:
                        text = str(exc)
                    answer = Refusal(url, status, error_message(text))
                    if about_request:
                        return answer, None
                    server_error = answer
    except (TimeoutError, aiohttp.ClientError):
        return None, None
    return None, None if answered else server_error
