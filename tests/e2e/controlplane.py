"""A real Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC, TLS, client
certificates, service-account tokens) and kube-controller-manager, built by
`kube/build.sh` and started as child processes of the test session."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchpilot.server.process import free_port

from . import procs
from .pki import KeyPair, Pki, make_pki

KUBE_DIR = Path(__file__).resolve().parent / "kube"
BUILD_SCRIPT = KUBE_DIR / "build.sh"
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service, first address of the range
_START_TIMEOUT_S = 120.0
_HTTP_TIMEOUT_S = 3.0


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message carries the log's tail."""


def binary_dir() -> Path:
    """Where build.sh keeps the binaries (it knows the versions and the cache root)."""
    out = subprocess.run(
        [str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=10, check=True
    )
    return Path(out.stdout.strip())


def require_binaries() -> Path:
    bin_dir = binary_dir()
    missing = [
        b
        for b in ("etcd", "kube-apiserver", "kube-controller-manager")
        if not (bin_dir / b).exists()
    ]
    if missing:
        raise ControlPlaneError(
            f"control-plane binaries missing in {bin_dir}: {', '.join(missing)}; "
            "build them with tests/e2e/kube/build.sh (scripts/test runs it)"
        )
    return bin_dir


def kubeconfig(server: str, ca_file: Path, user: dict[str, str], name: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user and one context, credentials inline."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }


def cert_user(pair: KeyPair) -> dict[str, str]:
    return {
        "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class ControlPlane:
    workdir: Path
    server: str
    admin_kubeconfig: Path
    pki: Pki
    logs: dict[str, Path] = field(default_factory=dict)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        # Controller-manager, then the API server, then etcd: dependents first.
        for proc in reversed(self._procs):
            procs.stop(proc, grace_s=10.0)
        self._procs.clear()

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{procs.tail(log, 1500)}" for name, log in self.logs.items()
        )


def _ssl_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
    return context


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _api_get(server: str, path: str, context: ssl.SSLContext) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(
            f"{server}{path}", timeout=_HTTP_TIMEOUT_S, context=context
        ) as response:
            data: dict[str, Any] = json.load(response)
            return data
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _wait(
    what: str,
    predicate: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"{what} exited with code {proc.returncode} while starting:\n{procs.tail(log)}"
            )
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{what} not ready within {timeout_s:g} s:\n{procs.tail(log)}")
        time.sleep(0.25)


def start_control_plane(
    workdir: Path, bin_dir: Path, apiserver_args: Sequence[str] = ()
) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager on 127.0.0.1; return once
    the API server is ready and the controller-manager has created the default
    ServiceAccount (pods cannot be admitted before that). `apiserver_args` go to
    kube-apiserver after the harness's own (an audit log, say)."""
    workdir.mkdir(parents=True, exist_ok=True)
    pki = make_pki(workdir / "pki", ["127.0.0.1", SERVICE_IP])
    etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    logs = {name: workdir / f"{name}.log" for name in ("etcd", "kube-apiserver", "kcm")}
    plane = ControlPlane(
        workdir=workdir,
        server=server,
        admin_kubeconfig=workdir / "admin.kubeconfig",
        pki=pki,
        logs=logs,
    )
    write_kubeconfig(
        plane.admin_kubeconfig, kubeconfig(server, pki.ca.cert, cert_user(pki.admin), "admin")
    )
    try:
        _start(plane, bin_dir, etcd_port, etcd_peer, api_port, apiserver_args)
    except BaseException:
        plane.stop()
        raise
    return plane


def _start(
    plane: ControlPlane,
    bin_dir: Path,
    etcd_port: int,
    etcd_peer: int,
    api_port: int,
    apiserver_args: Sequence[str],
) -> None:
    workdir, pki, logs = plane.workdir, plane.pki, plane.logs
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)}
    etcd = procs.spawn(
        [
            str(bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{etcd_peer}",
            "--listen-metrics-urls=",
            # A test cluster's data is disposable; fsync would only slow it down.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        log=logs["etcd"],
        env=env,
    )
    plane._procs.append(etcd)
    _wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), etcd, logs["etcd"], _START_TIMEOUT_S)

    apiserver = procs.spawn(
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            "--authorization-mode=RBAC",
            f"--client-ca-file={pki.ca.cert}",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints
            # validation rejects as loopback: nothing in the tests uses it.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=0",
            *apiserver_args,
        ],
        log=logs["kube-apiserver"],
        env=env,
    )
    plane._procs.append(apiserver)
    context = _ssl_context(pki)
    _wait(
        "kube-apiserver",
        lambda: _http_ok(f"{plane.server}/readyz", context),
        apiserver,
        logs["kube-apiserver"],
        _START_TIMEOUT_S,
    )

    kcm_kubeconfig = write_kubeconfig(
        workdir / "kcm.kubeconfig",
        kubeconfig(
            plane.server, pki.ca.cert, cert_user(pki.controller_manager), "controller-manager"
        ),
    )
    kcm = procs.spawn(
        [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kcm_kubeconfig}",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca.cert}",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            # The harness's node agent posts no kubelet heartbeats; without this the
            # node-lifecycle controller would taint the node and evict every pod.
            "--controllers=*,-nodelifecycle,-nodeipam",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--concurrent-deployment-syncs=2",
            # HPAs act within a trial of a few seconds (the default period is 15 s)
            "--horizontal-pod-autoscaler-sync-period=1s",
            "--v=0",
        ],
        log=logs["kcm"],
        env=env,
    )
    plane._procs.append(kcm)
    _wait(
        "kube-controller-manager",
        lambda: (
            _api_get(plane.server, "/api/v1/namespaces/default/serviceaccounts/default", context)
            is not None
        ),
        kcm,
        logs["kcm"],
        _START_TIMEOUT_S,
    )
