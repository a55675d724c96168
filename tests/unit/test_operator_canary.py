"""The canary's identity and isolation, and label selectors, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.operator import canary, decisions, neighbours
from batchpilot.operator.selectors import (
    Selector,
    SelectorError,
    from_label_selector,
    from_map,
)

OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "uid": "u1"},
}


def workload(kind: str = "Deployment", selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": "resnet",
            "namespace": "ns",
            "annotations": {"deployment.kubernetes.io/revision": "3", "team": "ml"},
        },
        "spec": {
            "replicas": 3,
            "selector": selector or {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet", "tier": "gpu", "team": "ml"}},
                "spec": {"containers": [{"name": "server", "image": "y"}]},
            },
        },
    }


def label(owner: str, selector: dict[str, Any]) -> canary.NamedSelector:
    parsed = from_label_selector(selector)
    assert parsed is not None
    return canary.NamedSelector(owner, parsed)


def service(name: str, selector: dict[str, str]) -> canary.NamedSelector:
    parsed = from_map(selector)
    assert parsed is not None
    return canary.NamedSelector(f"Service/{name}", parsed)


def own(w: dict[str, Any]) -> Selector:
    parsed = from_label_selector(w["spec"]["selector"])
    assert parsed is not None
    return parsed


# --- identity ------------------------------------------------------------------------


def test_canary_names_are_unique_per_inference_service_and_fit_pod_names() -> None:
    a = canary.canary_name("resnet", "ns", "a", "uid-a")
    assert a.startswith("resnet-bp-")
    assert len(a) == len("resnet-bp-") + canary.HASH_CHARS
    assert a == canary.canary_name("resnet", "ns", "a", "uid-a")  # stable across restarts
    others = {
        canary.canary_name("resnet", "ns", "b", "uid-b"),  # a second one on the same target
        canary.canary_name("resnet", "ns", "a", "uid-a2"),  # recreated under the same name
        canary.canary_name("resnet", "ns2", "a", "uid-a"),
    }
    assert a not in others
    assert len(others) == 3
    # targets cut to the same long prefix still get canaries of their own
    long_a = canary.canary_name("x" * 80 + "a", "ns", "a", "1")
    long_b = canary.canary_name("x" * 80 + "b", "ns", "b", "2")
    assert long_a != long_b
    assert len(long_a) <= 63 - 17  # room for the ReplicaSet and pod suffixes
    assert not canary.canary_name("a-" * 30, "ns", "a", "1").startswith("-")


def test_only_an_object_owned_by_this_inference_service_is_adopted() -> None:
    mine = {"metadata": {"name": "c", "ownerReferences": [{"uid": "u1"}]}}
    canary.check_adoptable(mine, OWNER)
    for foreign in (
        {"kind": "Deployment", "metadata": {"name": "c", "ownerReferences": [{"uid": "u2"}]}},
        {"kind": "Deployment", "metadata": {"name": "c"}},
    ):
        with pytest.raises(canary.CanaryRefused) as caught:
            canary.check_adoptable(foreign, OWNER)
        assert caught.value.reason == "CanaryNotOwned"
        assert "not owned by InferenceService resnet" in caught.value.message


# --- isolation -----------------------------------------------------------------------


def test_a_service_on_a_label_outside_the_workload_selector_does_not_select_the_canary() -> None:
    w = workload()
    selectors = [service("web", {"tier": "gpu"}), service("all", {"app": "resnet"})]
    isolation = canary.isolate(w["spec"]["template"]["metadata"]["labels"], own(w), selectors, "c1")
    labels = isolation.labels
    assert not any(s.selector.matches(labels) for s in selectors)
    assert not own(w).matches(labels)
    assert labels["tier"] != "gpu"
    assert labels["app"] != "resnet"
    assert labels["team"] == "ml"  # a label no selector uses is kept as it is
    assert labels[canary.CANARY_LABEL] == "c1"
    assert isolation.checked == ("Service/web", "Service/all")


def test_match_expressions_that_a_new_value_passes_lose_their_key() -> None:
    w = workload()
    selectors = [
        label(
            "PodDisruptionBudget/gpu", {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
        ),
        label(
            "PodMonitor/not-batch",
            {
                "matchExpressions": [
                    {"key": "app", "operator": "NotIn", "values": ["batch"]},
                    {"key": "team", "operator": "In", "values": ["ml", "ml-bp-canary"]},
                ]
            },
        ),
    ]
    labels = canary.isolate(
        w["spec"]["template"]["metadata"]["labels"], own(w), selectors, "c1"
    ).labels
    assert "tier" not in labels
    assert "team" not in labels
    assert not any(s.selector.matches(labels) for s in selectors)


def test_selectors_that_match_every_pod_refuse_the_canary_with_their_names() -> None:
    w = workload()
    templates = w["spec"]["template"]["metadata"]["labels"]
    for selector in (
        label("PodDisruptionBudget/everything", {}),
        label(
            "PodMonitor/absent",
            {"matchExpressions": [{"key": "batch", "operator": "DoesNotExist"}]},
        ),
    ):
        with pytest.raises(canary.CanaryRefused) as caught:
            canary.isolate(templates, own(w), [selector], "c1")
        assert caught.value.reason == "CanaryNotIsolated"
        assert selector.owner in caught.value.message


def test_the_canary_selects_its_own_pods_only_and_keeps_the_template() -> None:
    w = workload()
    labels = {"app": "x", canary.CANARY_LABEL: "c1"}
    body = canary.canary_manifest(w, OWNER, "c1", labels)
    assert body["kind"] == "Deployment"
    assert body["spec"]["selector"] == {"matchLabels": {canary.CANARY_LABEL: "c1"}}
    assert body["spec"]["template"]["metadata"]["labels"] == labels
    assert body["spec"]["template"]["spec"] == w["spec"]["template"]["spec"]
    assert body["spec"]["replicas"] == 1
    assert body["spec"]["strategy"] == {"type": "Recreate"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["metadata"]["annotations"] == {"team": "ml"}


def test_the_canary_drops_what_says_who_manages_or_scrapes_the_target() -> None:
    w = workload()
    w["metadata"]["annotations"] = {
        "team": "ml",
        "argocd.argoproj.io/tracking-id": "shop:apps/Deployment:prod/resnet",
        "kustomize.toolkit.fluxcd.io/name": "apps",
        "meta.helm.sh/release-name": "resnet",
        "prometheus.io/scrape": "true",
    }
    w["spec"]["template"].setdefault("metadata", {})["annotations"] = {
        "prometheus.io/scrape": "true"
    }
    body = canary.canary_manifest(w, OWNER, "c1", {canary.CANARY_LABEL: "c1"})
    assert body["metadata"]["annotations"] == {"team": "ml"}
    # the pods keep theirs: a Prometheus source measuring the canary needs them scraped
    assert body["spec"]["template"]["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}


def test_a_statefulset_canary_keeps_its_claims_and_deletes_them_with_it() -> None:
    w = workload("StatefulSet")
    claim = {
        "metadata": {"name": "cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    }
    w["spec"]["volumeClaimTemplates"] = [claim]
    w["spec"]["serviceName"] = "resnet-headless"
    body = canary.canary_manifest(w, OWNER, "c1", {canary.CANARY_LABEL: "c1"})
    assert body["kind"] == "StatefulSet"
    assert body["spec"]["volumeClaimTemplates"] == [
        {"metadata": claim["metadata"], "spec": claim["spec"]}
    ]
    assert body["spec"]["serviceName"] == "resnet-headless"
    assert body["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert "strategy" not in body["spec"]


# --- selectors -----------------------------------------------------------------------


def test_selectors_follow_the_api_servers_rules() -> None:
    assert from_map({}) is None
    assert from_map(None) is None
    assert from_label_selector(None) is None  # a PDB without: nothing
    everything = from_label_selector({})
    assert everything is not None
    assert everything.everything
    assert everything.matches({})
    expressions = from_label_selector(
        {
            "matchLabels": {"app": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
                {"key": "track", "operator": "NotIn", "values": ["canary"]},
                {"key": "zone", "operator": "Exists"},
                {"key": "debug", "operator": "DoesNotExist"},
            ],
        }
    )
    assert expressions is not None
    assert expressions.query() == ("app=a,tier in (gpu,cpu),track notin (canary),zone,!debug")
    assert expressions.matches({"app": "a", "tier": "gpu", "zone": "z"})
    assert not expressions.matches({"app": "a", "tier": "gpu", "zone": "z", "debug": "1"})
    assert not expressions.matches({"app": "a", "tier": "gpu", "zone": "z", "track": "canary"})
    with pytest.raises(SelectorError):
        everything.query()
    with pytest.raises(SelectorError, match="operator must be one of"):
        from_label_selector({"matchExpressions": [{"key": "a", "operator": "Gt"}]})


def test_a_workload_selecting_by_expressions_only_never_lists_every_pod() -> None:
    w = workload(
        selector={"matchExpressions": [{"key": "app", "operator": "In", "values": ["resnet"]}]}
    )
    assert decisions.label_selector(w) == "app=resnet"
    assert decisions.label_selector(workload()) == "app=resnet"
    w["spec"]["selector"] = {}
    with pytest.raises(SelectorError):
        decisions.label_selector(w)


# --- one tuner per target ------------------------------------------------------------


def isvc(
    name: str, created: str, target: str = "resnet", kind: str | None = None
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": target}
    if kind is not None:
        ref["kind"] = kind
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {"target": ref},
    }


def test_the_oldest_inference_service_on_a_target_is_its_first_claimant() -> None:
    items = [
        isvc("late", "2026-01-02T00:00:00Z"),
        isvc("b-tie", "2026-01-01T00:00:00Z"),
        isvc("a-tie", "2026-01-01T00:00:00Z", kind="Deployment"),
        isvc("other", "2025-01-01T00:00:00Z", target="other"),
        isvc("sts", "2025-01-01T00:00:00Z", kind="StatefulSet"),
    ]
    names = [i["metadata"]["name"] for i in neighbours.claimants(items, "Deployment", "resnet")]
    assert names == ["a-tie", "b-tie", "late"]
