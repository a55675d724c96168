"""The canary: its name, who may adopt it, and pod labels that nothing in production
selects. Pure functions; the world lists the selectors and creates the object.

Identity. The name is `<target, truncated>-bp-<hash>`, the hash taken over the
InferenceService's namespace, name and uid, so two InferenceServices (on one target, on
targets sharing a prefix, or one recreated under the same name) never share a canary.
An existing object of that name is adopted only when an ownerReference carries this
InferenceService's uid.

Isolation. Every template label whose key some selector in the namespace uses (the
target's own, Services, PodDisruptionBudgets, PodMonitors) gets a value of its own; a
selector that still matches (`NotIn`, `Exists`, `DoesNotExist`) loses the keys it needs;
what still matches after that (an empty selector, one made of `NotIn`/`DoesNotExist`
only) refuses the canary. The canary's own selector is `batchpilot.dev/canary: <name>`,
a label no other workload carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchpilot.operator.owners import owner_reference
from batchpilot.operator.selectors import Selector

CANARY_LABEL = "batchpilot.dev/canary"
# pod names derive from the workload's: room for a ReplicaSet hash and a pod suffix
# ("-" + 10 + "-" + 5), which also covers a StatefulSet's revision-hash label
NAME_LIMIT = 63 - 17
HASH_CHARS = 8
VALUE_SUFFIX = "-bp-canary"
_DROPPED_ANNOTATIONS = (
    "deployment.kubernetes.io/revision",
    "kubectl.kubernetes.io/last-applied-configuration",
)
# Annotations of the target's own object that say who manages it or what watches it:
# Argo CD's tracking id would make Argo CD prune the canary as an object of its app, Flux
# would claim it for a kustomization or release, and a scrape annotation on the object
# (not on its pods, which a Prometheus source of the canary's needs) would have it
# counted as production. The canary is the InferenceService's, so none of them apply.
_DROPPED_ANNOTATION_PREFIXES = (
    "argocd.argoproj.io/",
    "kustomize.toolkit.fluxcd.io/",
    "helm.toolkit.fluxcd.io/",
    "meta.helm.sh/",
    "prometheus.io/",
)


def _kept_annotation(key: str) -> bool:
    return key not in _DROPPED_ANNOTATIONS and not key.startswith(_DROPPED_ANNOTATION_PREFIXES)


class CanaryRefused(ValueError):
    """A canary that must not be created or adopted; `reason` is CamelCase."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def canary_name(target: str, namespace: str, isvc: str, uid: str) -> str:
    digest = hashlib.sha256(f"{namespace}/{isvc}/{uid}".encode()).hexdigest()[:HASH_CHARS]
    suffix = f"-bp-{digest}"
    return target[: NAME_LIMIT - len(suffix)].rstrip("-.") + suffix


def owner_uids(workload: Mapping[str, Any]) -> list[str]:
    refs = workload.get("metadata", {}).get("ownerReferences") or []
    return [str(ref.get("uid")) for ref in refs]


def check_adoptable(workload: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
    """Refuse an existing object of the canary's name that this InferenceService does
    not own: deleting or rolling it would hit someone else's workload."""
    meta = owner["metadata"]
    if str(meta["uid"]) in owner_uids(workload):
        return
    found = workload.get("metadata", {}).get("name", "?")
    owners = ", ".join(owner_uids(workload)) or "none"
    raise CanaryRefused(
        "CanaryNotOwned",
        f"{workload.get('kind', 'workload')} {found} exists but is not owned by "
        f"InferenceService {meta['name']} (uid {meta['uid']}; its owner uids: {owners}); "
        "the operator adopts only its own canary: delete or rename that workload",
    )


@dataclass(frozen=True)
class NamedSelector:
    """A selector and what it belongs to, e.g. `Service/web`."""

    owner: str
    selector: Selector


@dataclass(frozen=True)
class Isolation:
    labels: dict[str, str]
    checked: tuple[str, ...]  # the selectors checked, e.g. "Service/web"


def canary_value(value: str) -> str:
    if not value:
        return VALUE_SUFFIX.lstrip("-")
    return value[: 63 - len(VALUE_SUFFIX)].rstrip("-_.") + VALUE_SUFFIX


def isolate(
    template_labels: Mapping[str, str],
    own: Selector,
    selectors: Sequence[NamedSelector],
    name: str,
) -> Isolation:
    """Pod labels for the canary `name` that neither the target's selector (`own`) nor
    any of `selectors` matches, or CanaryRefused naming the selectors that would."""
    everyone = [NamedSelector("the target's selector", own), *selectors]
    used = set().union(*(s.selector.keys for s in everyone))
    labels = {k: canary_value(v) if k in used else v for k, v in template_labels.items()}
    labels[CANARY_LABEL] = name
    # A new value still passes NotIn and Exists: drop the keys such a selector needs.
    # Dropping can only make more NotIn/DoesNotExist requirements pass, so this ends.
    for _ in range(len(labels)):
        droppable = {
            r.key
            for s in everyone
            if s.selector.matches(labels)
            for r in s.selector.requirements
            if r.operator in ("In", "Exists") and r.key in labels and r.key != CANARY_LABEL
        }
        if not droppable:
            break
        labels = {k: v for k, v in labels.items() if k not in droppable}
    still = [s for s in everyone if s.selector.matches(labels)]
    if still:
        raise CanaryRefused(
            "CanaryNotIsolated",
            f"no labels keep the canary {name} out of {_describe(still)}: "
            "a selector that is empty or made only of NotIn/DoesNotExist matches pods "
            "lacking its keys; narrow it with matchLabels or an In/Exists expression, "
            "or use strategy InPlace",
        )
    return Isolation(labels=labels, checked=tuple(s.owner for s in selectors))


def _describe(found: Iterable[NamedSelector]) -> str:
    parts = []
    for s in found:
        shown = "{} (every pod)" if s.selector.everything else s.selector.query()
        parts.append(f"{s.owner} selecting {shown}")
    return ", ".join(parts)


def canary_manifest(
    workload: Mapping[str, Any], owner: Mapping[str, Any], name: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """A one-replica clone of the target (same kind) with the isolated pod `labels`,
    selecting on the canary label alone. Owned by the InferenceService so it is
    garbage-collected with it even if the finalizer never runs. A StatefulSet canary
    keeps its volumeClaimTemplates (fresh claims of its own, deleted with it)."""
    kind = str(workload.get("kind", "Deployment"))
    meta = workload.get("metadata", {})
    spec = workload.get("spec", {})
    template = dict(spec.get("template", {}))
    template["metadata"] = {**(template.get("metadata") or {}), "labels": dict(labels)}
    canary_spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": {CANARY_LABEL: name}},
        "template": template,
    }
    if kind == "StatefulSet":
        canary_spec["serviceName"] = spec.get("serviceName", "")
        canary_spec["volumeClaimTemplates"] = [
            {k: v for k, v in claim.items() if k != "status"}
            for claim in spec.get("volumeClaimTemplates") or []
        ]
        canary_spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete",
            "whenScaled": "Delete",
        }
    else:
        # Recreate: a pod holding the only free GPU must go before its successor
        # can be scheduled, or every Env trial would wait forever.
        canary_spec["strategy"] = {"type": "Recreate"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace"),
            "labels": {CANARY_LABEL: name},
            "annotations": {
                k: v for k, v in (meta.get("annotations") or {}).items() if _kept_annotation(k)
            },
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": canary_spec,
    }
