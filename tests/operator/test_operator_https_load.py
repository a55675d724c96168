"""KubeWorld measures pods that serve https: with load.endpoint.scheme https the load
goes to https://POD_IP:PORT, verified with the spec's caBundle against its serverName
(KMock for the API, a real HTTPS server on loopback standing in for the pod, its
certificate made for a DNS name only)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import pytest
from aiohttp import web
from test_operator_world import DEPLOYMENTS, NS, kube, ready_pod, target, world

from batchpilot.models import BatchingConfig
from batchpilot.operator.kube import Kube
from batchpilot.operator.spec import parse_spec

# the component tests' throw-away CA, shared rather than copied (tests/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from component.tls_support import Tls, https_context, make_tls

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]
__all__ = ["kube"]  # the KMock-backed client fixture, used by name

SERVER_NAME = "resnet.models.svc"
CONFIG = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"), server_name=SERVER_NAME)


@pytest.fixture
async def https_pod(tls: Tls) -> AsyncIterator[tuple[int, list[str]]]:
    """The pod's port, and the scheme and host of every inference request it got."""
    seen: list[str] = []

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        seen.append(f"{request.scheme}://{request.host}")
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/predict", predict)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=https_context(tls)).start()
    try:
        yield int(runner.addresses[0][1]), seen
    finally:
        await runner.cleanup()


def https_spec(port: int, tls: Tls) -> Any:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": {
                "endpoint": {
                    "port": port,
                    "path": "/v1/predict",
                    "scheme": "https",
                    "caBundle": tls.ca.read_text(),
                    "serverName": SERVER_NAME,
                },
                "maxRps": 5,
                "maxOverloadSeconds": 1,
                "stepSeconds": 1,
                "warmupSeconds": 0,
                "minRequests": 0,
            },
            "tuning": {"strategy": "InPlace"},
        }
    )


async def test_an_https_endpoint_is_measured_over_verified_tls(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    https_pod: tuple[int, list[str]],
    tls: Tls,
) -> None:
    port, seen = https_pod
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    result = await world(kube, https_spec(port, tls)).trials.measure(
        CONFIG, must_beat=None, since=datetime.now(UTC)
    )
    assert seen
    assert set(seen) == {f"https://127.0.0.1:{port}"}
    assert result.steps
    assert all(step.requests > 0 and step.error_rate == 0.0 for step in result.steps), [
        (step.requests, step.error_rate, step.reason) for step in result.steps
    ]
