"""TorchServe 0.12 for real (Java front end, Python worker, the bundled handler), started
once for the module on loopback: two configurations applied live as new model versions
and proven by the management API and the batch sizes the handler reports; requests
counted through changes under concurrent load; every socket on loopback; a stop that
leaves no process behind. Assertions are about behaviour, never about speed."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.loadgen.protocols import JSON_HEADERS
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.procfs import group_members
from batchpilot.runtimes.torchserve.adapter import TorchServeRuntime
from batchpilot.runtimes.torchserve.control import MODEL, TorchServeControl, request_body
from batchpilot.runtimes.torchserve.process import VENV, TorchServeProcess

from .support import group_pids, is_loopback, listening_addresses, require_runtime

pytestmark = [
    pytest.mark.runtimes,
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="module"),
]

START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
# Waits long enough that a burst of concurrent requests fills every batch to its cap.
SMALL = BatchingConfig(max_batch_size=4, max_queue_time_ms=50.0)
LARGE = BatchingConfig(max_batch_size=16, max_queue_time_ms=50.0)
BURST = 64


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def torchserve() -> AsyncIterator[tuple[TorchServeProcess, TorchServeControl]]:
    require_runtime(VENV, "torchserve")
    runtime = TorchServeRuntime()
    async with runtime.launcher(START) as server:
        yield server, runtime.control(server.url, server=server)


def _tcp_peers(pgid: int) -> list[tuple[str, str]]:
    """(local, remote) addresses of every TCP socket of the process group, any state."""
    inodes: set[str] = set()
    for pid in group_pids(pgid):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    peers = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                peers.append((_host(fields[1]), _host(fields[2])))
    return peers


def _host(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address.split(":")[0])
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


async def test_every_socket_is_on_loopback(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    server, control = torchserve
    await control.burst(8)  # some traffic, so that connections exist as well
    addresses = listening_addresses(server.pid)
    ports = {port for _, port in addresses}
    assert {server.ports[name] for name in ("inference", "management", "metrics")} <= ports
    assert all(is_loopback(address) for address, _ in addresses), addresses
    for local, remote in _tcp_peers(server.pid):
        assert is_loopback(local), (local, remote)
        assert is_loopback(remote) or ipaddress.ip_address(remote).is_unspecified, remote


async def test_two_configurations_take_effect_by_the_handlers_batch_record(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    _, control = torchserve
    for config in (SMALL, LARGE):
        await control.apply(config)
        assert await control.current() == config
        assert len(await control.versions()) == 1
        verification = control.last_verification
        assert verification is not None
        assert verification.native["max_batch_delay"] == 50
        assert verification.verified_by.startswith("management describe (version ")
        observed = await control.burst(BURST)
        assert observed.one("model_version") == {str((await control.describe())["modelVersion"])}
        sizes = observed.batch_sizes()
        assert max(sizes) <= config.max_batch_size, sizes
        if config == SMALL:
            assert max(sizes) == SMALL.max_batch_size, sizes
        else:
            # batches larger than the small cap prove the new cap is live
            assert max(sizes) > SMALL.max_batch_size, sizes


async def test_the_batch_size_query_of_the_model_api_is_accepted_and_ignored(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    """Why the adapter registers new versions: TorchServe answers 2xx to a batch_size
    in PUT /models/M and keeps running the old one. If a later TorchServe honours it,
    this test says so."""
    server, control = torchserve
    before = await control.native()
    async with (
        aiohttp.ClientSession() as session,
        session.put(f"{server.management_url}/models/{MODEL}?batch_size=2") as response,
    ):
        assert 200 <= response.status < 300, await response.text()
    assert await control.native() == before
    assert (await control.burst(BURST)).one("batch_size") == {before["batch_size"]}


async def test_the_archive_it_serves_cannot_be_registered_again_with_other_values(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    """Why `tune --url --runtime torchserve` is refused: with nothing but the management
    API, the only archive at hand is the one registered, whose manifest names the version
    already registered. If a later TorchServe takes it as a new version, this test says
    so."""
    server, control = torchserve
    described = await control.describe()
    before = await control.native()
    query = (
        f"url={described['modelUrl']}&model_name={MODEL}&batch_size=2&max_batch_delay=1"
        "&initial_workers=1&synchronous=true"
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.management_url}/models?{query}") as response,
    ):
        assert response.status == 409, await response.text()
        assert "is already registered" in await response.text()
    assert await control.native() == before
    assert await control.versions() == [str(described["modelVersion"])]


async def test_no_request_fails_while_configurations_change_under_load(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    server, control = torchserve
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()
    url = f"{server.url}/predictions/{MODEL}"

    async def worker(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                async with session.post(url, data=request_body(1), headers=JSON_HEADERS) as r:
                    await r.read()
                    outcomes[str(r.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcomes[type(exc).__name__] += 1

    # a request the change swallowed shows up as a timeout, not as a hung test
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        workers = [asyncio.create_task(worker(session)) for _ in range(16)]
        await asyncio.sleep(0.5)
        before = sum(outcomes.values())
        for config in (SMALL, LARGE):
            await control.apply(config)
        during = sum(outcomes.values()) - before
        stop.set()
        await asyncio.gather(*workers)
    assert during > 0, "the load kept going through the changes"
    assert set(outcomes) == {"200"}, outcomes


async def test_a_restart_after_a_crash_keeps_the_address_and_starts_at_the_start_values(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    server, control = torchserve
    await control.apply(LARGE)
    url, management = server.url, server.management_url
    os.killpg(server.pid, signal.SIGKILL)
    assert await server.exit_code(5.0) is not None
    await server.restart()
    assert (server.url, server.management_url) == (url, management)
    assert await control.current() == START
    await control.apply(SMALL)  # the control still reaches the model store
    assert await control.current() == SMALL


async def test_a_stop_leaves_no_process_behind(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    """Last in the module: it stops the shared server (the fixture's stop is then a
    no-op)."""
    server, _ = torchserve
    pgid = server.pid
    assert len(group_members(pgid)) >= 3  # launcher, Java front end, a worker
    store = server.store
    assert store is not None
    await server.stop()
    # not one live process of the group: no launcher, no Java, no worker (an exited
    # one that nobody reaped yet would show as a zombie, which this does not count)
    assert group_members(pgid) == []
    assert not store.root.exists()
