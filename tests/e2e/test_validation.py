"""Scenario e: invalid InferenceServices are rejected by `kubectl apply` with the
CRD's own messages: every CEL rule, unknown enum values, a negative SLA."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import Cluster

pytestmark = pytest.mark.e2e

Manifest = dict[str, Any]

VALID: Manifest = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "invalid"},
    "spec": {
        "target": {"kind": "Deployment", "name": "server"},
        "sla": {"p99LatencyMs": 300},
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
    },
}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def crd_schema(crd_dir: Path) -> dict[str, Any]:
    crd = yaml.safe_load((crd_dir / "inferenceservices.batchpilot.dev.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def cel_messages(schema: dict[str, Any]) -> list[str]:
    return [
        rule["message"]
        for node in _walk(schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]


def enum_values(schema: dict[str, Any], *path: str) -> list[str]:
    node = schema["properties"]["spec"]
    for key in path:
        node = node["properties"][key]
    values: list[str] = node["enum"]
    return values


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[dict[str, Any]], None]
    cel_key: str | None = None  # a phrase that singles out the CRD's CEL message
    expect: str | None = None  # or a literal phrase from the schema check


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _both(*mutations: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(spec)

    return mutate


def _extra(*params: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return _set("parameters.extra", list(params))


KSERVE_TARGET = {
    "apiVersion": "serving.kserve.io/v1beta1",
    "kind": "InferenceService",
    "name": "server",
}
RAY_TARGET = {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "server"}

CEL_CASES = [
    Case("negative p99", _set("sla.p99LatencyMs", -5), cel_key="p99LatencyMs must be"),
    Case("error rate of 1.5", _set("sla.maxErrorRate", 1.5), cel_key="maxErrorRate is a"),
    Case(
        "batch min above max",
        _set("parameters.maxBatchSize", {"min": 32, "max": 4}),
        cel_key="maxBatchSize.min",
    ),
    Case(
        "queue-time min above max",
        _set("parameters.maxQueueTimeMs", {"min": 50, "max": 10}),
        cel_key="maxQueueTimeMs.min",
    ),
    Case(
        "extra min above max",
        _extra({"name": "max_num_seqs", "min": 9, "max": 3, "env": "SEQS"}),
        cel_key="extra parameter's min",
    ),
    Case(
        "log scale from zero",
        _extra({"name": "max_num_seqs", "min": 0, "max": 3, "log": True, "env": "SEQS"}),
        cel_key="log-scaled",
    ),
    Case(
        "fractional int bounds",
        _extra({"name": "max_num_seqs", "kind": "int", "min": 1.5, "max": 3, "env": "SEQS"}),
        cel_key="whole-number",
    ),
    Case(
        "core knob as extra",
        _extra({"name": "max_batch_size", "min": 1, "max": 3, "env": "SEQS"}),
        cel_key="are set under parameters",
    ),
    Case(
        "duplicate extras",
        _extra(
            {"name": "max_num_seqs", "min": 1, "max": 3, "env": "A"},
            {"name": "max_num_seqs", "min": 1, "max": 4, "env": "B"},
        ),
        cel_key="names must be unique",
    ),
    Case(
        "Live without endpoint",
        _set("apply.method", "Live"),
        cel_key="is required when apply.method is Live",
    ),
    Case(
        "runtime without model",
        _set("runtime", {"kind": "Triton"}),
        cel_key="runtime.model is required",
    ),
    Case(
        "Ray dashboard port on Triton",
        _set("runtime", {"kind": "Triton", "model": "m", "managementPort": 8265}),
        cel_key="managementPort (the Ray dashboard",
    ),
    Case(
        "Triton metrics port on Ray",
        _set("runtime", {"kind": "RayServe", "model": "app", "metricsPort": 8002}),
        cel_key="metricsPort (Triton's",
    ),
    Case(
        "apply.live with a runtime",
        _both(
            _set("runtime", {"kind": "Triton", "model": "m"}),
            _set("apply", {"method": "Live", "live": {"port": 8000, "path": "/admin"}}),
        ),
        cel_key="apply.live is for runtime.kind Reference only",
    ),
    Case(
        "vLLM live",
        _both(_set("runtime", {"kind": "VLLM", "model": "m"}), _set("apply.method", "Live")),
        cel_key="are tuned by rollout",
    ),
    Case(
        "extras with a runtime's Live",
        _both(
            _set("runtime", {"kind": "Triton", "model": "m"}),
            _set("apply.method", "Live"),
            _extra({"name": "instances", "min": 1, "max": 2}),
        ),
        cel_key="a runtime's live control sets",
    ),
    Case(
        "reference without load path",
        _set("load.endpoint", {"port": 8080}),
        cel_key="load.endpoint.path is required",
    ),
    Case(
        "Prometheus URL scheme",
        _set("load.prometheus", {"url": "ftp://prometheus:9090"}),
        cel_key="url must start with",
    ),
    Case("Prometheus without URL", _set("load.source", "prometheus"), cel_key="(url) is required"),
    Case(
        "Prometheus URL fragment",
        _set("load.prometheus", {"url": "http://prometheus:9090/#/graph"}),
        cel_key="must not contain '#'",
    ),
    Case(
        "Prometheus CA bundle over http",
        _set(
            "load.prometheus",
            {"url": "http://prometheus:9090", "caBundle": "-----BEGIN CERTIFICATE-----"},
        ),
        cel_key="caBundle applies to https://",
    ),
    Case(
        "load CA bundle over http",
        _set("load.endpoint.caBundle", "-----BEGIN CERTIFICATE-----"),
        cel_key="load.endpoint.caBundle applies to scheme https",
    ),
    Case(
        "load server name over http",
        _set("load.endpoint.serverName", "model.serving.svc"),
        cel_key="load.endpoint.serverName applies to scheme https",
    ),
    Case(
        "https load with Live admin on the same port",
        _both(
            _set("load.endpoint.scheme", "https"),
            _set("apply", {"method": "Live", "live": {"port": 8080, "path": "/admin"}}),
        ),
        cel_key="load.endpoint.scheme https takes apply.method Env",
    ),
    Case(
        "Prometheus pod label not a label name",
        _set("load.prometheus", {"url": "http://prometheus:9090", "podLabel": "pod-name"}),
        cel_key="podLabel must be a Prometheus label name",
    ),
    Case(
        "MMPP fields on Poisson",
        _set("load.arrival", {"process": "Poisson", "burstFactor": 3}),
        cel_key="apply to process MMPP only",
    ),
    Case(
        "Trace without timestamps",
        _set("load.arrival", {"process": "Trace"}),
        cel_key="timestamps is required for process Trace",
    ),
    Case(
        "confirmation cap below its rounds",
        _both(_set("tuning.confirmRounds", 5), _set("tuning.maxConfirmRounds", 4)),
        cel_key="maxConfirmRounds must be greater than or equal",
    ),
    Case(
        "target kind without its apiVersion",
        _set("target.kind", "RayService"),
        cel_key="target.apiVersion and target.kind must be one of",
    ),
    Case(
        "container of a RayService",
        _set("target", {**RAY_TARGET, "container": "ray-head"}),
        cel_key="target.container does not apply to a RayService",
    ),
    Case(
        "serveDeployment of a Deployment",
        _set("target.serveDeployment", "app"),
        cel_key="serveDeployment applies to a RayService target only",
    ),
    Case(
        "KServe parent with a canary",
        _set("target", KSERVE_TARGET),
        cel_key="needs tuning.strategy InPlace",
    ),
    Case(
        "RayService with Env",
        _both(_set("target", RAY_TARGET), _set("tuning.strategy", "InPlace")),
        cel_key="a RayService target needs apply.method Live",
    ),
    Case(
        "InPlace without a load budget",
        _set("tuning.strategy", "InPlace"),
        cel_key="load.maxRps (the load budget per pod",
    ),
    Case(
        "load-worker toleration Exists with a value",
        _set("load.workers", {"max": 2, "tolerations": [{"operator": "Exists", "value": "x"}]}),
        cel_key="operator Exists takes no value",
    ),
    Case(
        "Env extra without variable",
        _extra({"name": "max_num_seqs", "min": 1, "max": 3}),
        cel_key="needs env",
    ),
]

# the SLA's bounds and the token-stream load they need
VLLM_STREAMS = _both(
    _set("runtime", {"kind": "VLLM", "model": "m"}), _set("load.protocol", "OpenAIStream")
)
CEL_CASES += [
    Case(
        "SLA without a bound",
        _set("sla", {"maxErrorRate": 0.01}),
        cel_key="sla needs p99LatencyMs, ttftP99Ms or tpotP99Ms",
    ),
    Case(
        "negative TTFT target",
        _both(VLLM_STREAMS, _set("sla.ttftP99Ms", -5)),
        cel_key="sla.ttftP99Ms must be",
    ),
    Case(
        "negative TPOT target",
        _both(VLLM_STREAMS, _set("sla.tpotP99Ms", -5)),
        cel_key="sla.tpotP99Ms must be",
    ),
    Case(
        "TTFT target on the runtime's requests",
        _set("sla.ttftP99Ms", 200),
        cel_key="are judged on token streams",
    ),
    Case(
        "prompt lengths on the runtime's requests",
        _set("load.promptTokens", "fixed:8"),
        cel_key="load.promptTokens and load.outputTokens apply to",
    ),
    Case(
        "token streams without a model",
        _set("load.protocol", "OpenAIStream"),
        cel_key="send a model name",
    ),
]

# load.request: each field with the protocols it belongs to (the command line's rules)
CEL_CASES += [
    Case(
        "a model for the runtime's own requests",
        _set("load.request", {"model": "m"}),
        cel_key="load.request.model applies to",
    ),
    Case(
        "an input name for a template",
        _both(
            _set("load.protocol", "Template"),
            _set("load.request", {"bodyTemplate": "{}", "inputName": "x"}),
        ),
        cel_key="load.request.inputName applies to",
    ),
    Case(
        "features for OpenAI requests",
        _both(
            _set("load.protocol", "OpenAI"),
            _set("load.request", {"model": "m", "features": 4}),
        ),
        cel_key="load.request.features applies to",
    ),
    Case(
        "max tokens for v2 requests",
        _both(_set("load.protocol", "V2"), _set("load.request", {"model": "m", "maxTokens": 8})),
        cel_key="load.request.maxTokens applies to",
    ),
    Case(
        "a body template for v2 requests",
        _both(
            _set("load.protocol", "V2"),
            _set("load.request", {"model": "m", "bodyTemplate": "{}"}),
        ),
        cel_key="load.request.bodyTemplate applies to",
    ),
    Case(
        "a template protocol without its body",
        _set("load.protocol", "Template"),
        cel_key="load.protocol Template needs load.request.bodyTemplate",
    ),
]

# tuning.window, tuning.retune and its window (the scheduling rules)
CEL_CASES += [
    Case(
        "window start of four fields",
        _set("tuning.window", {"start": "0 2 * *", "durationMinutes": 60}),
        cel_key="tuning.window.start is a 5-field cron",
    ),
    Case(
        "window shorter than a trial",
        _set("tuning.window", {"start": "0 2 * * *", "durationMinutes": 10}),
        cel_key="durationMinutes must cover tuning.trialDeadlineSeconds",
    ),
    Case("retune Sometimes", _set("tuning.retune", "Sometimes"), cel_key="retune is Never"),
    Case(
        "retuneWindow in days",
        _set("tuning.retuneWindow", "2d"),
        cel_key="tuning.retuneWindow is a number",
    ),
    Case(
        "OnSLABreach without Prometheus",
        _set("tuning.retune", "OnSLABreach"),
        cel_key="OnSLABreach needs load.source prometheus",
    ),
    Case(
        "OnSLABreach on a TTFT target Prometheus cannot read",
        _both(
            VLLM_STREAMS,
            _set("sla", {"ttftP99Ms": 200}),
            _set("load.source", "prometheus"),
            # vLLM's own names replaced by the reference server's way: no TTFT histogram
            _set("load.prometheus", {"url": "http://prometheus:9090", "latencyMetric": "g"}),
            _set("tuning.retune", "OnSLABreach"),
        ),
        cel_key="reads production's TTFT and TPOT from the server's own histograms",
    ),
]

ENUM_CASES = [
    ("target", "apiVersion"),
    ("target", "kind"),
    ("runtime", "kind"),
    ("apply", "method"),
    ("load", "source"),
    ("load", "protocol"),
    ("tuning", "strategy"),
    ("tuning", "sampler"),
    ("tuning", "writeBack"),
]

# (field under spec, a value out of range, the schema's message for it)
BOUND_CASES = [
    (
        "tuning.scheduleTimeoutSeconds",
        2,
        "spec.tuning.scheduleTimeoutSeconds in body should be greater than or equal to 5",
    ),
    (
        "tuning.verifySeconds",
        -1,
        "spec.tuning.verifySeconds in body should be greater than or equal to 0",
    ),
    (
        "tuning.verifySeconds",
        86401,
        "spec.tuning.verifySeconds in body should be less than or equal to 86400",
    ),
    (
        "load.workers.max",
        65,
        "spec.load.workers.max in body should be less than or equal to 64",
    ),
]


def _apply(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> tuple[int, str]:
    manifest = copy.deepcopy(VALID)
    manifest["spec"] = spec
    result = cluster.kubectl.run(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    return result.returncode, result.stderr


def test_invalid_resources_rejected_with_crd_messages(
    cluster: Cluster, crds: Path, namespace: str
) -> None:
    schema = crd_schema(crds)
    messages = cel_messages(schema)
    problems: list[str] = []

    # The table must name every CEL rule of the CRD: a new rule needs a new case here.
    for message in messages:
        if not any(case.cel_key and case.cel_key in message for case in CEL_CASES):
            problems.append(f"no case breaks the CEL rule with message {message!r}")

    for case in CEL_CASES:
        assert case.cel_key is not None
        matching = [m for m in messages if case.cel_key in m]
        if len(matching) != 1:
            problems.append(f"{case.name}: {case.cel_key!r} matches CRD messages {matching}")
            continue
        spec = copy.deepcopy(VALID["spec"])
        case.mutate(spec)
        code, stderr = _apply(cluster, namespace, spec)
        if code == 0:
            problems.append(f"{case.name}: accepted by kubectl apply")
        elif matching[0] not in " ".join(stderr.split()):
            problems.append(f"{case.name}: expected {matching[0]!r}, kubectl said: {stderr}")

    for section, field in ENUM_CASES:
        spec = copy.deepcopy(VALID["spec"])
        _set(f"{section}.{field}", "Bogus")(spec)
        code, stderr = _apply(cluster, namespace, spec)
        allowed = ", ".join(f'"{v}"' for v in enum_values(schema, section, field))
        expected = f'Unsupported value: "Bogus": supported values: {allowed}'
        if code == 0:
            problems.append(f"{section}.{field}=Bogus: accepted by kubectl apply")
        elif expected not in stderr:
            problems.append(f"{section}.{field}: expected {expected!r}, kubectl said: {stderr}")

    # A negative SLA also breaks the schema's own bound, reported with the field's path.
    code, stderr = _apply(
        cluster, namespace, {**copy.deepcopy(VALID["spec"]), "sla": {"p99LatencyMs": -300}}
    )
    if code == 0 or "spec.sla.p99LatencyMs in body should be greater than 0" not in stderr:
        problems.append(f"negative p99: kubectl said: {stderr}")

    for path, value, expected in BOUND_CASES:
        spec = copy.deepcopy(VALID["spec"])
        _set(path, value)(spec)
        code, stderr = _apply(cluster, namespace, spec)
        if code == 0 or expected not in stderr:
            problems.append(f"{path}={value}: expected {expected!r}, kubectl said: {stderr}")

    # Nothing invalid was stored, and the valid base is accepted.
    listed = cluster.kubectl("get", "inferenceservices", "-n", namespace, "-o", "name")
    if listed.strip():
        problems.append(f"invalid objects were stored: {listed}")
    code, stderr = _apply(cluster, namespace, copy.deepcopy(VALID["spec"]))
    if code != 0:
        problems.append(f"the valid base was rejected: {stderr}")

    assert not problems, "\n".join(problems)
