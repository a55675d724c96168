"""`tune --url` against a server behind an https gateway that wants credentials, as a
user's model server often sits: with --header and --ca-bundle every call (the load,
the control's reads and changes, the restore) carries the header and verifies the
gateway's certificate against the private CA; without them the run stops before any load
with a message that says what to give. The server is a real reference server, the
gateway a real https proxy. Assertions are about behaviour, never speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.registry import get_runtime
from batchpilot.server.process import ServerProcess
from support.gateway import Gateway

from .tls_support import Tls, https_context, make_tls

pytestmark = [pytest.mark.component, pytest.mark.timeout(540)]

TUNE = [sys.executable, "-m", "batchpilot", "tune"]
FOUND = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
SECRET = "Bearer gw-7f3c9a"


def _tune(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TUNE, *args], capture_output=True, text=True, timeout=480, check=False)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def server() -> AsyncIterator[ServerProcess]:
    process = ServerProcess(
        max_batch_size=FOUND.max_batch_size, max_queue_time_ms=FOUND.max_queue_time_ms, threads=1
    )
    async with process:
        yield process


@pytest.fixture
async def gateway(server: ServerProcess, tls: Tls) -> AsyncIterator[Gateway]:
    async with Gateway(
        server.url, header=("Authorization", SECRET), ssl_context=https_context(tls)
    ) as proxy:
        yield proxy


async def test_every_call_through_the_gateway_carries_the_header(
    server: ServerProcess, gateway: Gateway, tls: Tls, tmp_path: Path
) -> None:
    # the calls are under test, not the verdict: no confirmation rounds (test_tune_url's)
    config = tmp_path / "no-confirm.yaml"
    config.write_text("tuning:\n  confirm: false\n")
    args = ["--url", gateway.url, "--runtime", "reference", "--quick", "--json"]
    args += ["--header", f"Authorization: {SECRET}", "--ca-bundle", str(tls.ca)]
    args += ["--trials", "2", "--seed", "5", "--sla-p99-ms", "1000", "--config", str(config)]
    args += ["--min-requests", "200"]
    done = await asyncio.to_thread(_tune, args)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["trials"][0]["label"] == "baseline"
    assert out["baseline"]["max_batch_size"] == FOUND.max_batch_size
    # nothing reached the gateway without the credentials; the load and the control went
    # through it: the trials' changes (PUT) and read-backs, and the restore
    assert not gateway.refused, dict(gateway.refused)
    assert gateway.forwarded["/v1/predict"] >= 400
    assert gateway.forwarded["/admin/batching"] >= 4
    # the server was changed through the gateway and put back at the end
    assert await get_runtime("reference").control(server.url).current() == FOUND
    # the credentials are never printed
    assert SECRET.split()[1] not in done.stdout + done.stderr


async def test_without_the_header_the_run_stops_before_any_load_and_says_what_to_give(
    gateway: Gateway, tls: Tls
) -> None:
    done = await asyncio.to_thread(
        _tune, ["--url", gateway.url, "--quick", "--ca-bundle", str(tls.ca)]
    )
    assert done.returncode == 1
    assert "HTTP 401" in done.stderr
    assert "--header" in done.stderr
    assert gateway.forwarded["/v1/predict"] == 0
    assert gateway.refused["/v1/predict"] == 0


async def test_without_the_ca_bundle_the_gateway_is_not_trusted(gateway: Gateway) -> None:
    done = await asyncio.to_thread(
        _tune, ["--url", gateway.url, "--quick", "--header", f"Authorization: {SECRET}"]
    )
    assert done.returncode == 2
    assert f"--url {gateway.url}: nothing answers there" in done.stderr
    assert "certificate" in done.stderr.lower()
    assert not gateway.forwarded


async def test_the_ca_bundle_that_did_not_sign_the_gateway_is_refused(
    gateway: Gateway, tls: Tls
) -> None:
    args = ["--url", gateway.url, "--quick", "--header", f"Authorization: {SECRET}"]
    done = await asyncio.to_thread(_tune, [*args, "--ca-bundle", str(tls.other_ca)])
    assert done.returncode == 2
    assert "certificate" in done.stderr.lower()
    assert not gateway.forwarded
