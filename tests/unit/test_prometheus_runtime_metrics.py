"""The Prometheus step source reading a runtime adapter's own metric names: PromQL text,
units, the export delay, and a clear refusal where a runtime has no latency histogram.
Prometheus itself is replaced by a table of answers (one layer under test)."""

from __future__ import annotations

import math

import pytest

from batchpilot.capacity.prometheus import NoLatencyHistogram, PrometheusStepSource, sla_quantile
from batchpilot.capacity.promql import with_matchers
from batchpilot.capacity.steps import quantile_upper_rank
from batchpilot.loadgen.result import OK, LoadResult, summarise
from batchpilot.models import SLA
from batchpilot.runtimes.registry import get_runtime

URL = "http://127.0.0.1:9"


def _load(n: int = 50) -> LoadResult:
    offsets = [i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=float(n),
        window_s=1.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=[5.0] * n,
        lags_ms=[0.0] * n, done_at=[o + 0.001 for o in offsets], elapsed_s=1.0,
        interrupted=False,
    )  # fmt: skip


def test_matchers_go_inside_the_selectors_braces() -> None:
    assert with_matchers('x{a="1"}', 'job="j"') == 'x{job="j",a="1"}'
    assert with_matchers("x", '{job="j"}', "") == 'x{job="j"}'
    assert with_matchers("x") == "x"
    assert with_matchers('{__name__=~"a|b"}', 'job="j"') == '{job="j",__name__=~"a|b"}'
    with pytest.raises(ValueError, match="not a plain PromQL selector"):
        with_matchers("sum(x)", 'job="j"')


def test_mlserver_queries_name_its_http_histogram_and_counters() -> None:
    source = PrometheusStepSource.for_runtime(URL, get_runtime("mlserver"), selector='job="m"')
    queries = source.queries(4.0)
    path = 'path="/v2/models/{model_name}/infer"'
    assert queries["p99"] == (
        "histogram_quantile(0.99, sum by (le) (rate(rest_server_request_duration_seconds_bucket"
        f'{{job="m",{path}}}[4000ms])))'
    )
    assert queries["ok_rps"] == (
        f'sum(rate(rest_server_requests_total{{job="m",{path},status_code=~"2.."}}[4000ms]))'
    )
    total = f'rest_server_requests_total{{job="m",{path}}}'
    assert queries["total_rps"] == f"sum(rate({total}[4000ms]))"


def test_ray_queries_follow_the_application_of_the_model() -> None:
    ray = get_runtime("ray")
    bundled = PrometheusStepSource.for_runtime(URL, ray).queries(10.0)
    assert 'ray_serve_http_request_latency_ms_bucket{application="batchpilot"}' in bundled["p99"]
    other = PrometheusStepSource.for_runtime(URL, ray, model="shop/Ranker").queries(10.0)
    assert (
        'ray_serve_num_http_requests_total{application="shop",status_code=~"2.."}'
        in (other["ok_rps"])
    )


@pytest.mark.parametrize("name", ["torchserve", "triton"])
def test_a_runtime_without_a_latency_histogram_is_refused_by_name(name: str) -> None:
    runtime = get_runtime(name)
    with pytest.raises(NoLatencyHistogram, match=f"{runtime.title} exports no latency histogram"):
        PrometheusStepSource.for_runtime(URL, runtime)


def test_the_reference_servers_queries_are_unchanged() -> None:
    reference = PrometheusStepSource.for_runtime(URL, get_runtime("reference"), selector='job="x"')
    assert reference.queries(5.0) == PrometheusStepSource(URL, selector='job="x"').queries(5.0)


class _Answers(PrometheusStepSource):
    """Answers every query from a table by what it measures; records the times asked."""

    def __init__(self, *args: object, answers: dict[str, float], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.answers = answers
        self.asked_at: list[float] = []
        self.asked: list[str] = []

    async def query_scalar(self, query: str, *, at_unix: float) -> float:
        self.asked_at.append(at_unix)
        self.asked.append(query)
        _, window = self.measured_window(_load(), 0.0)
        kind = next(k for k, q in self.queries(window, SLA_QUANTILE).items() if q == query)
        return self.answers[kind]


@pytest.mark.parametrize(
    ("name", "p99_native", "p99_ms"), [("mlserver", 0.025, 25.0), ("ray", 25.0, 25.0)]
)
async def test_p99_is_read_in_the_histograms_unit_and_late_by_the_export_delay(
    name: str, p99_native: float, p99_ms: float
) -> None:
    runtime = get_runtime(name)
    metrics = runtime.metrics_for(None)
    source = _Answers(
        URL,
        metrics=metrics,
        settle_s=0.0,
        answers={
            "p50": p99_native / 2,
            "p99": p99_native,
            "sla": p99_native * 1.2,
            "ok_rps": 49.9,
            "total_rps": 50.0,
        },
    )
    # a window long past: the source need not wait for Prometheus to scrape it; the
    # 1 s schedule is read over 2 s, its end, without the drain that ran to 1010
    step = await source.step_result(
        load=_load(), start_unix=1000.0, end_unix=1010.0, sla=SLA(p99_ms=100.0, max_error_rate=0.01)
    )
    # 0.2 % of the 100 requests failed, counted infinitely slow: the SLA p99 is the
    # answered requests' 99.2th percentile
    assert step.ok_p99_ms == pytest.approx(p99_ms)
    assert step.p99_ms == pytest.approx(p99_ms * 1.2)
    assert f"histogram_quantile({SLA_QUANTILE:.6g}," in source.asked[-1]
    assert step.p50_ms == pytest.approx(p99_ms / 2)
    assert step.error_rate == pytest.approx(0.002)
    assert step.requests == 100
    assert set(source.asked_at) == {1001.0 + metrics.export_delay_s}
    assert (metrics.export_delay_s > 0) is (name == "ray")
    assert step.passed


SLA_QUANTILE = 0.99 / 0.998


def test_the_sla_quantile_counts_non_ok_attempts_as_infinitely_slow() -> None:
    assert sla_quantile(10_000, 0.0) == pytest.approx(0.99)
    assert sla_quantile(10_000, 0.005) == pytest.approx(0.99 / 0.995)
    assert sla_quantile(10_000, 0.01) == pytest.approx(1.0)
    assert sla_quantile(10_000, 0.02) is None  # more non-OK than the p99 leaves
    # fewer than min_requests: the upper confidence bound's quantile
    assert sla_quantile(1000, 0.0, 2000) == pytest.approx(quantile_upper_rank(1000) / 1000)
    assert sla_quantile(100, 0.0, 2000) is None  # too few to bound a p99
    assert sla_quantile(1000, 0.0, 1000) == pytest.approx(0.99)


async def test_a_prometheus_step_over_too_few_requests_fails_on_the_bound() -> None:
    source = _Answers(
        URL, settle_s=0.0,
        answers={"p50": 0.01, "p99": 0.02, "ok_rps": 50.0, "total_rps": 50.0},
    )  # fmt: skip
    step = await source.step_result(
        load=_load(), start_unix=1000.0, end_unix=1001.0, sla=SLA(p99_ms=100.0), min_requests=2000
    )
    assert not step.passed
    assert step.p99_ms == math.inf
    assert "upper 95% bound of p99 from 100 requests, fewer than 2000" in step.reason


async def test_a_prometheus_step_failed_by_a_stalled_client_is_invalid() -> None:
    source = _Answers(
        URL, settle_s=0.0,
        answers={"p50": 0.06, "p99": 0.12, "ok_rps": 50.0, "total_rps": 50.0},
    )  # fmt: skip
    stalled = _load().model_copy(
        update={"client": _load().client.model_copy(update={"loop_delay_max_ms": 40.0})}
    )
    step = await source.step_result(
        load=stalled, start_unix=1000.0, end_unix=1001.0, sla=SLA(p99_ms=100.0)
    )
    assert not step.valid
    assert step.reason.startswith("invalid, client-bound: client event-loop stall up to 40.0")


def test_triton_names_its_summary_and_labels_by_model() -> None:
    metrics = get_runtime("triton").metrics_for("resnet")
    assert metrics.latency_summary == "nv_inference_request_summary_us"
    assert metrics.latency_matchers == 'model="resnet"'
    assert metrics.ok_requests == 'nv_inference_request_success{model="resnet"}'
    with pytest.raises(NoLatencyHistogram, match="summary nv_inference_request_summary_us"):
        PrometheusStepSource.for_runtime(URL, get_runtime("triton"))
