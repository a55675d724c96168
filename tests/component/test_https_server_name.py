"""A pod that serves https with a certificate for a DNS name, reached by IP as the
operator reaches pods: the load the operator builds from load.endpoint (scheme https,
caBundle, serverName) is answered in this process and in worker processes, and without
serverName every request fails as `tls` (the certificate does not name the IP).

The server is a real HTTPS server on loopback, its certificate made in the test for a
name that resolves nowhere, so only a server name given apart from the URL can match it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from batchpilot.loadgen.endpoints import UnreachableError, check_reachable
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import speaking
from batchpilot.loadgen.result import TLS
from batchpilot.loadgen.workers import run_load_workers
from batchpilot.models import RequestMix
from batchpilot.operator import runtimes
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec

from .tls_support import Tls, https_context, make_tls

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]

SERVER_NAME = "model.serving.batchpilot.test"
POD_IP = "127.0.0.1"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"), server_name=SERVER_NAME)


async def _predict(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True})


@pytest.fixture
async def https_port(tls: Tls) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_post("/v1/predict", _predict)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, POD_IP, 0, ssl_context=https_context(tls)).start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


def _spec(port: int, tls: Tls, **endpoint: Any) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "model"},
            "sla": {"p99LatencyMs": 200},
            "load": {
                "endpoint": {
                    "port": port,
                    "path": "/v1/predict",
                    "scheme": "https",
                    "caBundle": tls.ca.read_text(),
                    **endpoint,
                }
            },
        }
    )


async def test_with_server_name_every_request_is_answered(https_port: int, tls: Tls) -> None:
    spec = _spec(https_port, tls, serverName=SERVER_NAME)
    url = runtimes.pod_url(spec, POD_IP)
    assert url == f"https://{POD_IP}:{https_port}"
    with speaking(runtimes.load_protocol(spec)):
        await check_reachable([url])
        result = await run_load(
            url, rate=40, duration_s=1.0, mix=RequestMix.default(), timeout_s=5.0
        )
        spread = await run_load_workers(
            [url], workers=2, rate=40, duration_s=1.0, mix=RequestMix.default(), timeout_s=5.0
        )
    for run in (result, spread):
        assert run.requests > 0
        assert run.ok == run.requests, run.errors


async def test_without_server_name_every_request_fails_as_tls(https_port: int, tls: Tls) -> None:
    spec = _spec(https_port, tls)
    url = runtimes.pod_url(spec, POD_IP)
    with speaking(runtimes.load_protocol(spec)):
        with pytest.raises(UnreachableError, match="cannot reach"):
            await check_reachable([url])
        result = await run_load(
            url, rate=40, duration_s=0.5, mix=RequestMix.default(), timeout_s=5.0
        )
    assert result.requests > 0
    assert result.errors == {TLS: result.requests}
