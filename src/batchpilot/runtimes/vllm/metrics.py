"""Where vLLM's own figures are in its Prometheus metrics (`/metrics` on the serving
port), for a step source reading a vLLM pod: the end-to-end latency, time-to-first-token
and time-per-output-token histograms (seconds, labelled by `model_name`), and finished
requests by `finished_reason` (stop, length and repetition are answers; abort, a client
that went away, and error are not). Requests refused before the engine (admission limits,
malformed bodies) finish nowhere here: the client's error rate counts them."""

from __future__ import annotations

from batchpilot.capacity.promql import Metrics, with_matchers

FINISHED = "vllm:request_success_total"
ANSWERED = 'finished_reason=~"stop|length|repetition"'


def vllm_metrics(model: str | None) -> Metrics:
    """vLLM's metrics for the served `model` (its `--served-model-name`; None: every
    model the pod serves)."""
    matcher = "" if model is None else f'model_name="{_escaped(model)}"'
    return Metrics(
        port_note="the serving port, /metrics",
        latency_histogram="vllm:e2e_request_latency_seconds",
        latency_unit="s",
        latency_matchers=matcher,
        ok_requests=with_matchers(FINISHED, matcher, ANSWERED),
        total_requests=with_matchers(FINISHED, matcher),
        ttft_histogram="vllm:time_to_first_token_seconds",
        tpot_histogram="vllm:request_time_per_output_token_seconds",
    )


def _escaped(value: str) -> str:
    """A PromQL string literal's content: backslashes and double quotes escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
