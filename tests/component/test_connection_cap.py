"""A client capped at a few connections (load.maxConnections) against a real HTTP server
on loopback whose every request takes a fixed time with unlimited concurrency: the cap,
not the server, bounds the rate, so the search ends client-bound."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from batchpilot.capacity.http import measure_capacity
from batchpilot.models import SLA, RequestMix
from support.stub_server import StubServerProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(180)]

DELAY_MS = 100.0
CAP = 2
# Little's law: CAP connections each busy DELAY_MS per request carry at most this rate
CAPPED_RPS = CAP * 1000.0 / DELAY_MS


async def test_a_capped_client_ends_client_bound_not_blaming_the_server() -> None:
    async with StubServerProcess(delay_ms=DELAY_MS) as stub:
        result = await measure_capacity(
            stub.url,
            sla=SLA(p99_ms=300.0),
            mix=RequestMix.default(),
            precision=0.2,
            step_duration_s=2.0,
            warmup_s=1.0,
            arrival="constant",
            min_requests=0,
            max_connections=CAP,
        )
    assert result.client_bound, [s.reason for s in result.steps]
    assert result.capacity_label().endswith("req/s, client-bound")
    # no passing step carried more than the cap allows (a busy host only lowers it)
    assert all(s.achieved_rps <= CAPPED_RPS * 1.05 for s in result.steps if s.passed)
    invalid = [s for s in result.steps if not s.valid]
    assert invalid
    for step in invalid:
        assert step.reason.startswith("invalid, client-bound: ")
        assert f"one of the {CAP} connections the client is allowed" in step.reason
        assert step.client is not None
        assert step.client.connection_cap == CAP
    # every request the server answered took about its fixed time: none failed it
    assert all(s.error_rate == 0.0 for s in result.steps if s.passed)


async def test_the_cli_splits_the_cap_over_its_workers() -> None:
    # two generator processes, one connection each: the merged client holds the cap
    async with StubServerProcess(delay_ms=DELAY_MS) as stub:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchpilot", "capacity", stub.url, "--p99-ms", "300",
            "--precision", "0.2", "--step-seconds", "2", "--warmup-seconds", "1",
            "--min-requests", "0", "--arrival", "constant", "--workers", "2",
            "--max-connections", str(CAP), "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 150)
    assert process.returncode == 0, err.decode()
    data = json.loads(out)
    assert data["client_bound"] is True, [s["reason"] for s in data["steps"]]
    for step in data["steps"]:
        assert step["client"]["connection_cap"] == CAP
        assert [w["connection_cap"] for w in step["worker_clients"]] == [1, 1]
    assert any(
        f"one of the {CAP} connections the client is allowed" in s["reason"] for s in data["steps"]
    )


async def test_loadtest_holds_to_the_cap_it_is_given() -> None:
    async with StubServerProcess(delay_ms=DELAY_MS) as stub:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchpilot", "loadtest", stub.url, "--rate", "40",
            "--duration", "2", "--arrival", "constant", "--max-connections", "1", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    data = json.loads(out)
    assert data["client"]["connection_cap"] == 1
    # 40 req/s need 4 in flight at 100 ms each: with one connection, requests queue for it
    assert data["client"]["conn_wait_p99_ms"] > 0
    assert data["achieved_rps"] <= 1000.0 / DELAY_MS * 1.05
