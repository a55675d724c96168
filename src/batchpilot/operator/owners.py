"""The owner reference every object a study creates carries: the InferenceService as its
controller, so Kubernetes' garbage collector removes the object with it, and the
admission policies (manifests/admission) know the object as the study's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
