"""KubeWorld against the real reference server on loopback (the 'pod' is a local
process at 127.0.0.1; KMock plays the API server): Live apply with GET verification,
and a measurement through the real capacity search."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kmock
import pytest
from kmock import ResourceInfo

from batchpilot.operator import decisions
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import batching_config, parse_spec
from batchpilot.operator.world import TargetProblem
from batchpilot.server.process import ServerProcess, free_port

pytestmark = [pytest.mark.operator, pytest.mark.component, pytest.mark.timeout(180)]

NS = "ns1"
DEPLOYMENTS = "apps/v1/deployments"
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "mlp", "uid": "uid-1"},
}


@pytest.fixture
async def server() -> AsyncIterator[ServerProcess]:
    async with ServerProcess(max_batch_size=4, max_queue_time_ms=2.0, threads=1) as process:
        yield process


def cluster_objects(k: kmock.KubernetesEmulator) -> None:
    k.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    k.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    # the operator's own resources: a world checks that it is the target's only tuner
    k.resources["batchpilot.dev/v1alpha1/inferenceservices"] = ResourceInfo(
        kind="InferenceService", namespaced=True
    )
    k.objects[DEPLOYMENTS, NS, "mlp"] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mlp", "namespace": NS, "generation": 1},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "mlp"}},
            "template": {"spec": {"containers": [{"name": "server", "image": "x"}]}},
        },
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        },
    }
    k.objects["v1/pods", NS, "mlp-1"] = {
        "metadata": {"name": "mlp-1", "namespace": NS, "labels": {"app": "mlp"}},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def live_world(
    kube: Kube, admin_port: int, serve_port: int, load: dict[str, Any] | None = None
) -> KubeWorld:
    spec = parse_spec(
        {
            "target": {"name": "mlp", "container": "server"},
            "sla": {"p99LatencyMs": 500, "maxErrorRate": 0.01},
            "apply": {"method": "Live", "live": {"port": admin_port, "path": "/admin/batching"}},
            "load": {
                "endpoint": {"port": serve_port, "path": "/v1/predict"},
                "requests": [{"weight": 1, "size": 1}],
                "stepSeconds": 1,
                "warmupSeconds": 0.5,
                "precision": 0.25,
                "maxRps": 100_000,
                **(load or {}),
            },
            "tuning": {"strategy": "InPlace"},
        }
    )

    async def on_problem(problem: decisions.PodProblem) -> None:
        raise AssertionError(problem.message)

    return KubeWorld(
        kube,
        spec=spec,
        namespace=NS,
        owner=OWNER,
        on_problem=on_problem,
        poll_s=0.05,
        settle_s=1.0,  # how long a refused admin port is waited for before giving up
    )


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    cluster_objects(kmock)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")))
    yield client
    await client.close()


async def admin(server: ServerProcess) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"{server.url}/admin/batching") as response,
    ):
        payload: dict[str, Any] = await response.json()
        return payload


async def test_live_apply_reaches_the_server_and_is_verified(
    server: ServerProcess, kube: Kube
) -> None:
    world = live_world(kube, server.port, server.port)
    original = await world.target.record_original(datetime(2026, 1, 1, tzinfo=UTC))
    assert original.params["max_batch_size"] == 4
    assert original.params["max_queue_time_ms"] == pytest.approx(2.0)
    await world.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 3.5})
    now = await admin(server)
    assert (now["max_batch_size"], now["max_queue_time_ms"]) == (8, 3.5)
    await world.trials.apply(original.params)
    assert (await admin(server))["max_batch_size"] == 4
    refused = live_world(kube, free_port(), server.port)
    with pytest.raises(TargetProblem) as caught:
        await refused.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 3.5})
    assert caught.value.reason == "AdminUnreachable"
    assert "not live after 1 s" in caught.value.message


async def test_measure_runs_the_capacity_search_against_the_pod_ips(
    server: ServerProcess, kube: Kube
) -> None:
    world = live_world(kube, server.port, server.port)
    config = batching_config({"max_batch_size": 4, "max_queue_time_ms": 2.0})
    result = await world.trials.measure(config, must_beat=None, since=datetime.now(UTC))
    assert result.steps
    assert result.sla.p99_ms == 500
    assert result.feasible
    assert result.effective_rps > 0


async def test_measure_refuses_steps_shorter_than_four_scrape_intervals(
    server: ServerProcess, kube: Kube
) -> None:
    # Nothing listens on the Prometheus port: the configured interval alone decides, and
    # the trial fails before any load is sent.
    prometheus = {"url": f"http://127.0.0.1:{free_port()}", "scrapeIntervalSeconds": 15}
    world = live_world(
        kube, server.port, server.port, {"source": "prometheus", "prometheus": prometheus}
    )
    config = batching_config({"max_batch_size": 4, "max_queue_time_ms": 2.0})
    with pytest.raises(TargetProblem) as caught:
        await world.trials.measure(config, must_beat=None, since=datetime.now(UTC))
    assert caught.value.reason == "StepShorterThanScrapes"
    assert "load.stepSeconds: a step of 1 s is shorter than 4 scrape intervals" in str(
        caught.value.message
    )
    assert "at least 60 s" in caught.value.message


async def test_measure_offers_the_load_arrival_process(server: ServerProcess, kube: Kube) -> None:
    world = live_world(
        kube, server.port, server.port, {"arrival": {"process": "MMPP", "burstFactor": 3}}
    )
    config = batching_config({"max_batch_size": 4, "max_queue_time_ms": 2.0})
    result = await world.trials.measure(config, must_beat=None, since=datetime.now(UTC))
    assert result.feasible
