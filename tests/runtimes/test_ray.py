"""A real Ray Serve (a single-node cluster on loopback, the bundled `@serve.batch` app),
started once for the module: two batching configurations applied live under concurrent
load, each verified by the Serve REST API and checked against the batch sizes and
batcher values the replica reports, every failed
request during a change counted, capacity measured with the app's protocol, Ray's own
metric names checked, every connection on loopback, and a stop that leaves no Ray
process behind."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.runtimes.base import RuntimeControl, representable
from batchpilot.runtimes.procfs import live_session_pids
from batchpilot.runtimes.rayserve.adapter import RayServeRuntime
from batchpilot.runtimes.rayserve.config import batch_sizes, check_answers
from batchpilot.runtimes.rayserve.control import RayServeControl
from batchpilot.runtimes.rayserve.process import VENV, RayServeProcess
from batchpilot.runtimes.registry import get_runtime
from batchpilot.tuner.local import LocalProbe

from .support import is_loopback, require_runtime

pytestmark = [
    pytest.mark.runtimes,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

START = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    require_runtime(VENV, "ray")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ray(installed: None) -> AsyncIterator[RayServeProcess]:
    server = get_runtime("ray").launcher(START)
    assert isinstance(server, RayServeProcess)
    async with server:
        yield server


def control_of(ray: RayServeProcess) -> RayServeControl:
    runtime = RayServeRuntime()
    return runtime.control(ray.url, model=runtime.default_model, server=ray)


@dataclass
class ClosedLoop:
    """`async with ClosedLoop(url, 32) as load:` clients that each keep one request in
    flight until the block ends: per request (sent, answered, status, batch size the
    replica reports, its max_batch_size)."""

    url: str
    clients: int
    answers: list[tuple[float, float, int, int, int]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> ClosedLoop:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
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
            batch = cap = 0
            sent = time.monotonic()
            try:
                async with self._session.post(self.url, json={"size": 1 + (index + n) % 5}) as r:
                    status = r.status
                    if status == 200:
                        data = await r.json()
                        batch, cap = int(data["batch_size"]), int(data["max_batch_size"])
            except (aiohttp.ClientError, TimeoutError):
                status = -1
            self.answers.append((sent, time.monotonic(), status, batch, cap))

    def across(self, start: float, end: float) -> list[tuple[float, float, int, int, int]]:
        """The requests in flight at some point between `start` and `end`."""
        return [a for a in self.answers if a[0] <= end and a[1] >= start]

    def after(self, moment: float) -> list[tuple[float, float, int, int, int]]:
        return [a for a in self.answers if a[0] > moment]


async def test_two_configurations_applied_live_are_what_the_replica_runs(
    ray: RayServeProcess,
) -> None:
    runtime = RayServeRuntime()
    control = control_of(ray)
    assert isinstance(control, RuntimeControl)
    assert await control.native() == {"max_batch_size": 4, "batch_wait_timeout_s": 0.002}
    assert await control.current() == START
    pids_before = (await control.state()).replica_pids

    async with ClosedLoop(ray.url + "/", clients=32) as load:
        await asyncio.sleep(1.5)
        first = list(load.answers)
        changes = []
        for config in (
            BatchingConfig(max_batch_size=16, max_queue_time_ms=20.0),
            BatchingConfig(max_batch_size=2, max_queue_time_ms=0.0),
        ):
            started = time.monotonic()
            await control.apply(config)
            ended = time.monotonic()
            changes.append((config, started, ended))
            await asyncio.sleep(1.5)
    assert first, "the clients were answered before the first change"
    assert {a[2] for a in first} == {200}
    assert max(a[3] for a in first) <= 4
    assert {a[4] for a in first} == {4}

    for (config, started, ended), nxt in zip(changes, [*changes[1:], None], strict=True):
        verification = control.last_verification if nxt is None else None
        during = load.across(started, ended)
        failed = [a for a in during if a[2] != 200]
        print(
            f"{config.label()}: change took {ended - started:.2f} s; {len(during)} requests "
            f"in flight during it, {len(failed)} failed"
        )
        assert len(during) >= load.clients, "the change happened under load"
        assert failed == []
        # what the replica ran once the change was verified, until the next one began
        until = nxt[1] if nxt is not None else float("inf")
        served = [a for a in load.after(ended) if a[1] < until]
        assert served, "answers after the change"
        assert {a[4] for a in served} == {config.max_batch_size}
        assert max(a[3] for a in served) <= config.max_batch_size
        if config.max_batch_size == 16:
            assert max(a[3] for a in served) > 4, "batches beyond the old cap"
        if verification is not None:
            assert verification.live == representable(runtime.knobs, config)
            assert verification.native == runtime.native(config)
            assert verification.verified_by.startswith("Serve REST API: user_config read back")
            assert "same replica processes" in verification.verified_by
    assert [a for a in load.answers if a[2] != 200] == []
    assert (await control.state()).replica_pids == pids_before, "no replica was replaced"
    # the bundled app's own report, an extra check of what the REST API verified: a
    # burst right after apply() returns runs on the new batcher values only
    config = BatchingConfig(max_batch_size=8, max_queue_time_ms=50.0)
    await control.apply(config)
    answers = await control.burst(32)
    assert check_answers(answers, runtime.native(config)) == []
    assert max(batch_sizes(answers)) > 2, "batches beyond the cap before"
    assert await control.native() == {"max_batch_size": 8, "batch_wait_timeout_s": 0.05}


async def test_a_malformed_request_is_refused_saying_what_the_app_takes(
    ray: RayServeProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        for body in ({"size": 0}, {"rows": 3}, [1]):
            async with session.post(ray.url + "/", json=body) as r:
                assert r.status == 400
                assert 'expected a JSON object {"size": N}' in (await r.json())["error"]


async def test_capacity_is_measured_with_the_apps_protocol(ray: RayServeProcess) -> None:
    runtime = get_runtime("ray")
    await control_of(ray).apply(START)
    probe = LocalProbe(
        ray.url,
        # What is under test is the protocol: every request accepted and answered. A
        # generous SLA keeps one stall of Ray's own background processes in a short
        # window on a 2-core machine from failing every step of the ramp.
        sla=SLA(p99_ms=2000.0),
        mix=RequestMix.default(),
        precision=0.3,
        step_duration_s=1.0,
        warmup_s=0.5,
        # Ray on 2 cores serves a few dozen requests per second: a one-second step
        # stretched to its limit holds fewer than the default minimum's 2,000, and under
        # 299 (what a p99 bound needs) no step could pass whatever Ray did
        min_requests=200,
        protocol=runtime.protocol(runtime.default_model),
    )
    result = await probe.measure(START, must_beat=None)
    steps = [(round(s.offered_rps, 1), s.requests, s.error_rate, s.reason) for s in result.steps]
    assert result.feasible, steps
    assert result.effective_rps > 0


async def metric_families(url: str) -> set[str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+)", text, re.MULTILINE)}


async def test_rays_metrics_carry_the_names_the_adapter_declares(ray: RayServeProcess) -> None:
    metrics = RayServeRuntime.metrics
    assert metrics.latency_histogram is not None
    wanted = {
        metrics.latency_histogram,
        "ray_serve_num_http_requests_total",
        "ray_serve_actual_batch_size",
    }
    # Ray exports its metrics about 10 s after they happen.
    deadline = time.monotonic() + 60
    found: set[str] = set()
    while time.monotonic() < deadline:
        found = await metric_families(ray.metrics_url)
        if wanted <= found:
            break
        await asyncio.sleep(2)
    assert wanted <= found, sorted(n for n in found if n.startswith("ray_serve"))


_SOCKET = re.compile(
    r"^(?P<state>\S+)\s+\S+\s+\S+\s+(?P<local>\S+)\s+(?P<peer>\S+)\s+(?P<users>.*)$"
)


def host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0].strip("[]")
    return "0.0.0.0" if host == "*" else host


async def session_sockets(sid: int) -> list[tuple[str, str, str, str]]:
    """(state, local address, peer address, owning processes) of every TCP socket a
    process of Ray's session holds, by `ss -tanpH`."""
    pids = live_session_pids(sid)
    out = (
        await asyncio.to_thread(
            subprocess.run, ["ss", "-tanpH"], capture_output=True, text=True, check=True
        )
    ).stdout
    found = []
    for line in out.splitlines():
        match = _SOCKET.match(line)
        if match and any(f"pid={pid}," in match["users"] for pid in pids):
            found.append((match["state"], match["local"], match["peer"], match["users"]))
    return found


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_every_connection_of_ray_stays_on_loopback(ray: RayServeProcess) -> None:
    async with ClosedLoop(ray.url + "/", clients=4):
        await asyncio.sleep(0.5)
        sockets = await session_sockets(ray.pid)
    connected = [(local, peer) for state, local, peer, _ in sockets if state != "LISTEN"]
    assert connected, "the clients' connections show up"
    for local, peer in connected:
        assert is_loopback(host_of(local)), f"Ray holds a socket on {local}"
        assert is_loopback(host_of(peer)), f"Ray talks to {peer}"
    listening = [
        (host_of(local), int(local.rsplit(":", 1)[1]), users)
        for state, local, _, users in sockets
        if state == "LISTEN"
    ]
    # Every endpoint of Ray's own (HTTP, gRPC, client server) listens on loopback only.
    for name, port in ray.ports.items():
        hosts = {host for host, p, _ in listening if p == port}
        assert hosts, name
        assert all(is_loopback(h) for h in hosts), (name, hosts)
    # Serve 2.60's replica opens its inter-deployment gRPC server on "[::]:0" in its code
    # (replica.py), with no option to bind it elsewhere. Nothing connects to it here (no
    # deployment calls another); it is the only socket beyond loopback.
    wide = [(host, p, users) for host, p, users in listening if not is_loopback(host)]
    print(f"listening beyond loopback: {wide}")
    assert all('"ray::ServeRepli"' in users for _, _, users in wide), wide


async def test_stop_ends_every_process_of_the_session(ray: RayServeProcess) -> None:
    sid = ray.pid
    assert len(live_session_pids(sid)) > 5, "Ray runs many processes in its session"
    root = ray.root
    await ray.stop()
    assert live_session_pids(sid) == []
    assert root is not None
    assert not root.exists()
