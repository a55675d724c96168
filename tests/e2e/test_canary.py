"""The canary's isolation and one tuner per target on the real API server: neither a
Service nor a PodDisruptionBudget selecting on a template label that is not one of the
Deployment's matchLabels keys selects the canary's pod (the PDB's pods are counted by the
controller-manager); a second InferenceService on a target is refused naming the first;
two field managers keep each other's variables on one workload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchpilot.operator import decisions
from batchpilot.operator.kube import Connection, Kube, workload_path
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import parse_spec

from . import procs
from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import STUDY_TIMEOUT_S, deploy_server, diagnostics, pods, wait_running_trial
from .study import events, wait_for
from .workloads import SERVER_PORT, container_env, dump, inference_service, server_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CANARY_LABEL = "batchpilot.dev/canary"


def _service(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [{"port": SERVER_PORT}]},
    }


def _pdb(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": selector}, "minAvailable": 1},
    }


def _expected_pods(cluster: Cluster, namespace: str, pdb: str) -> int | None:
    """The pods the controller-manager's disruption controller counts for a PDB."""
    found = cluster.kubectl.json("get", "pdb", pdb, "-n", namespace).get("status") or {}
    expected = found.get("expectedPods")
    return None if expected is None else int(expected)


def test_selectors_on_a_non_selector_label_never_reach_the_canary(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """Pods of this harness have loopback addresses, which EndpointSlices refuse, so
    the controller-manager's view is read from a PodDisruptionBudget (its disruption
    controller counts the pods it selects) and the Service's selector is evaluated by
    the API server, as the EndpointSlice controller does."""
    # production traffic goes through a Service on `tier`, which the Deployment's
    # selector (app=server) does not use: the old canary kept `tier` as it was
    server = server_deployment("server")
    server["spec"]["template"]["metadata"]["labels"]["tier"] = "serving"
    cluster.kubectl.apply(
        dump(
            server, _service("serving", {"tier": "serving"}), _pdb("serving", {"tier": "serving"})
        ),
        "-n",
        namespace,
    )
    cluster.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=120s")
    [production] = pods(cluster, namespace, "app=server")
    production_pod = production["metadata"]["name"]
    assert procs.wait_until(lambda: _expected_pods(cluster, namespace, "serving") == 1, 60), (
        diagnostics(cluster, operator)
    )

    isvc = inference_service("canary", "server", strategy="Canary", max_trials=2)
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    status = wait_for(
        cluster.kubectl,
        namespace,
        "canary",
        lambda s: bool(s.get("canary")) and any(t["number"] >= 1 for t in s.get("trials") or []),
        what="tuning a canary",
        timeout_s=STUDY_TIMEOUT_S,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    canary = status["canary"]
    assert canary.startswith("server-bp-"), canary
    # each trial recreates the canary's pod (strategy Recreate): wait for one to exist
    canary_pods: list[dict[str, Any]] = []

    def canary_pod_exists() -> bool:
        canary_pods[:] = pods(cluster, namespace, f"{CANARY_LABEL}={canary}")
        return bool(canary_pods)

    assert procs.wait_until(canary_pod_exists, 60), diagnostics(cluster, operator)
    # A PDB on the canary's own label is the barrier: once the disruption controller
    # counts the canary's pod there, it has also judged that pod for `serving`.
    cluster.kubectl.apply(dump(_pdb("probe", {CANARY_LABEL: canary})), "-n", namespace)
    assert procs.wait_until(lambda: _expected_pods(cluster, namespace, "probe") == 1, 60), (
        diagnostics(cluster, operator)
    )
    assert _expected_pods(cluster, namespace, "serving") == 1
    selected = [p["metadata"]["name"] for p in pods(cluster, namespace, "tier=serving")]
    assert selected == [production_pod]
    labels = canary_pods[0]["metadata"]["labels"]
    assert labels.get("tier") != "serving"
    assert labels.get("app") != "server"

    [isolated] = [
        e for e in events(cluster.kubectl, namespace, "canary") if e["reason"] == "CanaryIsolated"
    ]
    for checked in ("Service/serving", "PodDisruptionBudget/serving"):
        assert checked in isolated["message"]
    assert "no PodMonitor resource installed" in isolated["message"]


def test_a_second_inference_service_on_a_target_is_refused_naming_the_first(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace)
    cluster.kubectl.apply(dump(inference_service("first", "server")), "-n", namespace)
    wait_running_trial(cluster, namespace, "first", operator)
    cluster.kubectl.apply(dump(inference_service("second", "server")), "-n", namespace)

    def taken(status: dict[str, Any]) -> bool:
        return any(
            c["type"] == "TargetReady" and c["reason"] == "TargetTaken"
            for c in status.get("conditions") or []
        )

    status = wait_for(
        cluster.kubectl,
        namespace,
        "second",
        taken,
        what="refused as a second tuner",
        timeout_s=120,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    [condition] = [c for c in status["conditions"] if c["type"] == "TargetReady"]
    assert condition["status"] == "False"
    assert "InferenceService first" in condition["message"]
    assert not status.get("trials")  # it never measured, nor touched the target


@pytest.fixture
async def admin_kube(cluster: Cluster) -> AsyncIterator[Kube]:
    if cluster.plane is None:
        pytest.skip("needs the local control plane's admin certificate")
    pki = cluster.plane.pki
    kube = Kube(
        Connection(
            server=cluster.plane.server,
            ca_path=str(pki.ca.cert),
            certificate_path=str(pki.admin.cert),
            private_key_path=str(pki.admin.key),
        )
    )
    yield kube
    await kube.close()


def _world(kube: Kube, namespace: str, isvc: str, batch_var: str, wait_var: str) -> KubeWorld:
    spec = parse_spec(
        {
            "target": {"name": "server", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "apply": {"env": {"maxBatchSize": batch_var, "maxQueueTimeMs": wait_var}},
            "load": {"endpoint": {"port": SERVER_PORT, "path": "/v1/predict"}},
        }
    )

    async def ignore(problem: decisions.PodProblem) -> None:
        pass

    owner = {
        "apiVersion": "batchpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": isvc, "uid": f"uid-{isvc}"},
    }
    return KubeWorld(
        kube, spec=spec, namespace=namespace, owner=owner, on_problem=ignore, poll_s=0.5
    )


async def test_field_managers_per_inference_service_keep_each_others_variables(
    cluster: Cluster, namespace: str, admin_kube: Kube
) -> None:
    deploy_server(cluster, namespace)
    a = _world(admin_kube, namespace, "a", "A_BATCH", "A_WAIT")
    b = _world(admin_kube, namespace, "b", "B_BATCH", "B_WAIT")
    await a.target.write_back({"max_batch_size": 8, "max_queue_time_ms": 3.0})
    await b.target.write_back({"max_batch_size": 16, "max_queue_time_ms": 5.0})
    workload = await admin_kube.get(workload_path("Deployment", namespace, "server"))
    env = container_env(workload)
    assert {k: env.get(k) for k in ("A_BATCH", "A_WAIT", "B_BATCH", "B_WAIT")} == {
        "A_BATCH": "8",
        "A_WAIT": "3",
        "B_BATCH": "16",
        "B_WAIT": "5",
    }
    managers = {f["manager"] for f in workload["metadata"]["managedFields"]}
    assert {"batchpilot/a", "batchpilot/b"} <= managers
    # one releasing its variables (a restore of originally unset ones) leaves the other's
    await a.target.write_back({})
    env = container_env(await admin_kube.get(workload_path("Deployment", namespace, "server")))
    assert "A_BATCH" not in env
    assert env["B_BATCH"] == "16"
