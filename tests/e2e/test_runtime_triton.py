"""A runtime besides the reference server through the operator on the real control
plane: Triton, tuned live through its own API (runtime Triton, apply.method Live). The
baseline is read from Triton, every trial is applied by explicit model control and
verified by Triton's executed batches, the load speaks the KServe v2 protocol, and the
winner is written back live with the config.pbtxt lines to commit in status; a pod that
restarted, moved off the winner, gets it again from the operator."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.triton.adapter import TritonRuntime
from batchpilot.runtimes.triton.install import VENV_NAME
from runtimes.support import require_runtime

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import diagnostics, finished_trials, gap_free, pods, wait_converged
from .study import status as study_status
from .workloads import (
    TRITON_HTTP_PORT,
    TRITON_METRICS_PORT,
    TRITON_MODEL,
    container_env,
    dump,
    triton_deployment,
    triton_inference_service,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]


def triton_config(pod: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{pod['status']['podIP']}:{TRITON_HTTP_PORT}/v2/models/{TRITON_MODEL}/config"
    with urllib.request.urlopen(url, timeout=10) as response:
        config: dict[str, Any] = json.load(response)
    return config


def test_triton_live_study_through_the_operator(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    require_runtime(VENV_NAME, "python")
    cluster.kubectl.apply(dump(triton_deployment("triton")), "-n", namespace)
    cluster.kubectl("rollout", "status", "deployment/triton", "-n", namespace, "--timeout=180s")
    [before] = pods(cluster, namespace, "app=triton")
    template_before = cluster.kubectl.json("get", "deployment", "triton", "-n", namespace)

    isvc = triton_inference_service("tune-triton", "triton")
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    status = wait_converged(cluster, namespace, "tune-triton", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    assert gap_free(status)
    trials = finished_trials(status)
    assert len(trials) == 3, diagnostics(cluster, operator)

    # The baseline is what Triton ran, read through its API (4 requests, 2000 µs).
    baseline = status["trials"][0]
    assert baseline["source"] == "baseline"
    assert baseline["params"] == {"max_batch_size": 4, "max_queue_time_ms": 2.0}
    # KServe v2 requests reached the model: the trials scored throughput.
    assert any(t["state"] == "Complete" and t["effectiveRps"] > 0 for t in trials)

    # Written back live on the pod, which neither restarted nor was replaced.
    best = status["best"]
    assert status["applied"] is True
    [after] = pods(cluster, namespace, "app=triton")
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert all(c["restartCount"] == 0 for c in after["status"]["containerStatuses"])
    live = triton_config(after)
    assert live["max_batch_size"] == best["maxBatchSize"]
    delay_us = round(best["maxQueueTimeMs"] * 1000)
    assert int(live["dynamic_batching"]["max_queue_delay_microseconds"]) == delay_us

    # The pod template is untouched; status says what to commit to keep the winner.
    template_after = cluster.kubectl.json("get", "deployment", "triton", "-n", namespace)
    assert container_env(template_after) == container_env(template_before)
    assert template_after["metadata"]["generation"] == template_before["metadata"]["generation"]
    persist = status["persist"]
    assert (persist["runtime"], persist["kind"]) == ("Triton", "recommend")
    assert f"max_batch_size: {best['maxBatchSize']}" in persist["snippet"]
    assert f"max_queue_delay_microseconds: {delay_us}" in persist["snippet"]

    # A restarted pod starts from its model's configuration, which may be the winner
    # itself (the study's best can be the incumbent): so the new pod is also moved off
    # the winner through Triton's own API, as anything outside the operator could. The
    # operator reads the pods of the converged study and sets the winner back live.
    cluster.kubectl("delete", "pod", after["metadata"]["name"], "-n", namespace, "--wait=false")
    replaced = wait_ready_replacement(cluster, namespace, after["metadata"]["name"])
    drift = BatchingConfig(
        max_batch_size=1 if best["maxBatchSize"] != 1 else 2, max_queue_time_ms=0.0
    )
    control = TritonRuntime().control(
        f"http://{replaced['status']['podIP']}:{TRITON_HTTP_PORT}",
        model=TRITON_MODEL,
        metrics_url=f"http://{replaced['status']['podIP']}:{TRITON_METRICS_PORT}/metrics",
    )
    asyncio.run(control.apply(drift))
    deadline = time.monotonic() + 240
    while True:
        status = study_status(cluster.kubectl, namespace, "tune-triton")
        live = triton_config(replaced)
        back = live["max_batch_size"] == best["maxBatchSize"] and (
            int(live["dynamic_batching"]["max_queue_delay_microseconds"]) == delay_us
        )
        if back and status.get("liveReapplied", 0) >= 1:
            break
        assert time.monotonic() < deadline, diagnostics(cluster, operator)
        time.sleep(2)
    assert status["phase"] == "Converged"
    events = cluster.kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "reason=LiveReapplied"
    )["items"]
    assert any(f"on {replaced['metadata']['name']} (ran " in e["message"] for e in events), [
        e["message"] for e in events
    ]
    # the pod template is still untouched
    template_now = cluster.kubectl.json("get", "deployment", "triton", "-n", namespace)
    assert template_now["metadata"]["generation"] == template_before["metadata"]["generation"]


def wait_ready_replacement(cluster: Cluster, namespace: str, gone: str) -> dict[str, Any]:
    """The Triton pod that replaced pod `gone`, once it is ready."""
    deadline = time.monotonic() + 240
    while True:
        for pod in pods(cluster, namespace, "app=triton"):
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )
            if pod["metadata"]["name"] != gone and ready:
                return pod
        assert time.monotonic() < deadline, f"no ready pod replaced {gone}"
        time.sleep(1)
