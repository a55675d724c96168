"""Render the InferenceService CRD from the typed models, so the schema the API server
enforces and the one the operator validates against are the same.

    python -m batchpilot.operator.crd > crds/inferenceservices.batchpilot.dev.yaml

A test fails when the committed file and this output differ. The CRD reference page is
rendered from that file in turn: `python -m batchpilot.operator.crdref >
docs/operator/crd-reference.md` (batchpilot.operator.crdref).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel

from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import InferenceServiceStatus

GROUP = "batchpilot.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
# KServe already registers the short name `isvc` for its own InferenceService kind;
# a second `isvc` would make `kubectl get isvc` ambiguous where both are installed.
SHORT_NAMES = ("bpisvc",)
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"

Schema = dict[str, Any]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
    {
        "name": "SLA-p99-ms",
        "type": "number",
        "jsonPath": ".spec.sla.p99LatencyMs",
        "description": "p99 latency SLA, ms",
    },
    {
        "name": "Best-batch",
        "type": "integer",
        "jsonPath": ".status.best.maxBatchSize",
        "description": "max_batch_size of the best configuration",
    },
    {
        "name": "Best-wait-ms",
        "type": "number",
        "jsonPath": ".status.best.maxQueueTimeMs",
        "description": "max_queue_time_ms of the best configuration",
    },
    {
        "name": "Req/s",
        "type": "number",
        "jsonPath": ".status.best.effectiveRps",
        "description": "effective throughput of the best configuration, all measured pods "
        "together (the Rate-scope column of -o wide)",
    },
    {
        "name": "Trials",
        "type": "string",
        "jsonPath": ".status.trialsProgress",
        "description": "finished trials / tuning.maxTrials",
    },
    {
        "name": "Gain-%",
        "type": "number",
        "jsonPath": ".status.gainPercent",
        "description": "gain of the best over the baseline (the confirmation's when it ran)",
    },
    {
        "name": "Gain-low-%",
        "type": "number",
        "jsonPath": ".status.best.gainLowPercent",
        "description": "lower bound of that gain (written back only when >= minGainPercent)",
    },
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide only
    {
        "name": "Rate-scope",
        "type": "string",
        "jsonPath": ".status.rateScope",
        "description": "what Req/s covers: one pod, or the fleet of measured pods together",
        "priority": 1,
    },
    {
        "name": "Pods",
        "type": "integer",
        "jsonPath": ".status.measuredPods",
        "description": "ready pods the latest trial's load was spread over",
        "priority": 1,
    },
    {
        "name": "SLA-TTFT-ms",
        "type": "number",
        "jsonPath": ".spec.sla.ttftP99Ms",
        "description": "time-to-first-token p99 SLA, ms (a token-stream SLA)",
        "priority": 1,
    },
    {
        "name": "SLA-TPOT-ms",
        "type": "number",
        "jsonPath": ".spec.sla.tpotP99Ms",
        "description": "time-per-output-token p99 SLA, ms (a token-stream SLA)",
        "priority": 1,
    },
    {
        "name": "Max-rps/pod",
        "type": "number",
        "jsonPath": ".spec.load.maxRps",
        "description": "load budget per pod (load.maxRps)",
        "priority": 1,
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "priority": 1,
    },
]

_DROPPED_KEYS = ("title", "additionalProperties", "$defs")


def _resolve(node: Any, defs: dict[str, Schema]) -> Any:
    """Inline `$ref`s: structural schemas in a CRD cannot refer to definitions."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return merged
    return {key: _resolve(value, defs) for key, value in node.items()}


def _structural(node: Schema, *, default_sections: bool = True) -> Schema:
    """Turn pydantic's JSON Schema into the OpenAPI v3 subset a CRD accepts."""
    schema = dict(node)
    variants = schema.pop("anyOf", None)
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        nullable = len(non_null) < len(variants)
        types = {v.get("type") for v in non_null}
        if types <= {"number", "integer"} and len(non_null) > 1:
            chosen: Schema = {"type": "number"}  # `float | int`: a number either way
        elif len(non_null) == 1:
            chosen = dict(non_null[0])
        else:
            raise ValueError(f"cannot express a union in a structural schema: {variants}")
        schema = {**chosen, **schema}
        if nullable and schema.get("default", 0) is None:
            schema.pop("default")
        elif nullable:
            schema["nullable"] = True
    for key in _DROPPED_KEYS:
        if key == "additionalProperties" and isinstance(schema.get(key), dict):
            schema[key] = _structural(schema[key], default_sections=default_sections)
            continue
        schema.pop(key, None)
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(schema.get(bound), int | float) and not isinstance(schema[bound], bool):
            schema[flag] = schema.pop(bound)
            schema[bound] = True
    if "items" in schema:
        schema["items"] = _structural(schema["items"], default_sections=default_sections)
    properties = schema.get("properties")
    if properties is not None:
        required = set(schema.get("required", []))
        converted = {}
        for name, prop in properties.items():
            prop = _structural(prop, default_sections=default_sections)
            if (
                default_sections
                and name not in required
                and prop.get("type") == "object"
                and "properties" in prop
                and "default" not in prop
                and not prop.get("required")
            ):
                # An omitted section is defaulted as a whole, so `kubectl get -o yaml`
                # shows what is in force. The API server checks a default against the
                # section's CEL rules before filling in nested defaults, so the default
                # spells them out instead of being `{}`.
                prop["default"] = {
                    key: child["default"]
                    for key, child in prop["properties"].items()
                    if "default" in child
                }
            converted[name] = prop
        schema["properties"] = converted
    return schema


def model_schema(model: type[BaseModel], *, default_sections: bool = True) -> Schema:
    raw = model.model_json_schema(by_alias=True)
    return _structural(_resolve(raw, raw.get("$defs", {})), default_sections=default_sections)


def status_schema() -> Schema:
    # Status sections stay absent until the operator writes them.
    schema = model_schema(InferenceServiceStatus, default_sections=False)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def crd() -> Schema:
    spec = model_schema(InferenceServiceSpec)
    status = status_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["batchpilot"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An InferenceService asks BatchPilot to find and "
                            "keep the dynamic-batching settings of a model server that give "
                            "the most effective throughput within a p99 latency SLA.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = (
        "# Generated by `python -m batchpilot.operator.crd` from the models in\n"
        "# batchpilot.operator.spec and batchpilot.operator.status. Do not edit by hand.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
