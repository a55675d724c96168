"""The operator as the user runs it outside the cluster: `batchpilot operator` as a
process whose kubeconfig holds a token of the manifests' ServiceAccount (from the
TokenRequest API), so every call it makes goes through the RBAC of `manifests/`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .kubectl import Kubectl

TOKEN_DURATION = "2h"
# the tests' Prometheus (and the pods the node agent runs) listen on loopback, which the
# operator refuses for load.prometheus.url unless the platform team allows it
LOOPBACK_ALLOWED = ("--prometheus-allow=127.0.0.0/8", "--prometheus-allow=::1")


def service_account_kubeconfig(
    kubectl: Kubectl, namespace: str, service_account: str, path: Path
) -> Path:
    """A kubeconfig for `service_account` on the cluster `kubectl` talks to."""
    token = kubectl(
        "create", "token", service_account, "-n", namespace, f"--duration={TOKEN_DURATION}"
    ).strip()
    admin: dict[str, Any] = yaml.safe_load(
        kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "yaml")
    )
    cluster = admin["clusters"][0]["cluster"]
    user = f"system:serviceaccount:{namespace}:{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "operator",
                "context": {"cluster": "e2e", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class OperatorProcess:
    """`batchpilot operator` with a ServiceAccount kubeconfig; `kill9()` and `start()`
    again to test what survives a crash."""

    def __init__(self, kubeconfig: Path, log: Path, args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        # Never inherit credentials from the test runner's environment.
        for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(name, None)
        with self.log.open("a") as out:
            out.write(f"--- start {self.starts + 1} ---\n")
        self.proc = procs.spawn(
            [sys.executable, "-m", "batchpilot", "operator", *LOOPBACK_ALLOWED, *self.args],
            log=self.log,
            env=env,
        )
        self.starts += 1

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        procs.kill(self.proc)
        self.proc = None
        return pid

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, grace_s=15.0)
            self.proc = None

    def output(self, limit: int = 6000) -> str:
        return procs.tail(self.log, limit)
