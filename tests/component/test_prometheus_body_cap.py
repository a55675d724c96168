"""A hostile or broken Prometheus address: an answer that streams without end, or
declares a huge length, is refused at the body cap instead of filling the operator's
memory (a real HTTP server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from batchpilot.capacity import prometheus_http
from batchpilot.capacity.prometheus_http import PrometheusHTTP, PrometheusQueryError

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

CAP = 1024 * 1024  # the cap, lowered for the test


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    chunk = b'{"status":"success","data":' + b" " * (64 * 1024)
    sent = 0
    while sent < 20 * CAP:  # far past the cap; the client hangs up first
        await response.write(chunk)
        sent += len(chunk)
    return response


async def _declared(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Length": str(10 * CAP)})
    await response.prepare(request)
    await response.write(b"{")
    return response


async def _small(request: web.Request) -> web.Response:
    return web.json_response({"status": "success", "data": {"resultType": "scalar"}})


@pytest.fixture
async def url(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    monkeypatch.setattr(prometheus_http, "MAX_BODY_BYTES", CAP)
    app = web.Application()
    app.router.add_get("/api/v1/endless", _endless)
    app.router.add_get("/api/v1/declared", _declared)
    app.router.add_get("/api/v1/small", _small)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("path", ["/api/v1/endless", "/api/v1/declared"])
async def test_an_answer_past_the_cap_is_refused(url: str, path: str) -> None:
    client = PrometheusHTTP(url, timeout_s=20.0, attempts=1)
    with pytest.raises(PrometheusQueryError, match="with more than 1 MiB"):
        await client.get(path)


async def test_an_answer_within_the_cap_is_read(url: str) -> None:
    client = PrometheusHTTP(url, timeout_s=20.0, attempts=1)
    assert await client.get("/api/v1/small") == {"resultType": "scalar"}
