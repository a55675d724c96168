"""Which metrics the operator reads through Prometheus (load.source prometheus): a
runtime target's own names and units (`PrometheusStepSource.for_runtime`: MLServer's
seconds, Ray Serve's milliseconds and its export delay, vLLM's TTFT and TPOT
histograms), the reference server's otherwise. Construction only, no I/O: `KubeWorld` queries."""

from __future__ import annotations

from typing import Any

from batchpilot.capacity.prometheus import (
    DEFAULT_LATENCY_METRIC,
    DEFAULT_REQUESTS_METRIC,
    PrometheusStepSource,
    reference_metrics,
)
from batchpilot.capacity.prometheus_http import AddressGuard
from batchpilot.operator.runtimes import adapter
from batchpilot.operator.spec import InferenceServiceSpec, reads_vllm_metrics
from batchpilot.runtimes.vllm.metrics import vllm_metrics


def prometheus_source(
    spec: InferenceServiceSpec,
    *,
    selector: str | None = None,
    address_guard: AddressGuard | None = None,
) -> PrometheusStepSource | None:
    """The step source of `spec`, None unless load.source is prometheus.

    A target of a runtime with an adapter (Triton, RayServe, TorchServe, MLServer), or a
    vLLM engine, is read in that runtime's metrics for runtime.model; where
    load.prometheus names the metrics itself (latencyMetric, requestsMetric) those win,
    read as the reference server's are (a histogram in seconds, a counter with an
    outcome label), and ttftMetric, tpotMetric name a token-stream server's. Raises
    NoLatencyHistogram (a ValueError) for a runtime that exports no latency histogram
    (Triton 2.51, TorchServe), saying so. `selector` replaces load.prometheus.selector
    (the operator narrows it to the measured pods); `address_guard` checks every address
    a query connects to (the operator's URL policy)."""
    prometheus = spec.load.prometheus
    if spec.load.source != "prometheus" or prometheus is None:
        return None
    if selector is None:
        selector = prometheus.selector
    runtime = adapter(spec)
    named = bool(prometheus.latency_metric or prometheus.requests_metric)
    # a token-stream server's TTFT and TPOT histograms, where named (else the runtime's)
    tokens = {
        field: name
        for field, name in (
            ("ttft_histogram", prometheus.ttft_metric),
            ("tpot_histogram", prometheus.tpot_metric),
        )
        if name
    }
    options: dict[str, Any] = {
        "selector": selector,
        "scrape_interval_s": prometheus.scrape_interval_seconds,
        "ca_pem": prometheus.ca_bundle,
        "address_guard": address_guard,
    }
    if reads_vllm_metrics(spec):
        metrics = vllm_metrics(spec.runtime.model)
        return PrometheusStepSource(
            prometheus.url, metrics=metrics.model_copy(update=tokens), **options
        )
    if runtime is not None and spec.runtime.kind != "Reference" and not named:
        return PrometheusStepSource.for_runtime(
            prometheus.url, runtime, model=spec.runtime.model, tokens=tokens, **options
        )
    # unset metric names keep the reference server's
    metrics = reference_metrics(
        prometheus.latency_metric or DEFAULT_LATENCY_METRIC,
        prometheus.requests_metric or DEFAULT_REQUESTS_METRIC,
        prometheus.ok_outcome,
    )
    return PrometheusStepSource(
        prometheus.url, metrics=metrics.model_copy(update=tokens), **options
    )
