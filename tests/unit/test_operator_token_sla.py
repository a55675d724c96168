"""spec.sla.ttftP99Ms and tpotP99Ms: either or both, beside p99LatencyMs or alone, on a
token-stream load.protocol only; the lengths it sends; and how they reach the step
judgement (the SLA and the request protocol a trial runs under)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.loadgen.lengths import DEFAULT_LENGTHS, Fixed, LogNormal, Uniform
from batchpilot.loadgen.protocols import OPENAI_CHAT_PATH, OPENAI_COMPLETIONS_PATH
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.models import SLA
from batchpilot.operator import runtimes
from batchpilot.operator.spec import InferenceServiceSpec, explain_validation_error, parse_spec


def raw_spec(sla: dict[str, Any], load: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "target": {"name": "llm"},
        "runtime": {"kind": "VLLM", "model": "tiny-llama"},
        "apply": {"method": "Env"},
        "sla": sla,
        "load": {"endpoint": {"port": 8000}, **(load or {})},
    }


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_spec(raw)
    return explain_validation_error(caught.value)


STREAMS = {"protocol": "OpenAIStream"}


@pytest.mark.parametrize(
    ("sla", "expected"),
    [
        ({"ttftP99Ms": 500}, SLA(ttft_p99_ms=500)),
        ({"tpotP99Ms": 40}, SLA(tpot_p99_ms=40)),
        ({"ttftP99Ms": 500, "tpotP99Ms": 40}, SLA(ttft_p99_ms=500, tpot_p99_ms=40)),
        (
            {"p99LatencyMs": 9000, "ttftP99Ms": 500, "maxErrorRate": 0.01},
            SLA(p99_ms=9000, ttft_p99_ms=500, max_error_rate=0.01),
        ),
    ],
)
def test_token_targets_either_or_both_beside_the_p99_or_alone(
    sla: dict[str, Any], expected: SLA
) -> None:
    assert parse_spec(raw_spec(sla, STREAMS)).sla.to_sla() == expected


def test_the_p99_alone_keeps_the_runtimes_own_requests() -> None:
    spec = parse_spec(raw_spec({"p99LatencyMs": 300}))
    assert spec.load.protocol == "Runtime"
    assert spec.sla.to_sla() == SLA(p99_ms=300)


def test_an_sla_without_any_bound_is_refused() -> None:
    message = refusal(raw_spec({"maxErrorRate": 0.01}, STREAMS))
    assert "sla needs p99LatencyMs, ttftP99Ms or tpotP99Ms" in message


@pytest.mark.parametrize("field", ["ttftP99Ms", "tpotP99Ms", "p99LatencyMs"])
@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_bounds_are_refused_naming_the_field(field: str, value: float) -> None:
    message = refusal(raw_spec({field: value}, STREAMS))
    assert f"spec.sla.{field}" in message
    assert "greater than 0" in message


@pytest.mark.parametrize("sla", [{"ttftP99Ms": 500}, {"p99LatencyMs": 300, "tpotP99Ms": 40}])
def test_token_targets_need_a_token_stream_load(sla: dict[str, Any]) -> None:
    message = refusal(raw_spec(sla))
    assert "sla.ttftP99Ms and sla.tpotP99Ms are judged on token streams" in message
    assert "load.protocol OpenAIStream or OpenAIChatStream" in message


def test_token_streams_need_a_model_from_the_runtime_or_the_request() -> None:
    raw = raw_spec({"ttftP99Ms": 500}, STREAMS)
    raw["runtime"] = {"kind": "Generic"}
    raw["load"]["endpoint"]["path"] = "/v1/completions"
    message = refusal(raw)
    assert "send a model name" in message
    assert "set load.request.model" in message
    raw["load"]["request"] = {"model": "tiny-llama"}
    assert parse_spec(raw).request_model() == "tiny-llama"


def test_lengths_apply_to_token_streams_only() -> None:
    message = refusal(raw_spec({"p99LatencyMs": 300}, {"outputTokens": "fixed:64"}))
    assert "load.promptTokens and load.outputTokens apply to load.protocol" in message


@pytest.mark.parametrize(
    ("field", "text", "fragment"),
    [
        ("promptTokens", "uniform:9-3", "load.promptTokens 'uniform:9-3'"),
        ("outputTokens", "lots", "load.outputTokens 'lots'"),
        ("outputTokens", "file:/etc/pairs.jsonl", "read by the CLI only"),
    ],
)
def test_bad_lengths_are_refused_naming_the_field(field: str, text: str, fragment: str) -> None:
    message = refusal(raw_spec({"ttftP99Ms": 500}, {**STREAMS, field: text}))
    assert fragment in message


def spec_of(sla: dict[str, Any], load: dict[str, Any]) -> InferenceServiceSpec:
    return parse_spec(raw_spec(sla, load))


def test_a_trial_sends_the_token_streams_the_spec_names() -> None:
    spec = spec_of(
        {"ttftP99Ms": 500, "tpotP99Ms": 40},
        {**STREAMS, "promptTokens": "uniform:16-64", "outputTokens": "lognormal:128,0.5"},
    )
    protocol = runtimes.load_protocol(spec)
    assert protocol is not None
    assert protocol.stream is not None
    assert protocol.path == OPENAI_COMPLETIONS_PATH
    assert protocol.stream.model == "tiny-llama"
    assert not protocol.stream.chat
    assert protocol.stream.lengths.prompt == Uniform(low=16, high=64)
    assert protocol.stream.lengths.output == LogNormal(median=128, sigma=0.5)
    assert protocol.stream.sla == TokenSla(ttft_ms=500, tpot_ms=40)


def test_chat_streams_take_the_default_lengths_and_an_endpoint_path() -> None:
    spec = spec_of({"tpotP99Ms": 40}, {"protocol": "OpenAIChatStream"})
    protocol = runtimes.load_protocol(spec)
    assert protocol is not None
    assert protocol.stream is not None
    assert protocol.stream.chat
    assert protocol.path == OPENAI_CHAT_PATH
    assert protocol.stream.lengths.prompt == DEFAULT_LENGTHS.prompt
    assert protocol.stream.lengths.output == DEFAULT_LENGTHS.output
    moved = spec_of(
        {"tpotP99Ms": 40},
        {"protocol": "OpenAIChatStream", "endpoint": {"port": 8000, "path": "/llm/chat"}},
    )
    protocol = runtimes.load_protocol(moved)
    assert protocol is not None
    assert protocol.path == "/llm/chat"


def test_streams_may_be_measured_under_a_p99_alone() -> None:
    spec = spec_of({"p99LatencyMs": 9000}, {**STREAMS, "outputTokens": "fixed:32"})
    protocol = runtimes.load_protocol(spec)
    assert protocol is not None
    assert protocol.stream is not None
    assert protocol.stream.lengths.output == Fixed(tokens=32)
    assert protocol.stream.sla == TokenSla()
