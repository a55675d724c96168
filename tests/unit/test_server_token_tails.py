"""A token-stream server's own TTFT and TPOT histograms read through Prometheus: vLLM's
metric names for runtime.kind VLLM (or names the spec gives), a step judged on the
server's tails, production's tails in the verdict of the verify and re-tune windows, and
the spec refusing an OnSLABreach re-tune that could not read a token target. Prometheus
itself is replaced by a table of answers (one layer under test)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.capacity.prometheus import PrometheusStepSource, server_token_tails
from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.result import OK, LoadResult, summarise
from batchpilot.loadgen.tokens import StreamMeasure, TokenSla, summarise_stream
from batchpilot.models import SLA, TokenTails
from batchpilot.operator import decisions
from batchpilot.operator.promsource import prometheus_source
from batchpilot.operator.spec import InferenceServiceSpec, explain_validation_error, parse_spec
from batchpilot.runtimes.vllm.metrics import vllm_metrics

URL = "http://127.0.0.1:9"
TOKEN_SLA = SLA(ttft_p99_ms=200, tpot_p99_ms=20)


def raw_spec(**prometheus: Any) -> dict[str, Any]:
    return {
        "target": {"name": "llm"},
        "runtime": {"kind": "VLLM", "model": "tiny-llama"},
        "apply": {"method": "Env"},
        "sla": {"ttftP99Ms": 200, "tpotP99Ms": 20},
        "load": {
            "endpoint": {"port": 8000},
            "protocol": "OpenAIStream",
            "source": "prometheus",
            "prometheus": {"url": "http://prometheus:9090", **prometheus},
        },
        "tuning": {"retune": "OnSLABreach"},
    }


def source_of(spec: InferenceServiceSpec) -> PrometheusStepSource:
    source = prometheus_source(spec)
    assert source is not None
    return source


def test_vllm_is_read_in_its_own_histograms_for_the_served_model() -> None:
    queries = source_of(parse_spec(raw_spec(selector='job="llm"'))).queries(4.0)
    model = 'job="llm",model_name="tiny-llama"'
    assert queries["p99"] == (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(vllm:e2e_request_latency_seconds_bucket{{{model}}}[4000ms])))"
    )
    assert queries["ttft_p99"] == (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{{{model}}}[4000ms])))"
    )
    assert "vllm:request_time_per_output_token_seconds_bucket{" in queries["tpot_p99"]
    # answers are finished requests that stopped, reached their length or repeated; an
    # abort (the client gone) or an error is not one
    assert queries["ok_rps"] == (
        "sum(rate(vllm:request_success_total"
        f'{{{model},finished_reason=~"stop|length|repetition"}}[4000ms]))'
    )
    assert queries["total_rps"] == f"sum(rate(vllm:request_success_total{{{model}}}[4000ms]))"
    with_quantile = source_of(parse_spec(raw_spec())).queries(4.0, 0.995)
    assert with_quantile["ttft_sla"].startswith("histogram_quantile(0.995, ")
    assert with_quantile["tpot_sla"].startswith("histogram_quantile(0.995, ")


def test_a_model_name_is_quoted_as_a_promql_string() -> None:
    assert vllm_metrics('a"b\\c').latency_matchers == 'model_name="a\\"b\\\\c"'
    assert vllm_metrics(None).total_requests == "vllm:request_success_total"


def test_histograms_the_spec_names_are_read_for_any_server() -> None:
    raw = raw_spec(
        latencyMetric="sglang:e2e_request_latency_seconds",
        ttftMetric="sglang:time_to_first_token_seconds",
        tpotMetric="sglang:time_per_output_token_seconds",
    )
    queries = source_of(parse_spec(raw)).queries(4.0)
    assert "sglang:time_to_first_token_seconds_bucket" in queries["ttft_p99"]
    assert "sglang:time_per_output_token_seconds_bucket" in queries["tpot_p99"]
    # a server without them: the client's tails decide its steps
    plain = source_of(parse_spec({**raw_spec(latencyMetric="x_seconds"), "tuning": {}}))
    assert "ttft_p99" not in plain.queries(4.0)
    assert not plain.reads_token_tails


@pytest.mark.parametrize(
    ("prometheus", "sla", "fragment"),
    [
        # vLLM's own names replaced by the reference server's way: no token histogram left
        ({"latencyMetric": "gateway_seconds"}, {"ttftP99Ms": 200}, "ttftMetric"),
        ({"ttftMetric": "t_seconds", "latencyMetric": "g"}, {"tpotP99Ms": 20}, "tpotMetric"),
    ],
)
def test_a_retune_that_could_not_read_a_token_target_is_refused(
    prometheus: dict[str, Any], sla: dict[str, Any], fragment: str
) -> None:
    raw = raw_spec(**prometheus)
    raw["sla"] = sla
    with pytest.raises(ValidationError) as caught:
        parse_spec(raw)
    message = explain_validation_error(caught.value)
    assert "reads production's TTFT and TPOT from the server's own histograms" in message
    assert fragment in message


def test_a_retune_with_the_histograms_named_or_vllms_own_is_allowed() -> None:
    parse_spec(raw_spec())  # vLLM's own
    named = raw_spec(latencyMetric="g", ttftMetric="t", tpotMetric="p")
    parse_spec(named)


def stream_load(n: int = 200) -> LoadResult:
    """A one-second window of whole 11-token streams: TTFT 100 ms, TPOT 10 ms at the
    client, well within TOKEN_SLA."""
    measures = [StreamMeasure(100.0, [10.0] * 10, 10.0, 11) for _ in range(n)]
    stream = summarise_stream(measures, sla=TokenSla(ttft_ms=200, tpot_ms=20), measured_s=1.0)
    offsets = [i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=float(n),
        window_s=1.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=[200.0] * n,
        lags_ms=[0.0] * n, done_at=[o + 0.001 for o in offsets], elapsed_s=1.0,
        interrupted=False, stream=stream,
    )  # fmt: skip


class Answers(PrometheusStepSource):
    """Answers every query from a table by what it measures."""

    def __init__(self, answers: dict[str, float], metrics: Metrics) -> None:
        super().__init__(URL, metrics=metrics, settle_s=0.0)
        self.answers = answers

    async def query_scalar(self, query: str, *, at_unix: float) -> float:
        _, window = self.measured_window(stream_load(), 0.0)
        kind = next(k for k, q in self.queries(window).items() if q == query)
        return self.answers[kind]


async def test_a_step_is_judged_on_the_servers_tails() -> None:
    answers = {"p50": 0.15, "p99": 0.2, "ok_rps": 200.0, "total_rps": 200.0}
    # production's requests beside the load queue at the server: its TTFT p99 is 350 ms
    server = Answers({**answers, "ttft_p99": 0.35, "tpot_p99": 0.012}, vllm_metrics("m"))
    step = await server.step_result(
        load=stream_load(), start_unix=1000.0, end_unix=1001.0, sla=TOKEN_SLA
    )
    assert not step.passed
    assert "TTFT p99 350.0 ms > SLA 200 ms" in step.reason
    assert step.ttft_p99_ms == pytest.approx(350.0)
    assert step.tpot_p99_ms == pytest.approx(12.0)
    # the same window without the server's histograms: the client's 100 ms passes
    plain = Answers(
        {**answers, "tpot_p99": 0.012},
        vllm_metrics("m").model_copy(update={"ttft_histogram": None}),
    )
    assert plain.reads_token_tails  # TPOT still the server's
    step = await plain.step_result(
        load=stream_load(), start_unix=1000.0, end_unix=1001.0, sla=TOKEN_SLA
    )
    assert step.ttft_p99_ms == pytest.approx(100.0, rel=0.02)
    assert step.tpot_p99_ms == pytest.approx(12.0)
    assert step.passed, step.reason


def test_a_histogram_that_holds_nothing_is_no_answer_for_ttft_and_no_tpot() -> None:
    client = TokenTails(100.0, 10.0)
    empty = {"ttft_p99": math.nan, "tpot_p99": math.nan}
    assert server_token_tails(empty, client, vllm_metrics("m")) == TokenTails(math.inf, None)
    only_ttft = vllm_metrics("m").model_copy(update={"tpot_histogram": None})
    assert server_token_tails({"ttft_p99": 0.3}, client, only_ttft) == TokenTails(300.0, 10.0)


def test_production_breaks_a_token_target_seen_by_the_server() -> None:
    def breach(**tails: float) -> str | None:
        return decisions.sla_breach(
            p99_ms=math.nan, ok_rps=100, total_rps=100, sla=TOKEN_SLA, **tails
        )

    assert breach(ttft_p99_ms=150, tpot_p99_ms=15) is None
    assert breach(ttft_p99_ms=450, tpot_p99_ms=15) == "TTFT p99 450 ms > 200 ms at 100 req/s"
    assert breach(ttft_p99_ms=150, tpot_p99_ms=35) == "TPOT p99 35 ms > 20 ms at 100 req/s"
    # not read (no histogram): nothing to hold against the target
    assert breach() is None
