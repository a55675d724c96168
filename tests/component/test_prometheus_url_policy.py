"""The operator's Prometheus URL policy at connection time (a real HTTP server on
loopback): every address a query connects to is checked, an address literal and each
address a name resolves to alike, so a name re-pointed at a denied address after the
spec was admitted (DNS rebinding) is refused before any request is sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp import web

from batchpilot.capacity.prometheus_http import PrometheusHTTP, PrometheusQueryError
from batchpilot.operator.platform import address_guard, policy_from_flags
from batchpilot.operator.policy import prometheus_refusal

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

STRICT = policy_from_flags([], environ={})


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[int, list[str]]]:
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"status": "success", "data": {"resultType": "scalar"}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_loopback_prometheus_is_refused_without_a_request(
    prometheus: tuple[int, list[str]], host: str
) -> None:
    port, seen = prometheus
    client = PrometheusHTTP(
        f"http://{host}:{port}", timeout_s=10.0, attempts=1, address_guard=address_guard(STRICT)
    )
    with pytest.raises(PrometheusQueryError, match=r"is loopback.*--prometheus-allow"):
        await client.get("/api/v1/query")
    assert seen == []


async def test_a_name_that_resolves_to_a_denied_address_at_connection_is_refused(
    prometheus: tuple[int, list[str]],
) -> None:
    """As if `metrics.example` had resolved to an ordinary address when the spec was
    admitted and to loopback now: the guard sees what this connection resolved."""
    port, seen = prometheus
    resolved: list[Sequence[str]] = []

    def rebound(host: str, addresses: Sequence[str]) -> str | None:
        resolved.append(addresses)
        return prometheus_refusal("metrics.example", addresses, STRICT)

    client = PrometheusHTTP(
        f"http://localhost:{port}", timeout_s=10.0, attempts=1, address_guard=rebound
    )
    with pytest.raises(PrometheusQueryError, match=r"resolves to 127\.0\.0\.1, which is loopback"):
        await client.get("/api/v1/query")
    assert any("127.0.0.1" in addresses for addresses in resolved)
    assert seen == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_the_allow_list_lets_it_through(prometheus: tuple[int, list[str]], host: str) -> None:
    port, seen = prometheus
    allowed = policy_from_flags(["127.0.0.0/8", "::1", "localhost"], environ={})
    client = PrometheusHTTP(
        f"http://{host}:{port}", timeout_s=10.0, attempts=1, address_guard=address_guard(allowed)
    )
    assert await client.get("/api/v1/query") == {"resultType": "scalar"}
    assert seen == ["/api/v1/query"]
