"""Other writers of the target: a GitOps controller (Argo CD, Flux) or a parent
controller that puts its own template back, and a HorizontalPodAutoscaler that changes
the replicas. Pure checks plus the one listing they need."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from batchpilot.operator import decisions
from batchpilot.operator.kube import Kube, KubeError, NotFound

log = logging.getLogger(__name__)


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace)}/horizontalpodautoscalers"


def env_reverted(
    pods: Sequence[Mapping[str, Any]], container: str, env: Mapping[str, str | None]
) -> str | None:
    """Which ready pods do not run `env` (None: the variable unset) in `container`;
    None when all do. Pods being deleted are past caring; a pod listed without its
    containers (a partial object) cannot be judged and is left out."""
    stale: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        containers = (pod.get("spec") or {}).get("containers") or []
        if meta.get("deletionTimestamp") or not containers:
            continue
        if not decisions.ready_pod_ips([pod]):
            continue
        found = next((c for c in containers if c.get("name") == container), None)
        running = decisions.env_values(found or {}, env)
        wrong = {k: v for k, v in running.items() if v != env.get(k)}
        if wrong:
            shown = ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in wrong.items())
            stale.append(f"{meta.get('name', '?')} runs {shown}")
    if not stale:
        return None
    wanted = ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in env.items())
    return (
        f"applied {wanted}, but {'; '.join(stale)}: another writer (a GitOps controller "
        "such as Argo CD or Flux, or a parent controller) put its own values back"
    )


def autoscalers_of(items: Sequence[Mapping[str, Any]], kind: str, name: str) -> list[str]:
    """Names of the HorizontalPodAutoscalers whose scaleTargetRef is the workload."""
    found: list[str] = []
    for hpa in items:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        group = str(ref.get("apiVersion", "apps/v1")).split("/")[0]
        if ref.get("kind") == kind and ref.get("name") == name and group == "apps":
            found.append(str((hpa.get("metadata") or {}).get("name", "?")))
    return sorted(found)


async def find_autoscalers(kube: Kube, namespace: str, kind: str, name: str) -> list[str]:
    """The HPAs targeting the workload. An API server without autoscaling/v2, or an
    operator whose role cannot list them (an install older than this check), finds
    none: said in the log, not a reason to stop tuning."""
    try:
        listing = await kube.get(hpas_path(namespace))
    except NotFound:
        return []
    except KubeError as exc:
        if exc.status != 403:
            raise
        log.warning("cannot list HorizontalPodAutoscalers in %s: %s", namespace, exc)
        return []
    return autoscalers_of(listing.get("items") or [], kind, name)


def replicas_of(workload: Mapping[str, Any]) -> int:
    """The replicas the workload asks for (1 when unset, as the API server defaults)."""
    value = (workload.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)
