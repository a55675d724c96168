"""The load over https against a real HTTPS server on loopback whose certificate a
throw-away CA signed: every request answered when the CA bundle is given (one process and
two worker processes), none when it is not (verification is never off), and a bundle
that is not PEM refused by the CLI before any request."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import REFERENCE, speaking
from batchpilot.loadgen.workers import run_load_workers
from batchpilot.models import RequestMix

from .tls_support import Tls, https_context, make_tls

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


async def _predict(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True})


@pytest.fixture
async def https_url(tls: Tls) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/predict", _predict)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=https_context(tls))
    await site.start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_https_load_is_answered_with_the_ca_bundle(https_url: str, tls: Tls) -> None:
    trusted = dataclasses.replace(REFERENCE, ca_file=str(tls.ca))
    with speaking(trusted):
        result = await run_load(
            https_url, rate=40, duration_s=1.0, mix=RequestMix.default(), timeout_s=5.0
        )
    assert result.requests > 0
    assert result.ok == result.requests, result.errors


async def test_https_load_is_refused_without_it_or_with_another_ca(
    https_url: str, tls: Tls
) -> None:
    for protocol in (REFERENCE, dataclasses.replace(REFERENCE, ca_file=str(tls.other_ca))):
        with speaking(protocol):
            result = await run_load(
                https_url, rate=40, duration_s=0.5, mix=RequestMix.default(), timeout_s=5.0
            )
        assert result.requests > 0
        assert result.ok == 0, result.errors


async def test_worker_processes_get_the_ca_bundle(https_url: str, tls: Tls) -> None:
    trusted = dataclasses.replace(REFERENCE, ca_file=str(tls.ca))
    with speaking(trusted):
        result = await run_load_workers(
            [https_url],
            workers=2,
            rate=40,
            duration_s=1.0,
            mix=RequestMix.default(),
            timeout_s=5.0,
        )
    assert result.requests > 0
    assert result.ok == result.requests, result.errors


def test_cli_refuses_a_bundle_that_is_not_pem(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not a certificate\n")
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "batchpilot", "loadtest", "https://127.0.0.1:9"),
            *("--rate", "10", "--duration", "1", "--ca-bundle", str(bundle), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "--ca-bundle: the load's CA bundle (file" in done.stderr
    assert "PEM certificates" in done.stderr
    assert done.stdout == ""
