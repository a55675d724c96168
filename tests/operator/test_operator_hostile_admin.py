"""The operator's live read of a pod's admin endpoint (apply.live, a port and path from
the tenant's spec) against a server that streams without end: the answer is refused at
the cap, in bounded time and memory, as a final AdminRejected problem that names the
address and the cap, instead of filling the operator's memory (a real HTTP server on
loopback; KMock for the cluster)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kmock import ResourceInfo

from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES
from batchpilot.operator import decisions
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import parse_spec
from batchpilot.operator.world import TargetProblem
from support.hostile_server import ENDLESS_BYTES, Hostile, hostile_server

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NS = "ns1"
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "uid": "uid-1"},
}


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    async with hostile_server() as server:
        yield server


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources["apps/v1/deployments"] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    kmock.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def live_world(kube: Kube, port: int, path: str, *, http_timeout_s: float = 10.0) -> KubeWorld:
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "apply": {"method": "Live", "live": {"port": port, "path": path}},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )

    async def on_problem(problem: decisions.PodProblem) -> None:
        pass

    return KubeWorld(
        kube,
        spec=spec,
        namespace=NS,
        owner=OWNER,
        on_problem=on_problem,
        poll_s=0.01,
        http_timeout_s=http_timeout_s,
    )


@pytest.mark.parametrize("path", ["/endless", "/declared"])
async def test_an_endless_admin_answer_is_refused_at_the_cap(
    kube: Kube, hostile: Hostile, path: str
) -> None:
    world = live_world(kube, hostile.port, path)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TargetProblem) as caught:
            await world.live.admin_get("127.0.0.1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    problem = caught.value
    assert problem.reason == "AdminRejected"  # final: not waited out as a restarting pod
    assert f"GET {hostile.base}{path}" in problem.message
    assert "was refused: it is larger than the cap of 4 MiB" in problem.message
    assert time.monotonic() - started < 10.0
    assert hostile.sent[path] < ENDLESS_BYTES // 8
    assert peak < 8 * MAX_CONTROL_BODY_BYTES


async def test_a_dripping_admin_answer_stops_at_the_http_timeout(
    kube: Kube, hostile: Hostile
) -> None:
    world = live_world(kube, hostile.port, "/drip", http_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(TargetProblem) as caught:
        await world.live.admin_get("127.0.0.1")
    assert caught.value.reason == "AdminUnreachable"
    assert time.monotonic() - started < 5.0


async def test_apply_live_on_a_pod_that_streams_without_end_fails_at_once(
    kmock: kmock.KubernetesEmulator, kube: Kube, hostile: Hostile
) -> None:
    """The PUT is answered with an endless body too: refused, and not retried until the
    settle time runs out."""
    kmock.objects["apps/v1/deployments", NS, "resnet"] = deployment()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    world = live_world(kube, hostile.port, "/endless")
    started = time.monotonic()
    with pytest.raises(TargetProblem) as caught:
        await world.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.0})
    assert caught.value.reason == "AdminRejected"
    assert "cap of 4 MiB" in caught.value.message
    assert time.monotonic() - started < 10.0


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "resnet", "namespace": NS, "generation": 1, "uid": "d1"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet"}},
                "spec": {"containers": [{"name": "server", "image": "batchpilot:0.1.0"}]},
            },
        },
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        },
    }


def ready_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "resnet-1", "namespace": NS, "labels": {"app": "resnet"}},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
