"""Bounded waits and rollback on the real API server: a canary no node has room for
fails its study within tuning.scheduleTimeoutSeconds and is removed; a write-back that
crash-loops the target is rolled back to the original configuration; deleting an
InferenceService whose target cannot roll back finishes anyway, with an event saying
what was left."""

from __future__ import annotations

import json
from typing import Any

import pytest

from . import procs
from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import describe, diagnostics, pods, wait_running_trial
from .study import events, wait_for
from .workloads import container_env, dump, inference_service, server_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

GPU = "nvidia.com/gpu"  # the node agent's Node has 8


def gpu_server(name: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
    deployment = server_deployment(name, **kwargs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {GPU: str(gpus)}}
    return deployment


def deploy(cluster: Cluster, namespace: str, deployment: dict[str, Any]) -> None:
    cluster.kubectl.apply(dump(deployment), "-n", namespace)
    name = deployment["metadata"]["name"]
    cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=120s")


def _gone(cluster: Cluster, namespace: str, kind: str, name: str) -> bool:
    result = cluster.kubectl.run("get", kind, name, "-n", namespace, check=False)
    return result.returncode != 0 and "NotFound" in result.stderr


def _canaries(cluster: Cluster, namespace: str) -> list[str]:
    """The canary Deployments in the namespace (by the label every canary carries)."""
    found = cluster.kubectl.json(
        "get", "deployments", "-l", "batchpilot.dev/canary", "-n", namespace
    )
    return [d["metadata"]["name"] for d in found["items"]]


ORIGINAL = {"MAX_BATCH_SIZE": "4", "MAX_QUEUE_TIME_MS": "2"}  # server_deployment's


def _batching_env(cluster: Cluster, namespace: str) -> dict[str, str]:
    env = container_env(cluster.kubectl.json("get", "deployment", "server", "-n", namespace))
    return {k: env[k] for k in ORIGINAL}


def reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [str(e["reason"]) for e in events(cluster.kubectl, namespace, name)]


def test_unschedulable_canary_fails_the_study_within_the_timeout(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # The target holds every GPU of the node: its clone cannot be placed.
    deploy(cluster, namespace, gpu_server("server", gpus=8))
    [target_pod] = pods(cluster, namespace, "app=server")
    isvc = inference_service("full", "server", strategy="Canary", max_trials=3)
    isvc["spec"]["tuning"]["scheduleTimeoutSeconds"] = 5
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    status = wait_for(
        cluster.kubectl,
        namespace,
        "full",
        lambda s: s.get("phase") in ("Failed", "Converged"),
        what="finished",
        timeout_s=120,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    assert status["phase"] == "Failed", diagnostics(cluster, operator)
    assert f"1 Insufficient {GPU}" in status["message"], status["message"]
    assert "scheduleTimeoutSeconds" in status["message"]
    # The first trial ended the study: no trial after it waited for a node again.
    assert [t["state"] for t in status["trials"]] == ["Failed"], status["trials"]
    # the canary the scheduler refused (its message above) is gone, whatever its name
    assert status.get("canary") is None
    assert procs.wait_until(lambda: not _canaries(cluster, namespace), 60), _canaries(
        cluster, namespace
    )
    assert "StudyFailed" in reasons(cluster, namespace, "full")
    described = describe(cluster, namespace, "full", "failed")
    assert "scheduleTimeoutSeconds" in described.split("Events:")[0], described
    # The target was never touched.
    [after] = pods(cluster, namespace, "app=server")
    assert after["metadata"]["uid"] == target_pod["metadata"]["uid"]


def test_a_write_back_that_crash_loops_the_target_is_rolled_back(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy(cluster, namespace, server_deployment("server", max_batch_size=1))
    # Every configuration the search may pick has a batch of 2 or more.
    isvc = inference_service(
        "rollback", "server", strategy="Canary", max_trials=3, batch_range=(2, 16), verify_s=10
    )
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    wait_for(
        cluster.kubectl,
        namespace,
        "rollback",
        lambda s: bool(s.get("canary")),
        what="tuning a canary",
        timeout_s=120,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    # The fleet differs from the canary it was measured on (as a smaller GPU would):
    # its server refuses to start with a batch above 1. The queue limit is the batch
    # size times a million, over the server's maximum of a million from a batch of 2.
    patch = [
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/args",
            "value": ["--queue-limit=$(MAX_BATCH_SIZE)000000"],
        }
    ]
    cluster.kubectl(
        "patch", "deployment", "server", "-n", namespace, "--type=json", "-p", json.dumps(patch)
    )
    cluster.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=120s")

    status = wait_for(
        cluster.kubectl,
        namespace,
        "rollback",
        lambda s: s.get("phase") in ("RolledBack", "Converged", "Failed"),
        what="finished",
        timeout_s=240,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    assert status["phase"] == "RolledBack", diagnostics(cluster, operator)
    [degraded] = [c for c in status["conditions"] if c["type"] == "Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    assert "CrashLoopBackOff" in degraded["message"], degraded
    assert status["restored"] is True
    assert status["applied"] is False
    assert reasons(cluster, namespace, "rollback").count("RolledBack") == 1
    described = describe(cluster, namespace, "rollback", "rolled-back")
    assert "CrashLoopBackOff" in described.split("Events:")[0], described
    # The original batch is back, and the target rolls out on it.
    target = cluster.kubectl.json("get", "deployment", "server", "-n", namespace)
    assert container_env(target)["MAX_BATCH_SIZE"] == "1"
    cluster.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=90s")
    [after] = pods(cluster, namespace, "app=server")
    assert container_env({"spec": {"template": after}})["MAX_BATCH_SIZE"] == "1"


def test_delete_finishes_when_the_target_cannot_roll_back(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Half the node's GPUs: a rolling update of the target fits beside its old pod.
    deploy(cluster, namespace, gpu_server("server", gpus=4))
    isvc = inference_service("stuck", "server", max_trials=10)
    isvc["spec"]["tuning"]["scheduleTimeoutSeconds"] = 5
    # the trial must still be measuring when the delete comes: its steps keep the default
    # minimum of measured requests (stretched to 6 s) rather than the tier's short ones
    del isvc["spec"]["load"]["minRequests"]
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    wait_running_trial(cluster, namespace, "stuck", operator, at_least=1)
    # A trial's configuration reaches the target: the original is no longer running.
    assert procs.wait_until(lambda: _batching_env(cluster, namespace) != ORIGINAL, timeout_s=60), (
        diagnostics(cluster, operator)
    )
    # Another workload takes the other half: no rollout of the target fits any more.
    hog = gpu_server("hog", gpus=4)
    cluster.kubectl.apply(dump(hog), "-n", namespace)
    assert procs.wait_until(
        lambda: any(p["spec"].get("nodeName") for p in pods(cluster, namespace, "app=hog")), 60
    ), diagnostics(cluster, operator)

    deleted = cluster.kubectl.run(
        "delete", "inferenceservice", "stuck", "-n", namespace, "--timeout=120s", check=False
    )
    assert deleted.returncode == 0, deleted.stderr + diagnostics(cluster, operator)
    assert _gone(cluster, namespace, "inferenceservice", "stuck")
    found = [
        e for e in events(cluster.kubectl, namespace, "stuck") if e["reason"] == "CleanupIncomplete"
    ]
    assert found, diagnostics(cluster, operator)
    assert f"Insufficient {GPU}" in found[0]["message"]
    assert "Deployment server still runs the trial's configuration" in found[0]["message"]
