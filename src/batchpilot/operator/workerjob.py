"""The load-worker Job of one InferenceService: names, manifests and how many workers a
trial needs. Pure functions; `workerfleet` creates the objects and talks to the pods.

Objects (one name, `<isvc, truncated>-load-<hash>`, owned by the InferenceService, so
Kubernetes' garbage collector removes them with it):
- a ServiceAccount with no RoleBinding, and pods that do not mount its token: a worker
  has no Kubernetes API rights at all;
- a Secret holding the study's bearer token, read by the pods as an environment variable;
- an Indexed Job of N pods running `batchpilot load-worker`, one share index each.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from batchpilot.loadgen.serve_worker import DEFAULT_PORT, TOKEN_ENV
from batchpilot.models import CLIENT_MAX_CPU, StepResult
from batchpilot.operator.owners import owner_reference
from batchpilot.operator.spec import WorkersSpec

WORKER_LABEL = "batchpilot.dev/load-workers"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
TOKEN_KEY = "token"
NAME_LIMIT = 63 - 6  # the Job controller appends "-<index>-<5 chars>" to pod names
HASH_CHARS = 8
# A worker with no share for this long exits 0: its Job completes and its TTL removes it
# even when the operator that started it is gone.
IDLE_EXIT_S = 900
# No worker runs above this share of its ceiling at the highest rate the search reaches.
TARGET_UTILISATION = 0.6
# Deleted or crashed worker pods are replaced by the Job controller this many times.
BACKOFF_LIMIT = 100


def fleet_name(isvc: str, namespace: str, uid: str) -> str:
    digest = hashlib.sha256(f"{namespace}/{isvc}/{uid}".encode()).hexdigest()[:HASH_CHARS]
    suffix = f"-load-{digest}"
    return isvc[: NAME_LIMIT - len(suffix)].rstrip("-.") + suffix


def _metadata(name: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "batchpilot-load-worker",
            "app.kubernetes.io/managed-by": "batchpilot",
            WORKER_LABEL: name,
        },
        "ownerReferences": [owner_reference(owner)],
    }


def service_account_manifest(name: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(name, namespace, owner),
        "automountServiceAccountToken": False,
    }


def secret_manifest(
    name: str, namespace: str, owner: Mapping[str, Any], token: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(name, namespace, owner),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def job_manifest(
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    *,
    workers: int,
    spec: WorkersSpec,
    image: str,
    port: int = DEFAULT_PORT,
) -> dict[str, Any]:
    """An Indexed Job of `workers` long-lived load-worker pods."""
    if workers < 1:
        raise ValueError(f"a worker Job needs at least 1 worker, got {workers}")
    resources: dict[str, dict[str, str]] = {}
    for part, values in (("requests", spec.resources.requests), ("limits", spec.resources.limits)):
        given = {} if values is None else values.model_dump(exclude_none=True)
        if given:
            resources[part] = given
    container: dict[str, Any] = {
        "name": "load-worker",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "load-worker",
            "--host=0.0.0.0",
            f"--port={port}",
            f"--max-idle={IDLE_EXIT_S}",
        ],
        "env": [
            {
                "name": TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": name, "key": TOKEN_KEY}},
            },
            {"name": "HOME", "value": "/tmp"},
        ],
        "ports": [{"name": "shares", "containerPort": port}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": port},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
        },
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "automountServiceAccountToken": False,
        "restartPolicy": "OnFailure",
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations
        ]
    meta = _metadata(name, namespace, owner)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "backoffLimit": BACKOFF_LIMIT,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod_spec},
        },
    }


def worker_addresses(
    pods: Sequence[Mapping[str, Any]], workers: int, port: int = DEFAULT_PORT
) -> list[str] | None:
    """`ip:port` of the ready pod of every index 0..workers-1, in index order; None while
    some index has none (starting, restarting, replaced)."""
    by_index: dict[int, str] = {}
    for pod in pods:
        meta = pod.get("metadata", {}) or {}
        status = pod.get("status", {}) or {}
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", []) or []
        )
        index = (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
        if ready and status.get("podIP") and index is not None and str(index).isdigit():
            by_index[int(index)] = f"{status['podIP']}:{port}"
    if any(i not in by_index for i in range(workers)):
        return None
    return [by_index[i] for i in range(workers)]


# --- sizing ---------------------------------------------------------------------------


def worker_ceiling_rps(steps: Sequence[StepResult]) -> float | None:
    """The rate one worker sends at its CPU bound (CLIENT_MAX_CPU of a core), from the
    busiest step whose client health was measured: its rate per worker over the busiest
    worker's CPU share. None when no step says (nothing sent, CPU too small to read)."""
    best: tuple[float, float] | None = None  # (offered rps, ceiling)
    for step in steps:
        health = step.worker_clients or ([step.client] if step.client is not None else [])
        if not health or step.offered_rps <= 0:
            continue
        cpu = max(h.busiest_cpu() for h in health)
        if cpu < 0.01:  # too little work to extrapolate from
            continue
        ceiling = step.offered_rps / len(health) / cpu * CLIENT_MAX_CPU
        if best is None or step.offered_rps > best[0]:
            best = (step.offered_rps, ceiling)
    return None if best is None else best[1]


def highest_search_rps(max_rps_total: float | None, best_rps: float | None) -> float | None:
    """The highest rate the search can offer: the load budget when one is set, else twice
    the best throughput measured so far (the ramp doubles past its last pass); None when
    neither is known."""
    candidates = [r for r in (max_rps_total,) if r is not None]
    if candidates:
        return min(candidates)
    return None if best_rps is None or best_rps <= 0 else 2.0 * best_rps


def workers_needed(top_rps: float | None, ceiling_rps: float | None, max_workers: int) -> int:
    """Workers so that none runs above TARGET_UTILISATION of its ceiling at `top_rps`,
    at most `max_workers`; `max_workers` while either figure is unknown (the first
    trial measures them)."""
    if max_workers <= 1:
        return 1
    if top_rps is None or ceiling_rps is None or ceiling_rps <= 0:
        return max_workers
    needed = math.ceil(top_rps / (TARGET_UTILISATION * ceiling_rps))
    return max(1, min(max_workers, needed))
