"""Least privilege on the real API server: the admission policy of manifests/admission
lets the operator's ServiceAccount create and delete canaries only; the namespaced
overlay (manifests/namespaced) runs a study with a Role in the watched namespace and
nothing cluster-wide but reading CRDs; both overlays, and the load workers' optional
NetworkPolicy, pass a server-side dry run."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from . import procs
from .conftest import REPO, Cluster, OperatorIdentity, create_namespace
from .kubectl import Kubectl
from .operatorproc import OperatorProcess, service_account_kubeconfig
from .scenario import deploy_server, diagnostics
from .study import wait_for
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CANARY_LABEL = "batchpilot.dev/canary"
OVERLAY_OPERATOR_NAMESPACE = "batchpilot-system"
OVERLAY_WATCHED_NAMESPACE = "batchpilot-workloads"


def _deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 0,  # admission is the point: no pod needs to run
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "batchpilot:0.1.0"}]},
            },
        },
    }


def _as_operator(identity: OperatorIdentity) -> str:
    return f"--as=system:serviceaccount:{identity.namespace}:{identity.service_account}"


def test_policy_lets_the_operator_create_and_delete_only_canaries(
    cluster: Cluster, operator_identity: OperatorIdentity, namespace: str
) -> None:
    kubectl = cluster.kubectl
    as_operator = _as_operator(operator_identity)
    plain = dump(_deployment("plain", {"app": "plain"}))

    def refused() -> str:
        done = kubectl.run(
            "create", "-f", "-", "-n", namespace, as_operator, input=plain, check=False
        )
        return done.stderr if done.returncode != 0 else ""

    # a policy is enforced once the API server has compiled it: moments after it is created
    assert procs.wait_until(lambda: bool(refused()), timeout_s=30), "the policy never refused"
    message = refused()
    assert "may create only canary workloads" in message, message
    assert "ValidatingAdmissionPolicy 'batchpilot-operator-canaries-only'" in message, message
    # RBAC would have allowed it: only the policy said no
    assert (
        kubectl("auth", "can-i", "create", "deployments", "-n", namespace, as_operator).strip()
        == "yes"
    )

    canary = dump(_deployment("some-bp-canary", {CANARY_LABEL: "isvc"}))
    kubectl("create", "-f", "-", "-n", namespace, as_operator, input=canary)
    kubectl("delete", "deployment", "some-bp-canary", "-n", namespace, as_operator)

    # a workload the operator did not make (created here by the admin) it may not delete
    kubectl("create", "-f", "-", "-n", namespace, input=plain)
    done = kubectl.run("delete", "deployment", "plain", "-n", namespace, as_operator, check=False)
    assert done.returncode != 0
    assert "may delete only canary workloads" in done.stderr, done.stderr
    assert (
        kubectl.json("get", "deployment", "plain", "-n", namespace)["metadata"]["name"] == "plain"
    )
    # anyone else is not bound by the policy
    kubectl("delete", "deployment", "plain", "-n", namespace)


def test_both_overlays_pass_a_server_side_dry_run(
    cluster: Cluster, operator_identity: OperatorIdentity
) -> None:
    kubectl = cluster.kubectl
    kubectl("apply", "-k", str(REPO / "manifests" / "default"), "--dry-run=server")
    # the namespaced overlay's example namespace must exist for its Role to be admitted
    kubectl.run("create", "namespace", OVERLAY_WATCHED_NAMESPACE, check=False)
    try:
        out = kubectl("apply", "-k", str(REPO / "manifests" / "namespaced"), "--dry-run=server")
        # the optional load-worker NetworkPolicy, placed in that same example namespace
        policy = kubectl(
            "apply", "-k", str(REPO / "manifests" / "load-workers"), "--dry-run=server"
        )
    finally:
        kubectl.run("delete", "namespace", OVERLAY_WATCHED_NAMESPACE, "--wait=false", check=False)
    assert "role.rbac.authorization.k8s.io/batchpilot-operator created (server dry run)" in out
    assert "networkpolicy.networking.k8s.io/batchpilot-load-workers created (server dry run)" in (
        policy
    )
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/" in out


def _namespaced_install(kubectl: Kubectl, operator_ns: str, watched: str) -> list[dict[str, Any]]:
    """manifests/namespaced as rendered, moved to the test's namespaces: the operator's
    objects into `operator_ns`, the Role into `watched`; cluster-wide objects of its own
    renamed so the session's default install is left alone. The CRD is applied already,
    the Deployment is replaced by a local process with the same arguments."""
    rendered = [
        d
        for d in yaml.safe_load_all(kubectl("kustomize", str(REPO / "manifests" / "namespaced")))
        if d
    ]
    moved = {OVERLAY_OPERATOR_NAMESPACE: operator_ns, OVERLAY_WATCHED_NAMESPACE: watched}
    suffix = f"-{operator_ns}"
    docs = []
    for original in rendered:
        doc = copy.deepcopy(original)
        kind, meta = doc["kind"], doc["metadata"]
        if kind in ("CustomResourceDefinition", "Namespace"):
            continue
        if meta.get("namespace") in moved:
            meta["namespace"] = moved[meta["namespace"]]
        for subject in doc.get("subjects") or []:
            subject["namespace"] = moved.get(subject.get("namespace", ""), subject.get("namespace"))
        if kind in ("ClusterRole", "ClusterRoleBinding") and meta["name"].endswith("-crds"):
            meta["name"] += suffix
            if kind == "ClusterRoleBinding":
                doc["roleRef"]["name"] += suffix
        docs.append(doc)
    return docs


@pytest.fixture
def operator_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"e2e-bp-op-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, name)
    yield name
    cluster.kubectl.run("delete", "namespace", name, "--wait=false", check=False)
    for kind in ("clusterrolebinding", "clusterrole"):
        cluster.kubectl.run("delete", kind, f"batchpilot-operator-crds-{name}", check=False)


def test_namespaced_install_tunes_with_a_role_only(
    cluster: Cluster, crds: Any, namespace: str, operator_namespace: str
) -> None:
    kubectl = cluster.kubectl
    docs = _namespaced_install(kubectl, operator_namespace, namespace)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    kubectl.apply(yaml.safe_dump_all([d for d in docs if d["kind"] != "Deployment"]))
    [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
    name = account["metadata"]["name"]
    as_operator = f"--as=system:serviceaccount:{operator_namespace}:{name}"

    def can(*args: str) -> str:
        return kubectl.run("auth", "can-i", *args, as_operator, check=False).stdout.strip()

    # what the Role grants, where it grants it, and nothing beyond
    assert can("create", "deployments", "-n", namespace) == "yes"
    assert can("patch", "inferenceservices.batchpilot.dev/status", "-n", namespace) == "yes"
    assert can("create", "deployments", "-n", "default") == "no"
    assert can("list", "pods", "--all-namespaces") == "no"
    assert can("list", "namespaces") == "no"
    assert can("list", "customresourcedefinitions.apiextensions.k8s.io") == "yes"

    args = [
        f"--namespace={namespace}" if a == f"--namespace={OVERLAY_WATCHED_NAMESPACE}" else a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(("--liveness", "--metrics-port"))
    ]
    election = ["--leader-election", "--lease-duration=15", "--renew-period=5"]
    assert args == ["operator", f"--namespace={namespace}", *election]
    kubeconfig = service_account_kubeconfig(
        kubectl, operator_namespace, name, cluster.workdir / f"{operator_namespace}.kubeconfig"
    )
    operator = OperatorProcess(
        kubeconfig,
        cluster.workdir / f"operator-{operator_namespace}.log",
        # the pod's POD_NAMESPACE: the Lease lives beside the operator, where its Role is
        [
            *args[1:],
            f"--lease-namespace={operator_namespace}",
            "--liveness",
            "",
            "--metrics-port",
            "0",
        ],
    )
    deploy_server(cluster, namespace)
    operator.start()
    try:
        kubectl.apply(
            dump(inference_service("scoped", "server", strategy="Canary")), "-n", namespace
        )
        status = wait_for(
            kubectl,
            namespace,
            "scoped",
            lambda s: (
                bool(s.get("canary")) and any(t["number"] >= 1 for t in s.get("trials") or [])
            ),
            what="tuning a canary with the Role's rights",
            timeout_s=240,
            diagnostics=lambda: diagnostics(cluster, operator),
        )
        canary = status["canary"]
        assert kubectl.json("get", "deployment", canary, "-n", namespace)["metadata"]["labels"][
            CANARY_LABEL
        ]
        # the finalizer deletes the canary through the Role and the admission policy
        kubectl("delete", "inferenceservice", "scoped", "-n", namespace, "--timeout=120s")
        assert procs.wait_until(
            lambda: (
                kubectl.run("get", "deployment", canary, "-n", namespace, check=False).returncode
                != 0
            ),
            timeout_s=60,
        ), diagnostics(cluster, operator)
        assert "Not enough permissions to list namespaces" in operator.output(20000)
    finally:
        kubectl.run(
            "delete", "inferenceservices", "--all", "-n", namespace, "--timeout=60s", check=False
        )
        operator.stop()
