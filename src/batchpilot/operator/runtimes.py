"""What spec.runtime means to the operator: which adapter of `batchpilot.runtimes` speaks
to the target's pods, on which ports, with which requests, and how a winner is kept.
Pure decisions, no I/O: `KubeWorld` does the calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final, Literal

from batchpilot.loadgen.protocols import (
    DEFAULT_MAX_TOKENS,
    REFERENCE,
    REFERENCE_PATH,
    RequestProtocol,
    kserve_v2,
    openai,
    openai_stream,
    template_protocol,
    with_headers,
)
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.operator import envknobs
from batchpilot.operator.spec import (
    STREAM_LOAD_PROTOCOLS,
    InferenceServiceSpec,
    RuntimeKind,
    batching_config,
)
from batchpilot.operator.status import PersistAdvice
from batchpilot.runtimes.base import Knob, Runtime, RuntimeControl
from batchpilot.runtimes.registry import get_runtime

# spec.runtime.kind -> the adapter's registry name; VLLM and Generic have no adapter
# (they are tuned by rollout, their knobs being start-up arguments).
REGISTRY_NAMES: Final[Mapping[RuntimeKind, str]] = {
    "Reference": "reference",
    "Triton": "triton",
    "RayServe": "ray",
    "TorchServe": "torchserve",
    "MLServer": "mlserver",
}
DEFAULT_TRITON_METRICS_PORT = 8002
DEFAULT_RAY_DASHBOARD_PORT = 8265
# Kinds whose adapter reads a remote pod's live knobs over the network (Triton's model
# config, Ray Serve's user_config, TorchServe's management describe). MLServer reports
# its values only in its bundled model's answers; vLLM and Generic report none.
READBACK_RUNTIMES: Final = ("Triton", "RayServe", "TorchServe")

# "engine": vLLM reports no configuration; its own gauge of running sequences under a
# burst of more streams than the cap shows whether it runs that cap
EnvReadback = Literal["apply.live", "runtime", "engine"]


def adapter(spec: InferenceServiceSpec) -> Runtime | None:
    """The runtime's adapter, None for kinds without one (VLLM, Generic)."""
    name = REGISTRY_NAMES.get(spec.runtime.kind)
    return None if name is None else get_runtime(name)


def live_adapter(spec: InferenceServiceSpec) -> Runtime | None:
    """The adapter that applies configurations live, None when the operator uses its own
    ways (method Env: the pod template; Reference with Live: apply.live)."""
    if spec.apply.method != "Live" or spec.runtime.kind == "Reference":
        return None
    return adapter(spec)


def wait_knob(spec: InferenceServiceSpec) -> Knob | None:
    """The runtime's own queue-wait knob (its name, unit, whole units or not); None for
    kinds without an adapter."""
    runtime = adapter(spec)
    if runtime is None:
        return None
    return next(k for k in runtime.knobs if k.canonical == "max_queue_time_ms")


def env_wait(spec: InferenceServiceSpec) -> envknobs.WaitEncoding:
    """How method Env writes the queue wait into apply.env.maxQueueTimeMs's variable."""
    return envknobs.wait_encoding(spec.apply.env.max_queue_time_ms, wait_knob(spec))


def env_readback(spec: InferenceServiceSpec) -> EnvReadback | None:
    """Where the knobs an Env rollout left on a pod are read back from: apply.live's
    admin endpoint (kind Reference), the runtime's own API (READBACK_RUNTIMES), vLLM's
    engine under a burst of streams (VLLM), or nowhere (MLServer, Generic, Reference
    without apply.live): then a pod that ignores the variables cannot be told from one
    that reads them."""
    if spec.apply.method != "Env":
        return None
    kind = spec.runtime.kind
    if kind == "Reference":
        return "apply.live" if spec.apply.live is not None else None
    if kind == "VLLM":
        return "engine" if spec.load.endpoint.scheme == "http" else None
    # a runtime's API is reached over plain http, as its live control is
    readable = kind in READBACK_RUNTIMES and spec.load.endpoint.scheme == "http"
    return "runtime" if readable else None


def pod_url(spec: InferenceServiceSpec, ip: str) -> str:
    """The base URL the load is sent to on the pod at `ip`: load.endpoint's scheme and port
    (an IPv6 address bracketed, as a URL needs it)."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"{spec.load.endpoint.scheme}://{host}:{spec.load.endpoint.port}"


def control_url(spec: InferenceServiceSpec, ip: str) -> str:
    """The base URL of a pod's inference server (the load's port) as a runtime's live
    control reaches it: plain http, the spec refusing Live control of an https endpoint."""
    return f"http://{ip}:{spec.load.endpoint.port}"


def control_for(runtime: Runtime, spec: InferenceServiceSpec, ip: str) -> RuntimeControl:
    """A control of the runtime on the pod at `ip`. Ports other than the inference port
    come from spec.runtime, defaulting to the runtime's own defaults."""
    url = control_url(spec, ip)
    model = spec.runtime.model
    kind = spec.runtime.kind
    if kind == "Triton":
        from batchpilot.runtimes.triton.adapter import TritonRuntime

        assert isinstance(runtime, TritonRuntime)
        port = spec.runtime.metrics_port or DEFAULT_TRITON_METRICS_PORT
        return runtime.control(url, model=model, metrics_url=f"http://{ip}:{port}/metrics")
    if kind == "RayServe":
        from batchpilot.runtimes.rayserve.adapter import RayServeRuntime

        assert isinstance(runtime, RayServeRuntime)
        port = spec.runtime.management_port or DEFAULT_RAY_DASHBOARD_PORT
        return runtime.control(url, model=model, dashboard_url=f"http://{ip}:{port}")
    return runtime.control(url, model=model)


def load_protocol(spec: InferenceServiceSpec) -> RequestProtocol | None:
    """The requests a trial sends, in load.protocol's terms: the runtime's own protocol for
    its model, KServe v2 with a tensor given by hand, OpenAI completions, token streams
    (their goodput counted against the SLA's TTFT and TPOT targets) or the body template,
    with load.request's headers, on load.endpoint.path when that is set, verifying an
    https endpoint with its CA bundle and server name. None keeps the reference server's
    requests on load.endpoint.path (kinds Reference and Generic over plain http). A v2
    protocol built from the model's metadata is the world's (`shaped_by_metadata`)."""
    kind = spec.runtime.kind
    load = spec.load
    request = load.request
    headers = dict(request.headers or {}) if request is not None else {}
    model = spec.request_model()
    protocol: RequestProtocol
    if load.protocol in STREAM_LOAD_PROTOCOLS:
        assert model is not None  # the spec's rule
        sla = spec.sla
        protocol = openai_stream(
            model,
            lengths=load.token_lengths(),
            chat=load.protocol == "OpenAIChatStream",
            sla=TokenSla(ttft_ms=sla.ttft_p99_ms, tpot_ms=sla.tpot_p99_ms),
            headers=headers,
        )
    elif load.protocol in ("OpenAI", "OpenAIChat"):
        assert model is not None  # the spec's rule
        max_tokens = request.max_tokens if request is not None else None
        protocol = openai(
            model,
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            chat=load.protocol == "OpenAIChat",
            headers=headers,
        )
    elif load.protocol == "V2":
        assert model is not None  # the spec's rule
        assert request is not None
        assert request.input_name is not None
        protocol = kserve_v2(
            model, input_name=request.input_name, features=request.features or 1, headers=headers
        )
    elif load.protocol == "Template":
        assert request is not None
        assert request.body_template is not None
        protocol = template_protocol(
            request.body_template,
            path=load.endpoint.path or inference_path(spec),
            headers=headers,
            require_size=False,
        )
    elif kind == "VLLM":
        assert model is not None  # the spec's rule
        protocol = openai(model, headers=headers)
    elif kind in ("Reference", "Generic"):
        if load.endpoint.scheme == "http" and not headers:
            return None
        reference = dataclasses.replace(REFERENCE, path=load.endpoint.path or REFERENCE_PATH)
        protocol = with_headers(reference, headers)
    else:
        runtime = adapter(spec)
        assert runtime is not None
        protocol = with_headers(runtime.protocol(spec.runtime.model), headers)
    return on_endpoint(protocol, spec)


def inference_path(spec: InferenceServiceSpec) -> str:
    """The runtime's own inference path for runtime.model (the reference server's for
    kinds without one)."""
    runtime = adapter(spec)
    if runtime is None or spec.runtime.kind == "Reference":
        return REFERENCE_PATH
    return runtime.protocol(spec.runtime.model).path


def on_endpoint(protocol: RequestProtocol, spec: InferenceServiceSpec) -> RequestProtocol:
    """`protocol` sent to load.endpoint: on its path when that is set, verifying an https
    endpoint with its CA bundle and server name."""
    endpoint = spec.load.endpoint
    if endpoint.path is not None:
        protocol = dataclasses.replace(protocol, path=endpoint.path)
    if endpoint.scheme == "https":
        protocol = dataclasses.replace(
            protocol, ca_pem=endpoint.ca_bundle, server_name=endpoint.server_name
        )
    return protocol


# the kinds whose own requests are KServe v2, built from the model's metadata
METADATA_RUNTIMES: Final = ("Triton", "MLServer")


def shaped_by_metadata(spec: InferenceServiceSpec) -> bool:
    """Whether a trial's requests are built from the served model's KServe v2 metadata
    (its inputs; on Triton its config's max_batch_size for the batch dimension), so a
    model of the user's own, whatever its inputs, takes them: load.protocol V2 without a
    tensor given by hand, and Triton's and MLServer's own requests."""
    load = spec.load
    if load.protocol == "V2":
        return load.request is None or load.request.input_name is None
    return load.protocol == "Runtime" and spec.runtime.kind in METADATA_RUNTIMES


def metadata_model(spec: InferenceServiceSpec) -> str:
    """The model whose metadata shapes the requests: load.request.model, else
    runtime.model, else the runtime's default."""
    return spec.request_model() or served_model(spec)


# what to set when a server refuses the requests, per load.protocol
_REQUEST_FIELDS: Final[Mapping[str, str]] = {
    "Runtime": "load.protocol V2 (requests from the model's metadata) or Template with "
    "load.request.bodyTemplate (a body of the model's own)",
    "V2": "load.request.inputName and features (one FP32 tensor), or load.protocol "
    "Template with load.request.bodyTemplate (a body of the model's own)",
    "OpenAI": "load.request.model and maxTokens, or load.protocol Template with "
    "load.request.bodyTemplate",
    "OpenAIStream": "load.request.model, load.promptTokens and load.outputTokens",
    "Template": "load.request.bodyTemplate",
}


def refusal_message(spec: InferenceServiceSpec, refusal: str) -> str:
    """What a study says when the server refused its first requests (a 4xx, or a 5xx to
    every one of them twice): the server's words, the requests it was sent, and the
    fields that set them."""
    protocol = spec.load.protocol
    if spec.runtime.kind in METADATA_RUNTIMES and protocol == "Runtime":
        protocol = "V2"  # these runtimes' own requests are the model's metadata's
    key = {"OpenAIChat": "OpenAI", "OpenAIChatStream": "OpenAIStream"}.get(protocol, protocol)
    return (
        f"the server refused the study's first requests (load.protocol {spec.load.protocol}, "
        f"runtime.kind {spec.runtime.kind}): {refusal}; set {_REQUEST_FIELDS[key]}, and "
        "load.endpoint.path if the path is wrong"
    )


def served_model(spec: InferenceServiceSpec) -> str:
    """runtime.model, else the name of the runtime's bundled model."""
    runtime = adapter(spec)
    model = spec.runtime.model or (runtime.default_model if runtime is not None else None)
    if model is None:
        raise ValueError(f"runtime.kind {spec.runtime.kind} names no model: set runtime.model")
    return model


def persist_advice(
    spec: InferenceServiceSpec, params: Mapping[str, float | int]
) -> PersistAdvice | None:
    """How to make a live write-back survive a pod restart, for status.persist; None
    when the write-back itself persists (method Env writes the pod template)."""
    runtime = live_adapter(spec)
    if runtime is None:
        return None
    persistence = runtime.persistence(batching_config(dict(params)), model=spec.runtime.model)
    return PersistAdvice(
        runtime=spec.runtime.kind,
        kind=persistence.kind,
        where=persistence.where,
        snippet=persistence.snippet,
    )
