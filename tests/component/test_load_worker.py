"""Load-worker processes (`batchpilot load-worker`) driven over HTTP as the operator
drives its worker pods: shares merged exactly, the token enforced, a late or dead
worker making the step invalid, an https target behind a private CA verified with the
CA bundle the share carries."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from batchpilot.capacity.http import measure_capacity, share_spec
from batchpilot.loadgen.arrivals import Constant, schedule
from batchpilot.loadgen.protocols import REFERENCE, REFERENCE_PATH, RequestProtocol, speaking
from batchpilot.loadgen.result import TLS
from batchpilot.loadgen.serve_worker import (
    SHARE_PATH,
    TOKEN_ENV,
    ShareRequest,
    run_remote_shares,
)
from batchpilot.loadgen.workers import ShareSpec, WorkerError
from batchpilot.models import SLA, RequestMix
from batchpilot.server.process import free_port
from support.stub_server import StubServerProcess

from .tls_support import https_context, make_tls

pytestmark = [pytest.mark.component, pytest.mark.timeout(180)]

TOKEN = "component-test-token"


async def start_worker() -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchpilot", "load-worker", "--host", "127.0.0.1",
        "--port", str(port),
        env={**os.environ, TOKEN_ENV: TOKEN},
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        async with asyncio.timeout(60):
            while True:
                try:
                    async with session.get(f"http://{address}/healthz") as response:
                        if response.status == 200:
                            return proc, address
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)


@pytest.fixture
async def workers() -> AsyncIterator[list[tuple[asyncio.subprocess.Process, str]]]:
    started = [await start_worker() for _ in range(2)]
    yield started
    for proc, _ in started:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def spec_for(url: str, rate: float = 100.0, duration_s: float = 2.0) -> ShareSpec:
    return ShareSpec(
        urls=[url], rate=rate, duration_s=duration_s, mix=RequestMix.default(),
        arrival=Constant(), timeout_s=5.0, seed=7,
    )  # fmt: skip


async def test_two_workers_send_the_one_schedule_between_them(
    workers: list[tuple[asyncio.subprocess.Process, str]],
) -> None:
    async with StubServerProcess(capacity_rps=1000.0, queue_limit=10_000) as stub:
        spec = spec_for(stub.url)
        merged = await run_remote_shares([a for _, a in workers], TOKEN, spec)
    assert merged.requests == len(schedule(spec.rate, spec.duration_s, spec.arrival, spec.seed))
    assert merged.ok == merged.requests
    assert len(merged.worker_clients) == 2
    assert merged.urls == [stub.url]


async def test_a_wrong_token_is_refused(
    workers: list[tuple[asyncio.subprocess.Process, str]],
) -> None:
    with pytest.raises(WorkerError, match="401"):
        await run_remote_shares([workers[0][1]], "not-the-token", spec_for("http://127.0.0.1:1"))


async def test_a_share_that_arrives_late_is_refused(
    workers: list[tuple[asyncio.subprocess.Process, str]],
) -> None:
    late = ShareRequest(spec=spec_for("http://127.0.0.1:1"), start_at=time.time() - 5.0)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.post(
            f"http://{workers[0][1]}{SHARE_PATH}",
            data=late.model_dump_json(by_alias=True),
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 409
        assert "after its start" in await response.text()


async def test_a_dead_worker_makes_every_step_it_misses_invalid(
    workers: list[tuple[asyncio.subprocess.Process, str]],
) -> None:
    (alive, alive_address), (dead, dead_address) = workers
    dead.kill()
    await dead.wait()

    async def send(spec: ShareSpec) -> object:
        return await run_remote_shares([alive_address, dead_address], TOKEN, spec)

    async with StubServerProcess(capacity_rps=1000.0, queue_limit=10_000) as stub:
        result = await measure_capacity(
            stub.url, sla=SLA(p99_ms=1000), mix=RequestMix.default(), step_duration_s=1.0,
            warmup_s=0.0, start_rps=50.0, min_requests=0, sender=send,  # type: ignore[arg-type]
        )  # fmt: skip
    assert result.steps
    assert all(not s.valid and not s.passed for s in result.steps)
    assert all("load worker 1" in s.reason for s in result.steps)
    assert not result.feasible
    assert alive.returncode is None


async def _answer(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True})


@pytest.fixture
async def private_ca_target(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[str, str]]:
    """An https server on loopback whose certificate a throw-away CA signed: its URL and
    the CA's PEM file."""
    tls = make_tls(tmp_path_factory.mktemp("tls"))
    app = web.Application()
    app.router.add_post("/v1/predict", _answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=https_context(tls)).start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}", str(tls.ca)
    finally:
        await runner.cleanup()


async def test_workers_verify_a_private_ca_target_with_the_bundle_the_share_carries(
    workers: list[tuple[asyncio.subprocess.Process, str]],
    private_ca_target: tuple[str, str],
) -> None:
    url, ca_file = private_ca_target
    addresses = [a for _, a in workers]

    def step(protocol: RequestProtocol) -> ShareSpec:
        """One step's share as the operator builds it, with `protocol` in force."""
        with speaking(protocol):
            return share_spec(
                [url], 40.0, 1.0, RequestMix.default(), "constant", 5.0, 7, REFERENCE_PATH
            )

    trusted = await run_remote_shares(
        addresses, TOKEN, step(dataclasses.replace(REFERENCE, ca_file=ca_file))
    )
    assert trusted.requests > 0
    assert trusted.ok == trusted.requests, trusted.errors
    untrusted = await run_remote_shares(addresses, TOKEN, step(REFERENCE))
    assert untrusted.requests > 0
    assert untrusted.errors == {TLS: untrusted.requests}


async def test_a_share_with_a_bundle_that_is_not_pem_is_refused_by_name(
    workers: list[tuple[asyncio.subprocess.Process, str]],
) -> None:
    spec = spec_for("https://127.0.0.1:1").model_copy(update={"ca_pem": "not a certificate"})
    with pytest.raises(WorkerError, match="400") as refused:
        await run_remote_shares([workers[0][1]], TOKEN, spec)
    assert "spec.ca_pem" in str(refused.value)
    assert "no PEM certificate block" in str(refused.value)
    assert all(proc.returncode is None for proc, _ in workers)  # refused, not crashed
