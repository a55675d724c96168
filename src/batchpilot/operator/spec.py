"""The InferenceService spec as typed models: the one source of truth for the CRD's
schema (`batchpilot.operator.crd` renders it) and the operator's second validation.

Field names are snake_case in Python and camelCase in Kubernetes (aliases). The CEL
rules sit beside the model they check so that schema and rule cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from batchpilot.extras import gp_sampler_missing
from batchpilot.loadgen.arrivals import (
    MMPP,
    ArrivalKind,
    Constant,
    Poisson,
    TraceError,
    trace_from_timestamps,
)
from batchpilot.loadgen.lengths import DEFAULT_LENGTHS, TokenLengths, describe_dist, parse_dist
from batchpilot.loadgen.protocols import APPLIES_TO
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    MAX_BATCH_SIZE_LIMIT,
    MAX_CONNECTIONS,
    MAX_QUEUE_TIME_MS_LIMIT,
    SLA,
    BatchingConfig,
    RequestClass,
    RequestMix,
)

# Knob names as the tuner and the reference server's admin API spell them.
MAX_BATCH_SIZE = "max_batch_size"
MAX_QUEUE_TIME_MS = "max_queue_time_ms"
CORE_PARAMETERS = (MAX_BATCH_SIZE, MAX_QUEUE_TIME_MS)

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
HTTP_PATH_PATTERN = r"^/[A-Za-z0-9/_.~%-]*$"
MAX_EXTRA_PARAMETERS = 8
MAX_REQUEST_CLASSES = 16
MAX_TRIALS_LIMIT = 100
# the confirmation's size: its status keeps a measurement per finalist and incumbent per round
MAX_FINALISTS = 10
MAX_CONFIRM_ROUNDS_LIMIT = 20


def cel(rule: str, message: str, *, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry: the API server evaluates `rule` at
    `kubectl apply` and shows `message` when it is false."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def _model_config(*rules: dict[str, str]) -> ConfigDict:
    extra: dict[str, Any] = {"x-kubernetes-validations": list(rules)} if rules else {}
    return ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=extra or None,
    )


# Target kinds by API version. The workloads own their pods; the parents (a KServe
# InferenceService, a RayService) own a Deployment or RayCluster that their controller
# reverts, so the operator writes to the parent (batchpilot.operator.parents).
WORKLOAD_API_VERSION = "apps/v1"
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
RAY_API_VERSION = "ray.io/v1"
TARGET_KINDS: dict[str, tuple[str, ...]] = {
    WORKLOAD_API_VERSION: ("Deployment", "StatefulSet"),
    KSERVE_API_VERSION: ("InferenceService",),
    RAY_API_VERSION: ("RayService",),
}
PARENT_KINDS = ("InferenceService", "RayService")
_TARGET_PAIRS = ", ".join(f"{v} {k}" for v, kinds in TARGET_KINDS.items() for k in kinds)
TARGET_PAIR_MESSAGE = f"target.apiVersion and target.kind must be one of: {_TARGET_PAIRS}"
RAY_CONTAINER_MESSAGE = (
    "target.container does not apply to a RayService: its knobs live in "
    "spec.serveConfigV2 (name the Serve deployment with target.serveDeployment)"
)
SERVE_DEPLOYMENT_MESSAGE = "target.serveDeployment applies to a RayService target only"
PARENT_STRATEGY_MESSAGE = (
    "a KServe InferenceService or RayService target needs tuning.strategy InPlace: a "
    "canary copy of it would be a new service with its own controller"
)
RAY_APPLY_MESSAGE = (
    "a RayService target needs apply.method Live: Ray Serve takes max_batch_size and "
    "batch_wait_timeout_s from its user_config, not from environment variables (the "
    "winner is written to spec.serveConfigV2)"
)


class TargetRef(BaseModel):
    """The workload whose batching is tuned, or the KServe InferenceService or
    RayService that owns it."""

    model_config = _model_config(
        cel(
            " || ".join(
                f"(self.apiVersion == '{v}' && self.kind in [{', '.join(repr(k) for k in ks)}])"
                for v, ks in TARGET_KINDS.items()
            ),
            TARGET_PAIR_MESSAGE,
        ),
        cel("self.kind != 'RayService' || !has(self.container)", RAY_CONTAINER_MESSAGE),
        cel("self.kind == 'RayService' || !has(self.serveDeployment)", SERVE_DEPLOYMENT_MESSAGE),
    )

    api_version: Literal["apps/v1", "serving.kserve.io/v1beta1", "ray.io/v1"] = Field(
        default="apps/v1",
        description="API version of the target: apps/v1 (Deployment, StatefulSet), "
        "serving.kserve.io/v1beta1 (InferenceService) or ray.io/v1 (RayService).",
    )
    kind: Literal["Deployment", "StatefulSet", "InferenceService", "RayService"] = Field(
        default="Deployment",
        description="Kind of the target. For a KServe InferenceService or a RayService the "
        "operator finds the serving pods through it and writes to it, never to the "
        "Deployment or RayCluster its controller owns.",
    )
    name: str = Field(
        description="Name of the target in the InferenceService's namespace.",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    container: str | None = Field(
        default=None,
        description="Container that serves the model; the pod's first container when unset "
        "(a KServe predictor's model container: kserve-container).",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
    )
    serve_deployment: str | None = Field(
        default=None,
        description="RayService: the Serve application, or APP/DEPLOYMENT, whose "
        "user_config carries the knobs; needed when serveConfigV2 holds more than one.",
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kind not in TARGET_KINDS[self.api_version]:
            raise ValueError(TARGET_PAIR_MESSAGE)
        if self.kind == "RayService" and self.container is not None:
            raise ValueError(RAY_CONTAINER_MESSAGE)
        if self.kind != "RayService" and self.serve_deployment is not None:
            raise ValueError(SERVE_DEPLOYMENT_MESSAGE)
        return self

    @property
    def is_parent(self) -> bool:
        return self.kind in PARENT_KINDS


_SLA_BOUND_MESSAGE = (
    "sla needs p99LatencyMs, ttftP99Ms or tpotP99Ms (one of them or several; the token "
    "targets with a token-stream load.protocol)"
)
# the SLA's token-stream targets, and the message when the load does not stream
SLA_TOKEN_FIELDS = ("ttftP99Ms", "tpotP99Ms")
STREAM_LOAD_PROTOCOLS = ("OpenAIStream", "OpenAIChatStream")
_TOKEN_SLA_MESSAGE = (
    "sla.ttftP99Ms and sla.tpotP99Ms are judged on token streams: they need load.protocol "
    "OpenAIStream or OpenAIChatStream"
)


class SLASpec(BaseModel):
    """What a sustained request rate must keep to count as effective throughput: an
    end-to-end p99 bound, token-stream targets (TTFT and TPOT p99), or several."""

    model_config = _model_config(
        cel(
            "has(self.p99LatencyMs) || has(self.ttftP99Ms) || has(self.tpotP99Ms)",
            _SLA_BOUND_MESSAGE,
        ),
        cel(
            "!has(self.p99LatencyMs) || self.p99LatencyMs > 0.0",
            "sla.p99LatencyMs must be a positive number of ms",
        ),
        cel(
            "!has(self.ttftP99Ms) || self.ttftP99Ms > 0.0",
            "sla.ttftP99Ms must be a positive number of ms",
        ),
        cel(
            "!has(self.tpotP99Ms) || self.tpotP99Ms > 0.0",
            "sla.tpotP99Ms must be a positive number of ms",
        ),
        cel(
            "self.maxErrorRate >= 0.0 && self.maxErrorRate < 1.0",
            "sla.maxErrorRate is a fraction: at least 0 and below 1 (0.001 = 0.1%)",
        ),
    )

    p99_latency_ms: float | None = Field(
        default=None,
        description="Highest allowed 99th-percentile end-to-end latency, in milliseconds. "
        "Required unless ttftP99Ms or tpotP99Ms is given.",
        gt=0.0,
        le=3_600_000.0,
    )
    max_error_rate: float = Field(
        default=0.001,
        description="Highest allowed fraction of failed or timed-out requests, in [0, 1).",
        ge=0.0,
        lt=1.0,
    )
    ttft_p99_ms: float | None = Field(
        default=None,
        description="Token streams (load.protocol OpenAIStream, OpenAIChatStream): highest "
        "allowed 99th-percentile time to first token, in milliseconds. A step whose TTFT "
        "p99 is over it fails, and the effective throughput is the goodput: the requests "
        "per second within it and tpotP99Ms.",
        gt=0.0,
        le=3_600_000.0,
    )
    tpot_p99_ms: float | None = Field(
        default=None,
        description="Token streams: highest allowed 99th-percentile time per output token "
        "(the gap between the first and last token over the tokens after the first), in "
        "milliseconds; judged as ttftP99Ms.",
        gt=0.0,
        le=3_600_000.0,
    )

    @model_validator(mode="after")
    def _bounded(self) -> SLASpec:
        if self.p99_latency_ms is None and self.ttft_p99_ms is None and self.tpot_p99_ms is None:
            raise ValueError(_SLA_BOUND_MESSAGE)
        return self

    def to_sla(self) -> SLA:
        return SLA(
            p99_ms=self.p99_latency_ms,
            max_error_rate=self.max_error_rate,
            ttft_p99_ms=self.ttft_p99_ms,
            tpot_p99_ms=self.tpot_p99_ms,
        )


def _ordered_message(what: str) -> str:
    return f"{what}.min must be less than or equal to max"


class _OrderedRange(BaseModel):
    """Inclusive bounds; min <= max is checked here and, through the CEL rule each
    subclass's config carries, by the API server."""

    # The spec field the range belongs to, for the error message.
    what: ClassVar[str]
    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(_ordered_message(self.what))
        return self


class BatchSizeRange(_OrderedRange):
    """Bounds of max_batch_size (requests per batch), inclusive."""

    what: ClassVar[str] = "maxBatchSize"
    model_config = _model_config(cel("self.min <= self.max", _ordered_message(what)))

    min: int = Field(
        default=1, description="Smallest batch size tried.", ge=1, le=MAX_BATCH_SIZE_LIMIT
    )
    max: int = Field(
        default=64, description="Largest batch size tried.", ge=1, le=MAX_BATCH_SIZE_LIMIT
    )


class QueueTimeRange(_OrderedRange):
    """Bounds of max_queue_time_ms (longest wait for a batch to fill), inclusive. Not used
    with runtime.kind VLLM, which has no queue wait: there the wait stays 0."""

    what: ClassVar[str] = "maxQueueTimeMs"
    model_config = _model_config(cel("self.min <= self.max", _ordered_message(what)))

    min: float = Field(
        default=0.0, description="Shortest wait tried, ms.", ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT
    )
    max: float = Field(
        default=100.0, description="Longest wait tried, ms.", ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT
    )


class ExtraParameter(BaseModel):
    """A further server knob to tune, such as vLLM's max_num_seqs."""

    model_config = _model_config(
        cel("self.min <= self.max", "an extra parameter's min must be less than or equal to max"),
        cel("!self.log || self.min > 0.0", "a log-scaled parameter needs min > 0"),
        cel(
            "self.kind != 'int' || (double(int(self.min)) == self.min && "
            "double(int(self.max)) == self.max)",
            "an int parameter needs whole-number min and max",
        ),
        cel(
            "self.name != 'max_batch_size' && self.name != 'max_queue_time_ms'",
            "max_batch_size and max_queue_time_ms are set under parameters.maxBatchSize "
            "and parameters.maxQueueTimeMs, not as extra parameters",
        ),
    )

    name: str = Field(
        description="Name of the parameter (snake_case); the key sent to a Live endpoint.",
        min_length=1,
        max_length=63,
        pattern=r"^[a-z][a-z0-9_]*$",
    )
    kind: Literal["int", "float"] = Field(default="int", description="int or float.")
    min: float = Field(description="Smallest value tried.")
    max: float = Field(description="Largest value tried.")
    log: bool = Field(default=False, description="Sample on a log scale (needs min > 0).")
    env: str | None = Field(
        default=None,
        description="Environment variable that carries the value (required for apply Env).",
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )

    @model_validator(mode="after")
    def _consistent(self) -> ExtraParameter:
        if self.min > self.max:
            raise ValueError(f"parameter {self.name}: min must be less than or equal to max")
        if self.log and self.min <= 0:
            raise ValueError(f"parameter {self.name}: a log-scaled parameter needs min > 0")
        if self.kind == "int" and not (self.min.is_integer() and self.max.is_integer()):
            raise ValueError(f"parameter {self.name}: an int parameter needs whole-number bounds")
        if self.name in CORE_PARAMETERS:
            raise ValueError(f"{self.name} is set under parameters, not as an extra parameter")
        return self


class ParametersSpec(BaseModel):
    """The search space."""

    model_config = _model_config(
        cel(
            "!has(self.extra) || self.extra.all(p, self.extra.exists_one(q, q.name == p.name))",
            "parameters.extra names must be unique",
        )
    )

    max_batch_size: BatchSizeRange = Field(
        default_factory=lambda: BatchSizeRange(min=1, max=64),
        description="Range of max_batch_size.",
    )
    max_queue_time_ms: QueueTimeRange = Field(
        default_factory=lambda: QueueTimeRange(min=0.0, max=100.0),
        description="Range of max_queue_time_ms (runtime.kind VLLM has no queue wait: it stays 0).",
    )
    extra: list[ExtraParameter] = Field(
        default_factory=list,
        description="Further named parameters to tune beside the two batching knobs.",
        max_length=MAX_EXTRA_PARAMETERS,
    )

    @model_validator(mode="after")
    def _unique(self) -> ParametersSpec:
        names = [p.name for p in self.extra]
        if len(names) != len(set(names)):
            raise ValueError("parameters.extra names must be unique")
        return self


class EnvNames(BaseModel):
    """Environment variables that carry the batching knobs into the container."""

    model_config = _model_config()

    max_batch_size: str = Field(
        default="MAX_BATCH_SIZE",
        description="Variable holding max_batch_size.",
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )
    max_queue_time_ms: str = Field(
        default="MAX_QUEUE_TIME_MS",
        description="Variable holding max_queue_time_ms, written in the unit its name "
        "ends with (_MS, _US, _S), else in runtime.kind's own unit (MLServer and RayServe "
        "seconds, Triton whole microseconds, TorchServe whole milliseconds), else ms.",
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )


class HTTPEndpoint(BaseModel):
    """A port and path on every pod."""

    model_config = _model_config()

    port: int = Field(description="Container port.", ge=1, le=65535)
    path: str = Field(description="HTTP path.", max_length=256, pattern=HTTP_PATH_PATTERN)


# PEM CA bundles given in the spec (they travel in status.startedWith too, see scope)
MAX_CA_BUNDLE_CHARS = 65536
_ENDPOINT_CA_MESSAGE = "load.endpoint.caBundle applies to scheme https only"
_ENDPOINT_SERVER_NAME_MESSAGE = "load.endpoint.serverName applies to scheme https only"


class LoadEndpoint(BaseModel):
    """The port the load is sent to on every pod, and the path when the runtime's own
    inference path is not the one to use."""

    model_config = _model_config(
        cel("!has(self.caBundle) || self.scheme == 'https'", _ENDPOINT_CA_MESSAGE),
        cel("!has(self.serverName) || self.scheme == 'https'", _ENDPOINT_SERVER_NAME_MESSAGE),
    )

    port: int = Field(description="Container port.", ge=1, le=65535)
    scheme: Literal["http", "https"] = Field(
        default="http",
        description="https: the pods serve TLS on the port; their certificate is always "
        "verified (see caBundle, serverName).",
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM CA certificates that sign the pods' certificate (scheme https); "
        "the operator's trust store when unset. CA certificates are public, so they are "
        "given here rather than read from a Secret.",
        min_length=1,
        max_length=MAX_CA_BUNDLE_CHARS,
    )
    server_name: str | None = Field(
        default=None,
        description="The name the pods' certificate is verified against, sent as SNI "
        "(scheme https): pods are reached by IP, and certificates rarely carry pod IPs. "
        "Unset: the certificate must be valid for the pod IP.",
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    path: str | None = Field(
        default=None,
        description="HTTP path of the inference requests. Required for runtime.kind "
        "Reference and Generic with load.protocol Runtime or Template; the other runtimes "
        "default it to their own inference path for runtime.model (Triton, MLServer: "
        "/v2/models/MODEL/infer; TorchServe: /predictions/MODEL; VLLM: /v1/completions), "
        "and so do the protocols with a path of their own (V2, the OpenAI ones).",
        max_length=256,
        pattern=HTTP_PATH_PATTERN,
    )

    @model_validator(mode="after")
    def _tls_fields_usable(self) -> LoadEndpoint:
        from batchpilot.loadgen.protocols import CA_BUNDLE
        from batchpilot.tls import verifying_context

        if self.ca_bundle is not None:
            if self.scheme != "https":
                raise ValueError(_ENDPOINT_CA_MESSAGE)
            try:
                verifying_context(ca_pem=self.ca_bundle, what=CA_BUNDLE)
            except ValueError as exc:
                raise ValueError(f"load.endpoint.caBundle: {exc}") from None
        if self.server_name is not None and self.scheme != "https":
            raise ValueError(_ENDPOINT_SERVER_NAME_MESSAGE)
        return self


class ApplySpec(BaseModel):
    """How a configuration reaches the pods."""

    # Whether apply.live is needed depends on spec.runtime: the rule sits on the spec.
    model_config = _model_config()

    method: Literal["Env", "Live"] = Field(
        default="Env",
        description="Env: set the pod template's environment and wait for the rollout. "
        "Live: PUT the values to an admin endpoint on every ready pod, no restart.",
    )
    env: EnvNames = Field(
        default_factory=lambda: EnvNames(
            max_batch_size="MAX_BATCH_SIZE", max_queue_time_ms="MAX_QUEUE_TIME_MS"
        ),
        description="Variable names used by method Env.",
    )
    live: HTTPEndpoint | None = Field(
        default=None,
        description="Admin endpoint used by method Live with runtime.kind Reference; it "
        'accepts GET and PUT of JSON {"max_batch_size": ..., "max_queue_time_ms": ...}. '
        "With method Env, its GET verifies each rollout: a pod reporting other values "
        "than the variables carry fails the trial as EnvIgnored.",
    )


RuntimeKind = Literal[
    "Reference", "Triton", "RayServe", "TorchServe", "MLServer", "VLLM", "Generic"
]
# Kinds whose adapter changes a running server over its own API (apply.method Live).
LIVE_RUNTIMES = ("Triton", "RayServe")
# Kinds tuned by rollout only: their knobs are start-up settings, or the adapter needs
# the model's files on the operator's machine to change them.
ROLLOUT_RUNTIMES = ("MLServer", "TorchServe", "VLLM", "Generic")
# Kinds that name the model they serve.
MODEL_RUNTIMES = ("Triton", "RayServe", "TorchServe", "MLServer", "VLLM")
# Kinds without a model name: the reference server serves one model, Generic is opaque.
MODELLESS_RUNTIMES = ("Reference", "Generic")
# Kinds whose requests the operator cannot shape: load.endpoint.path is the user's.
PATHLESS_RUNTIMES = ("Reference", "Generic")


def _cel_list(kinds: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{k}'" for k in kinds) + "]"


def _kinds(kinds: tuple[str, ...]) -> str:
    return ", ".join(kinds[:-1]) + " and " + kinds[-1]


_MODEL_MESSAGE = (
    f"runtime.model is required for kinds {_kinds(MODEL_RUNTIMES)} (the name "
    "the server serves the model under; RayServe: APP or APP/DEPLOYMENT) and not used by "
    f"{_kinds(MODELLESS_RUNTIMES)}"
)
_MANAGEMENT_MESSAGE = (
    "runtime.managementPort (the Ray dashboard's port, Serve's REST API) applies to kind "
    "RayServe only"
)
_METRICS_MESSAGE = "runtime.metricsPort (Triton's metrics port) applies to kind Triton only"


class RuntimeSpec(BaseModel):
    """The inference server the target runs: how its knobs are set, read and kept, and
    which requests it serves."""

    model_config = _model_config(
        cel(
            f"(self.kind in {_cel_list(MODELLESS_RUNTIMES)}) != has(self.model)",
            _MODEL_MESSAGE,
        ),
        cel("!has(self.managementPort) || self.kind == 'RayServe'", _MANAGEMENT_MESSAGE),
        cel("!has(self.metricsPort) || self.kind == 'Triton'", _METRICS_MESSAGE),
    )

    kind: RuntimeKind = Field(
        default="Reference",
        description="Reference: BatchPilot's reference server. Triton, RayServe: changed "
        "live through their own APIs (apply.method Live) or by rollout (Env). TorchServe, "
        "MLServer: by rollout (Env). VLLM, Generic: by rollout (Env), the values reaching "
        "the server through $(VAR) references in the container's args.",
    )
    model: str | None = Field(
        default=None,
        description="The model's name on the server (Triton, MLServer, TorchServe, VLLM); "
        "RayServe: the application, or APP/DEPLOYMENT.",
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$",
    )
    management_port: int | None = Field(
        default=None,
        description="RayServe: the dashboard port serving Serve's REST API [8265].",
        ge=1,
        le=65535,
    )
    metrics_port: int | None = Field(
        default=None,
        description="Triton: the metrics port, read to verify the batches after a change [8002].",
        ge=1,
        le=65535,
    )

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> RuntimeSpec:
        if (self.kind in MODELLESS_RUNTIMES) != (self.model is None):
            raise ValueError(_MODEL_MESSAGE)
        if self.management_port is not None and self.kind != "RayServe":
            raise ValueError(_MANAGEMENT_MESSAGE)
        if self.metrics_port is not None and self.kind != "Triton":
            raise ValueError(_METRICS_MESSAGE)
        return self


class RequestClassSpec(BaseModel):
    """One kind of request in the load mix."""

    model_config = _model_config()

    weight: float = Field(description="Relative weight in the mix (> 0).", gt=0.0)
    size: int = Field(description="Input size (rows or tokens) of the request.", ge=1, le=65536)


# load.protocol in the command line's words (loadtest/capacity/tune --protocol): one
# vocabulary, so anything `loadtest` can send a study can too
LOAD_PROTOCOLS: dict[str, str | None] = {
    "Runtime": None,
    "V2": "v2",
    "OpenAI": "openai",
    "OpenAIChat": "openai-chat",
    "OpenAIStream": "openai-stream",
    "OpenAIChatStream": "openai-chat-stream",
    "Template": "template",
}
# the protocols whose requests name a model (v2: in the path; OpenAI: the model field)
MODEL_LOAD_PROTOCOLS = ("V2", "OpenAI", "OpenAIChat", *STREAM_LOAD_PROTOCOLS)
# load.request's fields and the command-line flag each one is
_REQUEST_FLAGS = {
    "model": "--model",
    "inputName": "--input-name",
    "features": "--features",
    "maxTokens": "--max-tokens",
    "bodyTemplate": "--body-template",
}


def _request_field_protocols(field: str) -> tuple[str, ...]:
    """The load.protocol values a load.request field applies to, from the flags'."""
    flags = APPLIES_TO[_REQUEST_FLAGS[field]]
    return tuple(name for name, cli in LOAD_PROTOCOLS.items() if cli in flags)


def _request_field_message(field: str) -> str:
    return (
        f"load.request.{field} applies to load.protocol "
        f"{' or '.join(_request_field_protocols(field))}"
    )


_TEMPLATE_MESSAGE = "load.protocol Template needs load.request.bodyTemplate"
_REQUEST_MODEL_MESSAGE = (
    f"load.protocol {', '.join(MODEL_LOAD_PROTOCOLS)} send a model name (V2: in the path; "
    "OpenAI: the request's model field): set load.request.model, or a runtime.kind that "
    "names its model (runtime.model)"
)
# the spec travels whole in annotations (kubectl's last-applied, the operator's
# last-handled) that share 256 KiB: a sample body, not a data set
MAX_BODY_TEMPLATE_CHARS = 16384
MAX_REQUEST_HEADERS = 16
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_VALUE_CHARS = 1024
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"


class LoadRequestSpec(BaseModel):
    """What each request carries, beside load.protocol: the same choices as the command
    line's --model, --input-name, --features, --max-tokens, --body-template and --header."""

    model_config = _model_config()

    model: str | None = Field(
        default=None,
        description="V2: the model in the path; OpenAI, OpenAIChat, OpenAIStream, "
        "OpenAIChatStream: the request's model field [runtime.model].",
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$",
    )
    input_name: str | None = Field(
        default=None,
        description="V2: send one FP32 tensor [size, features] of this name instead of the "
        "inputs the model's metadata declares [from the metadata].",
        min_length=1,
        max_length=256,
        pattern=r"^[^/\s]+$",
    )
    features: int | None = Field(
        default=None,
        description="V2: values per item of the inputName tensor [1].",
        ge=1,
        le=65536,
    )
    max_tokens: int | None = Field(
        default=None,
        description="OpenAI, OpenAIChat: max_tokens of every request [16].",
        ge=1,
        le=1_000_000,
    )
    body_template: str | None = Field(
        default=None,
        description="Template: the JSON body of every request, {size} standing for the "
        "request's size from load.requests (without it every request sends this body), "
        "sent to load.endpoint.path or the runtime's inference path for runtime.model. "
        "For a model whose inputs nothing else describes (a handler's own JSON, BYTES "
        "inputs).",
        min_length=2,
        max_length=MAX_BODY_TEMPLATE_CHARS,
    )
    headers: dict[str, Annotated[str, Field(max_length=MAX_HEADER_VALUE_CHARS)]] | None = Field(
        default=None,
        description="Extra request headers, name to value (Content-Type replaces the "
        "JSON one). Not for secrets: whoever reads the InferenceService reads them.",
        max_length=MAX_REQUEST_HEADERS,
    )

    @model_validator(mode="after")
    def _usable(self) -> LoadRequestSpec:
        from batchpilot.loadgen.protocols import template_protocol

        if self.body_template is not None:
            try:
                template_protocol(self.body_template, path="/", require_size=False)
            except ValueError as exc:
                raise ValueError(f"load.request.bodyTemplate: {exc}") from None
        for name in self.headers or {}:
            if len(name) > MAX_HEADER_NAME_CHARS or not re.fullmatch(HEADER_NAME_PATTERN, name):
                raise ValueError(
                    f"load.request.headers: {name[:64]!r} is not an HTTP header name of at "
                    f"most {MAX_HEADER_NAME_CHARS} letters, digits and !#$%&'*+.^_`|~-"
                )
        return self

    def given(self) -> list[str]:
        """The fields set, by their names in the spec."""
        values = {
            "model": self.model,
            "inputName": self.input_name,
            "features": self.features,
            "maxTokens": self.max_tokens,
            "bodyTemplate": self.body_template,
        }
        return [field for field, value in values.items() if value is not None]


# a Prometheus label name; those starting with '__' are Prometheus's own, dropped after
# relabelling, so never on a stored series
PROMETHEUS_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
POD_LABEL_MESSAGE = (
    "load.prometheus.podLabel must be a Prometheus label name: letters, digits and '_', "
    "not starting with a digit or with '__' (e.g. pod, kubernetes_pod_name)"
)


class PrometheusSpec(BaseModel):
    """Where a trial's latency and rates are read when load.source is prometheus."""

    model_config = _model_config(
        cel(
            "self.url.startsWith('http://') || self.url.startsWith('https://')",
            "load.prometheus.url must start with http:// or https://",
        ),
        cel(
            "!self.url.contains('#') && !self.url.contains('?')",
            "load.prometheus.url must not contain '#' (a fragment) or '?' (a query): the API "
            "path is appended to the URL",
        ),
        cel(
            "!has(self.caBundle) || self.url.startsWith('https://')",
            "load.prometheus.caBundle applies to https:// URLs only",
        ),
        cel(
            f"!has(self.podLabel) || (self.podLabel.matches('{PROMETHEUS_LABEL_PATTERN}') && "
            "!self.podLabel.startsWith('__'))",
            POD_LABEL_MESSAGE,
        ),
    )

    url: str = Field(
        description="Base URL of the Prometheus API; https is verified (see caBundle), "
        "without a query or fragment. The operator refuses a host on loopback, link-local "
        "addresses or the Kubernetes API server unless its --prometheus-allow allows it.",
        min_length=8,
        max_length=512,
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM CA certificates that sign an https Prometheus's certificate; the "
        "operator's trust store when unset. Verification is always on. CA certificates are "
        "public, so they are given here rather than read from a Secret.",
        min_length=1,
        max_length=MAX_CA_BUNDLE_CHARS,
    )
    latency_metric: str | None = Field(
        default=None,
        description="Latency histogram (seconds) to read p99 from; unset: the runtime's own "
        "(runtime.kind Triton, RayServe, TorchServe, MLServer, VLLM: its names and units), "
        "else the reference server's. Naming it or requestsMetric reads both the reference "
        "server's way.",
        max_length=256,
    )
    ttft_metric: str | None = Field(
        default=None,
        description="A token-stream server's time-to-first-token histogram (in "
        "latencyMetric's unit), read for sla.ttftP99Ms: a step's TTFT p99 and production's "
        "over the verify and re-tune windows. Unset: vLLM's "
        "vllm:time_to_first_token_seconds for runtime.kind VLLM, else none (steps are "
        "judged on the client's TTFT, production's is not read).",
        max_length=256,
    )
    tpot_metric: str | None = Field(
        default=None,
        description="A token-stream server's time-per-output-token histogram, one value per "
        "request, read for sla.tpotP99Ms as ttftMetric is. Unset: vLLM's "
        "vllm:request_time_per_output_token_seconds for runtime.kind VLLM, else none.",
        max_length=256,
    )
    requests_metric: str | None = Field(
        default=None,
        description="Counter of requests with an outcome label; unset: as latencyMetric.",
        max_length=256,
    )
    ok_outcome: str = Field(
        default="ok",
        description="Value of the outcome label that counts as success.",
        max_length=63,
    )
    selector: str = Field(
        default="",
        description='Extra label matchers added to every query, e.g. job="resnet".',
        max_length=512,
    )
    pod_label: str = Field(
        default="pod",
        description="The label that holds the pod's name in the series (pod with the "
        "Prometheus Operator and most Kubernetes service discovery setups; others relabel "
        "it into kubernetes_pod_name, pod_name, exported_pod...). Queries are narrowed to "
        "the measured pods by it.",
        min_length=1,
        max_length=128,
    )
    scrape_interval_seconds: float | None = Field(
        default=None,
        description="How often Prometheus scrapes the target, s; read from Prometheus's "
        "configuration when unset. load.stepSeconds must be at least 4 intervals.",
        gt=0.0,
        le=3600.0,
    )

    @field_validator("pod_label")
    @classmethod
    def _pod_label_is_a_label_name(cls, value: str) -> str:
        if not re.match(PROMETHEUS_LABEL_PATTERN, value) or value.startswith("__"):
            raise ValueError(f"{POD_LABEL_MESSAGE}; got {value!r}")
        return value

    @model_validator(mode="after")
    def _url_and_ca_usable(self) -> PrometheusSpec:
        from batchpilot.capacity.prometheus_http import check_prometheus_url, tls_context

        try:
            check_prometheus_url(self.url)
        except ValueError as exc:
            raise ValueError(f"load.prometheus.url: {exc}") from None
        if self.ca_bundle is not None:
            if not self.url.startswith("https://"):
                raise ValueError("load.prometheus.caBundle applies to https:// URLs only")
            try:
                tls_context(ca_pem=self.ca_bundle)
            except ValueError as exc:
                raise ValueError(f"load.prometheus.caBundle: {exc}") from None
        return self


MAX_TRACE_TIMESTAMPS = 10_000


class ArrivalSpec(BaseModel):
    """The arrival process every step is offered under (the simulator's too)."""

    model_config = _model_config(
        cel(
            "self.process == 'MMPP' || (!has(self.burstFactor) && !has(self.burstFraction) "
            "&& !has(self.meanBurstSeconds))",
            "load.arrival: burstFactor, burstFraction and meanBurstSeconds apply to "
            "process MMPP only",
        ),
        cel(
            "(self.process == 'Trace') == has(self.timestamps)",
            "load.arrival.timestamps is required for process Trace and allowed for it only",
        ),
    )

    process: Literal["Poisson", "Constant", "MMPP", "Trace"] = Field(
        default="Poisson",
        description="Poisson: independent users. Constant: evenly spaced. MMPP: bursts at "
        "burstFactor x the quiet rate, burstFraction of the time, meanBurstSeconds long "
        "(seconds at every rate). Trace: the recorded timestamps replayed, their gaps "
        "scaled to each step's rate.",
    )
    burst_factor: float | None = Field(
        default=None, description="MMPP: burst rate / quiet rate [4].", ge=1.0, le=1000.0
    )
    burst_fraction: float | None = Field(
        default=None, description="MMPP: share of the time in bursts [0.2].", gt=0.0, lt=1.0
    )
    mean_burst_seconds: float | None = Field(
        default=None, description="MMPP: mean length of a burst, s [0.5].", gt=0.0, le=3600.0
    )
    timestamps: list[float] | None = Field(
        default=None,
        description="Trace: arrival times in seconds, not decreasing.",
        min_length=2,
        max_length=MAX_TRACE_TIMESTAMPS,
    )

    @model_validator(mode="after")
    def _fields_fit_the_process(self) -> ArrivalSpec:
        mmpp_fields = (self.burst_factor, self.burst_fraction, self.mean_burst_seconds)
        if self.process != "MMPP" and any(v is not None for v in mmpp_fields):
            raise ValueError(
                "load.arrival: burstFactor, burstFraction and meanBurstSeconds apply to "
                "process MMPP only"
            )
        if (self.process == "Trace") != (self.timestamps is not None):
            raise ValueError(
                "load.arrival.timestamps is required for process Trace and allowed for it only"
            )
        if self.timestamps is not None:
            self.process_model()  # a trace that cannot be replayed says why here
        return self

    def process_model(self) -> ArrivalKind:
        """The load generator's (and simulator's) process this spec names."""
        if self.process == "Constant":
            return Constant()
        if self.process == "MMPP":
            given = {
                "burst_factor": self.burst_factor,
                "high_fraction": self.burst_fraction,
                "mean_burst_s": self.mean_burst_seconds,
            }
            return MMPP.model_validate({k: v for k, v in given.items() if v is not None})
        if self.process == "Trace":
            assert self.timestamps is not None  # the validator's rule
            try:
                return trace_from_timestamps(self.timestamps, "load.arrival.timestamps")
            except TraceError as exc:
                raise ValueError(str(exc)) from None
        return Poisson()


# Most load-worker pods one study may run (load.workers.max).
MAX_WORKER_PODS = 64
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"


class WorkerResourceList(BaseModel):
    """CPU and memory of one load-worker pod, as Kubernetes quantities."""

    model_config = _model_config()

    cpu: str | None = Field(
        default=None, description="CPU, e.g. '1' or '500m'.", pattern=QUANTITY_PATTERN
    )
    memory: str | None = Field(
        default=None, description="Memory, e.g. '256Mi'.", pattern=QUANTITY_PATTERN
    )


class WorkerResources(BaseModel):
    """Requests and limits of every load-worker pod."""

    model_config = _model_config()

    requests: WorkerResourceList = Field(
        default_factory=lambda: WorkerResourceList(cpu="1", memory="256Mi"),
        description="What a worker is scheduled with [cpu 1, memory 256Mi].",
        json_schema_extra={"default": {"cpu": "1", "memory": "256Mi"}},
    )
    limits: WorkerResourceList | None = Field(
        default=None, description="Upper bounds; unset: none."
    )


class WorkerToleration(BaseModel):
    """A toleration of the load-worker pods (the Kubernetes fields)."""

    model_config = _model_config(
        cel(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value)",
            "load.workers.tolerations: operator Exists takes no value",
        ),
    )

    key: str | None = Field(
        default=None, description="Taint key; unset with Exists: every taint.", max_length=316
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Equal (default) or Exists."
    )
    value: str | None = Field(default=None, description="Taint value (Equal).", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; unset: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None, description="NoExecute: how long the pod stays after the taint.", ge=0
    )

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Self:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("load.workers.tolerations: operator Exists takes no value")
        return self


class WorkersSpec(BaseModel):
    """Load-worker pods: a step's schedule split over an Indexed Job when one client
    cannot drive the rates the search reaches (docs/operator/load-workers.md)."""

    model_config = _model_config()

    max: int = Field(
        default=1,
        description="Most worker pods a step is split over. 1: the operator sends the "
        "load itself and no Job is created.",
        ge=1,
        le=MAX_WORKER_PODS,
    )
    image: str | None = Field(
        default=None,
        description="Image of the worker pods; unset: the operator's own image.",
        min_length=1,
        max_length=512,
    )
    resources: WorkerResources = Field(
        default_factory=WorkerResources,
        description="Requests and limits of each worker pod.",
        json_schema_extra={"default": {"requests": {"cpu": "1", "memory": "256Mi"}}},
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels the worker pods must be placed on."
    )
    tolerations: list[WorkerToleration] | None = Field(
        default=None, description="Taints the worker pods tolerate.", max_length=32
    )
    ttl_seconds_after_finished: int = Field(
        default=300,
        description="Seconds a finished worker Job is kept before Kubernetes deletes it.",
        ge=0,
        le=86400,
    )


_LENGTHS_MESSAGE = (
    "load.promptTokens and load.outputTokens apply to load.protocol OpenAIStream and "
    "OpenAIChatStream"
)
_LENGTH_FORMS = "fixed:N, uniform:LO-HI or lognormal:MEDIAN,SIGMA"


class LoadSpec(BaseModel):
    """How a trial is measured."""

    model_config = _model_config(
        cel(
            "self.source != 'prometheus' || has(self.prometheus)",
            "load.prometheus (url) is required when load.source is prometheus",
        ),
        cel(
            "(!has(self.promptTokens) && !has(self.outputTokens)) || (has(self.protocol) && "
            f"self.protocol in {_cel_list(STREAM_LOAD_PROTOCOLS)})",
            _LENGTHS_MESSAGE,
        ),
        *(
            cel(
                f"!has(self.request) || !has(self.request.{field}) || (has(self.protocol) && "
                f"self.protocol in {_cel_list(_request_field_protocols(field))})",
                _request_field_message(field),
            )
            for field in _REQUEST_FLAGS
        ),
        cel(
            "!has(self.protocol) || self.protocol != 'Template' || "
            "(has(self.request) && has(self.request.bodyTemplate))",
            _TEMPLATE_MESSAGE,
        ),
    )

    endpoint: LoadEndpoint = Field(description="Inference endpoint the load is sent to.")
    protocol: Literal[
        "Runtime", "V2", "OpenAI", "OpenAIChat", "OpenAIStream", "OpenAIChatStream", "Template"
    ] = Field(
        default="Runtime",
        description="Runtime: the runtime's own requests (sized by load.requests); for "
        "Triton and MLServer built from the model's metadata as each trial's first pod "
        "serves it (its "
        "inputs' names, datatypes and shapes; an input such as BYTES that needs a sample "
        "stops the study, reason RequestShape). "
        "V2: KServe v2 inference requests (Triton, MLServer, KServe, any v2 server) built "
        "from the model's metadata the same way, or one FP32 tensor named "
        "request.inputName. OpenAI, OpenAIChat: completions or chat completions with a "
        "prompt of size words. "
        "OpenAIStream, OpenAIChatStream: streamed OpenAI completions or chat completions, "
        "their lengths from promptTokens and outputTokens: TTFT, TPOT, goodput and output "
        "tokens/s are measured, and sla.ttftP99Ms and sla.tpotP99Ms can be judged. "
        "Template: request.bodyTemplate. A server that refuses a trial's first requests "
        "with a 4xx, or answers every one of them with a 5xx twice 2 s apart (a model "
        "that raises on its input), stops the study (reason RequestShape) with its "
        "message.",
    )
    request: LoadRequestSpec | None = Field(
        default=None,
        description="What each request carries beside load.protocol: the model named, a "
        "v2 tensor by hand, max_tokens, a body template, extra headers.",
    )
    prompt_tokens: str | None = Field(
        default=None,
        description="Token streams: each request's prompt length in tokens (about one word "
        f"a token): {_LENGTH_FORMS} "
        f"[{describe_dist(DEFAULT_LENGTHS.prompt)}].",
        max_length=64,
    )
    output_tokens: str | None = Field(
        default=None,
        description="Token streams: each request's output length, asked with max_tokens = "
        "min_tokens and ignore_eos: the same forms as promptTokens "
        f"[{describe_dist(DEFAULT_LENGTHS.output)}].",
        max_length=64,
    )
    requests: list[RequestClassSpec] = Field(
        default_factory=lambda: [
            RequestClassSpec(weight=c.weight, size=c.size) for c in RequestMix.default().classes
        ],
        description="The request mix: weighted input sizes. Mix short and long requests; "
        "a uniform size gives a flattering p99.",
        json_schema_extra={
            "default": [{"weight": c.weight, "size": c.size} for c in RequestMix.default().classes]
        },
        min_length=1,
        max_length=MAX_REQUEST_CLASSES,
    )
    source: Literal["client", "prometheus"] = Field(
        default="client",
        description="client: latency measured by the built-in load generator. prometheus: "
        "read from the server's histogram in Prometheus.",
    )
    prometheus: PrometheusSpec | None = Field(
        default=None, description="Used when source is prometheus."
    )
    step_seconds: float = Field(
        default=5.0, description="Length of one step of the capacity search, s.", ge=1.0, le=600.0
    )
    warmup_seconds: float = Field(
        default=2.0, description="Warm-up before the first step, s.", ge=0.0, le=600.0
    )
    precision: float = Field(
        default=0.05,
        description="Relative precision of the effective-throughput search.",
        ge=0.005,
        le=0.5,
    )
    arrival: ArrivalSpec = Field(
        default_factory=ArrivalSpec,
        description="Arrival process of the offered load; a bursty service is tuned under "
        "its bursts.",
        json_schema_extra={"default": {"process": "Poisson"}},
    )
    request_timeout_seconds: float | None = Field(
        default=None,
        description="Client timeout per request, s; a timeout counts as an error.",
        gt=0.0,
        le=600.0,
    )
    min_requests: int = Field(
        default=DEFAULT_MIN_REQUESTS,
        description=(
            "Measured requests a step holds at least (it is stretched up to 6 x stepSeconds); "
            "a step still short is judged on the upper 95 % bound of its p99."
        ),
        ge=0,
        le=1_000_000,
    )

    max_rps: float | None = Field(
        default=None,
        description="Load budget: the highest rate offered per measured pod, req/s. The "
        "capacity search never offers more than maxRps x the ready pods. Required by "
        "strategy InPlace, where the load lands on production beside live traffic.",
        gt=0.0,
        le=1_000_000.0,
    )
    workers: WorkersSpec = Field(
        default_factory=WorkersSpec,
        description="Load-worker pods that send the load when one client is not enough.",
        json_schema_extra={
            "default": {
                "max": 1,
                "ttlSecondsAfterFinished": 300,
                "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
            }
        },
    )
    max_overload_seconds: float | None = Field(
        default=None,
        description="Load budget: the longest time, s, that the steps of one trial may run "
        "above the SLA. A step is started only while the time left covers its whole "
        "window; unset: no limit. Should be at least stepSeconds, else no step fits.",
        ge=1.0,
        le=86400.0,
    )
    max_connections: int | None = Field(
        default=None,
        description="Load budget: the most connections (so requests in flight) the load "
        "generator holds to the measured pods, split over load workers (at least one "
        "each). A step that needs more in flight waits for a slot: that wait is the "
        "client's limit, so the trial ends ClientBound with its capacity as a lower bound "
        "(about maxConnections / latency). Unset: a pool sized for open loop.",
        ge=1,
        le=MAX_CONNECTIONS,
    )

    @model_validator(mode="after")
    def _prometheus_needs_url(self) -> LoadSpec:
        if self.source == "prometheus" and self.prometheus is None:
            raise ValueError("load.prometheus (url) is required when load.source is prometheus")
        return self

    @model_validator(mode="after")
    def _request_fits_the_protocol(self) -> LoadSpec:
        given = self.request.given() if self.request is not None else []
        for field in given:
            if self.protocol not in _request_field_protocols(field):
                raise ValueError(_request_field_message(field))
        if self.protocol == "Template" and "bodyTemplate" not in given:
            raise ValueError(_TEMPLATE_MESSAGE)
        return self

    @model_validator(mode="after")
    def _lengths_of_streams(self) -> LoadSpec:
        given = self.prompt_tokens is not None or self.output_tokens is not None
        if given and self.protocol not in STREAM_LOAD_PROTOCOLS:
            raise ValueError(_LENGTHS_MESSAGE)
        self.token_lengths()  # a distribution the CLI would refuse is refused here
        return self

    def token_lengths(self) -> TokenLengths:
        """The prompt and output lengths of a token-stream load; ValueError naming the
        field and the forms allowed."""
        for field, text in (
            ("load.promptTokens", self.prompt_tokens),
            ("load.outputTokens", self.output_tokens),
        ):
            if text is not None and text.strip().startswith("file:"):
                raise ValueError(
                    f"{field}: a file of length pairs is read by the CLI only; the spec "
                    f"takes {_LENGTH_FORMS}"
                )
        return TokenLengths(
            prompt=DEFAULT_LENGTHS.prompt
            if self.prompt_tokens is None
            else parse_dist(self.prompt_tokens, "load.promptTokens"),
            output=DEFAULT_LENGTHS.output
            if self.output_tokens is None
            else parse_dist(self.output_tokens, "load.outputTokens"),
        )

    def mix(self) -> RequestMix:
        return RequestMix(
            classes=tuple(RequestClass(weight=r.weight, size=r.size) for r in self.requests)
        )


RETUNE_WINDOW_PATTERN = r"^[1-9][0-9]{0,4}[smh]$"
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
# the re-tune check reads Prometheus over this window: long enough to hold several
# scrapes, short enough to be one range query
MIN_RETUNE_WINDOW_S = 60
MAX_RETUNE_WINDOW_S = 7 * 86400
_RETUNE_WINDOW_MESSAGE = (
    "tuning.retuneWindow is a number and a unit s, m or h (e.g. 10m), from 1m to 168h"
)


def duration_seconds(text: str) -> int:
    """`10m` → 600; raises ValueError naming the allowed form."""
    import re

    if not re.fullmatch(RETUNE_WINDOW_PATTERN, text):
        raise ValueError(f"{_RETUNE_WINDOW_MESSAGE}; got {text!r}")
    seconds = int(text[:-1]) * _DURATION_UNITS[text[-1]]
    if not MIN_RETUNE_WINDOW_S <= seconds <= MAX_RETUNE_WINDOW_S:
        raise ValueError(f"{_RETUNE_WINDOW_MESSAGE}; got {text!r}")
    return seconds


def _check_cron(text: str, field: str) -> None:
    from batchpilot.operator.cron import Cron, CronError

    try:
        Cron.parse(text)
    except CronError as exc:
        raise ValueError(f"{field}: {exc}") from None


# a CEL check of the shape only (five fields); the operator parses the rest
_CEL_CRON_SHAPE = r"^\\S+( +\\S+){4}$"
MAX_WINDOW_MINUTES = 7 * 24 * 60


class WindowSpec(BaseModel):
    """A maintenance window: trials run only while one is open."""

    model_config = _model_config(
        cel(
            f"self.start.matches('{_CEL_CRON_SHAPE}')",
            "tuning.window.start is a 5-field cron expression: minute hour day-of-month "
            "month day-of-week (e.g. '0 2 * * sat')",
        ),
    )

    start: str = Field(
        description="When a window opens: a 5-field cron expression (minute hour "
        "day-of-month month day-of-week; *, ranges a-b, steps */n, lists, month and "
        "weekday names), read on the clock of timeZone. E.g. '0 2 * * *': 02:00 daily.",
        min_length=1,
        max_length=128,
    )
    duration_minutes: int = Field(
        description="How long a window stays open, minutes. Must cover "
        "tuning.trialDeadlineSeconds: a trial starts only when the window still holds it.",
        ge=1,
        le=MAX_WINDOW_MINUTES,
    )
    time_zone: str = Field(
        default="UTC",
        description="IANA time zone of start, e.g. Europe/Berlin.",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_+./-]+$",
    )

    @model_validator(mode="after")
    def _usable(self) -> Self:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        _check_cron(self.start, "tuning.window.start")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"tuning.window.timeZone: {self.time_zone!r} is not an IANA time zone "
                "(e.g. UTC, Europe/Berlin, America/New_York)"
            ) from None
        return self


_RETUNE_MESSAGE = (
    "tuning.retune is Never, OnSLABreach, or a 5-field cron schedule (e.g. '0 3 * * sun')"
)
_WINDOW_DEADLINE_MESSAGE = (
    "tuning.window.durationMinutes must cover tuning.trialDeadlineSeconds: a trial only "
    "starts when the window can hold it"
)
_RETUNE_SOURCE_MESSAGE = (
    "tuning.retune OnSLABreach needs load.source prometheus: the target's p99 over "
    "tuning.retuneWindow is read from Prometheus"
)
_RETUNE_TOKENS_MESSAGE = (
    "tuning.retune OnSLABreach with sla.ttftP99Ms or sla.tpotP99Ms reads production's TTFT "
    "and TPOT from the server's own histograms: runtime.kind VLLM has them (with "
    "load.prometheus.latencyMetric and requestsMetric unset); another server names them in "
    "load.prometheus.ttftMetric and tpotMetric"
)


# Adaptive confirmation's cap: 3 rounds, then up to this many while undecided.
DEFAULT_MAX_CONFIRM_ROUNDS = 6
_ROUNDS_MESSAGE = "tuning.maxConfirmRounds must be greater than or equal to tuning.confirmRounds"


class TuningSpec(BaseModel):
    """How the study runs and what happens to its result."""

    model_config = _model_config(
        cel("self.maxConfirmRounds >= self.confirmRounds", _ROUNDS_MESSAGE),
        cel(
            "!has(self.window) || self.window.durationMinutes * 60 >= self.trialDeadlineSeconds",
            _WINDOW_DEADLINE_MESSAGE,
        ),
        cel(
            f"self.retune in ['Never', 'OnSLABreach'] || self.retune.matches('{_CEL_CRON_SHAPE}')",
            _RETUNE_MESSAGE,
        ),
        cel(
            "self.retuneWindow.matches('^[1-9][0-9]{0,4}[smh]$')",
            _RETUNE_WINDOW_MESSAGE,
        ),
    )

    strategy: Literal["Canary", "InPlace"] = Field(
        default="Canary",
        description="Canary: tune a clone of the target that the Service does not select, "
        "then delete it. InPlace: tune the target itself and restore it on failure; its "
        "failing steps stop as soon as their p99 is certain to break the SLA.",
    )
    max_trials: int = Field(
        default=20,
        description="Trials in a study, the baseline included.",
        ge=1,
        le=MAX_TRIALS_LIMIT,
    )
    patience: int | None = Field(
        default=None,
        description="Stop early (Converged) after this many trials in a row that did not "
        "improve the best; unset runs all maxTrials.",
        ge=1,
        le=MAX_TRIALS_LIMIT,
    )
    sampler: Literal["TPE", "GP", "Random"] = Field(
        default="TPE",
        description="Optuna sampler that proposes the next configuration. GP needs PyTorch "
        "in the operator's image (the default image has none: the spec is refused).",
    )

    @field_validator("sampler")
    @classmethod
    def _sampler_runs_here(cls, sampler: str) -> str:
        # GP fits its model with PyTorch: without it, ask() would fail trials in
        if sampler == "GP" and (missing := gp_sampler_missing()) is not None:
            raise ValueError(missing)
        return sampler

    write_back: Literal["Apply", "Recommend"] = Field(
        default="Apply",
        description="Apply: write the best values onto the target (server-side apply, field "
        "manager batchpilot). Recommend: status only; the target is left as it was.",
    )
    trial_deadline_seconds: int = Field(
        default=900,
        description="Longest a trial (apply, rollout and measurement) may take. The "
        "operator refuses a value over its --max-trial-deadline-seconds (default 3600), "
        "set by the platform team.",
        ge=10,
        le=86400,
    )
    max_failures: int = Field(
        default=5,
        description="Failed trials in a row (target not reachable, rollout stuck) after "
        "which the study stops as Failed and the original configuration is restored.",
        ge=1,
        le=50,
    )
    schedule_timeout_seconds: int = Field(
        default=300,
        description="Longest a pod of the measured workload (the canary, or the target "
        "under InPlace) may stay Unschedulable: past it the study fails with the "
        "scheduler's message and frees the measurement slot and the canary's resources. "
        "Counted from when the pod's own condition says it became Unschedulable, so an "
        "operator restart does not start the wait over.",
        ge=5,
        le=86400,
    )
    verify_seconds: int = Field(
        default=300,
        description="After a write-back, how long the target is watched: crash-looping or "
        "unready pods, or a p99 or error rate over the SLA (production's in Prometheus "
        "with load.source prometheus, else a light client probe, 2 req/s a pod, in "
        "windows that hold 100 of its requests) restore the original configuration and "
        "end the study as RolledBack. 0 skips the "
        "watch; the write-back's rollout is still awaited.",
        ge=0,
        le=86400,
    )
    write_back_deadline_seconds: int = Field(
        default=900,
        description="Longest the write-back (the apply and its rollout, or the live apply "
        "on every pod) may take; past it the write-back is rolled back and the step ends "
        "in a condition (reason WriteBackTimedOut) instead of waiting on.",
        ge=1,
        le=86400,
    )
    restore_deadline_seconds: int = Field(
        default=900,
        description="Longest putting the original configuration back may take (on failure, "
        "rollback, a spec change or deletion); past it the step ends in a condition (reason "
        "RestoreTimedOut) and is retried, and deletion goes ahead saying what it left.",
        ge=1,
        le=86400,
    )
    seed: int = Field(default=0, description="Seed of the sampler and the load generator.", ge=0)
    finalists: int = Field(
        default=3,
        description="After the trials, the best this many distinct configurations are "
        "measured again against the original (the incumbent), interleaved. 0 turns the "
        "confirmation off: the study's best is written back unproven, and only when its "
        "study figure is at least minGainPercent above the incumbent's.",
        ge=0,
        le=MAX_FINALISTS,
    )
    confirm_rounds: int = Field(
        default=3,
        description="Interleaved rounds of that re-measurement: each round measures every "
        "finalist and then the incumbent, with the same load seed.",
        ge=3,
        le=MAX_CONFIRM_ROUNDS_LIMIT,
    )
    max_confirm_rounds: int = Field(
        default=DEFAULT_MAX_CONFIRM_ROUNDS,
        description="Adaptive confirmation: after confirmRounds, further rounds are "
        "measured while the verdict is undecided (a finalist's gain interval reaches across "
        "minGainPercent), up to this many rounds in all. Equal to confirmRounds: a fixed "
        "number of rounds.",
        ge=3,
        le=MAX_CONFIRM_ROUNDS_LIMIT,
    )
    min_gain_percent: float = Field(
        default=5.0,
        description="Write back (or recommend) a finalist only when the lower bound of its "
        "gain over the incumbent (95 % interval over the rounds) is at least this; "
        "otherwise the study ends Converged with reason NoSignificantGain.",
        ge=0.0,
        le=1000.0,
    )

    window: WindowSpec | None = Field(
        default=None,
        description="Maintenance windows: trials (and confirmation rounds) start only "
        "inside one, and only when it still holds trialDeadlineSeconds; outside, the study "
        "waits (Reconciling, reason OutsideWindow) and sends no load. Unset: any time.",
    )
    retune: str = Field(
        default="Never",
        description="When a Converged study starts over: Never; OnSLABreach (needs "
        "load.source prometheus: the target's p99 or error rate over retuneWindow, checked "
        "once per window, breaks the SLA); or a 5-field cron schedule. The new study's "
        "incumbent is the configuration the last one wrote back.",
        min_length=5,
        max_length=128,
    )
    retune_window: str = Field(
        default="10m",
        description="OnSLABreach: the window the target's p99 is read over, and the time "
        "between two checks (a number and s, m or h; 1m to 168h).",
        max_length=8,
    )

    @model_validator(mode="after")
    def _rounds_ordered(self) -> TuningSpec:
        if self.max_confirm_rounds < self.confirm_rounds:
            raise ValueError(_ROUNDS_MESSAGE)
        return self

    @model_validator(mode="after")
    def _schedules_usable(self) -> TuningSpec:
        window = self.window
        if window is not None and window.duration_minutes * 60 < self.trial_deadline_seconds:
            raise ValueError(
                f"{_WINDOW_DEADLINE_MESSAGE} ({window.duration_minutes} min < "
                f"{self.trial_deadline_seconds} s)"
            )
        if self.retune not in ("Never", "OnSLABreach"):
            if len(self.retune.split()) != 5:
                raise ValueError(f"{_RETUNE_MESSAGE}; got {self.retune!r}")
            _check_cron(self.retune, "tuning.retune")
        duration_seconds(self.retune_window)
        return self


_IN_PLACE_BUDGET_MESSAGE = (
    "load.maxRps (the load budget per pod, req/s) is required when tuning.strategy is "
    "InPlace: the trials' load lands on production pods beside their live traffic"
)


_CEL_REFERENCE = "!has(self.runtime) || self.runtime.kind == 'Reference'"
_LIVE_ENDPOINT_MESSAGE = (
    "apply.live (port and path of the admin endpoint) is required when apply.method is Live "
    "and runtime.kind is Reference"
)
_LIVE_ADAPTER_MESSAGE = (
    "apply.live is for runtime.kind Reference only: with another runtime the operator "
    "reaches the runtime's own control API (remove apply.live)"
)
_ROLLOUT_MESSAGE = (
    f"apply.method Live is for runtime.kind Reference, {_kinds(LIVE_RUNTIMES)}; "
    f"{_kinds(ROLLOUT_RUNTIMES)} are tuned by rollout: set apply.method Env and read the "
    "variables in the container (e.g. args: --max-num-seqs=$(MAX_BATCH_SIZE))"
)
_LIVE_EXTRA_MESSAGE = (
    "parameters.extra needs apply.method Env or runtime.kind Reference: a runtime's live "
    "control sets maxBatchSize and maxQueueTimeMs only"
)
_HTTPS_LIVE_MESSAGE = (
    "load.endpoint.scheme https takes apply.method Env, or Live with runtime.kind Reference "
    "and an apply.live port other than load.endpoint.port: Live admin calls are plain http, "
    "and a runtime's live control is reached on the inference port"
)
# the protocols that bring their own path (v2: /v2/models/MODEL/infer, OpenAI's)
PATHED_LOAD_PROTOCOLS = MODEL_LOAD_PROTOCOLS
_PATH_MESSAGE = (
    f"load.endpoint.path is required for runtime.kind {_kinds(PATHLESS_RUNTIMES)} with "
    "load.protocol Runtime or Template; the other runtimes default it to their own "
    f"inference path, as load.protocol {', '.join(PATHED_LOAD_PROTOCOLS)} do"
)


def runtime_problems(spec: InferenceServiceSpec) -> list[tuple[bool, str]]:
    """The spec-wide runtime rules, as the CEL rules above state them: (broken, message)."""
    kind = spec.runtime.kind
    live = spec.apply.method == "Live"
    reference = kind == "Reference"
    return [
        (live and reference and spec.apply.live is None, _LIVE_ENDPOINT_MESSAGE),
        (live and not reference and spec.apply.live is not None, _LIVE_ADAPTER_MESSAGE),
        (live and not reference and kind not in LIVE_RUNTIMES, _ROLLOUT_MESSAGE),
        (live and not reference and bool(spec.parameters.extra), _LIVE_EXTRA_MESSAGE),
        (
            spec.load.endpoint.path is None
            and kind in PATHLESS_RUNTIMES
            and spec.load.protocol not in PATHED_LOAD_PROTOCOLS,
            _PATH_MESSAGE,
        ),
        (
            live
            and spec.load.endpoint.scheme == "https"
            and (spec.apply.live is None or spec.apply.live.port == spec.load.endpoint.port),
            _HTTPS_LIVE_MESSAGE,
        ),
    ]


class InferenceServiceSpec(BaseModel):
    """Tunes the dynamic batching of a model server for the most effective throughput
    within a p99 latency SLA."""

    model_config = _model_config(
        cel(
            "self.apply.method != 'Env' || !has(self.parameters.extra) || "
            "self.parameters.extra.all(p, has(p.env))",
            "every parameters.extra entry needs env when apply.method is Env",
        ),
        cel(
            "!(self.target.kind in ['InferenceService', 'RayService']) || "
            "self.tuning.strategy == 'InPlace'",
            PARENT_STRATEGY_MESSAGE,
        ),
        cel("self.target.kind != 'RayService' || self.apply.method == 'Live'", RAY_APPLY_MESSAGE),
        cel(
            "!has(self.tuning) || !has(self.tuning.strategy) || "
            "self.tuning.strategy != 'InPlace' || has(self.load.maxRps)",
            _IN_PLACE_BUDGET_MESSAGE,
        ),
        cel(
            f"self.apply.method != 'Live' || !({_CEL_REFERENCE}) || has(self.apply.live)",
            _LIVE_ENDPOINT_MESSAGE,
        ),
        cel(
            f"self.apply.method != 'Live' || {_CEL_REFERENCE} || !has(self.apply.live)",
            _LIVE_ADAPTER_MESSAGE,
        ),
        cel(
            f"self.apply.method != 'Live' || {_CEL_REFERENCE} || "
            f"self.runtime.kind in {_cel_list(LIVE_RUNTIMES)}",
            _ROLLOUT_MESSAGE,
        ),
        cel(
            f"self.apply.method != 'Live' || {_CEL_REFERENCE} || "
            "!has(self.parameters.extra) || size(self.parameters.extra) == 0",
            _LIVE_EXTRA_MESSAGE,
        ),
        cel(
            "has(self.load.endpoint.path) || (has(self.runtime) && "
            f"!(self.runtime.kind in {_cel_list(PATHLESS_RUNTIMES)})) || "
            f"(has(self.load.protocol) && self.load.protocol in "
            f"{_cel_list(PATHED_LOAD_PROTOCOLS)})",
            _PATH_MESSAGE,
        ),
        cel(
            "!has(self.load.endpoint.scheme) || self.load.endpoint.scheme != 'https' || "
            "self.apply.method != 'Live' || "
            "(has(self.apply.live) && self.apply.live.port != self.load.endpoint.port)",
            _HTTPS_LIVE_MESSAGE,
        ),
        cel(
            "!has(self.tuning) || !has(self.tuning.retune) || "
            "self.tuning.retune != 'OnSLABreach' || "
            "(has(self.load.source) && self.load.source == 'prometheus')",
            _RETUNE_SOURCE_MESSAGE,
        ),
        cel(
            "!(has(self.sla.ttftP99Ms) || has(self.sla.tpotP99Ms)) || "
            "(has(self.load.protocol) && "
            f"self.load.protocol in {_cel_list(STREAM_LOAD_PROTOCOLS)})",
            _TOKEN_SLA_MESSAGE,
        ),
        cel(
            "!has(self.tuning) || !has(self.tuning.retune) || "
            "self.tuning.retune != 'OnSLABreach' || !has(self.load.prometheus) || "
            "(has(self.runtime) && has(self.runtime.kind) && self.runtime.kind == 'VLLM' && "
            "!has(self.load.prometheus.latencyMetric) && "
            "!has(self.load.prometheus.requestsMetric)) || "
            "((!has(self.sla.ttftP99Ms) || has(self.load.prometheus.ttftMetric)) && "
            "(!has(self.sla.tpotP99Ms) || has(self.load.prometheus.tpotMetric)))",
            _RETUNE_TOKENS_MESSAGE,
        ),
        cel(
            f"!has(self.load.protocol) || !(self.load.protocol in "
            f"{_cel_list(MODEL_LOAD_PROTOCOLS)}) || "
            "(has(self.runtime) && has(self.runtime.model)) || "
            "(has(self.load.request) && has(self.load.request.model))",
            _REQUEST_MODEL_MESSAGE,
        ),
    )

    target: TargetRef = Field(description="The workload to tune.")
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="The inference server the target runs (Reference when unset).",
    )
    sla: SLASpec = Field(description="The latency and error SLA.")
    parameters: ParametersSpec = Field(
        default_factory=lambda: ParametersSpec.model_validate({}),
        description="The search space.",
    )
    apply: ApplySpec = Field(
        default_factory=lambda: ApplySpec.model_validate({}),
        description="How a configuration reaches the pods.",
    )
    load: LoadSpec = Field(description="How a trial is measured.")
    tuning: TuningSpec = Field(
        default_factory=lambda: TuningSpec.model_validate({}),
        description="How the study runs and what happens to its result.",
    )

    suspend: bool = Field(
        default=False,
        description="Pause the study at its next safe point (between trials): the canary "
        "is deleted and an InPlace target gets its original configuration back; no "
        "re-tune starts. false resumes the study where it stopped.",
    )

    @model_validator(mode="after")
    def _retune_needs_prometheus(self) -> InferenceServiceSpec:
        if self.tuning.retune != "OnSLABreach":
            return self
        if self.load.source != "prometheus":
            raise ValueError(_RETUNE_SOURCE_MESSAGE)
        prometheus = self.load.prometheus
        if prometheus is None:
            return self  # refused by load's own rule
        unread = (self.sla.ttft_p99_ms is not None and not prometheus.ttft_metric) or (
            self.sla.tpot_p99_ms is not None and not prometheus.tpot_metric
        )
        if unread and not reads_vllm_metrics(self):
            raise ValueError(_RETUNE_TOKENS_MESSAGE)
        return self

    @model_validator(mode="after")
    def _token_targets_on_streams(self) -> InferenceServiceSpec:
        streams = self.load.protocol in STREAM_LOAD_PROTOCOLS
        if self.sla.to_sla().token_targets and not streams:
            raise ValueError(_TOKEN_SLA_MESSAGE)
        if self.load.protocol in MODEL_LOAD_PROTOCOLS and self.request_model() is None:
            raise ValueError(_REQUEST_MODEL_MESSAGE)
        return self

    @model_validator(mode="after")
    def _runtime_fits_the_method(self) -> InferenceServiceSpec:
        for broken, message in runtime_problems(self):
            if broken:
                raise ValueError(message)
        return self

    @model_validator(mode="after")
    def _env_for_extras(self) -> InferenceServiceSpec:
        if self.apply.method == "Env":
            missing = [p.name for p in self.parameters.extra if p.env is None]
            if missing:
                raise ValueError(
                    "every parameters.extra entry needs env when apply.method is Env; "
                    f"missing for: {', '.join(missing)}"
                )
        if self.tuning.strategy == "InPlace" and self.load.max_rps is None:
            raise ValueError(_IN_PLACE_BUDGET_MESSAGE)
        return self

    @model_validator(mode="after")
    def _parent_combinations(self) -> InferenceServiceSpec:
        if self.target.is_parent and self.tuning.strategy != "InPlace":
            raise ValueError(PARENT_STRATEGY_MESSAGE)
        if self.target.kind == "RayService" and self.apply.method != "Live":
            raise ValueError(RAY_APPLY_MESSAGE)
        return self

    def request_model(self) -> str | None:
        """The model the requests name: load.request.model, else runtime.model."""
        request = self.load.request
        if request is not None and request.model is not None:
            return request.model
        return self.runtime.model

    @property
    def wait_pinned(self) -> bool:
        """Whether the runtime has no queue wait (vLLM batches continuously: a request
        joins the running batch at the next engine step), so the axis stays at 0 whatever
        parameters.maxQueueTimeMs says, and no variable carries it."""
        return self.runtime.kind == "VLLM"

    def queue_bounds(self) -> tuple[float, float]:
        """The queue-wait bounds searched: parameters.maxQueueTimeMs, or 0 when pinned."""
        if self.wait_pinned:
            return (0.0, 0.0)
        bounds = self.parameters.max_queue_time_ms
        return (bounds.min, bounds.max)

    def env_names(self) -> dict[str, str]:
        """Parameter name → environment variable, for method Env (no queue wait's where
        it is pinned)."""
        names = {MAX_BATCH_SIZE: self.apply.env.max_batch_size}
        if not self.wait_pinned:
            names[MAX_QUEUE_TIME_MS] = self.apply.env.max_queue_time_ms
        for p in self.parameters.extra:
            if p.env is not None:
                names[p.name] = p.env
        return names


Params = dict[str, float | int]


def batching_config(params: Params) -> BatchingConfig:
    return BatchingConfig(
        max_batch_size=int(params[MAX_BATCH_SIZE]),
        max_queue_time_ms=float(params[MAX_QUEUE_TIME_MS]),
    )


def explain_validation_error(error: ValidationError) -> str:
    """One line naming each bad field (camelCase, as the user wrote it) and what is allowed."""
    parts: list[str] = []
    for item in error.errors():
        location = ""
        for part in item["loc"]:
            location += f"[{part}]" if isinstance(part, int) else f".{part}"
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"spec{location}: {message}" if location else message)
    return "; ".join(parts)


def parse_spec(raw: Any) -> InferenceServiceSpec:
    """Validate a spec as it came from the API server; raises ValidationError."""
    return InferenceServiceSpec.model_validate(raw if raw is not None else {})


def reads_vllm_metrics(spec: InferenceServiceSpec) -> bool:
    """Whether a Prometheus source reads vLLM's own series (its TTFT and TPOT histograms
    among them): runtime.kind VLLM, with no latency or request metric of the spec's own."""
    prometheus = spec.load.prometheus
    return (
        spec.runtime.kind == "VLLM"
        and prometheus is not None
        and not (prometheus.latency_metric or prometheus.requests_metric)
    )
