"""Scenarios f and g: deleting an InferenceService mid-study undoes it (InPlace target
restored, canary removed) with no finalizer left behind; suspending one mid-trial
restores the target within seconds and resuming finishes the study; `writeBack: Apply` owns the
tuned fields under the field manager `batchpilot/<name>`, and what another manager's
`kubectl apply` of the original manifest then does. The uninstall order the docs give
(docs/getting-started/install.md, "Uninstall") leaves nothing Terminating."""

from __future__ import annotations

import os

import pytest

from . import procs
from .conftest import EXISTING_CLUSTER_ENV, Cluster
from .harness import CRD_NAME, apply_crds
from .operatorproc import OperatorProcess
from .scenario import (
    deploy_server,
    describe,
    diagnostics,
    pods,
    wait_converged,
    wait_running_trial,
)
from .study import wait_for
from .workloads import container_env, dump, inference_service, server_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

ORIGINAL = {"MAX_BATCH_SIZE": "4", "MAX_QUEUE_TIME_MS": "2"}


def _env(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return container_env(cluster.kubectl.json("get", "deployment", name, "-n", namespace))


def _gone(cluster: Cluster, namespace: str, kind: str, name: str) -> bool:
    result = cluster.kubectl.run("get", kind, name, "-n", namespace, check=False)
    return result.returncode != 0 and "NotFound" in result.stderr


def _in_place_study_mid_trial(cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
    """An InPlace study whose trial 1 has rolled its configuration onto the target."""
    deploy_server(cluster, namespace)
    cluster.kubectl.apply(dump(inference_service("inplace", "server")), "-n", namespace)
    wait_running_trial(cluster, namespace, "inplace", operator, at_least=1)
    assert procs.wait_until(
        lambda: _env(cluster, namespace, "server") != {"PORT": "8080", **ORIGINAL}, timeout_s=60
    ), diagnostics(cluster, operator)


def test_delete_mid_study_restores_in_place_target(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _in_place_study_mid_trial(cluster, namespace, operator)

    deleted = cluster.kubectl.run(
        "delete", "inferenceservice", "inplace", "-n", namespace, "--timeout=120s", check=False
    )
    assert deleted.returncode == 0, deleted.stderr + diagnostics(cluster, operator)
    assert _gone(cluster, namespace, "inferenceservice", "inplace")
    env = _env(cluster, namespace, "server")
    assert {k: env[k] for k in ORIGINAL} == ORIGINAL
    cluster.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=90s")


def test_suspend_mid_trial_restores_in_place_target_and_resume_finishes(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _in_place_study_mid_trial(cluster, namespace, operator)

    cluster.kubectl(
        "patch", "inferenceservice", "inplace", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"suspend": true}}',
    )  # fmt: skip
    # the brake: the trial in flight is stopped and the original is back within 10 s,
    # not after the trial's own end
    restored = procs.wait_until(
        lambda: {k: _env(cluster, namespace, "server").get(k) for k in ORIGINAL} == ORIGINAL,
        timeout_s=10,
    )
    assert restored, diagnostics(cluster, operator)
    status = wait_for(
        cluster.kubectl,
        namespace,
        "inplace",
        lambda s: s.get("suspended") is True,
        what="the suspension in status",
        timeout_s=30,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    assert "stopped mid-measurement" in status["message"], status["message"]
    assert "the original configuration restored" in status["message"]
    assert "Suspended" in describe(cluster, namespace, "inplace", "suspended")

    cluster.kubectl(
        "patch", "inferenceservice", "inplace", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"suspend": false}}',
    )  # fmt: skip
    status = wait_converged(cluster, namespace, "inplace", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    assert status["suspended"] is False


def test_delete_mid_study_removes_canary(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace)
    [target_pod] = pods(cluster, namespace, "app=server")
    cluster.kubectl.apply(
        dump(inference_service("canary", "server", strategy="Canary")), "-n", namespace
    )
    status = wait_for(
        cluster.kubectl,
        namespace,
        "canary",
        lambda s: bool(s.get("canary")) and any(t["number"] >= 1 for t in s.get("trials") or []),
        what="tuning a canary",
        timeout_s=180,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    canary = status["canary"]
    assert not _gone(cluster, namespace, "deployment", canary)

    deleted = cluster.kubectl.run(
        "delete", "inferenceservice", "canary", "-n", namespace, "--timeout=120s", check=False
    )
    assert deleted.returncode == 0, deleted.stderr + diagnostics(cluster, operator)
    assert procs.wait_until(lambda: _gone(cluster, namespace, "deployment", canary), 60)
    # The target itself was never touched.
    assert _env(cluster, namespace, "server") == {"PORT": "8080", **ORIGINAL}
    [after] = pods(cluster, namespace, "app=server")
    assert after["metadata"]["uid"] == target_pod["metadata"]["uid"]


def test_write_back_then_another_manager_applies_original(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace)
    # A search space without the original batch size: whatever wins, the value written
    # back differs from the manifest's.
    isvc = inference_service("writeback", "server", max_trials=2, batch_range=(8, 16))
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    status = wait_converged(cluster, namespace, "writeback", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    best = status["best"]
    assert best["maxBatchSize"] >= 8
    assert "Converged" in describe(cluster, namespace, "writeback", "converged")
    tuned = {
        "MAX_BATCH_SIZE": str(best["maxBatchSize"]),
        "MAX_QUEUE_TIME_MS": _env(cluster, namespace, "server")["MAX_QUEUE_TIME_MS"],
    }
    assert float(tuned["MAX_QUEUE_TIME_MS"]) == pytest.approx(best["maxQueueTimeMs"])
    original = dump(server_deployment("server"))

    # A GitOps tool applying server-side meets the fields batchpilot owns: a conflict
    # naming the manager and the fields, and the tuned values stay.
    gitops = cluster.kubectl.run(
        "apply", "--server-side", "--field-manager=gitops", "-n", namespace, "-f", "-",
        input=original, check=False,
    )  # fmt: skip
    assert gitops.returncode != 0
    assert 'conflict with "batchpilot/writeback"' in gitops.stderr.replace("conflicts", "conflict")
    assert 'env[name="MAX_BATCH_SIZE"].value' in gitops.stderr
    env = _env(cluster, namespace, "server")
    assert {k: env[k] for k in tuned} == tuned

    # A plain client-side `kubectl apply` of the original manifest puts the original
    # values back and takes the fields over; the study's result stays in status and
    # the operator does not start another study.
    cluster.kubectl.apply(original, "-n", namespace)
    env = _env(cluster, namespace, "server")
    assert {k: env[k] for k in ORIGINAL} == ORIGINAL
    after = cluster.kubectl.json("get", "inferenceservice", "writeback", "-n", namespace)
    assert after["status"]["phase"] == "Converged"
    assert after["status"]["best"] == best
    assert after["metadata"]["generation"] == 1


@pytest.mark.skipif(
    os.environ.get(EXISTING_CLUSTER_ENV) == "1", reason="deletes the CRD of the whole cluster"
)
def test_uninstall_in_the_documented_order_restores_and_leaves_nothing_terminating(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _in_place_study_mid_trial(cluster, namespace, operator)
    try:
        # 1. every InferenceService, while the operator runs
        deleted = cluster.kubectl.run(
            "delete",
            CRD_NAME,
            "--all",
            "--all-namespaces",
            "--timeout=120s",
            check=False,
        )
        assert deleted.returncode == 0, deleted.stderr + diagnostics(cluster, operator)
        env = _env(cluster, namespace, "server")
        assert {k: env[k] for k in ORIGINAL} == ORIGINAL
        # 2. the operator, then the CRD: nothing is left for a finalizer to wait on
        operator.stop()
        gone = cluster.kubectl.run("delete", "crd", CRD_NAME, "--timeout=60s", check=False)
        assert gone.returncode == 0, gone.stderr
        ended = cluster.kubectl.run("delete", "namespace", namespace, "--timeout=90s", check=False)
        assert ended.returncode == 0, ended.stderr
    finally:
        # the tier's later tests need the CRD: once a deletion under way has finished
        procs.wait_until(lambda: not _crd_terminating(cluster), 60)
        apply_crds(cluster)


def _crd_terminating(cluster: Cluster) -> bool:
    found = cluster.kubectl.run("get", "crd", CRD_NAME, "-o", "json", check=False)
    return found.returncode == 0 and '"deletionTimestamp"' in found.stdout
