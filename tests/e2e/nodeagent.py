"""A stand-in kubelet for the e2e tier: registers a Node, binds pending pods to it, runs
each pod's container as a local process with its own 127.x.y.z address, reports
readiness from the container's HTTP readiness probe, restarts or fails containers that
exit, and finishes pod deletion. It also writes the pods' scrape targets for Prometheus.

One thread reconciles the whole node every `interval_s` from a fresh list of pods: the
cluster is tiny, and a single loop has no races between events."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import fit, procs
from .fit import NODE_CAPACITY
from .kubeapi import STRATEGIC_PATCH, ApiError, Kube
from .podspec import (
    HOST_IP,
    ContainerState,
    HttpProbe,
    Pod,
    Refused,
    bind_to_pod,
    container_env,
    container_ports,
    expand,
    pod_status,
    project_argv,
    readiness_probe,
    restart_delay,
    restarts,
    scrape_target,
)

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 1.0
_PROBE_FAILURE_THRESHOLD = 3
_MAX_GRACE_S = 10.0
# What a pod process inherits from the test machine: enough to find the project's
# interpreter and write temporary files, nothing else.
# PYTHONPATH: pods run the project's code under test, as the operator does.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AddressPool:
    """Pod addresses from one random 127.a.b.0/24, so that concurrent test sessions on
    the same machine do not hand out the same address."""

    def __init__(self, rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        self._prefix = f"127.{rng.randint(16, 250)}.{rng.randint(0, 255)}."
        self._free = list(range(2, 255))
        self._used: set[str] = set()

    def allocate(self, ports: list[int]) -> str:
        for host in list(self._free):
            ip = f"{self._prefix}{host}"
            if all(_bindable(ip, port) for port in ports):
                self._free.remove(host)
                self._used.add(ip)
                return ip
        raise RuntimeError(f"no free pod address left in {self._prefix}0/24")

    def release(self, ip: str) -> None:
        if ip in self._used:
            self._used.discard(ip)
            # Freed addresses go to the back: a quick reuse could meet a socket of the
            # old pod still in TIME_WAIT.
            self._free.append(int(ip.rsplit(".", 1)[1]))


def _bindable(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
        return True


@dataclass
class RunningPod:
    namespace: str
    name: str
    uid: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    probe: HttpProbe | None
    restart_policy: str
    grace_s: float
    start_time: str
    container: ContainerState
    proc: subprocess.Popen[bytes] | None = None
    ready_since: str = ""
    probe_failures: int = 0
    restart_at: float = 0.0
    terminating_since: float | None = None
    starts: int = 0
    scrape: tuple[str, str] | None = None  # (address, metrics path)
    last_status: dict[str, Any] = field(default_factory=dict)


class NodeAgent:
    def __init__(
        self,
        api: Kube,
        workdir: Path,
        *,
        node_name: str = "e2e-node",
        scrape_file: Path | None = None,
        interval_s: float = 0.3,
    ) -> None:
        self.node_name = node_name
        self._api = api
        self._workdir = workdir
        self._scrape_file = scrape_file
        self._interval_s = interval_s
        self._pool = AddressPool()
        self._pods: dict[str, RunningPod] = {}  # by uid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scrape_targets: list[dict[str, Any]] | None = None
        self.errors: list[str] = []

    # --- test-facing -------------------------------------------------------------

    def start(self) -> None:
        self._register_node()
        self._thread = threading.Thread(target=self._run, name="e2e-node-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            for pod in self._pods.values():
                if pod.proc is not None:
                    procs.stop(pod.proc, grace_s=5.0)
            self._pods.clear()

    def pod(self, namespace: str, name: str) -> RunningPod | None:
        with self._lock:
            for pod in self._pods.values():
                if pod.namespace == namespace and pod.name == name:
                    return pod
        return None

    def containers(self) -> list[tuple[str, str, int]]:
        """(namespace, pod name, PID) of every container running now: its process and
        the children in its session are what the pod uses (the metrics API's CPU)."""
        with self._lock:
            return [
                (pod.namespace, pod.name, pod.proc.pid)
                for pod in self._pods.values()
                if pod.proc is not None
            ]

    def kill_container(self, namespace: str, name: str) -> int:
        """`kill -9` the pod's container process, as a crash would; its PID."""
        pod = self.pod(namespace, name)
        if pod is None or pod.proc is None:
            raise LookupError(f"pod {namespace}/{name} has no running container")
        pid = pod.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return pid

    # --- node --------------------------------------------------------------------

    def _register_node(self) -> None:
        capacity = dict(NODE_CAPACITY)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux"},
            },
        }
        try:
            self._api.post("/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:  # already registered by an earlier session
                raise
        stamp = now()
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": HOST_IP}],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "e2e node agent is running pods as local processes",
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "e2e-node-agent",
                    "kubeProxyVersion": "",
                    "bootID": "",
                    "machineID": "",
                    "systemUUID": "",
                    "kernelVersion": "",
                    "osImage": "",
                    "containerRuntimeVersion": "local-process",
                },
            }
        }
        self._api.patch(f"/api/v1/nodes/{self.node_name}/status", status)

    # --- loop --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as error:  # a flaky API call must not stop the node
                message = f"{type(error).__name__}: {error}"
                if not self.errors or self.errors[-1] != message:
                    self.errors.append(message)
                log.warning("node agent: %s", message)
            self._stop.wait(self._interval_s)

    def _list_pods(self) -> list[Pod]:
        items: list[Pod] = self._api.get("/api/v1/pods")["items"]
        return items

    def _reconcile(self) -> None:
        pods = self._list_pods()
        used = fit.in_use(pods, self.node_name)
        seen: set[str] = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            node = pod["spec"].get("nodeName")
            if not node:
                if not pod["metadata"].get("deletionTimestamp"):
                    short = fit.shortfall(pod, used)
                    if short is None:
                        self._bind(pod)
                        fit.add(used, pod)
                    else:
                        self._post_unschedulable(pod, short)
                continue
            if node != self.node_name:
                continue
            if pod["status"].get("phase") in ("Succeeded", "Failed") and uid not in self._pods:
                continue
            self._sync(pod)
        with self._lock:
            gone = [uid for uid in self._pods if uid not in seen]
        for uid in gone:
            self._forget(uid)
        self._write_scrape_targets()

    def _post_unschedulable(self, pod: Pod, message: str) -> None:
        """What kube-scheduler reports on a pod no node has room for."""
        meta = pod["metadata"]
        for condition in pod["status"].get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("message") == message:
                return
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": now(),
                }
            ],
        }
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self._api.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": status},
                STRATEGIC_PATCH,
            )

    def _bind(self, pod: Pod) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        # A conflict means another pass (or a deletion) got there first.
        with contextlib.suppress(ApiError):
            self._api.post(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", body
            )

    def _sync(self, pod: Pod) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            running = self._pods.get(uid)
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(pod, running)
            return
        if running is None:
            running = self._admit(pod)
            if running is None:
                return
        self._check(running)
        self._post_status(running)

    def _admit(self, pod: Pod) -> RunningPod | None:
        meta, spec = pod["metadata"], pod["spec"]
        containers = spec.get("containers") or []
        ip = ""
        try:
            if len(containers) != 1:
                raise Refused("the e2e node agent runs pods with exactly one container")
            container = containers[0]
            argv = project_argv(container, sys.executable)
            ip = self._pool.allocate(list(container_ports(container).values()))
            env = container_env(
                container, pod, ip, lambda secret, key: self._secret(meta, secret, key)
            )
            probe = readiness_probe(container)
            scrape = scrape_target(pod, ip)
        except Refused as refusal:
            # the pod is admitted again on the next pass: its address must not leak
            if ip:
                self._pool.release(ip)
            self._post_refusal(pod, str(refusal))
            return None
        argv = bind_to_pod([expand(a, env) for a in argv], ip)
        base = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        running = RunningPod(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            ip=ip,
            argv=argv,
            env={**base, "HOSTNAME": meta["name"], **env},
            log=self._workdir / "pods" / f"{meta['namespace']}_{meta['name']}.log",
            probe=probe,
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_s=min(float(spec.get("terminationGracePeriodSeconds", 30)), _MAX_GRACE_S),
            start_time=now(),
            container=ContainerState(
                name=container["name"],
                image=container.get("image", ""),
                running_since=None,
                ready=False,
                restart_count=0,
            ),
            scrape=scrape,
        )
        running.ready_since = running.start_time
        with self._lock:
            self._pods[running.uid] = running
        self._launch(running)
        return running

    def _secret(self, meta: dict[str, Any], name: str, key: str) -> str:
        """A secretKeyRef's value, as the kubelet reads it when it starts the container."""
        try:
            secret = self._api.get(f"/api/v1/namespaces/{meta['namespace']}/secrets/{name}")
        except ApiError as error:
            raise Refused(f"secret {name}: {error}") from None
        data = secret.get("data") or {}
        if key not in data:
            raise Refused(f"secret {name} has no key {key!r}")
        return base64.b64decode(data[key]).decode()

    def _launch(self, pod: RunningPod) -> None:
        # Spawned from the agent's own long-lived thread: the parent-death signal then
        # fires only when the agent stops or pytest dies.
        pod.proc = procs.spawn(pod.argv, log=pod.log, env=pod.env)
        pod.starts += 1
        pod.probe_failures = 0
        pod.container = replace(
            pod.container, running_since=now(), ready=pod.probe is None, waiting_reason=""
        )

    def _check(self, pod: RunningPod) -> None:
        if pod.proc is None:
            if time.monotonic() >= pod.restart_at and restarts(
                pod.restart_policy, pod.container.last_exit_code or 0
            ):
                self._launch(pod)
            return
        code = pod.proc.poll()
        if code is not None:
            procs.stop(pod.proc, grace_s=0.5)  # reap its group and unregister it
            pod.proc = None
            exit_code = code if code >= 0 else 128 - code  # killed by signal n: 128 + n
            restart = restarts(pod.restart_policy, exit_code)
            delay = restart_delay(pod.container.restart_count)
            pod.container = replace(
                pod.container,
                running_since=None,
                ready=False,
                last_exit_code=exit_code,
                last_finished_at=now(),
                restart_count=pod.container.restart_count + (1 if restart else 0),
                waiting_reason="CrashLoopBackOff",
                waiting_message=f"back-off {delay:g}s restarting failed container "
                f"{pod.container.name} (exit code {exit_code})",
            )
            pod.restart_at = time.monotonic() + delay
            if restart and delay == 0:
                self._launch(pod)
            return
        ready = self._probe(pod)
        if ready != pod.container.ready:
            pod.container = replace(pod.container, ready=ready)

    def _probe(self, pod: RunningPod) -> bool:
        if pod.probe is None:
            return True
        url = f"http://{pod.ip}:{pod.probe.port}{pod.probe.path}"
        try:
            with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S) as response:
                ok = 200 <= response.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            ok = False
        if ok:
            pod.probe_failures = 0
            return True
        pod.probe_failures += 1
        # Like the kubelet: a ready container turns unready only after several failures.
        return pod.container.ready and pod.probe_failures < _PROBE_FAILURE_THRESHOLD

    def _phase(self, pod: RunningPod) -> str:
        code = pod.container.last_exit_code
        if pod.proc is None and code is not None and not restarts(pod.restart_policy, code):
            return "Succeeded" if code == 0 else "Failed"
        return "Running" if pod.container.running_since or pod.starts else "Pending"

    def _post_status(self, pod: RunningPod) -> None:
        if pod.container.ready != (
            (pod.last_status.get("containerStatuses") or [{}])[0].get("ready", False)
        ):
            pod.ready_since = now()
        status = pod_status(
            phase=self._phase(pod),
            pod_ip=pod.ip,
            host_ip=HOST_IP,
            start_time=pod.start_time,
            container=pod.container,
            ready_since=pod.ready_since,
        )
        if status == pod.last_status:
            return
        self._api.patch(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
            {"status": status},
            STRATEGIC_PATCH,
        )
        pod.last_status = status

    def _post_refusal(self, pod: Pod, message: str) -> None:
        meta = pod["metadata"]
        if (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get(
            "waiting", {}
        ).get("message") == message:
            return
        containers = pod["spec"].get("containers") or [{"name": "unknown"}]
        status = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "CreateContainerError", "message": message}},
                }
                for c in containers
            ],
        }
        self._api.patch(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            {"status": status},
            STRATEGIC_PATCH,
        )

    def _terminate(self, pod: Pod, running: RunningPod | None) -> None:
        meta = pod["metadata"]
        if running is not None and running.proc is not None:
            if running.terminating_since is None:
                running.terminating_since = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.proc.pid, signal.SIGTERM)
            elapsed = time.monotonic() - running.terminating_since
            if running.proc.poll() is None and elapsed < running.grace_s:
                return  # still draining; look again on the next pass
            procs.stop(running.proc, grace_s=0.5)
            running.proc = None
        with contextlib.suppress(ApiError):  # already gone
            self._api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
        if running is not None:
            self._forget(running.uid)

    def _forget(self, uid: str) -> None:
        with self._lock:
            running = self._pods.pop(uid, None)
        if running is None:
            return
        if running.proc is not None:
            procs.stop(running.proc, grace_s=running.grace_s)
        self._pool.release(running.ip)

    def _write_scrape_targets(self) -> None:
        if self._scrape_file is None:
            return
        targets: list[dict[str, Any]] = []
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            if pod.proc is None or pod.scrape is None:
                continue
            address, path = pod.scrape
            targets.append(
                {
                    "targets": [address],
                    "labels": {
                        "namespace": pod.namespace,
                        "pod": pod.name,
                        "__metrics_path__": path,
                    },
                }
            )
        if targets == self._scrape_targets:
            return
        tmp = self._scrape_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(targets))
        tmp.replace(self._scrape_file)  # atomic: Prometheus never reads half a file
        self._scrape_targets = targets
