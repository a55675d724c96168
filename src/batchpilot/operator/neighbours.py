"""What else in the namespace touches a target: the selectors that could reach a
canary's pods, and the other InferenceServices tuning the same workload."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchpilot.operator.canary import NamedSelector
from batchpilot.operator.kube import JSON, Kube, NotFound
from batchpilot.operator.selectors import Selector, from_label_selector, from_map

MONITORING = "/apis/monitoring.coreos.com/v1/namespaces/{ns}"
# (kind, collection path, whether `spec.selector` is a Service's map or a LabelSelector,
# whether the resource is a CRD that may be absent)
POD_SELECTORS = (
    ("Service", "/api/v1/namespaces/{ns}/services", "map", False),
    ("PodDisruptionBudget", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", "label", False),
    ("PodMonitor", MONITORING + "/podmonitors", "label", True),
)
SHOWN = 20  # names listed in an event before "and N more"


@dataclass
class Survey:
    """The pod selectors of a namespace and what was looked at."""

    selectors: list[NamedSelector] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # optional kinds not installed
    service_monitors: list[str] = field(default_factory=list)

    def describe(self) -> str:
        names = [s.owner for s in self.selectors]
        shown = ", ".join(names[:SHOWN]) + (
            f" and {len(names) - SHOWN} more" if names[SHOWN:] else ""
        )
        parts = [f"checked {len(names)} selectors ({shown or 'none'})"]
        if self.service_monitors:
            parts.append(
                f"{len(self.service_monitors)} ServiceMonitors reach pods through the Services "
                "checked"
            )
        parts += [f"no {kind} resource installed" for kind in self.absent]
        return "; ".join(parts)


def _selector(item: Mapping[str, Any], shape: str) -> Selector | None:
    raw = (item.get("spec") or {}).get("selector")
    return from_map(raw) if shape == "map" else from_label_selector(raw)


async def survey(kube: Kube, namespace: str) -> Survey:
    """Every Service, PodDisruptionBudget and PodMonitor of the namespace that selects
    any pod. PodMonitor and ServiceMonitor are skipped when their CRDs are absent;
    selectors that select nothing are left out. SelectorError on one it cannot read."""
    found = Survey()
    for kind, path, shape, optional in POD_SELECTORS:
        try:
            listing = await kube.get(path.format(ns=namespace))
        except NotFound:
            if not optional:
                raise
            found.absent.append(kind)
            continue
        for item in listing.get("items") or []:
            selector = _selector(item, shape)
            if selector is not None:
                name = item.get("metadata", {}).get("name", "?")
                found.selectors.append(NamedSelector(f"{kind}/{name}", selector))
    try:
        monitors = await kube.get(MONITORING.format(ns=namespace) + "/servicemonitors")
    except NotFound:
        found.absent.append("ServiceMonitor")
    else:
        found.service_monitors = [
            str(m.get("metadata", {}).get("name", "?")) for m in monitors.get("items") or []
        ]
    return found


KSERVE_API_GROUP = "serving.kserve.io/"


def kserve_predictor_names(isvc: str) -> tuple[str, ...]:
    """The Deployments KServe's raw deployment mode makes for an InferenceService's
    predictor (`NAME-predictor`; `NAME-predictor-default` in releases before 0.11)."""
    return (f"{isvc}-predictor", f"{isvc}-predictor-default")


def kserve_owner(workload: Mapping[str, Any]) -> str | None:
    """The KServe InferenceService that owns `workload`, None when none does."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        api = str(ref.get("apiVersion") or "")
        if ref.get("kind") == "InferenceService" and api.startswith(KSERVE_API_GROUP):
            return str(ref.get("name") or "") or None
    return None


def _target_of(isvc: Mapping[str, Any]) -> tuple[str, str]:
    target = (isvc.get("spec") or {}).get("target") or {}
    return str(target.get("kind") or "Deployment"), str(target.get("name") or "")


def claimants(
    items: Iterable[JSON], kind: str, name: str, aliases: Iterable[tuple[str, str]] = ()
) -> list[JSON]:
    """The InferenceServices targeting `kind`/`name`, or any of `aliases` (other names
    of the same pods: a KServe InferenceService and the Deployment it owns), the first
    claimant first: the oldest, the name breaking a tie. One being deleted still holds
    the target until its finalizer has restored it."""
    targets = {(kind, name), *aliases}
    same = [i for i in items if _target_of(i) in targets]
    return sorted(
        same,
        key=lambda i: (
            str(i.get("metadata", {}).get("creationTimestamp") or ""),
            str(i.get("metadata", {}).get("name") or ""),
        ),
    )
