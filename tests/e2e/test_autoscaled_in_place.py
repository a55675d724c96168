"""An InPlace study on production as a platform team runs it: live traffic on the
Deployment's pods the whole time, a HorizontalPodAutoscaler on CPU (the controller-
manager's own, reading the resource metrics API), and the operator's trials loading the
same pods. Production's requests, sent and timed by the test, never see a p99 above the
SLA for longer than one step; the trial during which the HPA scaled the Deployment out
is not scored (`invalid: ScaledDuringTrial`, naming the HPA) and is measured again; the
original configuration is back on every pod at the end, the one the HPA added
included."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest

from batchpilot.loadgen.protocols import synthetic_body

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import (
    Poller,
    deploy_server,
    diagnostics,
    finished_trials,
    live_config,
    wait_converged,
)
from .workloads import SERVER_PORT, dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

SLA_MS = 250.0  # the e2e InferenceService's p99LatencyMs
STEP_S = 1.0  # its load.stepSeconds
LIVE_RPS = 40.0  # production's traffic, over all the pods
# production's p99 is judged over windows this long: 10 requests each at LIVE_RPS, so a
# window breaks the SLA when one of its requests is slower than it, or failed
BIN_S = 0.25
HPA = "server-hpa"
# CPU per pod at which the HPA scales out: several times what the live traffic costs,
# a fraction of what a trial's ramp to the pod's capacity does
HPA_CPU = "300m"
ORIGINAL = {"max_batch_size": 4, "max_queue_time_ms": 2.0}


class Production:
    """Production's clients: LIVE_RPS requests a second at fixed times, spread over the
    ready pods of app=server (as a Service would). Each is timed from the moment it
    left: this test's own threads share a loaded machine with the cluster, and a
    moment they wait for the interpreter is theirs, not production's."""

    def __init__(self) -> None:
        # (due, latency s from the send | None: failed)
        self.samples: list[tuple[float, float | None]] = []
        self.targets: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=32)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Production:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        start = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            due = start + sent / LIVE_RPS
            self._stop.wait(max(0.0, due - time.monotonic()))
            targets = self.targets
            if targets:
                self._pool.submit(self._send, targets[sent % len(targets)], due)
            sent += 1

    def _send(self, ip: str, due: float) -> None:
        request = urllib.request.Request(
            f"http://{ip}:{SERVER_PORT}/v1/predict",
            data=synthetic_body(1),
            headers={"Content-Type": "application/json"},
        )
        latency: float | None
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
            latency = time.monotonic() - sent
        except (urllib.error.URLError, OSError):
            latency = None
        with self._lock:
            self.samples.append((due, latency))

    def breaches(self) -> list[tuple[str, float, float]]:
        """Each run of consecutive BIN_S windows whose p99 was above the SLA (a failed
        request counts as above it): (wall clock at its start, its length s, its slowest
        request s, inf: failed)."""
        with self._lock:
            samples = sorted(self.samples)
        if not samples:
            return []
        first = samples[0][0]
        slowest: dict[int, float] = {}  # window -> its slowest request over the SLA
        for due, latency in samples:
            seconds = math.inf if latency is None else latency
            if seconds * 1000 > SLA_MS:
                window = int((due - first) / BIN_S)
                slowest[window] = max(slowest.get(window, 0.0), seconds)
        runs: list[list[int]] = []  # the windows of each run
        for window in sorted(slowest):
            if runs and runs[-1][-1] == window - 1:
                runs[-1].append(window)
            else:
                runs.append([window])
        wall = time.time() - time.monotonic() + first
        return [
            (
                datetime.fromtimestamp(wall + run[0] * BIN_S).strftime("%H:%M:%S.%f")[:-3],
                len(run) * BIN_S,
                round(max(slowest[w] for w in run), 3),
            )
            for run in runs
        ]


class Fleet(Poller):
    """The Deployment's replicas (wall time, spec.replicas) and production's targets,
    its ready pods, once a second."""

    interval_s = 1.0

    def __init__(self, cluster: Cluster, namespace: str, production: Production) -> None:
        super().__init__()
        self._kubectl = cluster.kubectl
        self._namespace = namespace
        self._production = production
        self.replicas: list[tuple[float, int]] = []
        self.cpu: list[tuple[float, dict[str, str]]] = []  # what the HPA reads, per pod

    def poll(self) -> None:
        found = self._kubectl.run(
            "get", "deployment,pods", "-l", "app=server", "-n", self._namespace, "-o", "json",
            check=False,
        )  # fmt: skip
        if found.returncode != 0:
            return
        items = json.loads(found.stdout)["items"]
        for item in items:
            if item["kind"] == "Deployment":
                self.replicas.append((time.time(), int(item["spec"]["replicas"])))
        ready = [
            p["status"]["podIP"]
            for p in items
            if p["kind"] == "Pod"
            and not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
        ]
        if ready:
            self._production.targets = ready
        metrics = self._kubectl.run(
            "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{self._namespace}/pods",
            check=False,
        )  # fmt: skip
        if metrics.returncode == 0:
            usage = {
                m["metadata"]["name"]: m["containers"][0]["usage"]["cpu"]
                for m in json.loads(metrics.stdout)["items"]
            }
            self.cpu.append((time.time(), usage))

    def scaled_out(self) -> tuple[float, float] | None:
        """(last poll at 1 replica, first at 2): when the HPA scaled out; None if never."""
        for (before, was), (after, now) in zip(self.replicas, self.replicas[1:], strict=False):
            if was == 1 and now == 2:
                return before, after
        return None


def autoscaler() -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": HPA},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "server"},
            "minReplicas": 1,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "AverageValue", "averageValue": HPA_CPU},
                    },
                }
            ],
            # one scale-out, at once, and none back: the study meets exactly one
            # disturbance, wherever it falls
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {"selectPolicy": "Disabled"},
            },
        },
    }


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_in_place_beside_live_traffic_and_an_hpa_keeps_production_within_one_step(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace)
    cluster.kubectl.apply(dump(autoscaler()), "-n", namespace)
    isvc = inference_service(
        "autoscaled", "server", method="Live", write_back="Recommend", max_trials=3
    )
    load = isvc["spec"]["load"]
    # judged on plain p99s: production, not a bound on a short step, says what broke
    load["minRequests"] = 0
    # the failing steps of a trial take one step at most: a trial breaks production's
    # SLA once, for one step
    load["maxOverloadSeconds"] = STEP_S
    with Production() as production, Fleet(cluster, namespace, production) as fleet:
        deadline = time.monotonic() + 30
        while not production.targets and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(5)  # production's traffic alone, before any trial
        quiet = list(fleet.replicas)
        cluster.kubectl.apply(dump(isvc), "-n", namespace)
        status = wait_converged(cluster, namespace, "autoscaled", operator)
        time.sleep(2)  # what the last trial left behind drains
    why = diagnostics(cluster, operator)
    hpa = cluster.kubectl.json("get", "hpa", HPA, "-n", namespace)
    assert status["phase"] == "Converged", why
    assert all(r == 1 for _, r in quiet), ("live traffic alone scaled the Deployment", quiet)

    # the premise: the trials' load made the HPA scale the Deployment out
    scaled = fleet.scaled_out()
    assert scaled is not None, ("the HPA never scaled out", hpa.get("status"), fleet.cpu)

    # the trial measuring while it happened is not scored, and measured again; a trial
    # clearly before or after it is scored as usual
    trials = [t for t in status["trials"] if t["state"] != "Running"]
    disturbed = [t for t in trials if "ScaledDuringTrial" in (t.get("reason") or "")]
    assert len(disturbed) <= 1, disturbed
    for trial in trials:
        started, finished = _unix(trial["startedAt"]), _unix(trial["finishedAt"])
        if started + 2 <= scaled[0] and scaled[1] <= finished - 2:
            assert trial in disturbed, (trial, scaled)
            assert trial["reason"].startswith("invalid: ScaledDuringTrial"), trial
            assert f"HorizontalPodAutoscaler {HPA}" in trial["reason"], trial
            again = trials[trials.index(trial) + 1]
            assert again["params"] == trial["params"], trials
        elif finished + 1 < scaled[0] or started - 1 > scaled[1]:
            assert trial not in disturbed, (trial, scaled)
    assert len(finished_trials(status)) == 3
    assert len(trials) == 3 + len(disturbed)

    # production's p99 broke the SLA for one step at most at a time
    breaches = production.breaches()
    assert len(production.samples) >= LIVE_RPS * 10
    longest = max((length for _, length, _ in breaches), default=0.0)
    assert longest <= STEP_S + BIN_S, (breaches, why)

    # the original configuration is back on every pod, the HPA's new one included
    pods = cluster.kubectl.json("get", "pods", "-l", "app=server", "-n", namespace)["items"]
    assert len(pods) == 2
    for pod in pods:
        config = live_config(pod)
        assert (config["max_batch_size"], config["max_queue_time_ms"]) == (
            ORIGINAL["max_batch_size"],
            ORIGINAL["max_queue_time_ms"],
        ), pod["metadata"]["name"]
