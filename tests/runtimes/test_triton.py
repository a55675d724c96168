"""A real Triton (python backend, the bundled model) on loopback: two batching
configurations applied live under concurrent load, each proven by Triton's own counters
and statistics of the batch sizes it executed, with no failed request while the change
happens."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from batchpilot.errors import TargetError
from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.runtimes.base import RuntimeControl, representable
from batchpilot.runtimes.registry import get_runtime
from batchpilot.runtimes.triton.control import TritonControl, TritonCounters
from batchpilot.runtimes.triton.install import VENV_NAME
from batchpilot.runtimes.triton.process import TritonProcess
from batchpilot.runtimes.triton.repository import (
    BATCH_SIZE_OUTPUT,
    INPUT_NAME,
    TritonBatching,
)
from batchpilot.tuner.local import LocalProbe

from .support import is_loopback, listening_addresses, require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def installed() -> None:
    require_runtime(VENV_NAME, "python")


@pytest.fixture
async def triton() -> AsyncIterator[TritonProcess]:
    async with TritonProcess(TritonBatching(4, 2000)) as server:
        yield server


def infer_body(size: int) -> dict[str, object]:
    return {
        "inputs": [
            {"name": INPUT_NAME, "shape": [1, size], "datatype": "FP32", "data": [0.5] * size}
        ]
    }


@dataclass
class ClosedLoop:
    """`async with ClosedLoop(url, 32) as load:` clients that each keep one request in
    flight until the block ends: what each request answered, when, and the batch size the
    model says served it."""

    url: str
    clients: int
    # (sent, answered, status, batch) per request
    answers: list[tuple[float, float, int, int]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> ClosedLoop:
        self._session = aiohttp.ClientSession()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    async def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            batch = 0
            sent = time.monotonic()
            try:
                body = infer_body(1 + (index + n) % 5)
                async with self._session.post(self.url, json=body) as r:
                    status = r.status
                    if status == 200:
                        outputs = (await r.json())["outputs"]
                        batch = next(
                            o["data"][0] for o in outputs if o["name"] == BATCH_SIZE_OUTPUT
                        )
            except aiohttp.ClientError:
                status = -1
            self.answers.append((sent, time.monotonic(), status, batch))

    def across(self, start: float, end: float) -> list[tuple[float, float, int, int]]:
        """The requests in flight at some point between `start` and `end`."""
        return [a for a in self.answers if a[0] <= end and a[1] >= start]


def infer_url(triton: TritonProcess) -> str:
    return f"{triton.url}/v2/models/{triton.model}/infer"


async def served(
    triton: TritonProcess, control: TritonControl, seconds: float
) -> tuple[ClosedLoop, TritonCounters]:
    """32 closed-loop clients for `seconds`, and Triton's counters over that time."""
    before = await control.counters()
    async with ClosedLoop(infer_url(triton), clients=32) as load:
        await asyncio.sleep(seconds)
    return load, (await control.counters()).since(before)


async def test_two_configurations_applied_live_are_what_triton_executes(
    triton: TritonProcess,
) -> None:
    control = TritonControl(triton.url, triton.metrics_url, triton.model)
    assert await control.batching() == TritonBatching(4, 2000)

    first, under_4 = await served(triton, control, 2.0)
    assert {a[2] for a in first.answers} == {200}
    assert max(a[3] for a in first.answers) <= 4
    assert 1.0 < under_4.mean_batch <= 4.0

    # Raise the cap and the wait while 32 clients keep sending: no request may fail.
    async with ClosedLoop(infer_url(triton), clients=32) as load:
        await asyncio.sleep(0.3)
        started = time.monotonic()
        change = await control.apply(TritonBatching(16, 20_000))
        ended = time.monotonic()
        await asyncio.sleep(0.3)
    assert change.live == TritonBatching(16, 20_000)
    during = load.across(started, ended)
    print(
        f"change took {change.seconds:.2f} s; {len(during)} requests in flight during it, "
        f"{sum(1 for a in during if a[2] != 200)} failed, the slowest took "
        f"{max(a[1] - a[0] for a in during):.2f} s"
    )
    # every client had a request in flight while the change ran
    assert len(during) >= load.clients, "the change happened under load"
    assert [a for a in load.answers if a[2] != 200] == []

    second, under_16 = await served(triton, control, 2.0)
    assert max(a[3] for a in second.answers) > 4, "batches beyond the old cap"
    assert under_16.mean_batch > 4.0
    assert under_16.failure == 0

    # And down to batches of two without waiting.
    await control.apply(TritonBatching(2, 0))
    third, under_2 = await served(triton, control, 1.0)
    assert max(a[3] for a in third.answers) <= 2
    assert under_2.mean_batch <= 2.0
    assert await control.batching() == TritonBatching(2, 0)
    print(
        f"mean batch by Triton's counters: {under_4.mean_batch:.2f} (cap 4), "
        f"{under_16.mean_batch:.2f} (cap 16), {under_2.mean_batch:.2f} (cap 2)"
    )


async def test_a_refused_configuration_leaves_the_running_one(triton: TritonProcess) -> None:
    control = TritonControl(triton.url, triton.metrics_url, triton.model)
    config = await control.config()
    config["input"][0]["data_type"] = "TYPE_NOT_A_TYPE"
    with pytest.raises(TargetError, match=r"did not load 'batchpilot' .*HTTP 500.*failed to load"):
        await control.load(config)
    assert await control.batching() == TritonBatching(4, 2000)
    async with (
        aiohttp.ClientSession() as session,
        session.post(infer_url(triton), json=infer_body(3)) as r,
    ):
        assert r.status == 200


_SOCKET = re.compile(
    r"^(?P<state>\S+)\s+\S+\s+\S+\s+(?P<local>\S+)\s+(?P<peer>\S+)\s+(?P<users>.*)$"
)


async def group_sockets(pgid: int) -> list[tuple[str, str, str]]:
    """(state, local address, peer address) of every TCP socket a process of the group
    holds, by `ss -tanpH`."""
    pids = (
        await asyncio.to_thread(
            subprocess.run, ["pgrep", "-g", str(pgid)], capture_output=True, text=True
        )
    ).stdout.split()
    out = (
        await asyncio.to_thread(
            subprocess.run, ["ss", "-tanpH"], capture_output=True, text=True, check=True
        )
    ).stdout
    found = []
    for line in out.splitlines():
        match = _SOCKET.match(line)
        if match and any(f"pid={pid}," in match["users"] for pid in pids):
            found.append((match["state"], match["local"], match["peer"]))
    return found


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]")


async def test_triton_listens_on_loopback_only(triton: TritonProcess) -> None:
    listening = listening_addresses(triton.pid)
    assert {port for _, port in listening} == {
        triton.http_port,
        triton.grpc_port,
        triton.metrics_port,
    }
    assert all(is_loopback(address) for address, _ in listening), listening


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_every_connection_of_triton_stays_on_loopback(triton: TritonProcess) -> None:
    async with ClosedLoop(infer_url(triton), clients=4):
        await asyncio.sleep(0.5)
        sockets = await group_sockets(triton.pid)
    connected = [(local, peer) for state, local, peer in sockets if state != "LISTEN"]
    assert connected, "the clients' connections show up"
    for local, peer in connected:
        assert is_loopback(host_of(local)), f"Triton holds a socket on {local}"
        assert is_loopback(host_of(peer)), f"Triton talks to {peer}"


async def test_stop_ends_the_stub_processes_too() -> None:
    server = TritonProcess(TritonBatching(2, 0))
    await server.start()
    pgid = server.pid
    await server.stop()
    alive = await asyncio.to_thread(
        subprocess.run, ["pgrep", "-g", str(pgid)], capture_output=True, text=True
    )
    assert alive.stdout.strip() == ""
    assert server.returncode == 0
    assert "successfully unloaded" in server.stderr_tail()


async def test_the_adapter_verifies_each_change_by_the_batches_executed(
    triton: TritonProcess,
) -> None:
    runtime = get_runtime("triton")
    control = runtime.control(triton.url, model=runtime.default_model, server=triton)
    assert isinstance(control, RuntimeControl)
    assert await control.current() == BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
    for config in (
        BatchingConfig(max_batch_size=16, max_queue_time_ms=5.0004),
        BatchingConfig(max_batch_size=2, max_queue_time_ms=0.0),
    ):
        await control.apply(config)
        verification = control.last_verification
        assert verification is not None
        assert verification.live == representable(runtime.knobs, config)
        assert verification.native == runtime.native(config)
        assert verification.batch_sizes is not None
        assert max(verification.batch_sizes) <= config.max_batch_size
        # every request of the verification burst (twice the cap) ran in one of them
        executed = sum(size * n for size, n in verification.batch_sizes.items())
        assert executed == 2 * config.max_batch_size
        # the bundled model pins no preferred size: Triton prefers the cap
        assert verification.verified_by.startswith(
            f"config read-back (preferred_batch_size [{config.max_batch_size}]), model READY; "
            "executed batch sizes"
        )
    assert await control.native() == {"max_batch_size": 2, "max_queue_delay_microseconds": 0}


async def test_capacity_is_measured_with_the_v2_protocol(triton: TritonProcess) -> None:
    runtime = get_runtime("triton")
    counters = TritonControl(triton.url, triton.metrics_url, triton.model)
    before = await counters.counters()
    probe = LocalProbe(
        triton.url,
        sla=SLA(p99_ms=200.0),
        mix=RequestMix.default(),
        precision=0.3,
        step_duration_s=1.0,
        warmup_s=0.5,
        protocol=runtime.protocol(runtime.default_model),
    )
    result = await probe.measure(
        BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0), must_beat=None
    )
    served = (await counters.counters()).since(before)
    assert result.feasible
    assert result.effective_rps > 0
    ok_client = sum(round(s.requests * (1 - s.error_rate)) for s in result.steps)
    # Triton counts every request the client saw answered (and the warm-up's besides)
    assert served.success >= ok_client
    assert served.failure == 0
    assert served.mean_batch <= 4.0


def test_tune_local_runtime_triton_gives_the_knobs_in_tritons_terms(tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text("tuning:\n  confirm: false\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "batchpilot", "tune", "--local", "--runtime", "triton", "--quick"),
            *("--trials", "2", "--config", str(config), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert [t["state"] for t in out["trials"]] == ["Complete", "Complete"]
    assert out["best"]["effective_rps"] > 0
    figures = out["runtime"]
    assert figures["name"] == "triton"
    assert figures["knobs"]["max_queue_time_ms"] == "max_queue_delay_microseconds (us)"
    assert figures["baseline"] == {"max_batch_size": 8, "max_queue_delay_microseconds": 5000}
    best = out["best"]
    assert figures["best"] == {
        "max_batch_size": best["max_batch_size"],
        "max_queue_delay_microseconds": round(best["max_queue_time_ms"] * 1000),
    }
    assert figures["persist_kind"] == "recommend"
    assert "max_queue_delay_microseconds:" in figures["persist_snippet"]
    assert "executed batch sizes" in figures["verified_by"]
