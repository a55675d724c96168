"""The measurement slots go to each namespace in turn, first come first served within
one; a waiter that gives up leaves no hole and loses no slot."""

from __future__ import annotations

import asyncio

import pytest

from batchpilot.operator.slots import Slots


async def _grants(slots: Slots, waiters: list[tuple[str, str]]) -> list[str]:
    """The order in which `waiters` (name, namespace), queued in that order behind a
    holder, get the one slot; each gives it back at once."""
    order: list[str] = []

    async def wait(name: str, namespace: str) -> None:
        await slots.acquire(namespace)
        order.append(name)
        slots.release()

    await slots.acquire("ns-a")  # the holder
    tasks = []
    for name, namespace in waiters:
        tasks.append(asyncio.create_task(wait(name, namespace)))
        await asyncio.sleep(0)  # queued in this order
    assert slots.busy()
    slots.release()
    await asyncio.gather(*tasks)
    return order


async def test_a_namespace_with_many_studies_does_not_keep_another_waiting() -> None:
    order = await _grants(
        Slots(), [("a1", "ns-a"), ("a2", "ns-a"), ("a3", "ns-a"), ("b1", "ns-b"), ("c1", "ns-c")]
    )
    assert order == ["a1", "b1", "c1", "a2", "a3"]


async def test_within_a_namespace_first_come_first_served() -> None:
    assert await _grants(Slots(), [("b1", "ns-b"), ("b2", "ns-b")]) == ["b1", "b2"]


async def test_a_free_slot_is_taken_at_once_and_several_slots_are_shared() -> None:
    slots = Slots(2)
    await slots.acquire("ns-a")
    assert not slots.busy()
    await slots.acquire("ns-b")
    assert slots.busy()
    slots.release()
    slots.release()
    assert not slots.busy()


async def test_a_waiter_that_gives_up_leaves_the_queue() -> None:
    slots = Slots()
    await slots.acquire("ns-a")
    gives_up = asyncio.create_task(slots.acquire("ns-b"))
    stays = asyncio.create_task(slots.acquire("ns-c"))
    await asyncio.sleep(0)
    gives_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gives_up
    slots.release()
    await asyncio.wait_for(stays, 1)  # the slot went to the next waiter
    slots.release()
    assert not slots.busy()


async def test_a_waiter_cancelled_as_its_turn_came_passes_the_slot_on() -> None:
    slots = Slots()
    await slots.acquire("ns-a")
    first = asyncio.create_task(slots.acquire("ns-b"))
    second = asyncio.create_task(slots.acquire("ns-c"))
    await asyncio.sleep(0)
    slots.release()  # first's turn: granted, not yet resumed
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)
    slots.release()
    assert not slots.busy()


def test_there_is_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)
