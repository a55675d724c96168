"""The canary's identity and isolation, and one tuner per target, against KMock: what
KubeWorld lists, creates, refuses and recreates on the API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from kmock import ResourceInfo
from test_operator_world import (
    DEPLOYMENTS,
    NS,
    OWNER,
    make_spec,
    ready_pod,
    register_neighbours,
    target,
    world,
)

from batchpilot.operator.canary import CANARY_LABEL, canary_name
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.selectors import from_label_selector, from_map
from batchpilot.operator.spec import parse_spec
from batchpilot.operator.world import TargetProblem

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ISVCS = "batchpilot.dev/v1alpha1/inferenceservices"
CANARY = canary_name("resnet", NS, "resnet", "uid-1")
ROLLED_OUT = {
    "observedGeneration": 1,
    "replicas": 1,
    "updatedReplicas": 1,
    "readyReplicas": 1,
    "availableReplicas": 1,
}


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources["apps/v1/statefulsets"] = ResourceInfo(kind="StatefulSet", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    register_neighbours(kmock)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def labelled_target() -> dict[str, Any]:
    workload = target()
    workload["spec"]["template"]["metadata"]["labels"] = {
        "app": "resnet",
        "tier": "gpu",
        "team": "ml",
        "version": "v1",
    }
    return workload


def events(kmock: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    return [
        r.data for r in kmock["post"] if r.resource is not None and r.resource.plural == "events"
    ]


def creates(kmock: kmock.KubernetesEmulator, plural: str) -> list[dict[str, Any]]:
    return [r.data for r in kmock["post"] if r.resource is not None and r.resource.plural == plural]


async def test_the_canary_escapes_every_selector_and_says_which_it_checked(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = labelled_target()
    # production selectors on labels that are not the Deployment's matchLabels keys
    services = {"web": {"tier": "gpu"}, "by-team": {"team": "ml", "version": "v1"}}
    for name, selector in services.items():
        kmock.objects["v1/services", NS, name] = {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": selector},
        }
    kmock.objects["v1/services", NS, "external"] = {  # selects no pod at all
        "metadata": {"name": "external", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": "example.invalid"},
    }
    pdb = {"matchExpressions": [{"key": "version", "operator": "Exists"}]}
    kmock.objects["policy/v1/poddisruptionbudgets", NS, "gpu"] = {
        "metadata": {"name": "gpu", "namespace": NS},
        "spec": {"selector": pdb, "minAvailable": 1},
    }

    assert await world(kube, make_spec("Canary")).canary.prepare(None) == CANARY

    body = kmock.objects[DEPLOYMENTS, NS, CANARY].raw
    labels = body["spec"]["template"]["metadata"]["labels"]
    for selector in services.values():
        parsed = from_map(selector)
        assert parsed is not None
        assert not parsed.matches(labels)
    parsed_pdb = from_label_selector(pdb)
    assert parsed_pdb is not None
    assert not parsed_pdb.matches(labels)
    assert labels[CANARY_LABEL] == CANARY
    assert body["spec"]["selector"] == {"matchLabels": {CANARY_LABEL: CANARY}}
    [event] = events(kmock)
    assert event["reason"] == "CanaryIsolated"
    assert event["involvedObject"]["uid"] == "uid-1"
    for checked in ("Service/web", "Service/by-team", "PodDisruptionBudget/gpu"):
        assert checked in event["message"]
    assert "Service/external" not in event["message"]
    assert "no PodMonitor resource installed" in event["message"]


async def test_pod_monitors_are_checked_when_their_crd_exists(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.resources["monitoring.coreos.com/v1/podmonitors"] = ResourceInfo(
        kind="PodMonitor", namespaced=True
    )
    kmock.resources["monitoring.coreos.com/v1/servicemonitors"] = ResourceInfo(
        kind="ServiceMonitor", namespaced=True
    )
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = labelled_target()
    kmock.objects["monitoring.coreos.com/v1/podmonitors", NS, "ml"] = {
        "metadata": {"name": "ml", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"team": "ml"}}},
    }
    await world(kube, make_spec("Canary")).canary.prepare(None)
    labels = kmock.objects[DEPLOYMENTS, NS, CANARY].raw["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] != "ml"
    [event] = events(kmock)
    assert "PodMonitor/ml" in event["message"]
    assert "not installed" not in event["message"]


async def test_a_pdb_selecting_every_pod_refuses_the_canary(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = labelled_target()
    kmock.objects["policy/v1/poddisruptionbudgets", NS, "all"] = {
        "metadata": {"name": "all", "namespace": NS},
        "spec": {"selector": {}, "maxUnavailable": 1},
    }
    with pytest.raises(TargetProblem) as caught:
        await world(kube, make_spec("Canary")).canary.prepare(None)
    assert caught.value.reason == "CanaryNotIsolated"
    assert "PodDisruptionBudget/all" in caught.value.message
    assert not creates(kmock, "deployments")


async def test_a_workload_of_the_canarys_name_owned_by_another_is_not_adopted(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    foreign = target()
    foreign["metadata"] = {
        "name": CANARY,
        "namespace": NS,
        "ownerReferences": [{"kind": "InferenceService", "name": "other", "uid": "uid-9"}],
    }
    kmock.objects[DEPLOYMENTS, NS, CANARY] = foreign
    w = world(kube, make_spec("Canary"))
    with pytest.raises(TargetProblem) as caught:
        await w.canary.prepare(None)
    assert caught.value.reason == "CanaryNotOwned"
    assert "uid-9" in caught.value.message
    assert not kmock["patch"]
    assert not kmock["delete"]
    assert not creates(kmock, "deployments")


async def test_a_canary_deleted_mid_study_is_created_again_before_the_next_trial(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "canary-1"] = ready_pod()
    w = world(kube, make_spec("Canary"))
    assert await w.canary.prepare(None) == CANARY
    await kube.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/{CANARY}")  # by someone

    apply = asyncio.ensure_future(w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.0}))
    async with asyncio.timeout(10):
        # KMock records requests but offers nothing to await one by
        while len(creates(kmock, "deployments")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    # the Deployment controller's part: the recreated canary rolls out
    kmock.objects[DEPLOYMENTS, NS, CANARY].patch({"status": ROLLED_OUT})
    await asyncio.wait_for(apply, 10)

    patched = [r for r in kmock["patch"] if r.name == CANARY]
    assert patched, "the trial's configuration went to the recreated canary"
    assert [e["reason"] for e in events(kmock)] == ["CanaryIsolated", "CanaryRecreated"]


async def test_a_statefulset_target_gets_a_statefulset_canary_with_its_claims(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    sts = target()
    sts["kind"] = "StatefulSet"
    sts["spec"]["serviceName"] = "resnet"
    sts["spec"]["volumeClaimTemplates"] = [
        {"metadata": {"name": "cache"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    ]
    kmock.objects["apps/v1/statefulsets", NS, "resnet"] = sts
    spec = parse_spec(
        {
            "target": {"kind": "StatefulSet", "name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
            "tuning": {"strategy": "Canary"},
        }
    )
    w = world(kube, spec)
    assert await w.canary.prepare(None) == CANARY
    body = kmock.objects["apps/v1/statefulsets", NS, CANARY].raw
    assert [c["metadata"]["name"] for c in body["spec"]["volumeClaimTemplates"]] == ["cache"]
    await w.canary.remove(CANARY)
    assert [r.name for r in kmock["delete"]] == [CANARY]


def isvc(name: str, uid: str, created: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batchpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "creationTimestamp": created,
            **meta,
        },
        "spec": {"target": {"name": "resnet"}},
    }


async def test_a_second_inference_service_on_a_target_is_refused_naming_the_first(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects[ISVCS, NS, "first"] = isvc("first", "uid-0", "2026-01-01T00:00:00Z")
    kmock.objects[ISVCS, NS, "resnet"] = isvc("resnet", "uid-1", "2026-01-02T00:00:00Z")
    w = world(kube, make_spec("Canary"))
    for step in (w.target.record_original(NOW), w.canary.prepare(None)):
        with pytest.raises(TargetProblem) as caught:
            await step
        assert caught.value.reason == "TargetTaken"
        assert "InferenceService first" in caught.value.message
    assert not creates(kmock, "deployments")
    assert not kmock["patch"]

    # the first one is deleted: this one now tunes the target
    await kube.delete(f"/apis/batchpilot.dev/v1alpha1/namespaces/{NS}/inferenceservices/first")
    await w.target.record_original(NOW)
    assert await w.canary.prepare(None) == CANARY


def foreign_workload(name: str) -> dict[str, Any]:
    workload = target()
    workload["metadata"] = {
        "name": name,
        "namespace": NS,
        "uid": "d9",
        "ownerReferences": [{"kind": "InferenceService", "name": "other", "uid": "uid-9"}],
    }
    return workload


async def test_a_canary_name_in_status_owned_by_another_is_neither_used_nor_deleted(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    # a status from an operator version that named canaries `<target>-bp-canary`, a name
    # two InferenceServices on one target share
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects[DEPLOYMENTS, NS, "resnet-bp-canary"] = foreign_workload("resnet-bp-canary")
    w = world(kube, make_spec("Canary"))
    assert await w.canary.prepare("resnet-bp-canary") == CANARY  # a canary of its own instead
    await w.canary.remove("resnet-bp-canary")
    assert [r.name for r in kmock["delete"]] == []
    await w.canary.remove(CANARY)
    assert [r.name for r in kmock["delete"]] == [CANARY]


async def test_a_canary_of_an_earlier_name_that_is_ours_is_kept(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    ours = foreign_workload("resnet-bp-canary")
    ours["metadata"]["ownerReferences"] = [{"kind": "InferenceService", "uid": "uid-1"}]
    kmock.objects[DEPLOYMENTS, NS, "resnet-bp-canary"] = ours
    w = world(kube, make_spec("Canary"))
    assert await w.canary.prepare("resnet-bp-canary") == "resnet-bp-canary"
    assert not creates(kmock, "deployments")
    await w.canary.remove("resnet-bp-canary")
    [delete] = kmock["delete"]
    # only that very object: one recreated under the name in between stays
    assert delete.data["preconditions"] == {"uid": "d9"}


KSERVE_TARGET = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService"}


def predictor(name: str, owner: str) -> dict[str, Any]:
    """The Deployment KServe's raw deployment mode makes for InferenceService `owner`."""
    workload = target()
    workload["metadata"] = {
        "name": name,
        "namespace": NS,
        "uid": f"d-{name}",
        "ownerReferences": [
            {**KSERVE_TARGET, "name": owner, "uid": "kserve-1", "controller": True}
        ],
    }
    return workload


def workload_of(kube: Kube, target_ref: dict[str, Any]) -> Workload:
    spec = parse_spec(
        {
            "target": target_ref,
            "sla": {"p99LatencyMs": 300},
            "apply": {"method": "Env"},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )

    async def on_problem(_: Any) -> None:
        return None

    return Workload(kube, spec=spec, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01)


@pytest.mark.parametrize(
    ("theirs", "ours", "through"),
    [
        # they tune the KServe InferenceService, we name the Deployment it owns
        (
            {**KSERVE_TARGET, "name": "bert"},
            {"name": "bert-predictor"},
            "through InferenceService bert",
        ),
        # they tune the predictor Deployment, we name its KServe InferenceService
        (
            {"name": "bert-predictor"},
            {**KSERVE_TARGET, "name": "bert"},
            "through Deployment bert-predictor",
        ),
    ],
)
async def test_a_kserve_service_and_its_predictor_deployment_are_one_target(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    theirs: dict[str, Any],
    ours: dict[str, Any],
    through: str,
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "bert-predictor"] = predictor("bert-predictor", "bert")
    first = isvc("first", "uid-0", "2026-01-01T00:00:00Z")
    first["spec"]["target"] = theirs
    kmock.objects[ISVCS, NS, "first"] = first
    with pytest.raises(TargetProblem) as caught:
        await workload_of(kube, ours).check_sole_tuner()
    assert caught.value.reason == "TargetTaken"
    assert "InferenceService first" in caught.value.message
    assert through in caught.value.message


async def test_a_deployment_of_another_kserve_service_is_not_the_same_target(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    # bert-predictor belongs to another InferenceService than the one tuned by first
    kmock.objects[DEPLOYMENTS, NS, "bert-predictor"] = predictor("bert-predictor", "roberta")
    first = isvc("first", "uid-0", "2026-01-01T00:00:00Z")
    first["spec"]["target"] = {**KSERVE_TARGET, "name": "bert"}
    kmock.objects[ISVCS, NS, "first"] = first
    await workload_of(kube, {"name": "bert-predictor"}).check_sole_tuner()
    await workload_of(kube, {**KSERVE_TARGET, "name": "roberta"}).check_sole_tuner()
