"""Start and stop the e2e tier's local cluster as plain functions and context managers:
the control plane, Prometheus, the node agent, the CRDs and the operator's identity.

The pytest fixtures (conftest.py) are thin wrappers around these, and so is
benchmarks/operator_study.py, which runs the same cluster outside pytest."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .controlplane import ControlPlane, ControlPlaneError, require_binaries, start_control_plane
from .kubeapi import Kube
from .kubectl import Kubectl
from .nodeagent import NodeAgent
from .operatorproc import service_account_kubeconfig
from .podmetrics import PodMetricsApi
from .prometheus import Prometheus, start_prometheus

REPO = Path(__file__).resolve().parents[2]
CRD_NAME = "inferenceservices.batchpilot.dev"
# The tests make a namespace each, so the harness runs the operator as
# manifests/cluster-wide does: every namespace, with that overlay's ClusterRole.
OPERATOR_ARGS = ("--all-namespaces", "--liveness", "", "--metrics-port", "0")


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl: Kubectl
    workdir: Path
    plane: ControlPlane | None = None  # None on an existing cluster
    agent: NodeAgent | None = None
    prometheus: Prometheus | None = None
    audit_log: Path | None = None  # the API server's audit log (audit.py), when kept

    @property
    def local(self) -> bool:
        return self.plane is not None

    def diagnostics(self) -> str:
        parts = []
        if self.plane is not None:
            parts.append(self.plane.diagnostics())
        if self.agent is not None and self.agent.errors:
            parts.append("--- node agent ---\n" + "\n".join(self.agent.errors[-20:]))
        return "\n".join(parts)


def start_plane(
    workdir: Path, bin_dir: Path, attempts: int = 2, apiserver_args: Sequence[str] = ()
) -> ControlPlane:
    # Ports are picked free but bound only when each binary starts: on a shared machine
    # another process can take one in between, so a failed start is tried once more.
    for attempt in range(1, attempts):
        try:
            return start_control_plane(
                workdir / f"control-plane-{attempt}", bin_dir, apiserver_args
            )
        except ControlPlaneError:
            continue
    return start_control_plane(workdir / f"control-plane-{attempts}", bin_dir, apiserver_args)


@contextmanager
def local_cluster(workdir: Path, apiserver_args: Sequence[str] = ()) -> Iterator[Cluster]:
    """The control plane, Prometheus, the node agent and the resource metrics API on
    loopback, under `workdir`; everything stopped, by PID, on the way out."""
    plane = start_plane(workdir, require_binaries(), apiserver_args=apiserver_args)
    cluster = Cluster(
        kubeconfig=plane.admin_kubeconfig,
        kubectl=Kubectl(plane.admin_kubeconfig),
        workdir=workdir,
        plane=plane,
    )
    metrics: PodMetricsApi | None = None
    try:
        cluster.prometheus = start_prometheus(workdir / "prometheus")
        api = Kube(plane.server, plane.pki.ca.cert, plane.pki.admin)
        cluster.agent = NodeAgent(api, workdir, scrape_file=cluster.prometheus.targets_file)
        cluster.agent.start()
        metrics = PodMetricsApi(cluster.agent.containers, api, plane.pki.apiserver)
        metrics.start()
        yield cluster
    finally:
        if metrics is not None:
            metrics.stop()
        if cluster.agent is not None:
            cluster.agent.stop()
        if cluster.prometheus is not None:
            cluster.prometheus.stop()
        plane.stop()
        procs.stop_all()


def create_namespace(cluster: Cluster, name: str) -> None:
    """Create namespace `name` and wait until pods can be admitted there: once the
    controller-manager made its default ServiceAccount."""
    cluster.kubectl("create", "namespace", name)
    admitted = procs.wait_until(
        lambda: (
            cluster.kubectl.run(
                "get", "serviceaccount", "default", "-n", name, check=False
            ).returncode
            == 0
        ),
        timeout_s=60,
    )
    if not admitted:
        raise AssertionError(
            f"namespace {name}: no default ServiceAccount\n{cluster.diagnostics()}"
        )


def wait_established(kubectl: Kubectl, crd: str, timeout_s: float = 60.0) -> None:
    """Until the CRD named `crd` is Established. Polled rather than `kubectl wait`, which
    fails at once on a CRD whose status has no conditions yet (a loaded API server sets
    them a moment after the create)."""
    query = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool:
        found = kubectl.run("get", f"crd/{crd}", "-o", f"jsonpath={query}", check=False)
        return found.returncode == 0 and found.stdout.strip() == "True"

    if not procs.wait_until(established, timeout_s=timeout_s, interval_s=0.5):
        raise RuntimeError(f"CRD {crd} was not Established within {timeout_s:g} s")


def apply_crds(cluster: Cluster) -> Path:
    """The project's CRDs applied with kubectl and established; their directory."""
    crd_dir = REPO / "crds"
    source = "-k" if (crd_dir / "kustomization.yaml").exists() else "-f"
    cluster.kubectl("apply", source, str(crd_dir))
    wait_established(cluster.kubectl, CRD_NAME)
    return crd_dir


@dataclass(frozen=True)
class OperatorIdentity:
    namespace: str
    service_account: str
    kubeconfig: Path

    @property
    def user(self) -> str:
        """The API server's name for the identity (as in RBAC subjects and audit logs)."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def operator_manifests(kubectl: Kubectl) -> list[dict[str, Any]]:
    """What `kubectl apply -k manifests/cluster-wide` would create, less the operator's
    own Deployment: the tests run the operator as a local process with the same identity,
    over namespaces made per test (test_least_privilege covers manifests/default, whose
    rights end at the namespaces it names)."""
    rendered = kubectl("kustomize", str(REPO / "manifests" / "cluster-wide"))
    return [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] not in ("Deployment", "CustomResourceDefinition")
    ]


def operator_service_account(documents: list[dict[str, Any]]) -> tuple[str, str]:
    """(namespace, name) of the one ServiceAccount the manifests define."""
    accounts = [d for d in documents if d["kind"] == "ServiceAccount"]
    if len(accounts) != 1:
        raise AssertionError(f"the manifests should define one ServiceAccount: {accounts}")
    meta = accounts[0]["metadata"]
    return meta.get("namespace", "default"), meta["name"]


def apply_operator_identity(cluster: Cluster) -> OperatorIdentity:
    """manifests/cluster-wide's namespace, ServiceAccount and RBAC applied by kubectl, and a
    kubeconfig holding a token of that ServiceAccount."""
    documents = operator_manifests(cluster.kubectl)
    cluster.kubectl.apply(yaml.safe_dump_all(documents))
    namespace, name = operator_service_account(documents)
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace, name, cluster.workdir / "operator.kubeconfig"
    )
    return OperatorIdentity(namespace, name, kubeconfig)
