"""The open-loop generator against stub servers of known behaviour, in real processes on
loopback. Stub latencies come from a virtual clock, so a slow host can only make the
measured latency larger and the achieved rate smaller: the bounds asserted below hold on
any machine."""

from __future__ import annotations

import asyncio

import pytest

from batchpilot.loadgen.arrivals import MMPP
from batchpilot.loadgen.breach import BreachRule
from batchpilot.loadgen.generator import run_load
from batchpilot.models import RequestMix
from support.stub_server import StubServerProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]

MIX = RequestMix.default()


async def test_every_request_of_a_fixed_delay_server_takes_at_least_the_delay() -> None:
    async with StubServerProcess(delay_ms=50) as stub:
        result = await run_load(stub.url, rate=100, duration_s=1.0, mix=MIX, arrival="constant")
    assert result.requests == result.ok == 100
    assert result.errors == {}
    assert result.latency.count == 100
    assert result.latency.p50_ms >= 50.0
    assert result.offered_rps == pytest.approx(100.0)
    assert len(result.timeline) == 1
    assert result.timeline[0].ok == 100


async def test_latency_runs_from_the_scheduled_time_when_the_server_falls_behind() -> None:
    # 200 req/s offered to a server of exactly 100 req/s for 2 s: request k is scheduled
    # at k/200 s but served at k/100 s, so the last ones wait about 2 s. A closed-loop
    # generator would wait for each response and report about 10 ms instead.
    async with StubServerProcess(capacity_rps=100, queue_limit=10_000) as stub:
        result = await run_load(
            stub.url, rate=200, duration_s=2.0, mix=MIX, arrival="constant", timeout_s=10
        )
    assert result.ok == 400
    assert result.latency.p99_ms >= 1500.0
    assert result.latency.max_ms >= 1800.0
    assert result.achieved_rps <= 105.0
    assert result.offered_rps == pytest.approx(200.0)
    # The timeline shows the queue building up second by second.
    assert result.timeline[1].p50_ms > result.timeline[0].p50_ms


async def test_a_timeout_is_an_error_and_at_least_the_timeout_in_latency() -> None:
    async with StubServerProcess(delay_ms=5000) as stub:
        result = await run_load(stub.url, rate=20, duration_s=1.0, mix=MIX, timeout_s=0.3)
    assert result.ok == 0
    assert result.errors == {"timeout": 20}
    assert result.timeouts == 20
    assert result.error_rate == 1.0
    assert result.latency.count == 20
    assert result.latency.p50_ms >= 300.0


async def test_rejections_are_counted_by_status_code() -> None:
    async with StubServerProcess(capacity_rps=20, queue_limit=2) as stub:
        result = await run_load(stub.url, rate=200, duration_s=1.0, mix=MIX, arrival="constant")
    assert result.errors.get("503", 0) > 100
    assert result.ok + result.errors["503"] == result.requests == 200
    assert result.latency.count == result.ok  # rejections are not timed


async def test_refused_connections_are_counted_not_raised() -> None:
    async with StubServerProcess() as stub:
        url = stub.url
    # The stub is gone: nothing listens on its port any more.
    result = await run_load(url, rate=50, duration_s=0.2, mix=MIX, timeout_s=2)
    assert result.errors == {"connection": 10}
    assert result.ok == 0


async def test_several_urls_share_the_load_round_robin() -> None:
    async with StubServerProcess() as one, StubServerProcess() as two:
        result = await run_load(
            [one.url, two.url], rate=100, duration_s=1.0, mix=MIX, arrival="constant"
        )
        counts = [await one.served(), await two.served()]
    assert result.ok == 100
    assert counts == [50, 50]
    assert result.urls == [one.url, two.url]


async def test_stopping_early_returns_the_partial_result() -> None:
    async with StubServerProcess(delay_ms=10) as stub:
        stop = asyncio.Event()
        run = asyncio.create_task(run_load(stub.url, rate=100, duration_s=30.0, mix=MIX, stop=stop))
        for _ in range(1200):
            if await stub.served() >= 20:
                break
            await asyncio.sleep(0.05)
        stop.set()
        result = await run
    assert result.interrupted
    assert result.duration_s < 30.0
    assert 20 <= result.ok < 3000
    assert result.errors == {}


async def test_mmpp_arrivals_reach_the_server_in_bursts() -> None:
    # Bursts of 8x the quiet rate, 3 s long on average, a third of the time, over 12 s:
    # the seconds of the run carry very different numbers of scheduled requests, and the
    # whole run exactly rate x duration.
    process = MMPP(burst_factor=8.0, high_fraction=0.3, mean_burst_s=3.0)
    async with StubServerProcess(delay_ms=1) as stub:
        result = await run_load(stub.url, rate=50, duration_s=12.0, mix=MIX, arrival=process)
    assert result.requests == 600
    assert result.arrival == "mmpp:factor=8,fraction=0.3,burst_s=3"
    per_second = [s.scheduled for s in result.timeline]
    assert max(per_second) > 3 * min(per_second)


async def test_a_breach_rule_stops_the_run_once_its_p99_must_break_the_bound() -> None:
    # 200 req/s to a server of 100 req/s: request k waits about k/200 s. Of 400 planned
    # requests 4 may be over 100 ms; the fifth over it (answered, or still in flight past
    # it) comes at about 0.25 s, long before the window's end at 2 s.
    rule = BreachRule(bound_ms=100.0)
    async with StubServerProcess(capacity_rps=100, queue_limit=10_000) as stub:
        result = await run_load(
            stub.url, rate=200, duration_s=2.0, mix=MIX, arrival="constant", timeout_s=10,
            breach=rule,
        )  # fmt: skip
    assert result.breach_stop is not None
    assert result.breach_stop.startswith("stopped after ")
    assert "of its 400 measured requests were already over 100 ms" in result.breach_stop
    assert "more than the 4 a p99 within the SLA allows" in result.breach_stop
    assert result.interrupted
    assert result.duration_s < 1.0
    assert result.offered_rps * result.duration_s < 200  # no sends after the stop


async def test_a_breach_rule_leaves_a_run_within_its_bound_alone() -> None:
    async with StubServerProcess(delay_ms=5) as stub:
        result = await run_load(
            stub.url, rate=100, duration_s=1.0, mix=MIX, arrival="constant",
            breach=BreachRule(bound_ms=100.0),
        )  # fmt: skip
    assert result.breach_stop is None
    assert not result.interrupted
    assert result.ok == 100
