"""The capacity search over HTTP: a stub of known capacity, and the reference server
end to end through the CLI."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest

from batchpilot.capacity.http import measure_capacity, measure_step, step_window_s
from batchpilot.models import SLA, RequestMix
from batchpilot.server.process import ServerProcess
from support.stub_server import StubServerProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(240)]

CAPACITY = 300.0


async def test_finds_the_known_capacity_of_a_stub() -> None:
    # Constant arrivals below the stub's capacity never queue; above it the queue grows
    # by (rate - capacity) per second, so the step fails on p99 or on keeping up. A slow
    # host can only add latency, so the search can land lower, never higher. On a busy
    # host the client itself may stall at the edge: such a step is invalid, not failed,
    # and the search stops there with a client-bound lower bound instead of bisecting on.
    steps: list[float] = []
    async with StubServerProcess(capacity_rps=CAPACITY, queue_limit=100_000) as stub:
        result = await measure_capacity(
            stub.url,
            sla=SLA(p99_ms=1000),
            mix=RequestMix.default(),
            precision=0.05,
            step_duration_s=2.0,
            warmup_s=1.0,
            arrival="constant",
            min_requests=200,
            on_step=lambda step, load: steps.append(load.offered_rps),
        )
    assert result.feasible
    assert 0.85 * CAPACITY <= result.effective_rps <= 1.04 * CAPACITY
    assert [s.offered_rps for s in result.steps] == steps
    assert any(not s.passed for s in result.steps)
    best = max((s for s in result.steps if s.passed), key=lambda s: s.offered_rps)
    assert result.effective_rps == best.achieved_rps
    if result.client_bound:
        # only a step the client could not keep stops the search early
        assert any(not s.valid for s in result.steps)
    else:
        # The bisection ran to the requested precision: the lowest failing rate above the
        # best passing one is within 5% of it; the answer is that step's goodput.
        lowest_fail = min(
            s.offered_rps for s in result.steps if not s.passed and s.offered_rps > best.offered_rps
        )
        assert (lowest_fail - best.offered_rps) / best.offered_rps <= 0.05 + 1e-9
    assert all(s.client is not None for s in result.steps)


async def test_a_starved_client_gives_invalid_steps_not_a_failed_server() -> None:
    # A thread spinning in Python holds the interpreter for 50 ms at a time: the event
    # loop that sends the requests stalls, the process uses a whole core, so the client
    # cannot keep its schedule. The stub could serve 3,000 req/s within the SLA, ten
    # times what the starved client ever sends (at 300 a less starved client on a busy
    # host could reach the stub's own limit first): the steps its stalls can explain are
    # invalid and the result is client-bound.
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            sum(range(1000))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    thread = threading.Thread(target=hog, daemon=True)
    try:
        async with StubServerProcess(capacity_rps=10 * CAPACITY, queue_limit=100_000) as stub:
            thread.start()
            result = await measure_capacity(
                stub.url, sla=SLA(p99_ms=250), mix=RequestMix.default(), precision=0.25,
                step_duration_s=1.0, warmup_s=0, start_rps=100, arrival="constant",
                min_requests=0, cooldown_s=0,
            )  # fmt: skip
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert result.client_bound
    assert not result.pruned
    invalid = [s for s in result.steps if not s.valid]
    assert invalid
    assert all(s.reason.startswith("invalid, client-bound: ") for s in invalid)
    # A failure the client's delays cannot explain (on this loaded machine the hog can
    # stall the loop for most of a second, so some requests time out beyond what one
    # stall and the send lag account for) stands, but never without naming the client.
    failed = [s for s in result.steps if s.valid and not s.passed]
    assert all("(the client was over its limits too: " in s.reason for s in failed)


async def test_an_overloaded_first_step_ramps_down() -> None:
    # A short queue: overloaded steps are rejected (503) instead of leaving a backlog.
    async with StubServerProcess(capacity_rps=50, queue_limit=10) as stub:
        result = await measure_capacity(
            stub.url, sla=SLA(p99_ms=250), mix=RequestMix.default(), precision=0.25,
            step_duration_s=1.0, warmup_s=0, start_rps=400, arrival="constant", cooldown_s=0.5,
            min_requests=0,
        )  # fmt: skip
    # the first failure is confirmed (measured twice) before the ramp goes down
    assert [round(s.offered_rps) for s in result.steps[:4]] == [400, 400, 200, 100]
    assert result.feasible
    assert result.effective_rps <= 52.0


async def test_an_unreachable_target_is_reported_before_any_load() -> None:
    from batchpilot.loadgen.endpoints import UnreachableError
    from batchpilot.server.process import free_port

    with pytest.raises(UnreachableError, match="connection refused"):
        await measure_capacity(
            f"http://127.0.0.1:{free_port()}", sla=SLA(p99_ms=100), mix=RequestMix.default()
        )


async def test_capacity_cli_against_the_reference_server(tmp_path: Path) -> None:
    plot = tmp_path / "capacity.png"
    async with ServerProcess(max_batch_size=8, max_queue_time_ms=5, threads=1) as server:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchpilot", "capacity", server.url, "--p99-ms", "200",
            "--precision", "0.25", "--step-seconds", "1", "--warmup-seconds", "1",
            "--min-requests", "100", "--replicas", "2", "--json", "--plot", str(plot),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 200)
    assert process.returncode == 0, err.decode()
    data = json.loads(out)
    assert data["feasible"]
    assert data["effective_rps"] > 0
    assert data["p99_ms"] <= 200
    assert data["sla"] == {"p99_ms": 200.0, "max_error_rate": 0.001}
    assert data["accelerator_hours_per_million"] == pytest.approx(
        2 / (data["effective_rps"] * 3600) * 1e6
    )
    steps = data["steps"]
    assert len(steps) >= 2
    assert {"offered_rps", "achieved_rps", "p50_ms", "p99_ms", "error_rate", "passed"} <= set(
        steps[0]
    )
    assert any(not s["passed"] for s in steps)
    assert data["plot"] == str(plot)
    assert plot.read_bytes()[:4] == b"\x89PNG"


async def test_a_step_on_production_ends_as_soon_as_its_breach_is_certain() -> None:
    # twice what the server does: the p99 over 100 ms is certain a fraction of a second in
    sla = SLA(p99_ms=100, max_error_rate=0.01)
    async with StubServerProcess(capacity_rps=100, queue_limit=10_000) as stub:
        whole, whole_load = await measure_step(
            [stub.url], rate=200, sla=sla, mix=RequestMix.default(), duration_s=2.0,
            timeout_s=10, seed=1, arrival="constant",
        )  # fmt: skip
        await asyncio.sleep(2.5)  # the stub's queue drains
        cut, cut_load = await measure_step(
            [stub.url], rate=200, sla=sla, mix=RequestMix.default(), duration_s=2.0,
            timeout_s=10, seed=1, arrival="constant", stop_on_breach=True,
        )  # fmt: skip
        await asyncio.sleep(1.0)
        # under a connection cap the requests over the bound wait in the client, off the
        # server: the window runs whole and is judged as before
        capped, capped_load = await measure_step(
            [stub.url], rate=200, sla=sla, mix=RequestMix.default(), duration_s=2.0,
            timeout_s=10, seed=1, arrival="constant", stop_on_breach=True, max_connections=2,
        )  # fmt: skip
    assert not whole.passed
    assert whole.valid
    assert whole_load.breach_stop is None
    assert whole.duration_s == 2.0
    assert (cut.passed, cut.valid) == (False, True), cut
    assert cut.reason.startswith("stopped after ")
    assert "more than the" in cut.reason
    assert "a p99 within the SLA allows" in cut.reason
    assert cut_load.duration_s < 1.0
    assert cut.duration_s == cut_load.duration_s
    assert capped_load.breach_stop is None
    assert capped.duration_s == 2.0
    assert not capped.passed


async def test_a_step_a_few_requests_short_by_chance_is_judged_on_its_p99() -> None:
    # stretched to hold 200 measured requests on average; the Poisson schedule of seed 13
    # holds 186: the arrivals' noise, not a shortfall worth an (infinite) p99 bound
    window = step_window_s(100, 1.0, 200)
    async with StubServerProcess(delay_ms=5) as stub:
        step, load = await measure_step(
            [stub.url], rate=100, sla=SLA(p99_ms=1000), mix=RequestMix.default(),
            duration_s=window, timeout_s=5, seed=13, arrival="poisson", min_requests=200,
        )  # fmt: skip
    assert load.requests == 186
    assert step.passed, step.reason
    assert not step.failed_on_bound_only
