"""Which metrics the operator reads through Prometheus (load.source prometheus): a
runtime target's own names and units (`PrometheusStepSource.for_runtime`: MLServer's
seconds, Ray Serve's milliseconds and its export delay), the reference server's
otherwise. Construction only, no I/O: `KubeWorld` queries."""

from __future__ import annotations

from typing import Any

from batchpilot.capacity.prometheus import PrometheusStepSource
from batchpilot.capacity.prometheus_http import AddressGuard
from batchpilot.operator.runtimes import adapter
from batchpilot.operator.spec import InferenceServiceSpec


def prometheus_source(
    spec: InferenceServiceSpec,
    *,
    selector: str | None = None,
    address_guard: AddressGuard | None = None,
) -> PrometheusStepSource | None:
    """The step source of `spec`, None unless load.source is prometheus.

    A target of a runtime with an adapter (Triton, RayServe, TorchServe, MLServer) is
    read in that runtime's metrics for runtime.model; where load.prometheus names the
    metrics itself (latencyMetric, requestsMetric) those win, read as the reference
    server's are (a histogram in seconds, a counter with an outcome label). Raises
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
    if runtime is not None and spec.runtime.kind != "Reference" and not named:
        return PrometheusStepSource.for_runtime(
            prometheus.url,
            runtime,
            model=spec.runtime.model,
            selector=selector,
            scrape_interval_s=prometheus.scrape_interval_seconds,
            ca_pem=prometheus.ca_bundle,
            address_guard=address_guard,
        )
    # unset metric names keep the source's defaults: the reference server's metrics
    options: dict[str, Any] = {
        "ok_outcome": prometheus.ok_outcome,
        "selector": selector,
    }
    if prometheus.latency_metric:
        options["latency_metric"] = prometheus.latency_metric
    if prometheus.requests_metric:
        options["requests_metric"] = prometheus.requests_metric
    if prometheus.scrape_interval_seconds is not None:
        options["scrape_interval_s"] = prometheus.scrape_interval_seconds
    return PrometheusStepSource(
        prometheus.url, ca_pem=prometheus.ca_bundle, address_guard=address_guard, **options
    )
