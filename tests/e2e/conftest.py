"""Fixtures of the e2e tier: a real control plane for the session, a node agent that
runs pods as local processes, a real Prometheus, kubectl, and a namespace per test.

Set BATCHPILOT_E2E_EXISTING_CLUSTER=1 with KUBECONFIG pointing at a cluster to run the
tests there instead (docs/testing.md, the e2e tier, says what that cluster needs)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import audit
from .harness import (
    OPERATOR_ARGS,
    REPO,
    Cluster,
    OperatorIdentity,
    apply_crds,
    apply_operator_identity,
    create_namespace,
    local_cluster,
    operator_manifests,
)
from .kubectl import Kubectl
from .operatorproc import OperatorProcess

__all__ = ["REPO", "Cluster", "OperatorIdentity", "create_namespace", "operator_manifests"]

EXISTING_CLUSTER_ENV = "BATCHPILOT_E2E_EXISTING_CLUSTER"


def _existing_cluster() -> Path | None:
    if os.environ.get(EXISTING_CLUSTER_ENV) != "1":
        return None
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise pytest.UsageError(f"{EXISTING_CLUSTER_ENV}=1 needs KUBECONFIG to name a kubeconfig")
    return Path(kubeconfig.split(os.pathsep)[0])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("e2e")
    existing = _existing_cluster()
    if existing is not None:
        yield Cluster(kubeconfig=existing, kubectl=Kubectl(existing), workdir=workdir)
        return
    args, audit_log = audit.apiserver_args(workdir / "audit")
    with local_cluster(workdir, apiserver_args=args) as local:
        local.audit_log = audit_log
        yield local


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
    return apply_crds(cluster)


@pytest.fixture(scope="session")
def operator_identity(cluster: Cluster, crds: Path) -> OperatorIdentity:
    """The manifests' namespace, ServiceAccount and RBAC applied by kubectl, and a
    kubeconfig holding a token of that ServiceAccount."""
    return apply_operator_identity(cluster)


@pytest.fixture
def operator(
    cluster: Cluster, operator_identity: OperatorIdentity, namespace: str
) -> Iterator[OperatorProcess]:
    """`batchpilot operator --all-namespaces`, as manifests/cluster-wide runs it, with
    that overlay's ServiceAccount.

    On the way out the test's InferenceServices are deleted while the operator still
    runs, so their finalizers are handled and the namespace can go."""
    process = OperatorProcess(
        operator_identity.kubeconfig,
        cluster.workdir / f"operator-{namespace}.log",
        OPERATOR_ARGS,
    )
    process.start()
    yield process
    if not process.running():
        process.start()
    cluster.kubectl.run(
        "delete", "inferenceservices", "--all", "-n", namespace, "--timeout=60s", check=False
    )
    process.stop()
