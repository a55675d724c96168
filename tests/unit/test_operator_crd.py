"""The committed CRD is exactly what the models render, and it carries what
`kubectl` needs: printer columns, status subresource, CEL rules, defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from batchpilot.operator import crd
from batchpilot.operator.spec import MAX_CONFIRM_ROUNDS_LIMIT, MAX_FINALISTS
from batchpilot.operator.status import Confirmation

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / crd.CRD_FILE


def _version() -> dict[str, Any]:
    document = yaml.safe_load(CRD_PATH.read_text())
    versions: list[dict[str, Any]] = document["spec"]["versions"]
    assert len(versions) == 1
    return versions[0]


def _walk(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(_walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_walk(value))
    return found


def test_committed_crd_matches_the_models() -> None:
    assert CRD_PATH.read_text() == crd.render(), (
        "crds/ is stale: run `python -m batchpilot.operator.crd > crds/" + crd.CRD_FILE + "`"
    )


def test_schema_is_structural() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node
        assert "anyOf" not in node
        assert "title" not in node
        assert node.get("additionalProperties") is not False


def test_names_status_and_columns() -> None:
    document = yaml.safe_load(CRD_PATH.read_text())
    names = document["spec"]["names"]
    assert document["metadata"]["name"] == "inferenceservices.batchpilot.dev"
    assert names["kind"] == "InferenceService"
    assert "isvc" not in names["shortNames"]
    version = _version()
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Target": ".spec.target.name",
        "SLA-p99-ms": ".spec.sla.p99LatencyMs",
        "Best-batch": ".status.best.maxBatchSize",
        "Best-wait-ms": ".status.best.maxQueueTimeMs",
        "Req/s": ".status.best.effectiveRps",
        "Trials": ".status.trialsProgress",
        "Gain-%": ".status.gainPercent",
        "Gain-low-%": ".status.best.gainLowPercent",
        "Phase": ".status.phase",
        "Age": ".metadata.creationTimestamp",
        "Rate-scope": ".status.rateScope",
        "Pods": ".status.measuredPods",
        "SLA-TTFT-ms": ".spec.sla.ttftP99Ms",
        "SLA-TPOT-ms": ".spec.sla.tpotP99Ms",
        "Max-rps/pod": ".spec.load.maxRps",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
    }
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")}
    # kubectl get -o wide
    assert wide == {"Rate-scope", "Pods", "SLA-TTFT-ms", "SLA-TPOT-ms", "Max-rps/pod", "Ready"}


def test_spec_has_cel_rules_defaults_and_enums() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert set(spec["required"]) == {"target", "sla", "load"}
    rules = {r["rule"] for node in _walk(spec) for r in node.get("x-kubernetes-validations", [])}
    assert "self.min <= self.max" in rules
    assert "!has(self.p99LatencyMs) || self.p99LatencyMs > 0.0" in rules
    assert "has(self.p99LatencyMs) || has(self.ttftP99Ms) || has(self.tpotP99Ms)" in rules
    # apply.live is needed for the reference server only: the rule sits on the spec
    assert (
        "self.apply.method != 'Live' || !(!has(self.runtime) || self.runtime.kind == "
        "'Reference') || has(self.apply.live)"
    ) in rules
    assert "self.source != 'prometheus' || has(self.prometheus)" in rules
    assert "self.maxConfirmRounds >= self.confirmRounds" in rules
    assert props["tuning"]["default"]["maxConfirmRounds"] == 6
    assert props["tuning"]["properties"]["strategy"]["enum"] == ["Canary", "InPlace"]
    assert props["tuning"]["properties"]["writeBack"]["default"] == "Apply"
    # defaults of sections spell out their fields: the API server evaluates a section's
    # CEL rules against its default before nested defaults apply
    assert props["apply"]["default"]["method"] == "Env"
    assert props["runtime"]["default"] == {"kind": "Reference"}
    assert props["load"]["properties"]["endpoint"]["required"] == ["port"]
    assert props["parameters"]["properties"]["maxBatchSize"]["default"] == {"min": 1, "max": 64}
    assert props["parameters"]["default"]["maxQueueTimeMs"] == {"min": 0.0, "max": 100.0}
    for node in _walk(spec):
        for name, child in node.get("properties", {}).items():
            assert child.get("description"), f"{name} has no description for kubectl explain"
        if node.get("type") == "array":
            assert "maxItems" in node  # CEL cost estimation needs bounded lists


def test_status_sections_are_not_defaulted() -> None:
    status = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    for name in ("original", "baseline", "best", "trialsSummary"):
        assert "default" not in status["properties"][name]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_every_status_list_has_a_cap() -> None:
    # the API server refuses a status over its caps instead of storing an object that
    # grows with every trial or round until etcd's object limit breaks every write
    status = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    uncapped = [node for node in _walk(status) if node.get("type") == "array"]
    uncapped = [node.get("description", "?") for node in uncapped if "maxItems" not in node]
    assert uncapped == []


def test_the_largest_confirmation_fits_its_cap() -> None:
    finalists = [{"maxBatchSize": b, "maxQueueTimeMs": 1.0} for b in range(MAX_FINALISTS)]
    measurements = [
        {"round": r, "params": p, "effectiveRps": 1.0}
        for r in range(MAX_CONFIRM_ROUNDS_LIMIT)
        for p in [*finalists, {"maxBatchSize": 99, "maxQueueTimeMs": 1.0}]
    ]
    largest = {
        "reason": "trials done",
        "finalists": finalists,
        "incumbent": {"maxBatchSize": 99, "maxQueueTimeMs": 1.0},
        "rounds": 3,
        "maxRounds": MAX_CONFIRM_ROUNDS_LIMIT,
        "measurements": measurements,
    }
    Confirmation.model_validate(largest)
    caps = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    schema = caps["confirmation"]["properties"]
    assert len(finalists) == schema["finalists"]["maxItems"]
    assert len(measurements) == schema["measurements"]["maxItems"]
