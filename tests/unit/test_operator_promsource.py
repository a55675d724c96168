"""load.source prometheus: the PromQL the operator builds for each spec.runtime.kind,
in the runtime's own metric names and units, and the runtimes it cannot read a p99
from, refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.capacity.prometheus import NoLatencyHistogram
from batchpilot.operator.promsource import prometheus_source
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec

PROMETHEUS = {"url": "http://prometheus:9090", "selector": 'namespace="prod"'}


def spec(
    runtime: dict[str, Any] | None,
    *,
    method: str = "Env",
    source: str = "prometheus",
    **prometheus: Any,
) -> InferenceServiceSpec:
    endpoint: dict[str, Any] = {"port": 8000}
    if runtime is None or runtime["kind"] in ("Reference", "Generic"):
        endpoint["path"] = "/v1/predict"
    raw: dict[str, Any] = {
        "target": {"name": "model"},
        "sla": {"p99LatencyMs": 200},
        "apply": {"method": method},
        "load": {
            "endpoint": endpoint,
            "source": source,
            "prometheus": {**PROMETHEUS, **prometheus},
        },
    }
    if runtime is not None:
        raw["runtime"] = runtime
    return parse_spec(raw)


def p99_and_total(target: InferenceServiceSpec) -> tuple[str, str, str]:
    source = prometheus_source(target)
    assert source is not None
    queries = source.queries(10.0)
    return queries["p99"], queries["total_rps"], source.metrics.latency_unit


def test_mlserver_is_read_in_its_own_http_metrics_in_seconds() -> None:
    p99, total, unit = p99_and_total(spec({"kind": "MLServer", "model": "iris"}))
    assert p99 == (
        "histogram_quantile(0.99, sum by (le) (rate(rest_server_request_duration_seconds_bucket"
        '{namespace="prod",path="/v2/models/{model_name}/infer"}[10000ms])))'
    )
    assert total == (
        'sum(rate(rest_server_requests_total{namespace="prod",'
        'path="/v2/models/{model_name}/infer"}[10000ms]))'
    )
    assert unit == "s"


def test_ray_serve_is_read_in_milliseconds_for_the_models_application() -> None:
    target = spec({"kind": "RayServe", "model": "shop/ranker"}, method="Live")
    p99, total, unit = p99_and_total(target)
    assert "rate(ray_serve_http_request_latency_ms_bucket{" in p99
    assert 'application="shop"' in p99
    assert 'namespace="prod"' in p99
    assert total.startswith("sum(rate(ray_serve_num_http_requests_total{")
    assert 'application="shop"' in total
    assert unit == "ms"
    source = prometheus_source(target)
    assert source is not None
    # Ray pushes its figures late: the window is read that much later
    assert source.metrics.export_delay_s == 10.0


@pytest.mark.parametrize("kind", [None, "Reference", "Generic"])
def test_targets_without_a_runtime_adapter_keep_the_reference_servers_names(
    kind: str | None,
) -> None:
    runtime = None if kind is None else {"kind": kind}
    p99, total, unit = p99_and_total(spec(runtime))
    assert "rate(batchpilot_request_latency_seconds_bucket{" in p99
    assert total == 'sum(rate(batchpilot_requests_total{namespace="prod"}[10000ms]))'
    assert unit == "s"


def test_metrics_the_spec_names_win_over_the_runtimes() -> None:
    target = spec(
        {"kind": "MLServer", "model": "iris"},
        latencyMetric="gateway_latency_seconds",
        requestsMetric="gateway_requests_total",
        okOutcome="success",
    )
    source = prometheus_source(target)
    assert source is not None
    queries = source.queries(10.0)
    assert "rate(gateway_latency_seconds_bucket{" in queries["p99"]
    assert queries["ok_rps"] == (
        'sum(rate(gateway_requests_total{namespace="prod",outcome="success"}[10000ms]))'
    )


@pytest.mark.parametrize(
    ("runtime", "method", "why"),
    [
        ({"kind": "Triton", "model": "resnet"}, "Live", "Triton Inference Server 2.51 exports no"),
        ({"kind": "TorchServe", "model": "m"}, "Env", "TorchServe 0.12 exports no latency"),
    ],
)
def test_runtimes_without_a_latency_histogram_are_refused_saying_so(
    runtime: dict[str, Any], method: str, why: str
) -> None:
    with pytest.raises(NoLatencyHistogram, match=why) as caught:
        prometheus_source(spec(runtime, method=method))
    assert "decided on the client's p99" in str(caught.value)


def test_client_measured_load_has_no_prometheus_source() -> None:
    assert prometheus_source(spec({"kind": "MLServer", "model": "m"}, source="client")) is None
