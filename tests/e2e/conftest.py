"""Fixtures of the e2e tier: a real control plane for the session, a node agent that
runs pods as local processes, a real Prometheus, kubectl, and a namespace per test.

Set BATCHPILOT_E2E_EXISTING_CLUSTER=1 with KUBECONFIG pointing at a cluster to run the
tests there instead (see the README's e2e section for what that cluster needs)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import procs
from .controlplane import (
    ControlPlane,
    ControlPlaneError,
    require_binaries,
    start_control_plane,
)
from .kubeapi import Kube
from .kubectl import Kubectl
from .nodeagent import NodeAgent
from .operatorproc import OperatorProcess, service_account_kubeconfig
from .prometheus import Prometheus, start_prometheus

EXISTING_CLUSTER_ENV = "BATCHPILOT_E2E_EXISTING_CLUSTER"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl: Kubectl
    workdir: Path
    plane: ControlPlane | None = None  # None on an existing cluster
    agent: NodeAgent | None = None
    prometheus: Prometheus | None = None

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


def _existing_cluster() -> Path | None:
    if os.environ.get(EXISTING_CLUSTER_ENV) != "1":
        return None
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise pytest.UsageError(f"{EXISTING_CLUSTER_ENV}=1 needs KUBECONFIG to name a kubeconfig")
    return Path(kubeconfig.split(os.pathsep)[0])


def _start_plane(workdir: Path, bin_dir: Path, attempts: int = 2) -> ControlPlane:
    # Ports are picked free but bound only when each binary starts: on a shared machine
    # another process can take one in between, so a failed start is tried once more.
    for attempt in range(1, attempts):
        try:
            return start_control_plane(workdir / f"control-plane-{attempt}", bin_dir)
        except ControlPlaneError:
            continue
    return start_control_plane(workdir / f"control-plane-{attempts}", bin_dir)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("e2e")
    existing = _existing_cluster()
    if existing is not None:
        yield Cluster(kubeconfig=existing, kubectl=Kubectl(existing), workdir=workdir)
        return
    plane = _start_plane(workdir, require_binaries())
    cluster = Cluster(
        kubeconfig=plane.admin_kubeconfig,
        kubectl=Kubectl(plane.admin_kubeconfig),
        workdir=workdir,
        plane=plane,
    )
    try:
        cluster.prometheus = start_prometheus(workdir / "prometheus")
        api = Kube(plane.server, plane.pki.ca.cert, plane.pki.admin)
        cluster.agent = NodeAgent(api, workdir, scrape_file=cluster.prometheus.targets_file)
        cluster.agent.start()
        yield cluster
    finally:
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
    assert procs.wait_until(
        lambda: (
            cluster.kubectl.run(
                "get", "serviceaccount", "default", "-n", name, check=False
            ).returncode
            == 0
        ),
        timeout_s=60,
    ), f"namespace {name}: no default ServiceAccount\n{cluster.diagnostics()}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    name = f"e2e-{request.node.name.removeprefix('test_')[:30].replace('_', '-')}-"
    name = (name + uuid.uuid4().hex[:6]).lower()
    create_namespace(cluster, name)
    yield name
    cluster.kubectl.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> Path:
    """The project's CRDs applied with kubectl and established."""
    crd_dir = REPO / "crds"
    source = "-k" if (crd_dir / "kustomization.yaml").exists() else "-f"
    cluster.kubectl("apply", source, str(crd_dir))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/inferenceservices.batchpilot.dev",
    )
    return crd_dir


@dataclass(frozen=True)
class OperatorIdentity:
    namespace: str
    service_account: str
    kubeconfig: Path


def operator_manifests(kubectl: Kubectl) -> list[dict[str, Any]]:
    """What `kubectl apply -k manifests/default` would create, less the operator's own
    Deployment: the tests run the operator as a local process with the same identity."""
    rendered = kubectl("kustomize", str(REPO / "manifests" / "default"))
    return [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] not in ("Deployment", "CustomResourceDefinition")
    ]


@pytest.fixture(scope="session")
def operator_identity(cluster: Cluster, crds: Path) -> OperatorIdentity:
    """The manifests' namespace, ServiceAccount and RBAC applied by kubectl, and a
    kubeconfig holding a token of that ServiceAccount."""
    documents = operator_manifests(cluster.kubectl)
    cluster.kubectl.apply(yaml.safe_dump_all(documents))
    accounts = [d for d in documents if d["kind"] == "ServiceAccount"]
    assert len(accounts) == 1, f"manifests/default should define one ServiceAccount: {accounts}"
    meta = accounts[0]["metadata"]
    namespace = meta.get("namespace", "default")
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace, meta["name"], cluster.workdir / "operator.kubeconfig"
    )
    return OperatorIdentity(namespace, meta["name"], kubeconfig)


@pytest.fixture
def operator(
    cluster: Cluster, operator_identity: OperatorIdentity, namespace: str
) -> Iterator[OperatorProcess]:
    """`batchpilot operator --all-namespaces`, as manifests/operator runs it, with the
    manifests' ServiceAccount.

    On the way out the test's InferenceServices are deleted while the operator still
    runs, so their finalizers are handled and the namespace can go."""
    process = OperatorProcess(
        operator_identity.kubeconfig,
        cluster.workdir / f"operator-{namespace}.log",
        # Kopf's --namespace mode lists namespaces, which the manifests' ClusterRole does
        # not grant; the deployed operator watches all namespaces, and so does the test.
        ["--all-namespaces", "--liveness", "", "--metrics-port", "0"],
    )
    process.start()
    yield process
    if not process.running():
        process.start()
    cluster.kubectl.run(
        "delete", "inferenceservices", "--all", "-n", namespace, "--timeout=60s", check=False
    )
    process.stop()
