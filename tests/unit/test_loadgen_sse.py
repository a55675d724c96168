"""Reading a token stream as it arrives (loadgen.sse) and its figures (loadgen.tokens):
chunks however the bytes are split, a whole stream told from a broken one, TTFT, ITL and
TPOT from the chunk times, goodput judged per request, and summaries that merge exactly."""

from __future__ import annotations

import json
import random

import pytest
from hdrh.histogram import HdrHistogram

from batchpilot.loadgen.sse import (
    STREAM_EMPTY,
    STREAM_ERROR,
    STREAM_INCOMPLETE,
    STREAM_MALFORMED,
    TokenStream,
)
from batchpilot.loadgen.tokens import (
    StreamMeasure,
    TokenSla,
    measure,
    meets,
    merge_streams,
    summarise_stream,
)


def _event(chunk: object) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _text(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "text": text}]})


def _feed(parts: list[tuple[bytes, float]]) -> TokenStream:
    stream = TokenStream()
    for data, at in parts:
        stream.feed(data, at)
    stream.finish(parts[-1][1] if parts else 0.0)
    return stream


def test_token_chunks_are_timed_where_their_event_ends_however_the_bytes_split() -> None:
    body = (
        b": keep-alive comment\n\n"
        + _text("a")
        + _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})  # no token
        + _event({"choices": [{"index": 0, "delta": {"content": "b"}}]})
        + _text("")  # an empty text is no token
        + _text("c")
        + _event({"choices": [], "usage": {"completion_tokens": 5}})
        + b"data: [DONE]\n\n"
    )
    whole = _feed([(body, 1.0)])
    assert (whole.times, whole.tokens(), whole.problem()) == ([1.0, 1.0, 1.0], 5, None)
    # byte by byte, each byte at its own time: a chunk counts when its blank line arrives
    split = _feed([(body[k : k + 1], float(k)) for k in range(len(body))])
    ends = [body.index(_text("a")) + len(_text("a")) - 1]
    assert split.times[0] == float(ends[0])
    assert len(split.times) == 3
    assert split.problem() is None


def test_crlf_lines_and_an_unterminated_last_event_still_count() -> None:
    body = _text("a").replace(b"\n", b"\r\n") + b"data: [DONE]"
    stream = _feed([(body, 2.0)])
    assert stream.times == [2.0]
    assert stream.tokens() == 1  # no usage: the chunks
    assert stream.problem() is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (_text("a"), STREAM_INCOMPLETE),
        (_text("a") + b"event: error\ndata: {}\n\n", STREAM_ERROR),
        (_text("a") + _event({"error": {"message": "out of memory"}}), STREAM_ERROR),
        (_text("a") + b"data: {oops\n\n" + b"data: [DONE]\n\n", STREAM_MALFORMED),
        (_text("a") + b"data: [1, 2]\n\n" + b"data: [DONE]\n\n", STREAM_MALFORMED),
        (b"data: [DONE]\n\n", STREAM_EMPTY),
        (b"", STREAM_INCOMPLETE),
    ],
)
def test_a_stream_that_is_not_whole_names_its_problem(body: bytes, problem: str) -> None:
    assert _feed([(body, 0.0)]).problem() == problem


def test_what_follows_done_or_an_error_is_ignored() -> None:
    stream = _feed([(b"data: [DONE]\n\n" + _text("late"), 0.0)])
    assert stream.times == []
    broken = _feed([(_event({"error": "x"}) + b"data: [DONE]\n\n", 0.0)])
    assert broken.problem() == STREAM_ERROR


def _stream(times: list[float], usage: int | None = None) -> TokenStream:
    stream = TokenStream()
    stream.times = times
    stream.usage_tokens = usage
    stream.done = True
    return stream


def test_ttft_itl_and_tpot_from_the_chunk_times() -> None:
    m = measure(_stream([1.040, 1.050, 1.070, 1.100]), due=1.0)
    assert m.ttft_ms == pytest.approx(40.0)
    assert m.itls_ms == pytest.approx([10.0, 20.0, 30.0])
    assert m.tpot_ms == pytest.approx(60.0 / 3)
    assert m.tokens == 4
    # the usage count divides the span: two tokens a chunk, half the time per token
    assert measure(_stream([1.040, 1.050, 1.070, 1.100], usage=7), due=1.0).tpot_ms == (
        pytest.approx(60.0 / 6)
    )
    one = measure(_stream([1.2]), due=1.0)
    assert (one.itls_ms, one.tpot_ms, one.tokens) == ([], None, 1)


@pytest.mark.parametrize(
    ("sla", "ttft", "tpot", "good"),
    [
        (TokenSla(), 1e6, 1e6, True),
        (TokenSla(ttft_ms=100), 100.0, 1e6, True),  # at the target is within it
        (TokenSla(ttft_ms=100), 100.5, 1.0, False),
        (TokenSla(tpot_ms=20), 1e6, 20.5, False),
        (TokenSla(tpot_ms=20), 1e6, None, True),  # one token: no TPOT to break
        (TokenSla(ttft_ms=100, tpot_ms=20), 50.0, 10.0, True),
        (TokenSla(ttft_ms=100, tpot_ms=20), 50.0, 30.0, False),
    ],
)
def test_a_request_is_good_when_it_meets_every_target(
    sla: TokenSla, ttft: float, tpot: float | None, good: bool
) -> None:
    assert meets(sla, StreamMeasure(ttft, [], tpot, 2)) is good


def _contents(encoded: str) -> list[tuple[int, int]]:
    hdr = HdrHistogram.decode(encoded.encode("ascii"))
    return [
        (v.value_iterated_to, v.count_at_value_iterated_to) for v in hdr.get_recorded_iterator()
    ]


def test_summaries_of_shares_merge_into_the_summary_of_the_whole() -> None:
    rng = random.Random(5)
    measures = [
        StreamMeasure(
            rng.uniform(5, 500),
            [rng.uniform(1, 50) for _ in range(tokens - 1)],
            rng.uniform(1, 50) if tokens > 1 else None,
            tokens,
        )
        for tokens in (rng.randint(1, 40) for _ in range(600))
    ]
    sla = TokenSla(ttft_ms=300, tpot_ms=30)
    whole = summarise_stream(measures, sla=sla, measured_s=10.0)
    parts = [summarise_stream(measures[k::3], sla=sla, measured_s=10.0) for k in range(3)]
    merged = merge_streams(parts)
    for field in ("ttft_histogram", "itl_histogram", "tpot_histogram"):
        assert _contents(getattr(merged, field)) == _contents(getattr(whole, field))
    assert merged.ttft == whole.ttft
    assert merged.itl == whole.itl
    assert merged.tpot == whole.tpot
    assert (merged.streams, merged.output_tokens, merged.good) == (
        whole.streams,
        whole.output_tokens,
        whole.good,
    )
    assert merged.goodput_rps == pytest.approx(whole.goodput_rps)
    assert merged.output_tokens_per_s == pytest.approx(whole.output_tokens_per_s)
    assert (merged.ttft_p99_met, merged.tpot_p99_met) == (whole.ttft_p99_met, whole.tpot_p99_met)
    assert whole.good == sum(meets(sla, m) for m in measures)
    assert whole.goodput_rps == pytest.approx(whole.good / 10.0)


def test_no_stream_meets_no_tail_target() -> None:
    empty = summarise_stream([], sla=TokenSla(ttft_ms=1, tpot_ms=1), measured_s=1.0)
    assert (empty.streams, empty.goodput_rps, empty.ttft_p99_met, empty.tpot_p99_met) == (
        0,
        0.0,
        False,
        False,
    )
    with pytest.raises(ValueError, match="at least one"):
        merge_streams([])
