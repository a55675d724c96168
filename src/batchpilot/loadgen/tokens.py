"""What a run of token streams measured beyond whole-request latency: time to first token
(TTFT), every inter-token gap (ITL), time per output token (TPOT), output tokens per
second and goodput under a TTFT and TPOT SLA, DistServe-style (requests per second that
met both, judged request by request).

Per request (`measure`): TTFT runs from the request's scheduled send time, as the run's
latency does, to the first token-bearing chunk; ITL is each gap between consecutive
token-bearing chunks; TPOT = (last - first) / (tokens - 1), undefined for a one-token
answer (which meets any TPOT target). TTFT, ITL and TPOT go into HDR histograms that
travel encoded with the result and merge exactly across load processes
(`merge_streams`), as the latency histogram does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Annotated, NamedTuple

from pydantic import Field

from batchpilot.loadgen.histogram import LatencyHistogram, merge_encoded
from batchpilot.loadgen.sse import TokenStream
from batchpilot.models import Frozen, LatencySummary


class TokenSla(Frozen):
    """The per-request targets goodput counts against (None: no target on that one)."""

    ttft_ms: Annotated[float, Field(gt=0)] | None = None
    tpot_ms: Annotated[float, Field(gt=0)] | None = None


class StreamMeasure(NamedTuple):
    """One whole stream's figures, in milliseconds."""

    ttft_ms: float
    itls_ms: list[float]
    tpot_ms: float | None  # None: a one-token answer
    tokens: int


def measure(stream: TokenStream, due: float) -> StreamMeasure:
    """The figures of a whole stream (one token at least) sent at loop time `due`."""
    times = stream.times
    tokens = stream.tokens()
    itls = [(b - a) * 1000.0 for a, b in pairwise(times)]
    span_ms = (times[-1] - times[0]) * 1000.0
    tpot = span_ms / (tokens - 1) if tokens > 1 else None
    return StreamMeasure((times[0] - due) * 1000.0, itls, tpot, tokens)


def meets(sla: TokenSla, m: StreamMeasure) -> bool:
    """Whether one request met both targets (a missing target is met)."""
    if sla.ttft_ms is not None and m.ttft_ms > sla.ttft_ms:
        return False
    return not (sla.tpot_ms is not None and m.tpot_ms is not None and m.tpot_ms > sla.tpot_ms)


class StreamSummary(Frozen):
    """The token figures of the measured window's successful streams."""

    sla: TokenSla
    streams: int  # successful, measured streams
    output_tokens: int
    output_tokens_per_s: float
    good: int  # streams that met every target of `sla`
    goodput_rps: float  # good streams per second of the measured window
    ttft: LatencySummary
    itl: LatencySummary
    tpot: LatencySummary
    ttft_histogram: str
    itl_histogram: str
    tpot_histogram: str
    # whether each tail is within its target (None: no target)
    ttft_p99_met: bool | None = None
    tpot_p99_met: bool | None = None


def summarise_stream(
    measures: Iterable[StreamMeasure], *, sla: TokenSla, measured_s: float
) -> StreamSummary:
    """The summary of the measured window's successful streams."""
    ttft, itl, tpot = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    streams = tokens = good = 0
    for m in measures:
        streams += 1
        tokens += m.tokens
        good += meets(sla, m)
        ttft.record_ms(m.ttft_ms)
        for gap in m.itls_ms:
            itl.record_ms(gap)
        if m.tpot_ms is not None:
            tpot.record_ms(m.tpot_ms)
    return _summary(sla, streams, tokens, good, measured_s, ttft, itl, tpot)


def merge_streams(parts: Sequence[StreamSummary]) -> StreamSummary:
    """Summaries of generators that shared one schedule as one: counts and rates add
    (their windows are the same), histograms merge exactly."""
    if not parts:
        raise ValueError("merge_streams needs at least one summary")
    return _summary(
        parts[0].sla,
        sum(p.streams for p in parts),
        sum(p.output_tokens for p in parts),
        sum(p.good for p in parts),
        None,
        merge_encoded(p.ttft_histogram for p in parts),
        merge_encoded(p.itl_histogram for p in parts),
        merge_encoded(p.tpot_histogram for p in parts),
        rates=(
            sum(p.output_tokens_per_s for p in parts),
            sum(p.goodput_rps for p in parts),
        ),
    )


def _summary(
    sla: TokenSla,
    streams: int,
    tokens: int,
    good: int,
    measured_s: float | None,
    ttft: LatencyHistogram,
    itl: LatencyHistogram,
    tpot: LatencyHistogram,
    rates: tuple[float, float] | None = None,
) -> StreamSummary:
    if rates is None:
        per_s = 1.0 / measured_s if measured_s else 0.0
        rates = (tokens * per_s, good * per_s)
    ttft_summary, tpot_summary = ttft.summary(), tpot.summary()
    return StreamSummary(
        sla=sla,
        streams=streams,
        output_tokens=tokens,
        output_tokens_per_s=rates[0],
        good=good,
        goodput_rps=rates[1],
        ttft=ttft_summary,
        itl=itl.summary(),
        tpot=tpot_summary,
        ttft_histogram=ttft.encode(),
        itl_histogram=itl.encode(),
        tpot_histogram=tpot.encode(),
        ttft_p99_met=None if sla.ttft_ms is None else _within(ttft_summary, sla.ttft_ms),
        tpot_p99_met=None if sla.tpot_ms is None else _within(tpot_summary, sla.tpot_ms),
    )


def _within(summary: LatencySummary, target_ms: float) -> bool:
    """A tail is within its target only when something was measured."""
    return summary.count > 0 and summary.p99_ms <= target_ms
