"""Retries with exponential backoff and full jitter, for calls to servers that may be
briefly away (the Kubernetes API, a server's admin endpoint, a study step)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def backoff_delay(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after failed attempt `attempt` (0 for the first): uniform in
    [0, min(cap, base * 2**attempt)]. Full jitter spreads out the retries of many callers
    that failed together instead of letting them arrive together again."""
    return rng.uniform(0.0, min(cap, base * (2 ** max(0, attempt))))


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    retryable: Callable[[Exception], bool],
    delay: Callable[[int], float],
    on_error: Callable[[int, Exception], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> T:
    """`await call()` up to `attempts` times. An error `retryable` accepts is retried after
    `delay(attempt)` seconds (attempt counts from 0) until attempts run out, then raised;
    any other error is raised at once. `on_error(attempt, error)` sees each retryable
    failure, the last included (for logging). `sleep` defaults to asyncio.sleep, looked up
    at call time so a patched one is honoured."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as error:
            if not retryable(error):
                raise
            if on_error is not None:
                on_error(attempt, error)
            if attempt + 1 == attempts:
                raise
        await (sleep or asyncio.sleep)(delay(attempt))
    raise AssertionError("unreachable")  # the loop returns or raises
