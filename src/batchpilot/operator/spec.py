"""The InferenceService spec as typed models: the one source of truth for the CRD's
schema (`batchpilot.operator.crd` renders it) and the operator's second validation.

Field names are snake_case in Python and camelCase in Kubernetes (aliases). The CEL
rules sit beside the model they check so that schema and rule cannot drift apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from batchpilot.loadgen.arrivals import (
    MMPP,
    ArrivalKind,
    Constant,
    Poisson,
    TraceError,
    trace_from_timestamps,
)
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    MAX_BATCH_SIZE_LIMIT,
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


class TargetRef(BaseModel):
    """The workload whose batching is tuned."""

    model_config = _model_config()

    kind: Literal["Deployment", "StatefulSet"] = Field(
        default="Deployment", description="Kind of the workload: Deployment or StatefulSet."
    )
    name: str = Field(
        description="Name of the workload in the InferenceService's namespace.",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    container: str | None = Field(
        default=None,
        description="Container that serves the model; the pod's first container when unset.",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
    )


class SLASpec(BaseModel):
    """What a sustained request rate must keep to count as effective throughput."""

    model_config = _model_config(
        cel("self.p99LatencyMs > 0.0", "sla.p99LatencyMs must be a positive number of ms"),
        cel(
            "self.maxErrorRate >= 0.0 && self.maxErrorRate < 1.0",
            "sla.maxErrorRate is a fraction: at least 0 and below 1 (0.001 = 0.1%)",
        ),
    )

    p99_latency_ms: float = Field(
        description="Highest allowed 99th-percentile end-to-end latency, in milliseconds.",
        gt=0.0,
        le=3_600_000.0,
    )
    max_error_rate: float = Field(
        default=0.001,
        description="Highest allowed fraction of failed or timed-out requests, in [0, 1).",
        ge=0.0,
        lt=1.0,
    )

    def to_sla(self) -> SLA:
        return SLA(p99_ms=self.p99_latency_ms, max_error_rate=self.max_error_rate)


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
    """Bounds of max_queue_time_ms (longest wait for a batch to fill), inclusive."""

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
        description="Range of max_queue_time_ms.",
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
        description="Variable holding max_queue_time_ms.",
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )


class HTTPEndpoint(BaseModel):
    """A port and path on every pod."""

    model_config = _model_config()

    port: int = Field(description="Container port.", ge=1, le=65535)
    path: str = Field(description="HTTP path.", max_length=256, pattern=HTTP_PATH_PATTERN)


class ApplySpec(BaseModel):
    """How a configuration reaches the pods."""

    model_config = _model_config(
        cel(
            "self.method != 'Live' || has(self.live)",
            "apply.live (port and path of the admin endpoint) is required when apply.method "
            "is Live",
        ),
    )

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
        description="Admin endpoint used by method Live; it accepts GET and PUT of "
        'JSON {"max_batch_size": ..., "max_queue_time_ms": ...}.',
    )

    @model_validator(mode="after")
    def _live_needs_endpoint(self) -> ApplySpec:
        if self.method == "Live" and self.live is None:
            raise ValueError("apply.live (port and path) is required when apply.method is Live")
        return self


class RequestClassSpec(BaseModel):
    """One kind of request in the load mix."""

    model_config = _model_config()

    weight: float = Field(description="Relative weight in the mix (> 0).", gt=0.0)
    size: int = Field(description="Input size (rows or tokens) of the request.", ge=1, le=65536)


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
    )

    url: str = Field(
        description="Base URL of the Prometheus API; https is verified (see caBundle), "
        "without a query or fragment.",
        min_length=8,
        max_length=512,
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM CA certificates that sign an https Prometheus's certificate; the "
        "operator's trust store when unset. Verification is always on. CA certificates are "
        "public, so they are given here rather than read from a Secret.",
        min_length=1,
        max_length=65536,
    )
    latency_metric: str | None = Field(
        default=None,
        description="Latency histogram (seconds) to read p99 from; the reference server's "
        "when unset.",
        max_length=256,
    )
    requests_metric: str | None = Field(
        default=None,
        description="Counter of requests with an outcome label; the reference server's when unset.",
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
    scrape_interval_seconds: float | None = Field(
        default=None,
        description="How often Prometheus scrapes the target, s; read from Prometheus's "
        "configuration when unset. load.stepSeconds must be at least 4 intervals.",
        gt=0.0,
        le=3600.0,
    )

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


class LoadSpec(BaseModel):
    """How a trial is measured."""

    model_config = _model_config(
        cel(
            "self.source != 'prometheus' || has(self.prometheus)",
            "load.prometheus (url) is required when load.source is prometheus",
        ),
    )

    endpoint: HTTPEndpoint = Field(description="Inference endpoint the load is sent to.")
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

    @model_validator(mode="after")
    def _prometheus_needs_url(self) -> LoadSpec:
        if self.source == "prometheus" and self.prometheus is None:
            raise ValueError("load.prometheus (url) is required when load.source is prometheus")
        return self

    def mix(self) -> RequestMix:
        return RequestMix(
            classes=tuple(RequestClass(weight=r.weight, size=r.size) for r in self.requests)
        )


# Adaptive confirmation's cap: 3 rounds, then up to this many while undecided.
DEFAULT_MAX_CONFIRM_ROUNDS = 6
_ROUNDS_MESSAGE = "tuning.maxConfirmRounds must be greater than or equal to tuning.confirmRounds"


class TuningSpec(BaseModel):
    """How the study runs and what happens to its result."""

    model_config = _model_config(
        cel("self.maxConfirmRounds >= self.confirmRounds", _ROUNDS_MESSAGE),
    )

    strategy: Literal["Canary", "InPlace"] = Field(
        default="Canary",
        description="Canary: tune a clone of the target that the Service does not select, "
        "then delete it. InPlace: tune the target itself and restore it on failure.",
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
        default="TPE", description="Optuna sampler that proposes the next configuration."
    )
    write_back: Literal["Apply", "Recommend"] = Field(
        default="Apply",
        description="Apply: write the best values onto the target (server-side apply, field "
        "manager batchpilot). Recommend: status only; the target is left as it was.",
    )
    trial_deadline_seconds: int = Field(
        default=900,
        description="Longest a trial (apply, rollout and measurement) may take.",
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
    seed: int = Field(default=0, description="Seed of the sampler and the load generator.", ge=0)
    finalists: int = Field(
        default=3,
        description="After the trials, the best this many distinct configurations are "
        "measured again against the original (the incumbent), interleaved. 0 turns the "
        "confirmation off: the study's best is written back unproven.",
        ge=0,
        le=10,
    )
    confirm_rounds: int = Field(
        default=3,
        description="Interleaved rounds of that re-measurement: each round measures every "
        "finalist and then the incumbent, with the same load seed.",
        ge=3,
        le=20,
    )
    max_confirm_rounds: int = Field(
        default=DEFAULT_MAX_CONFIRM_ROUNDS,
        description="Adaptive confirmation: after confirmRounds, further rounds are "
        "measured while the verdict is undecided (a finalist's gain interval reaches across "
        "minGainPercent), up to this many rounds in all. Equal to confirmRounds: a fixed "
        "number of rounds.",
        ge=3,
        le=20,
    )
    min_gain_percent: float = Field(
        default=5.0,
        description="Write back (or recommend) a finalist only when the lower bound of its "
        "gain over the incumbent (95 % interval over the rounds) is at least this; "
        "otherwise the study ends Converged with reason NoSignificantGain.",
        ge=0.0,
        le=1000.0,
    )

    @model_validator(mode="after")
    def _rounds_ordered(self) -> TuningSpec:
        if self.max_confirm_rounds < self.confirm_rounds:
            raise ValueError(_ROUNDS_MESSAGE)
        return self


class InferenceServiceSpec(BaseModel):
    """Tunes the dynamic batching of a model server for the most effective throughput
    within a p99 latency SLA."""

    model_config = _model_config(
        cel(
            "self.apply.method != 'Env' || !has(self.parameters.extra) || "
            "self.parameters.extra.all(p, has(p.env))",
            "every parameters.extra entry needs env when apply.method is Env",
        ),
    )

    target: TargetRef = Field(description="The workload to tune.")
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

    @model_validator(mode="after")
    def _env_for_extras(self) -> InferenceServiceSpec:
        if self.apply.method == "Env":
            missing = [p.name for p in self.parameters.extra if p.env is None]
            if missing:
                raise ValueError(
                    "every parameters.extra entry needs env when apply.method is Env; "
                    f"missing for: {', '.join(missing)}"
                )
        return self

    def env_names(self) -> dict[str, str]:
        """Parameter name → environment variable, for method Env."""
        names = {
            MAX_BATCH_SIZE: self.apply.env.max_batch_size,
            MAX_QUEUE_TIME_MS: self.apply.env.max_queue_time_ms,
        }
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
