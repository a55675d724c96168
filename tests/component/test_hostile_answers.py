"""Addresses a user gave that answer without end: the runtimes' control client (the CLI's
and the operator's), and the simulator's profile fetch refuse an
answer past the cap, by its declared length or as soon as it streams past it, in
bounded time and memory; one that drips stops at the call's total timeout (a real HTTP
server on loopback)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES
from batchpilot.runtimes.http import ControlClient
from batchpilot.simulator.cost import ProfileError
from batchpilot.simulator.profile import PROFILE_PATH, fetch_profile
from support.hostile_server import ENDLESS_BYTES, Hostile, hostile_server

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    async with hostile_server({PROFILE_PATH: "endless"}) as server:
        yield server


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_the_control_client_refuses_an_endless_answer_in_bounded_memory(
    hostile: Hostile, method: str
) -> None:
    client = ControlClient(hostile.base, timeout_s=20.0, attempts=3, backoff_s=0.01)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TargetError) as caught:
            await client.call(method, "/endless", {"max_batch_size": 8})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert f"{hostile.base}/endless" in message
    assert "was refused" in message
    assert "cap of 4 MiB" in message
    assert time.monotonic() - started < 10.0
    # refused once, not retried: the same server would stream the same answer again
    assert hostile.sent["/endless"] < ENDLESS_BYTES // 8
    assert peak < 8 * MAX_CONTROL_BODY_BYTES


async def test_the_control_client_refuses_a_declared_huge_answer_before_reading_it(
    hostile: Hostile,
) -> None:
    client = ControlClient(hostile.base, timeout_s=20.0, attempts=1)
    started = time.monotonic()
    with pytest.raises(TargetError, match=r"refused: it is larger than the cap of 4 MiB"):
        await client.call("GET", "/declared")
    assert time.monotonic() - started < 5.0  # not the 30 s the server keeps it open


async def test_the_control_client_stops_a_dripping_answer_at_its_total_timeout(
    hostile: Hostile,
) -> None:
    client = ControlClient(hostile.base, timeout_s=1.0, attempts=1)
    started = time.monotonic()
    with pytest.raises(TargetError, match="TimeoutError"):
        await client.call("GET", "/drip")
    assert time.monotonic() - started < 5.0


async def test_the_simulator_profile_fetch_refuses_an_endless_answer(hostile: Hostile) -> None:
    with pytest.raises(ProfileError, match=rf"{PROFILE_PATH} was refused: .* cap of 4 MiB"):
        await fetch_profile(hostile.base, timeout_s=20.0)
