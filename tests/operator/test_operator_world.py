"""KubeWorld and the API client against KMock: the calls the operator makes to the
API server (server-side apply, canary creation, rollout checks), without Kopf."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from kmock import KubernetesError, Request, ResourceInfo
from kmock import method as http_method

from batchpilot.operator import decisions
from batchpilot.operator.canary import canary_name
from batchpilot.operator.kube import Connection, Kube, KubeError
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.world import KubeWorld, TargetProblem


def register_neighbours(kmock: kmock.KubernetesEmulator) -> None:
    """The resources the world lists besides the target: InferenceServices (one tuner
    per target), the selectors a canary must escape, and events. No PodMonitor CRD."""
    kmock.resources["batchpilot.dev/v1alpha1/inferenceservices"] = ResourceInfo(
        kind="InferenceService", namespaced=True
    )
    kmock.resources["v1/services"] = ResourceInfo(kind="Service", namespaced=True)
    kmock.resources["policy/v1/poddisruptionbudgets"] = ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True
    )
    kmock.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True)


pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NS = "ns1"
DEPLOYMENTS = "apps/v1/deployments"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "uid": "uid-1"},
}


def make_spec(strategy: str = "InPlace") -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
            "tuning": {"strategy": strategy},
        }
    )


def target() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "resnet", "namespace": NS, "generation": 1, "uid": "d1"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet"}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "batchpilot:0.1.0",
                            "env": [{"name": "MAX_BATCH_SIZE", "value": "32"}],
                        }
                    ]
                },
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


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    register_neighbours(kmock)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def world(kube: Kube, spec: InferenceServiceSpec, problems: list[Any] | None = None) -> KubeWorld:
    async def on_problem(problem: decisions.PodProblem) -> None:
        (problems if problems is not None else []).append(problem)

    return KubeWorld(kube, spec=spec, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01)


async def test_env_apply_is_a_server_side_apply_by_batchpilot(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    w = world(kube, make_spec())
    original = await w.record_original(NOW)
    assert original.env == {"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": None}
    assert original.params == {}  # one knob unset: the server's default is invisible
    assert await w.prepare(None) is None  # InPlace: no canary
    await w.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})
    patches = [r for r in kmock["patch"] if r.resource is not None and r.name == "resnet"]
    assert len(patches) == 1
    request = patches[0]
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    # a manager per InferenceService: another one's applies cannot release these fields
    assert request.params == {"fieldManager": "batchpilot/resnet", "force": "true"}
    container = request.data["spec"]["template"]["spec"]["containers"][0]
    assert container == {
        "name": "server",
        "env": [
            {"name": "MAX_BATCH_SIZE", "value": "8"},
            {"name": "MAX_QUEUE_TIME_MS", "value": "12.5"},
        ],
    }
    await w.restore(original)
    restore = [r for r in kmock["patch"] if r.name == "resnet"][-1]
    env = restore.data["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "MAX_BATCH_SIZE", "value": "32"}]  # the unset one is released


async def test_canary_is_created_owned_and_deleted(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    w = world(kube, make_spec("Canary"))
    name = await w.prepare(None)
    assert name == canary_name("resnet", NS, "resnet", "uid-1")
    canary = kmock.objects[DEPLOYMENTS, NS, name].raw
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert canary["spec"]["template"]["metadata"]["labels"]["app"] != "resnet"
    assert await w.prepare(name) == name  # after a restart: found, not created twice
    created = [r for r in kmock["post"] if r.resource is not None and r.resource.plural != "events"]
    assert len(created) == 1
    await w.remove_canary(name)
    assert len(kmock["delete"]) == 1
    await w.remove_canary(name)  # already gone: not an error


async def test_missing_target_and_container_are_target_problems(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    w = world(kube, make_spec())
    with pytest.raises(TargetProblem) as caught:
        await w.record_original(NOW)
    assert caught.value.reason == "TargetNotFound"
    other = target()
    other["spec"]["template"]["spec"]["containers"][0]["name"] = "sidecar"
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = other
    with pytest.raises(TargetProblem) as caught:
        await w.record_original(NOW)
    assert caught.value.reason == "ContainerNotFound"


async def test_crash_looping_pods_fail_the_apply_with_the_reason(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    crashing = ready_pod()
    crashing["status"]["containerStatuses"] = [
        {"name": "server", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    ]
    kmock.objects["v1/pods", NS, "resnet-1"] = crashing
    with pytest.raises(TargetProblem) as caught:
        await world(kube, make_spec()).apply({"max_batch_size": 8, "max_queue_time_ms": 1.0})
    assert caught.value.reason == "CrashLoopBackOff"


async def test_client_retries_conflicts_and_server_errors_then_gives_up(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    injected = [409, 503, 500]  # then the real answer
    decided: dict[int, int | None] = {}  # request id → code (filters run more than once)

    def code_for(request: Request) -> int | None:
        if request.id not in decided:
            decided[request.id] = injected.pop(0) if injected else None
        return decided[request.id]

    def fail(request: Request) -> KubernetesError:
        return KubernetesError(status=code_for(request) or 500, reason="Injected")

    (
        kmock[lambda request: request.method == http_method.GET and code_for(request) is not None]
        << fail
    )
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/resnet"
    got = await kube.get(path)
    assert got["metadata"]["name"] == "resnet"
    assert len(kmock["get"]) == 4
    with pytest.raises(KubeError) as caught:
        await kube.merge_patch(f"/apis/apps/v1/namespaces/{NS}/deployments/nope", {})
    assert caught.value.status == 404
