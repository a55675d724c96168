"""The dispatcher's waker: never calls back before the time asked, on either path, and
one pending callback at a time."""

from __future__ import annotations

import asyncio
import sys

import pytest

from batchpilot.loadgen.waker import Waker

pytestmark = pytest.mark.timeout(30)


async def woken_at(waker: Waker, at: float) -> float:
    loop = asyncio.get_running_loop()
    woke: asyncio.Future[float] = loop.create_future()
    waker.call_at(at, lambda: woke.set_result(loop.time()))
    return await asyncio.wait_for(woke, 5.0)


@pytest.mark.parametrize("precise", [True, False])
async def test_a_callback_runs_at_its_time_or_after_never_before(precise: bool) -> None:
    loop = asyncio.get_running_loop()
    with Waker(precise=precise) as waker:
        for k in range(50):
            at = loop.time() + (k % 7) * 0.0007
            assert await woken_at(waker, at) >= at
        past = loop.time() - 1.0
        assert await woken_at(waker, past) >= past  # a time already past: the next pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
async def test_on_linux_the_waker_uses_a_timerfd() -> None:
    with Waker() as waker:
        assert waker.precise
    assert not Waker(precise=False).precise


@pytest.mark.parametrize("precise", [True, False])
async def test_a_new_callback_replaces_the_pending_one_and_cancel_drops_it(
    precise: bool,
) -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    with Waker(precise=precise) as waker:
        waker.call_at(loop.time() + 0.001, lambda: calls.append("first"))
        later = loop.time() + 0.02
        assert await woken_at(waker, later) >= later
        waker.call_at(loop.time() + 0.001, lambda: calls.append("cancelled"))
        waker.cancel()
        await asyncio.sleep(0.02)
    assert calls == []


async def test_the_waker_is_used_inside_its_block_only() -> None:
    with pytest.raises(RuntimeError, match="inside `with`"):
        Waker().call_at(0.0, lambda: None)
