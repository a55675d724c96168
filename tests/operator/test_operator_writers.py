"""KubeWorld against KMock and loopback stand-ins: the Prometheus source narrowed to the
measured pods with production's live traffic taken off, a configuration reverted by
another writer, and an autoscaler that scales the target under a trial."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from aiohttp import web
from kmock import ResourceInfo
from test_operator_world import DEPLOYMENTS, NS, OWNER, ready_pod, register_neighbours, target

from batchpilot.models import BatchingConfig
from batchpilot.operator import decisions
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.world import TargetProblem

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

HPAS = "autoscaling/v2/horizontalpodautoscalers"
CONFIG = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
SINCE = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    kmock.resources[HPAS] = ResourceInfo(kind="HorizontalPodAutoscaler", namespaced=True)
    register_neighbours(kmock)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


class Prometheus:
    """Answers instant queries with the values set (`ok`, `total`, `p99`; `live` for
    the goodput over one stepSeconds (1 s) before the load, the steps' windows being
    2 s), or 500 when `broken`; keeps every query it was asked."""

    def __init__(self) -> None:
        self.answers: dict[str, float] = {}
        self.queries: list[str] = []
        self.broken = False

    async def query(self, request: web.Request) -> web.Response:
        promql = request.query["query"]
        self.queries.append(promql)
        if self.broken:
            return web.Response(status=500, text="query engine overloaded")
        key = "p99" if "0.99" in promql else "ok" if 'outcome="ok"' in promql else "total"
        if "0.5," in promql:
            key = "p99"
        if key == "ok" and "[1000ms]" in promql:
            key = "live"
        value = self.answers.get(key)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, Prometheus]]:
    fake = Prometheus()
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    runner, port = await serve(app)
    yield f"http://127.0.0.1:{port}", fake
    await runner.cleanup()


class ModelServer:
    """Answers every inference at once; `on_request` runs on the first one."""

    def __init__(self) -> None:
        self.requests = 0
        self.on_request: list[Any] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        while self.on_request:
            self.on_request.pop()()
        return web.json_response({"outputs": [[0.0]]})


@pytest.fixture
async def model() -> AsyncIterator[tuple[int, ModelServer]]:
    fake = ModelServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner, port = await serve(app)
    yield port, fake
    await runner.cleanup()


def spec(port: int, strategy: str = "InPlace", prometheus: str | None = None) -> Any:
    load: dict[str, Any] = {
        "endpoint": {"port": port, "path": "/v1/predict"},
        "maxRps": 5,
        "maxOverloadSeconds": 1,
        "stepSeconds": 1,
        "warmupSeconds": 0,
        "minRequests": 0,
    }
    if prometheus is not None:
        load["source"] = "prometheus"
        load["prometheus"] = {"url": prometheus, "scrapeIntervalSeconds": 0.25}
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": load,
            "tuning": {"strategy": strategy},
        }
    )


def world(kube: Kube, s: InferenceServiceSpec) -> KubeWorld:
    async def on_problem(problem: decisions.PodProblem) -> None:
        return None

    return KubeWorld(kube, spec=s, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01)


def events(k: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    return [
        dict(r.data) for r in k["post"] if r.resource is not None and r.resource.plural == "events"
    ]


async def test_in_place_prometheus_steps_read_the_measured_pods_without_live_traffic(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    prometheus: tuple[str, Prometheus],
    model: tuple[int, ModelServer],
) -> None:
    url, fake = prometheus
    port, _ = model
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    w = world(kube, spec(port, prometheus=url))
    # production alone serves 30 req/s; with the 5 req/s offered, 35 are served
    fake.answers.update({"live": 30.0, "ok": 35.0, "total": 35.0, "p99": 0.05})
    served = await w.trials.measure(CONFIG, must_beat=None, since=SINCE)
    # every query, the live traffic's before the load and each step's, is the pod's
    assert fake.queries
    assert all('{pod=~"resnet-1"' in q for q in fake.queries)
    # the effective throughput is all the pods served: live traffic plus the load
    assert served.feasible
    assert math.isclose(served.effective_rps, 35.0)
    assert any(e["reason"] == "LiveTraffic" for e in events(kmock))

    # the load is not served at all: production's 35 req/s must not pass the step
    fake.answers["live"] = 35.0
    starved = await w.trials.measure(CONFIG, must_beat=None, since=SINCE)
    assert not starved.feasible
    [step] = starved.steps
    assert not step.passed
    assert "achieved 0.0 req/s" in step.reason
    # said once for the study, not again with the new figure on the next measurement
    assert [e["reason"] for e in events(kmock)].count("LiveTraffic") == 1


async def test_a_failing_prometheus_is_a_target_problem(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    prometheus: tuple[str, Prometheus],
    model: tuple[int, ModelServer],
) -> None:
    url, fake = prometheus
    port, _ = model
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    fake.broken = True
    for strategy in ("InPlace", "Canary"):
        w = world(kube, spec(port, strategy=strategy, prometheus=url))
        with pytest.raises(TargetProblem) as caught:
            await w.trials.measure(CONFIG, must_beat=None, since=SINCE)
        assert caught.value.reason == "PrometheusUnavailable"
        assert "500" in caught.value.message
        assert "overloaded" not in caught.value.message  # the body is never echoed


def pod_with_env(env: dict[str, str]) -> dict[str, Any]:
    pod = ready_pod()
    pod["spec"] = {
        "containers": [{"name": "server", "env": [{"name": k, "value": v} for k, v in env.items()]}]
    }
    return pod


async def test_a_trial_whose_values_another_writer_reverted_fails_with_the_reason(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    # a GitOps controller put the Git values back: the pods run the original batch size
    kmock.objects["v1/pods", NS, "resnet-1"] = pod_with_env(
        {"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": "12.5"}
    )
    w = world(kube, spec(8080))
    with pytest.raises(TargetProblem) as caught:
        await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})
    assert caught.value.reason == "ConfigReverted"
    assert "resnet-1 runs MAX_BATCH_SIZE=32" in caught.value.message
    assert "Argo CD" in caught.value.message
    # the pods that run the trial's values pass
    kmock.objects["v1/pods", NS, "resnet-1"] = pod_with_env(
        {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": "12.5"}
    )
    await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})


def hpa(name: str, target_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target_name},
            "minReplicas": 1,
            "maxReplicas": 4,
        },
    }


async def test_an_autoscaler_is_named_and_a_scale_mid_trial_makes_it_invalid(
    kmock: kmock.KubernetesEmulator, kube: Kube, model: tuple[int, ModelServer]
) -> None:
    port, server = model
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    kmock.objects[HPAS, NS, "resnet-hpa"] = hpa("resnet-hpa", "resnet")
    kmock.objects[HPAS, NS, "web-hpa"] = hpa("web-hpa", "web")
    w = world(kube, spec(port))
    assert await w.canary.prepare(None) is None
    assert w.canary.autoscalers == ["resnet-hpa"]
    [detected] = [e for e in events(kmock) if e["reason"] == "AutoscalerDetected"]
    assert "resnet-hpa" in detected["message"]
    assert "web-hpa" not in detected["message"]

    await w.trials.measure(CONFIG, must_beat=None, since=SINCE)  # the same replicas: scored

    def scale_out() -> None:
        scaled = target()
        scaled["spec"]["replicas"] = 2
        kmock.objects[DEPLOYMENTS, NS, "resnet"] = scaled

    server.on_request.append(scale_out)
    with pytest.raises(TargetProblem) as caught:
        await w.trials.measure(CONFIG, must_beat=None, since=SINCE)
    assert caught.value.reason == "ScaledDuringTrial"
    assert caught.value.invalid
    assert not caught.value.stops_study
    assert "from 1 to 2 replicas" in caught.value.message
    assert "HorizontalPodAutoscaler resnet-hpa" in caught.value.message
