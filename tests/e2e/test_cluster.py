"""The harness itself on the real control plane: a Deployment's pod is created by the
controller-manager, bound and run by the node agent on its own loopback address, turns
Ready from its readiness probe, is scraped by Prometheus, and stops when deleted."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from . import procs
from .conftest import Cluster
from .workloads import SERVER_PORT, dump, server_deployment

pytestmark = pytest.mark.e2e


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl.json(
        "get", "pods", "-n", namespace, "-l", selector
    )["items"]
    return items


def test_deployment_pod_runs_as_local_process(cluster: Cluster, namespace: str) -> None:
    if not cluster.local:
        pytest.skip("inspects the node agent of the local control plane")
    assert cluster.agent is not None
    assert cluster.prometheus is not None
    cluster.kubectl.apply(dump(server_deployment("server", max_batch_size=6)), "-n", namespace)
    cluster.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=120s")
    [pod] = _pods(cluster, namespace, "app=server")
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.")
    assert ip != "127.0.0.1"
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    # The process listens on the pod's address with the pod's environment.
    with urllib.request.urlopen(f"http://{ip}:{SERVER_PORT}/admin/batching", timeout=5) as r:
        live = json.load(r)
    assert live["max_batch_size"] == 6

    # Prometheus scrapes the pod through the agent's targets file.
    assert procs.wait_until(
        lambda: (
            any(
                s["value"][1] == "1"
                for s in cluster.prometheus.query(f'up{{pod="{pod["metadata"]["name"]}"}}')
            )
            if cluster.prometheus
            else False
        ),
        timeout_s=30,
    ), f"Prometheus never scraped {ip}"

    running = cluster.agent.pod(namespace, pod["metadata"]["name"])
    assert running is not None
    assert running.proc is not None
    proc = running.proc
    cluster.kubectl("delete", "deployment", "server", "-n", namespace, "--timeout=60s")
    assert procs.wait_until(lambda: proc.poll() is not None, timeout_s=30)
    assert procs.wait_until(lambda: not _pods(cluster, namespace, "app=server"), timeout_s=30)


def test_foreign_command_is_refused(cluster: Cluster, namespace: str) -> None:
    if not cluster.local:
        pytest.skip("inspects the node agent of the local control plane")
    manifest = server_deployment("foreign", command=["sh", "-c", "echo hello"])
    cluster.kubectl.apply(dump(manifest), "-n", namespace)

    def refused() -> bool:
        pods = _pods(cluster, namespace, "app=foreign")
        if not pods:
            return False
        statuses = pods[0]["status"].get("containerStatuses") or [{}]
        waiting = statuses[0].get("state", {}).get("waiting", {})
        return "runs only the project's CLI" in waiting.get("message", "")

    assert procs.wait_until(refused, timeout_s=60), _pods(cluster, namespace, "app=foreign")
