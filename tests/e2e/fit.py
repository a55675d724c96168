"""The scheduler's resource fit, for the e2e node agent: whether a pod's requests fit
what the node has left, and the message kube-scheduler gives when they do not.

Only what the tests need: requests of the pods' containers (limits stand in for an
unset request, as the API server defaults them) against the node's allocatable."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}

_SUFFIXES = {
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
}
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")


def quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity ("500m", "8", "1Gi") as a number."""
    match = _QUANTITY.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a quantity this node agent understands: {value!r}")
    return Fraction(match.group(1)) * _SUFFIXES[match.group(2)]


def requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """What a pod asks of its node: its containers' requests summed, one pod slot."""
    total: dict[str, Fraction] = {"pods": Fraction(1)}
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            total[name] = total.get(name, Fraction(0)) + quantity(value)
    return total


def add(used: dict[str, Fraction], pod: Mapping[str, Any]) -> None:
    for name, amount in requests(pod).items():
        used[name] = used.get(name, Fraction(0)) + amount


def in_use(pods: Iterable[Mapping[str, Any]], node: str) -> dict[str, Fraction]:
    """What the pods bound to `node` hold; like kube-scheduler, a terminating pod holds
    its resources until it is gone."""
    used: dict[str, Fraction] = {}
    for pod in pods:
        if pod.get("spec", {}).get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        add(used, pod)
    return used


def shortfall(pod: Mapping[str, Any], used: Mapping[str, Fraction]) -> str | None:
    """kube-scheduler's message when `pod` does not fit beside `used`; None if it fits."""
    short = [
        name
        for name, amount in sorted(requests(pod).items())
        if amount and used.get(name, Fraction(0)) + amount > quantity(NODE_CAPACITY.get(name, "0"))
    ]
    if not short:
        return None
    reasons = ", ".join(f"1 Insufficient {name}" for name in short)
    return f"0/1 nodes are available: {reasons}. preemption: not eligible."
