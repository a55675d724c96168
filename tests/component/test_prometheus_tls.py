"""The Prometheus source over TLS and its error bodies, against a real HTTPS server on
loopback serving the Prometheus API paths, its certificate signed by a throw-away CA
(made with the `openssl` command): trusted with the CA bundle, refused without it; a
non-2xx answer's body never in the error's message."""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from batchpilot.capacity.prometheus import PrometheusQueryError, PrometheusStepSource
from support.stub_server import StubServerProcess

from .tls_support import Tls, https_context, make_tls

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]

SECRET = "tenant-secret-token-0123456789"
CONFIG_YAML = "global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: x\n"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


async def _query(request: web.Request) -> web.Response:
    query = request.query.get("query", "")
    if "refuse" in query:
        body = {"status": "error", "errorType": "bad_data", "error": SECRET * 40}
        return web.json_response(body, status=400)
    if "broken" in query:
        return web.Response(status=500, text=SECRET * 40)
    result = [{"metric": {}, "value": [0, "1"]}] if query == "vector(1)" else []
    return web.json_response(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    )


async def _config(request: web.Request) -> web.Response:
    return web.json_response({"status": "success", "data": {"yaml": CONFIG_YAML}})


@pytest.fixture
async def https_url(tls: Tls) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/prom/api/v1/query", _query)
    app.router.add_get("/prom/api/v1/status/config", _config)
    context = https_context(tls)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"https://127.0.0.1:{port}/prom"
    finally:
        await runner.cleanup()


async def test_trusted_with_the_ca_bundle_as_text_or_file(https_url: str, tls: Tls) -> None:
    for source in (
        PrometheusStepSource(https_url, ca_pem=tls.ca.read_text()),
        PrometheusStepSource(https_url + "/", ca_file=str(tls.ca)),
    ):
        await source.check_reachable()
        assert await source.query_scalar("vector(1)", at_unix=0.0) == 1.0
        assert math.isnan(await source.query_scalar("up", at_unix=0.0))
        assert await source.check_step(5.0) == 1.0


async def test_refused_without_the_bundle_or_with_another_ca(https_url: str, tls: Tls) -> None:
    for source in (
        PrometheusStepSource(https_url, query_timeout_s=5.0),
        PrometheusStepSource(https_url, ca_file=str(tls.other_ca), query_timeout_s=5.0),
    ):
        with pytest.raises(PrometheusQueryError, match="TLS certificate is not trusted"):
            await source.check_reachable()
        with pytest.raises(PrometheusQueryError, match="give the interval explicitly"):
            await source.check_step(5.0)


async def test_error_bodies_stay_out_of_messages(https_url: str, tls: Tls) -> None:
    source = PrometheusStepSource(https_url, ca_file=str(tls.ca), query_timeout_s=10.0)
    with pytest.raises(PrometheusQueryError) as refused:
        await source.query_scalar("refuse", at_unix=0.0)
    assert str(refused.value) == (
        f"Prometheus at {https_url} answered query with HTTP 400 Bad Request, errorType bad_data"
    )
    assert SECRET in refused.value.body_excerpt
    assert len(refused.value.body_excerpt) <= 201
    # a 500 is not retried (only 502-504 are) and has no errorType
    with pytest.raises(PrometheusQueryError) as broken:
        await source.query_scalar("broken", at_unix=0.0)
    assert SECRET not in str(broken.value)
    assert str(broken.value).endswith("HTTP 500 Internal Server Error")


async def _capacity(*args: str) -> tuple[int, str]:
    import asyncio

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchpilot", "capacity", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_capacity_cli_verifies_prometheus(https_url: str, tls: Tls) -> None:
    async with StubServerProcess() as stub:
        code, err = await _capacity(stub.url, "--p99-ms", "100", "--prometheus", https_url)
        assert code == 1
        assert "TLS certificate is not trusted" in err
        # trusted, it gets as far as the scrape interval: Prometheus's says 1 s, so a
        # 2 s step is refused, which proves the configuration was read over TLS
        code, err = await _capacity(
            stub.url, "--p99-ms", "100", "--prometheus", https_url,
            "--prometheus-ca-bundle", str(tls.ca), "--step-seconds", "2",
        )  # fmt: skip
        assert code == 1
        assert "shorter than 4 scrape intervals" in err
        code, err = await _capacity(stub.url, "--p99-ms", "100", "--prometheus", https_url + "#x")
        assert code == 1
        assert "has a fragment ('#')" in err
        code, err = await _capacity(stub.url, "--p99-ms", "100", "--prometheus-ca-bundle", __file__)
        assert code == 1
        assert "--prometheus-ca-bundle applies with --prometheus only" in err
