"""Least privilege on the real API server. The admission policies of manifests/admission
hold the operator's ServiceAccount to the objects a study owns (canaries, load workers)
and to plain variables in the workloads it patches; the default install
(manifests/default) gives it a Role in the watched namespace and nothing elsewhere but
reading CRDs, and runs a study with that; every overlay, and the load workers' optional
NetworkPolicy, passes a server-side dry run."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from batchpilot.operator import canary as canaries
from batchpilot.operator import workerjob
from batchpilot.operator.spec import WorkersSpec

from . import procs
from .conftest import REPO, Cluster, OperatorIdentity, create_namespace
from .kubectl import Kubectl
from .operatorproc import OperatorProcess, service_account_kubeconfig
from .scenario import deploy_server, diagnostics
from .study import wait_for
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CANARY_LABEL = canaries.CANARY_LABEL
OVERLAY_OPERATOR_NAMESPACE = "batchpilot-system"
OVERLAY_WATCHED_NAMESPACE = "batchpilot-workloads"
WORKLOAD_POLICY = "ValidatingAdmissionPolicy 'batchpilot-operator-workloads'"
WORKER_POLICY = "ValidatingAdmissionPolicy 'batchpilot-operator-load-workers'"
ONLY_VARIABLES = "may change only plain environment variables"


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
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "batchpilot:0.1.0",
                            "env": [{"name": "MAX_BATCH_SIZE", "value": "8"}],
                        }
                    ]
                },
            },
        },
    }


def _owner(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """An InferenceService to own test objects (no operator watches it here: it stays
    inert), as the API server returns it."""
    kubectl.apply(dump(inference_service("owner", "absent")), "-n", namespace)
    owner: dict[str, Any] = kubectl.json("get", "inferenceservice", "owner", "-n", namespace)
    return owner


def _canary(owner: dict[str, Any], name: str) -> dict[str, Any]:
    """A canary as the operator builds it (canary.canary_manifest), with no replicas."""
    manifest = canaries.canary_manifest(
        _deployment("target", {"app": "target"}), owner, name, {CANARY_LABEL: name}
    )
    manifest["spec"]["replicas"] = 0
    return manifest


def _as(user: str) -> str:
    return f"--as={user}"


def _refusal(kubectl: Kubectl, *args: str, manifest: dict[str, Any] | None = None) -> str:
    """The API server's refusal of a request (stderr), or "" when it was admitted."""
    done = kubectl.run(*args, input=None if manifest is None else dump(manifest), check=False)
    return done.stderr if done.returncode != 0 else ""


def _wait_for_policy(kubectl: Kubectl, *args: str, manifest: dict[str, Any] | None = None) -> None:
    """Wait until a policy refuses the request `args`, probed as a server-side dry run (a
    request admitted before the API server compiled the policy changes nothing)."""
    assert procs.wait_until(
        lambda: (
            "ValidatingAdmissionPolicy"
            in _refusal(kubectl, *args, "--dry-run=server", manifest=manifest)
        ),
        timeout_s=30,
    ), f"no policy refused kubectl {' '.join(args)}"


def test_policy_lets_the_operator_create_and_delete_only_canaries(
    cluster: Cluster, crds: Any, operator_identity: OperatorIdentity, namespace: str
) -> None:
    kubectl = cluster.kubectl
    as_operator = _as(operator_identity.user)
    plain = _deployment("plain", {"app": "plain"})
    create = ("create", "-f", "-", "-n", namespace, as_operator)

    # a policy is enforced once the API server has compiled it: moments after it is created
    _wait_for_policy(kubectl, *create, manifest=plain)
    message = _refusal(kubectl, *create, manifest=plain)
    assert "may create only canary workloads" in message, message
    assert WORKLOAD_POLICY in message, message
    # RBAC would have allowed it: only the policy said no
    assert (
        kubectl("auth", "can-i", "create", "deployments", "-n", namespace, as_operator).strip()
        == "yes"
    )
    # the canary label alone is not enough: a canary is owned by an InferenceService
    unowned = _deployment("some-bp-canary", {CANARY_LABEL: "isvc"})
    assert "may create only canary workloads" in _refusal(kubectl, *create, manifest=unowned)

    canary = _canary(_owner(kubectl, namespace), "owner-bp-canary")
    kubectl("create", "-f", "-", "-n", namespace, as_operator, input=dump(canary))
    kubectl("delete", "deployment", "owner-bp-canary", "-n", namespace, as_operator)

    # a workload the operator did not make (created here by the admin) it may not delete
    kubectl("create", "-f", "-", "-n", namespace, input=dump(plain))
    done = kubectl.run("delete", "deployment", "plain", "-n", namespace, as_operator, check=False)
    assert done.returncode != 0
    assert "may delete only canary workloads" in done.stderr, done.stderr
    assert (
        kubectl.json("get", "deployment", "plain", "-n", namespace)["metadata"]["name"] == "plain"
    )
    # anyone else is not bound by the policy
    kubectl("delete", "deployment", "plain", "-n", namespace)


def test_every_overlay_passes_a_server_side_dry_run(
    cluster: Cluster, operator_identity: OperatorIdentity
) -> None:
    kubectl = cluster.kubectl
    wide = kubectl("apply", "-k", str(REPO / "manifests" / "cluster-wide"), "--dry-run=server")
    # the default install's example namespace must exist for its Role to be admitted
    kubectl.run("create", "namespace", OVERLAY_WATCHED_NAMESPACE, check=False)
    try:
        out = kubectl("apply", "-k", str(REPO / "manifests" / "default"), "--dry-run=server")
        # the optional load-worker NetworkPolicy, placed in that same example namespace
        policy = kubectl(
            "apply", "-k", str(REPO / "manifests" / "load-workers"), "--dry-run=server"
        )
    finally:
        kubectl.run("delete", "namespace", OVERLAY_WATCHED_NAMESPACE, "--wait=false", check=False)
    assert "role.rbac.authorization.k8s.io/batchpilot-operator created (server dry run)" in out
    assert "clusterrole.rbac.authorization.k8s.io/batchpilot-operator " not in out
    assert "clusterrole.rbac.authorization.k8s.io/batchpilot-operator " in wide
    assert "networkpolicy.networking.k8s.io/batchpilot-load-workers created (server dry run)" in (
        policy
    )
    for overlay in (out, wide):
        for name in ("workloads", "load-workers"):
            assert (
                f"validatingadmissionpolicy.admissionregistration.k8s.io/batchpilot-operator-{name}"
                in overlay
            )


def _namespaced_install(kubectl: Kubectl, operator_ns: str, watched: str) -> list[dict[str, Any]]:
    """manifests/default as rendered, moved to the test's namespaces: the operator's
    objects into `operator_ns`, the Role into `watched`; cluster-wide objects of its own
    renamed so the session's install is left alone. The CRD is applied already, the
    Deployment is replaced by a local process with the same arguments."""
    rendered = [
        d
        for d in yaml.safe_load_all(kubectl("kustomize", str(REPO / "manifests" / "default")))
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


@dataclass(frozen=True)
class DefaultInstall:
    """manifests/default applied (but its Deployment) with the operator in `namespace`
    watching `watched`."""

    namespace: str
    watched: str
    service_account: str
    deployment: dict[str, Any]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@pytest.fixture
def default_install(cluster: Cluster, crds: Any, namespace: str) -> Iterator[DefaultInstall]:
    operator_ns = f"e2e-bp-op-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, operator_ns)
    docs = _namespaced_install(cluster.kubectl, operator_ns, namespace)
    cluster.kubectl.apply(yaml.safe_dump_all([d for d in docs if d["kind"] != "Deployment"]))
    [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    yield DefaultInstall(operator_ns, namespace, account["metadata"]["name"], deployment)
    cluster.kubectl.run("delete", "namespace", operator_ns, "--wait=false", check=False)
    for kind in ("clusterrolebinding", "clusterrole"):
        cluster.kubectl.run("delete", kind, f"batchpilot-operator-crds-{operator_ns}", check=False)


def _strategic(patch: dict[str, Any]) -> tuple[str, ...]:
    return ("--type=strategic", "-p", json.dumps(patch))


def _container_patch(**fields: Any) -> tuple[str, ...]:
    return _strategic({"spec": {"template": {"spec": {"containers": [{"name": "c", **fields}]}}}})


def test_the_default_install_holds_the_operator_to_what_a_study_owns(
    cluster: Cluster, default_install: DefaultInstall
) -> None:
    """An operator holding the rendered RBAC and policies can patch only plain variables
    of a workload in its namespace, and can create and delete only what a study owns;
    outside the namespaces it watches it can do nothing."""
    kubectl = cluster.kubectl
    watched = default_install.watched
    as_operator = _as(default_install.user)
    elsewhere = f"e2e-bp-elsewhere-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, elsewhere)
    owner = _owner(kubectl, watched)
    try:
        for ns in (watched, elsewhere):
            kubectl(
                "create", "-f", "-", "-n", ns, input=dump(_deployment("plain", {"app": "plain"}))
            )
            kubectl("create", "secret", "generic", "plain", "--from-literal=k=v", "-n", ns)

        def refused(ns: str, *args: str, manifest: dict[str, Any] | None = None) -> str:
            return _refusal(kubectl, *args, "-n", ns, as_operator, manifest=manifest)

        patch = ("patch", "deployment", "plain")

        # outside the watched namespace RBAC refuses everything (kubectl's read included)
        def rbac_refused(message: str, resource: str) -> bool:
            where = f'resource "{resource}" in API group'
            return f'is forbidden: User "{default_install.user}"' in message and (
                where in message and f'in the namespace "{elsewhere}"' in message
            )

        message = refused(
            elsewhere, *patch, *_container_patch(env=[{"name": "MAX_BATCH_SIZE", "value": "16"}])
        )
        assert rbac_refused(message, "deployments"), message
        message = refused(elsewhere, "delete", "secret", "plain")
        assert rbac_refused(message, "secrets"), message
        name = workerjob.fleet_name("owner", watched, owner["metadata"]["uid"])
        job = workerjob.job_manifest(
            name, watched, owner, workers=1, spec=WorkersSpec(), image="batchpilot:0.1.0"
        )
        job["spec"]["suspend"] = True  # admission is the point: no pod needs to run
        outside = copy.deepcopy(job)
        outside["metadata"]["namespace"] = elsewhere
        message = refused(elsewhere, "create", "-f", "-", manifest=outside)
        assert rbac_refused(message, "jobs"), message

        # inside it, an Env trial's change passes (once the policies are compiled) ...
        image = _container_patch(image="someone-else:1")
        _wait_for_policy(kubectl, *patch, *image, "-n", watched, as_operator)
        kubectl(
            *patch,
            "-n",
            watched,
            as_operator,
            *_container_patch(env=[{"name": "MAX_BATCH_SIZE", "value": "16"}]),
        )
        # ... and nothing else about a workload it did not make
        for change in (
            image,
            _container_patch(command=["sh", "-c", "true"]),
            _container_patch(
                env=[
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "plain", "key": "k"}}}
                ]
            ),
            _strategic({"spec": {"replicas": 3}}),
            _strategic(
                {
                    "spec": {
                        "template": {
                            "spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
                        }
                    }
                }
            ),
        ):
            message = refused(watched, *patch, *change)
            assert ONLY_VARIABLES in message, (change, message)
            assert WORKLOAD_POLICY in message, message
        label = refused(watched, "label", "deployment", "plain", f"{CANARY_LABEL}=plain")
        assert "may not add, change or remove the label" in label, label
        assert "may delete only canary workloads" in refused(
            watched, "delete", "deployment", "plain"
        )
        plain = kubectl.json("get", "deployment", "plain", "-n", watched)
        [container] = plain["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "batchpilot:0.1.0"
        assert container["env"] == [{"name": "MAX_BATCH_SIZE", "value": "16"}]
        assert CANARY_LABEL not in plain["metadata"]["labels"]

        # a canary may not reach the node
        on_host = _canary(owner, "owner-bp-canary")
        on_host["spec"]["template"]["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
        message = refused(watched, "create", "-f", "-", manifest=on_host)
        assert "may not use hostPath volumes" in message, message

        # secrets and jobs: only the load workers' own
        _wait_for_policy(kubectl, "delete", "secret", "plain", "-n", watched, as_operator)
        message = refused(watched, "delete", "secret", "plain")
        assert "may delete only its load workers' objects" in message, message
        assert WORKER_POLICY in message, message
        unowned = copy.deepcopy(job)
        del unowned["metadata"]["ownerReferences"]
        message = refused(watched, "create", "-f", "-", manifest=unowned)
        assert "may create only its load workers' objects" in message, message
        other_account = copy.deepcopy(job)
        other_account["spec"]["template"]["spec"]["serviceAccountName"] = "default"
        message = refused(watched, "create", "-f", "-", manifest=other_account)
        assert "runs as the ServiceAccount of its own name" in message, message
        assert kubectl("get", "secret", "plain", "-n", watched, "-o", "name").strip()

        # what a study makes, as the operator builds it, it may create and delete
        made = [
            workerjob.service_account_manifest(name, watched, owner),
            workerjob.secret_manifest(name, watched, owner, "a-token"),
            job,
            _canary(owner, "owner-bp-canary"),
        ]
        for manifest in made:
            kubectl("create", "-f", "-", "-n", watched, as_operator, input=dump(manifest))
        for manifest in made:
            kind = manifest["kind"].lower()
            kubectl("delete", kind, manifest["metadata"]["name"], "-n", watched, as_operator)
    finally:
        kubectl.run("delete", "inferenceservice", "owner", "-n", watched, check=False)
        kubectl.run("delete", "namespace", elsewhere, "--wait=false", check=False)


def test_namespaced_install_tunes_with_a_role_only(
    cluster: Cluster, default_install: DefaultInstall
) -> None:
    kubectl = cluster.kubectl
    namespace, operator_namespace = default_install.watched, default_install.namespace
    deployment = default_install.deployment
    name = default_install.service_account
    as_operator = _as(default_install.user)

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
