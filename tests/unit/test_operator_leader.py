"""Leader election: the decisions as pure functions, and two Electors on one Lease of a
loopback API server with optimistic concurrency, their clocks driven by the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from loopback import serving

from batchpilot.operator.kube import Connection
from batchpilot.operator.leader import (
    ElectionSettings,
    Elector,
    LeaseView,
    check_timing,
    leads,
    lease_body,
    leases_path,
    next_action,
    step_down_at,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = ElectionSettings(namespace="ops", identity="a", duration_s=15, renew_s=5.0)


def view(holder: str, duration_s: int = 15, rv: str = "1") -> LeaseView:
    return LeaseView(
        holder=holder, duration_s=duration_s, resource_version=rv, transitions=0, acquire_time=None
    )


class TestDecisions:
    def test_no_lease_is_created(self) -> None:
        assert next_action(None, "a", 0.0) == "create"

    def test_the_holder_renews(self) -> None:
        assert next_action(view("a"), "a", 100.0) == "renew"

    def test_a_live_lease_of_another_is_followed(self) -> None:
        assert next_action(view("b"), "a", 14.9) == "follow"

    def test_a_lease_unchanged_for_its_duration_is_taken_over(self) -> None:
        assert next_action(view("b"), "a", 15.0) == "acquire"

    def test_a_released_lease_is_taken_at_once(self) -> None:
        assert next_action(view(""), "a", 0.0) == "acquire"

    def test_the_leader_steps_down_before_a_standby_may_take_over(self) -> None:
        renewed = 100.0
        assert leads(renewed, 100.0, SETTINGS)
        assert leads(renewed, step_down_at(renewed, SETTINGS) - 0.01, SETTINGS)
        assert not leads(renewed, step_down_at(renewed, SETTINGS), SETTINGS)
        # a standby that saw the renewal at the earliest when it was sent waits the
        # whole duration: the leader stopped one renew period before
        assert step_down_at(renewed, SETTINGS) + SETTINGS.renew_s == renewed + 15
        assert not leads(None, 0.0, SETTINGS)

    @pytest.mark.parametrize(
        ("duration", "renew", "problem"),
        [
            (0, 1.0, "the lease duration must be 1 to 300 s"),
            (301, 1.0, "the lease duration must be 1 to 300 s"),
            (15, 0.1, "the renew period must be at least 0.2 s"),
            (15, 5.1, "at most a third of the lease duration"),
        ],
    )
    def test_bad_timing_says_what_is_allowed(
        self, duration: int, renew: float, problem: str
    ) -> None:
        message = check_timing(duration, renew)
        assert message is not None
        assert problem in message
        with pytest.raises(ValueError, match=problem):
            ElectionSettings(namespace="ops", identity="a", duration_s=duration, renew_s=renew)

    def test_good_timing(self) -> None:
        assert check_timing(15, 5.0) is None
        assert check_timing(5, 1.0) is None

    def test_a_takeover_counts_a_transition_and_a_renewal_does_not(self) -> None:
        first = lease_body(SETTINGS, None, holder="a", now=NOW)
        assert first["spec"]["leaseTransitions"] == 0
        assert first["spec"]["holderIdentity"] == "a"
        assert "resourceVersion" not in first["metadata"]
        renewed = lease_body(SETTINGS, view("a", rv="7"), holder="a", now=NOW)
        assert renewed["spec"]["leaseTransitions"] == 0
        assert renewed["metadata"]["resourceVersion"] == "7"
        taken = lease_body(SETTINGS, view("b"), holder="a", now=NOW)
        assert taken["spec"]["leaseTransitions"] == 1
        assert taken["spec"]["renewTime"] == "2026-01-01T00:00:00.000000Z"

    def test_a_release_empties_the_holder(self) -> None:
        released = lease_body(SETTINGS, view("a"), holder="", now=NOW)
        assert released["spec"]["holderIdentity"] is None
        assert released["spec"]["leaseDurationSeconds"] == 1


class LeaseServer:
    """The Lease endpoints of an API server: resourceVersion checked on replace."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.conflicts = 0

    def _stored(self, body: dict[str, Any]) -> web.Response:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        return web.json_response(body)

    async def get(self, request: web.Request) -> web.Response:
        if self.lease is None:
            return web.json_response({"reason": "NotFound", "message": "no lease"}, status=404)
        return web.json_response(self.lease)

    async def create(self, request: web.Request) -> web.Response:
        if self.lease is not None:
            return web.json_response({"reason": "AlreadyExists", "message": "x"}, status=409)
        return self._stored(await request.json())

    async def replace(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            self.conflicts += 1
            return web.json_response({"reason": "Conflict", "message": "modified"}, status=409)
        return self._stored(body)


@pytest.fixture
async def api() -> AsyncIterator[tuple[LeaseServer, Connection]]:
    server = LeaseServer()
    app = web.Application()
    path = leases_path("ops", "bp")
    app.router.add_get(path, server.get)
    app.router.add_put(path, server.replace)
    app.router.add_post(leases_path("ops"), server.create)
    async with serving(app) as url:
        yield server, Connection(server=url, token="t")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(identity: str, connection: Connection, clock: Clock) -> Elector:
    settings = ElectionSettings(
        namespace="ops", identity=identity, name="bp", duration_s=15, renew_s=5.0
    )
    return Elector(settings, lambda: connection, clock=clock, now=lambda: NOW)


async def test_one_leads_the_other_takes_over_only_after_the_leader_stopped(
    api: tuple[LeaseServer, Connection],
) -> None:
    server, connection = api
    clock_a, clock_b = Clock(), Clock()
    a, b = elector("a", connection, clock_a), elector("b", connection, clock_b)
    try:
        assert await a.round() == "create"
        assert await b.round() == "follow"
        assert a.is_leader()
        assert not b.is_leader()
        for _ in range(5):  # renewals keep the standby out, however long it waits
            clock_a.t += 5
            clock_b.t += 5
            assert await a.round() == "renew"
            assert await b.round() == "follow"
        assert a.is_leader()
        assert not b.is_leader()

        # the leader dies (no more renewals); it would have stopped leading before the
        # standby may take over
        died_at = clock_a.t
        while True:
            clock_a.t += 1
            clock_b.t += 1
            action = await b.round()
            if action == "acquire":
                break
            assert action == "follow"
            assert clock_b.t - died_at <= 16  # bounded: the lease duration
        assert b.is_leader()
        assert not a.is_leader()  # stepped down already, on its own clock
        assert await a.round() == "follow"
        assert server.lease is not None
        assert server.lease["spec"]["holderIdentity"] == "b"
        assert server.lease["spec"]["leaseTransitions"] == 1

        # a clean shutdown hands the lease over at once
        await b.release()
        assert not b.is_leader()
        assert await a.round() == "acquire"
        assert a.is_leader()
    finally:
        await a.close()
        await b.close()


async def test_a_stale_write_is_refused_and_loses(api: tuple[LeaseServer, Connection]) -> None:
    server, connection = api
    clock = Clock()
    a, b = elector("a", connection, clock), elector("b", connection, clock)
    try:
        assert await a.round() == "create"
        assert await b.round() == "follow"
        # b read the lease, then a renewed before b's write landed: b's replace with the
        # version it read is refused and b does not lead
        assert server.lease is not None
        stale = LeaseView.from_api(server.lease)
        clock.t += 5
        assert await a.round() == "renew"
        body = lease_body(b.settings, stale, holder="b", now=NOW)
        assert b._kube is not None
        with pytest.raises(Exception, match="409"):
            await b._kube.request("PUT", leases_path("ops", "bp"), body=body)
        assert server.conflicts == 1
        assert server.lease["spec"]["holderIdentity"] == "a"
        assert not b.is_leader()
    finally:
        await a.close()
        await b.close()


async def test_an_unreachable_api_server_costs_the_leader_its_leadership() -> None:
    clock = Clock()
    # nothing listens on port 9 of loopback: every renewal fails
    a = elector("a", Connection(server="http://127.0.0.1:9", token="t"), clock)
    try:
        assert await a.round() is None
        assert not a.is_leader()
    finally:
        await a.close()


async def test_a_lead_run_out_on_the_clock_is_waited_for_not_spun_on(
    api: tuple[LeaseServer, Connection],
) -> None:
    _, connection = api
    clock = Clock()
    a = elector("a", connection, clock)
    try:
        assert await a.round() == "create"
        assert await a.wait_leader(0.0)
        clock.t += 15  # past the step-down, before the elector's loop noticed
        assert not a.is_leader()
        # it waits for the lead to come back instead of returning at once
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(a.wait_leader(60.0), 0.05)
        await a.wait_lost()  # lost: returns at once
    finally:
        await a.close()
