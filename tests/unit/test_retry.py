"""Backoff with full jitter, and the retry helper built on it."""

from __future__ import annotations

import random

import pytest

from batchpilot.retry import backoff_delay, retry


class _Flaky(Exception):
    pass


class _Refused(Exception):
    pass


def test_backoff_stays_within_the_doubling_bound_and_the_cap() -> None:
    rng = random.Random(1)
    for attempt in range(12):
        bound = min(10.0, 0.5 * 2**attempt)
        delays = [backoff_delay(attempt, base=0.5, cap=10.0, rng=rng) for _ in range(200)]
        assert all(0.0 <= d <= bound for d in delays)
        # Full jitter: the draws use the whole range, not one fixed delay.
        assert min(delays) < bound * 0.25
        assert max(delays) > bound * 0.75


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    first = [backoff_delay(a, base=1.0, cap=8.0, rng=random.Random(7)) for a in range(5)]
    second = [backoff_delay(a, base=1.0, cap=8.0, rng=random.Random(7)) for a in range(5)]
    assert first == second


class _Calls:
    """A call that fails with the given errors in turn, then returns "done"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.count = 0

    async def __call__(self) -> str:
        self.count += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def _no_sleep(seconds: float, slept: list[float]) -> None:
    slept.append(seconds)


async def test_retryable_errors_are_retried_with_the_attempts_delays() -> None:
    calls = _Calls(_Flaky("a"), _Flaky("b"))
    slept: list[float] = []
    seen: list[tuple[int, str]] = []
    result = await retry(
        calls,
        attempts=3,
        retryable=lambda e: isinstance(e, _Flaky),
        delay=lambda attempt: 10.0 + attempt,
        on_error=lambda attempt, error: seen.append((attempt, str(error))),
        sleep=lambda s: _no_sleep(s, slept),
    )
    assert result == "done"
    assert calls.count == 3
    assert slept == [10.0, 11.0]
    assert seen == [(0, "a"), (1, "b")]


async def test_the_last_retryable_error_is_raised_when_attempts_run_out() -> None:
    calls = _Calls(_Flaky("a"), _Flaky("b"), _Flaky("c"))
    slept: list[float] = []
    seen: list[int] = []
    with pytest.raises(_Flaky, match="c"):
        await retry(
            calls,
            attempts=3,
            retryable=lambda e: isinstance(e, _Flaky),
            delay=lambda attempt: 1.0,
            on_error=lambda attempt, error: seen.append(attempt),
            sleep=lambda s: _no_sleep(s, slept),
        )
    assert calls.count == 3
    assert slept == [1.0, 1.0]  # no wait after the last attempt
    assert seen == [0, 1, 2]


async def test_other_errors_are_raised_at_once() -> None:
    calls = _Calls(_Refused("no"))
    slept: list[float] = []
    with pytest.raises(_Refused):
        await retry(
            calls,
            attempts=5,
            retryable=lambda e: isinstance(e, _Flaky),
            delay=lambda attempt: 1.0,
            sleep=lambda s: _no_sleep(s, slept),
        )
    assert calls.count == 1
    assert slept == []


async def test_attempts_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        await retry(_Calls(), attempts=0, retryable=lambda e: True, delay=lambda a: 0.0)
