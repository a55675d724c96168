"""Load workers on the real control plane: a study with `load.workers.max: 3` sends its
steps through an Indexed Job of worker pods (run by the node agent), a worker killed
while it holds a share makes that step invalid and the study goes on, and nothing of the
fleet is left once the study ends and the InferenceService is deleted."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from batchpilot.loadgen.serve_worker import DEFAULT_PORT
from batchpilot.operator.workerjob import INDEX_ANNOTATION

from . import procs
from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import deploy_server, diagnostics, pods, wait_converged
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WORKERS = "app.kubernetes.io/name=batchpilot-load-worker"


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _busy(pod: dict[str, Any]) -> bool:
    url = f"http://{pod['status']['podIP']}:{DEFAULT_PORT}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(json.load(response)["busy"])
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return False


def _left(cluster: Cluster, namespace: str) -> list[str]:
    found = cluster.kubectl.json("get", "jobs,pods", "-n", namespace, "-l", WORKERS)["items"]
    return [f"{o['kind']}/{o['metadata']['name']}" for o in found]


def test_worker_job_sends_the_load_and_is_gone_after(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if cluster.agent is None:
        pytest.skip("kills a worker's container process through the local node agent")
    deploy_server(cluster, namespace)
    isvc = inference_service("fleet", "server", method="Live", max_trials=2, write_back="Recommend")
    isvc["spec"]["load"]["workers"] = {
        "max": 3,
        "image": "batchpilot-operator:0.1.0",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    def ready_workers() -> list[dict[str, Any]]:
        return [p for p in pods(cluster, namespace, WORKERS) if _ready(p)]

    assert procs.wait_until(lambda: len(ready_workers()) == 3, 120), "; ".join(
        f"{p['metadata']['name']}: {json.dumps(p.get('status', {}).get('containerStatuses'))}"
        for p in pods(cluster, namespace, WORKERS)
    )
    [second] = [p for p in ready_workers() if p["metadata"]["annotations"][INDEX_ANNOTATION] == "1"]
    # killed while it sends a share: that step cannot be whole
    assert procs.wait_until(lambda: _busy(second), 60), diagnostics(cluster, operator)
    cluster.agent.kill_container(namespace, second["metadata"]["name"])

    status = wait_converged(cluster, namespace, "fleet", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    trials = status["trials"]
    assert any("load worker 1" in t.get("reason", "") for t in trials), trials
    # the study went on: every trial finished, each sent by the three workers
    assert len([t for t in trials if t["state"] != "Running"]) == 2, trials
    sent = status["loadWorkers"]
    assert [e["workers"] for e in sent] == [3, 3], sent
    assert all(e["job"] for e in sent)
    # the study ended: its fleet went with it
    assert procs.wait_until(lambda: not _left(cluster, namespace), 60), _left(cluster, namespace)

    deleted = cluster.kubectl.run(
        "delete", "inferenceservice", "fleet", "-n", namespace, "--timeout=60s", check=False
    )
    assert deleted.returncode == 0, deleted.stderr + diagnostics(cluster, operator)
    assert not _left(cluster, namespace)
    secrets = cluster.kubectl.json("get", "secrets,serviceaccounts", "-n", namespace, "-l", WORKERS)
    assert secrets["items"] == []
