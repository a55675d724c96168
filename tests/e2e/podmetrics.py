"""The resource metrics API (`metrics.k8s.io/v1beta1`) for the e2e cluster, which a
HorizontalPodAutoscaler needs: metrics-server reads the kubelet's summary API, and the
node agent runs pods as local processes with no kubelet. This server reads each pod's
CPU from /proc (its container's session) every second and serves `PodMetrics` over
HTTPS on loopback, registered with the API server as an aggregated APIService behind
an ExternalName Service, so the controller-manager's HPA controller reads it through
the API server exactly as it reads metrics-server."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from batchpilot.runtimes import procfs

from .kubeapi import ApiError, Kube
from .pki import KeyPair

GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
SERVICE = ("kube-system", "batchpilot-e2e-metrics")
SAMPLE_S = 1.0
# CPU is a rate over the samples of about this long, as metrics-server's is over its
# scrape interval; the HPA ignores a pod's metric until a window has passed since it
# turned ready
WINDOW_S = 2.0
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

Containers = Callable[[], list[tuple[str, str, int]]]


def _usage(session: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of the live processes of `session`."""
    cpu, rss = 0.0, 0
    for pid in procfs.pids(sid=session):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    return cpu, rss


def _stamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodUsage:
    """Samples every running container's CPU and memory each SAMPLE_S on a thread."""

    def __init__(self, containers: Containers) -> None:
        self._containers = containers
        self._samples: dict[tuple[str, str], deque[tuple[float, float, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-pod-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            running = {(ns, name): _usage(pid) for ns, name, pid in self._containers()}
            with self._lock:
                for key in list(self._samples):
                    if key not in running:
                        del self._samples[key]  # gone: a new pod of that name starts afresh
                for key, (cpu, rss) in running.items():
                    history = self._samples.setdefault(key, deque(maxlen=10))
                    history.append((now, cpu, rss))
            self._stop.wait(SAMPLE_S)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PodMetrics of a pod sampled for at least WINDOW_S; None before that."""
        with self._lock:
            history = list(self._samples.get((namespace, name), ()))
        if len(history) < 2:
            return None
        newest = history[-1]
        older = [s for s in history if newest[0] - s[0] >= WINDOW_S]
        if not older:
            return None
        then = older[-1]
        window = newest[0] - then[0]
        millicores = max(0.0, (newest[1] - then[1]) / window * 1000)
        return {
            "metadata": {"name": name, "namespace": namespace},
            "timestamp": _stamp(newest[0]),
            "window": f"{window:.3f}s",
            "containers": [
                {
                    "name": "server",
                    "usage": {"cpu": f"{round(millicores)}m", "memory": f"{newest[2] // 1024}Ki"},
                }
            ],
        }


def _resource_list() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [
            {
                "name": "pods",
                "singularName": "",
                "namespaced": True,
                "kind": "PodMetrics",
                "verbs": ["get", "list"],
            }
        ],
    }


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the tests read the metrics, not a line per request

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        prefix = ["apis", GROUP, VERSION]
        if parts == prefix:
            self._send(200, _resource_list())
        elif parts[:4] == [*prefix, "namespaces"] and len(parts) in (6, 7) and parts[5] == "pods":
            namespace = parts[4]
            if len(parts) == 7:
                found = self.server.usage.pod(namespace, parts[6])
                if found is None:
                    self._send(404, _status(404, f"no metrics for pod {namespace}/{parts[6]}"))
                else:
                    self._send(
                        200, {"kind": "PodMetrics", "apiVersion": f"{GROUP}/{VERSION}", **found}
                    )
                return
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            try:
                self._send(200, self.server.pod_list(namespace, selector))
            except ApiError as error:
                self._send(error.status, _status(error.status, str(error)))
        else:
            self._send(404, _status(404, f"{url.path} is not served here"))

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _status(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, usage: PodUsage, api: Kube, serving: KeyPair) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(serving.cert), str(serving.key))
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.usage = usage
        self._api = api

    def pod_list(self, namespace: str, selector: str) -> dict[str, Any]:
        """The PodMetrics of the pods the API server matches to `selector` (its own
        label-selector semantics) that have a window of samples."""
        query = {"labelSelector": selector} if selector else {}
        pods = self._api.get(f"/api/v1/namespaces/{namespace}/pods", **query)
        items = []
        for pod in pods.get("items", []):
            found = self.usage.pod(namespace, pod["metadata"]["name"])
            if found is not None:
                items.append(
                    {
                        **found,
                        "metadata": {
                            **found["metadata"],
                            "labels": pod["metadata"].get("labels", {}),
                        },
                    }
                )
        return {
            "kind": "PodMetricsList",
            "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {},
            "items": items,
        }


class PodMetricsApi:
    """The sampler and the HTTPS server, registered with the API server; `stop` ends
    both (the APIService goes with the cluster)."""

    def __init__(self, containers: Containers, api: Kube, serving: KeyPair) -> None:
        self.usage = PodUsage(containers)
        self._server = MetricsServer(self.usage, api, serving)
        self._api = api
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="e2e-metrics-api", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self, timeout_s: float = 60.0) -> None:
        self.usage.start()
        self._thread.start()
        self._register()
        self._wait_available(timeout_s)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self.usage.stop()

    def _register(self) -> None:
        namespace, name = SERVICE
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            # the aggregator dials an ExternalName Service's name at the APIService's
            # port: this server, on loopback, with no kube-proxy needed
            "spec": {
                "type": "ExternalName",
                "externalName": "localhost",
                "ports": [{"port": self.port, "protocol": "TCP"}],
            },
        }
        apiservice = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                # a self-signed test server: the aggregator checks the name it dials
                # (batchpilot-e2e-metrics.kube-system.svc), which no test certificate has
                "insecureSkipTLSVerify": True,
                "service": {"namespace": namespace, "name": name, "port": self.port},
            },
        }
        self._api.post(f"/api/v1/namespaces/{namespace}/services", service)
        self._api.post("/apis/apiregistration.k8s.io/v1/apiservices", apiservice)

    def _wait_available(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        conditions: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            found = self._api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
            conditions = found.get("status", {}).get("conditions", [])
            if any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"APIService {APISERVICE} not Available in {timeout_s:g} s: {conditions}"
        )
