"""Reading an InferenceService the way a user does, through kubectl, and waiting on it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .kubectl import Kubectl

Resource = dict[str, Any]


class StudyTimeout(AssertionError):
    pass


def get_isvc(kubectl: Kubectl, namespace: str, name: str) -> Resource:
    resource: Resource = kubectl.json("get", "inferenceservice", name, "-n", namespace)
    return resource


def status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = get_isvc(kubectl, namespace, name).get("status") or {}
    return result


def trials(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = status(kubectl, namespace, name).get("trials") or []
    return found


def wait_for(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    what: str,
    timeout_s: float,
    diagnostics: Callable[[], str] = lambda: "",
) -> dict[str, Any]:
    """Poll the resource's status until `predicate(status)` holds; the status then."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = status(kubectl, namespace, name)
        if predicate(last):
            return last
        time.sleep(0.5)
    raise StudyTimeout(
        f"{namespace}/{name}: not {what} within {timeout_s:g} s; last status: {last}\n"
        f"{diagnostics()}"
    )


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s.get("phase") in phases


def events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl.json(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind=InferenceService",
    )["items"]
    return found


def numbers(found: list[dict[str, Any]]) -> list[int]:
    return [int(t["number"]) for t in found]
