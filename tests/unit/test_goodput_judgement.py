"""The step rule on token streams: an SLA of TTFT and TPOT targets (with or without an
end-to-end p99 bound), the judgement of a window's two tails (`models.step_passes`),
the figures a token-stream step carries, and the goodput as the effective rate."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from batchpilot.capacity.http import default_timeout_s, judged_protocol
from batchpilot.capacity.search import summarise_steps
from batchpilot.capacity.steps import p99_upper_bound_ms, step_from_load, token_tails
from batchpilot.loadgen.histogram import LatencyHistogram
from batchpilot.loadgen.lengths import Fixed, TokenLengths, long_output_tokens
from batchpilot.loadgen.protocols import REFERENCE, openai_stream, speaking
from batchpilot.loadgen.result import OK, LoadResult, summarise
from batchpilot.loadgen.tokens import StreamMeasure, TokenSla, summarise_stream
from batchpilot.models import SLA, TokenTails, step_passes

TOKEN_SLA = SLA(ttft_p99_ms=200, tpot_p99_ms=20)


def judge(sla: SLA, tokens: TokenTails | None, *, p99_ms: float = 50.0) -> tuple[bool, str]:
    return step_passes(
        p99_ms=p99_ms,
        error_rate=0.0,
        offered_rps=100.0,
        achieved_rps=100.0,
        sla=sla,
        tokens=tokens,
    )


def test_tails_within_both_targets_pass_whatever_the_end_to_end_latency() -> None:
    # no p99 bound: a long answer's end-to-end latency is not judged
    assert judge(TOKEN_SLA, TokenTails(150.0, 19.0), p99_ms=math.inf) == (True, "")


@pytest.mark.parametrize(
    ("tails", "fragments"),
    [
        (TokenTails(250.0, 19.0), ["TTFT p99 250.0 ms > SLA 200 ms"]),
        (TokenTails(150.0, 25.0), ["TPOT p99 25.0 ms > SLA 20 ms"]),
        (TokenTails(250.0, 25.0), ["TTFT p99 250.0 ms", "TPOT p99 25.0 ms"]),
        (TokenTails(math.inf, 19.0), ["TTFT p99 inf ms"]),
        (TokenTails(150.0, math.nan), ["TPOT p99 nan ms"]),
        (TokenTails(None, 19.0), ["no whole stream, so no TTFT to judge"]),
    ],
)
def test_either_tail_over_its_target_fails_the_step(
    tails: TokenTails, fragments: list[str]
) -> None:
    passed, reason = judge(TOKEN_SLA, tails)
    assert not passed
    for fragment in fragments:
        assert fragment in reason


def test_a_target_left_out_is_not_judged() -> None:
    assert judge(SLA(ttft_p99_ms=200), TokenTails(150.0, 500.0))[0]
    assert judge(SLA(tpot_p99_ms=20), TokenTails(5000.0, 19.0))[0]


def test_one_token_answers_meet_any_tpot_target() -> None:
    assert judge(TOKEN_SLA, TokenTails(150.0, None)) == (True, "")


def test_token_targets_without_a_token_stream_fail() -> None:
    passed, reason = judge(TOKEN_SLA, None)
    assert not passed
    assert "judged on token streams" in reason


def test_the_end_to_end_bound_still_holds_beside_the_tails() -> None:
    sla = SLA(p99_ms=100, ttft_p99_ms=200, tpot_p99_ms=20)
    assert judge(sla, TokenTails(150.0, 19.0), p99_ms=90.0)[0]
    passed, reason = judge(sla, TokenTails(150.0, 19.0), p99_ms=120.0)
    assert not passed
    assert reason == "p99 120.0 ms > SLA 100 ms"


def test_errors_and_keeping_up_are_judged_as_before() -> None:
    passed, reason = step_passes(
        p99_ms=10.0, error_rate=0.01, offered_rps=100.0, achieved_rps=90.0,
        sla=TOKEN_SLA, tokens=TokenTails(10.0, 1.0),
    )  # fmt: skip
    assert not passed
    assert "error rate 0.0100 > 0.001" in reason
    assert "achieved 90.0 req/s < 97% of offered 100.0 req/s" in reason


def test_an_sla_needs_a_bound_and_every_bound_is_positive() -> None:
    with pytest.raises(ValidationError, match="p99 latency bound, a TTFT p99 target or a TPOT"):
        SLA()
    for field in ("p99_ms", "ttft_p99_ms", "tpot_p99_ms"):
        with pytest.raises(ValidationError, match=field):
            SLA.model_validate({field: 0})
        with pytest.raises(ValidationError, match=field):
            SLA.model_validate({field: -5})


def test_the_scale_of_token_targets_is_an_answer_within_them() -> None:
    assert SLA(p99_ms=100, ttft_p99_ms=200).scale_ms(50) == 100  # the bound, when given
    assert TOKEN_SLA.scale_ms(11) == 200 + 20 * 10
    assert TOKEN_SLA.scale_ms(1) == 200 + 20  # at least one token's TPOT
    assert SLA(tpot_p99_ms=20).scale_ms(5) == 80
    assert SLA(ttft_p99_ms=200).scale_ms(5) == 200
    assert TOKEN_SLA.describe() == "TTFT p99 ≤ 200 ms, TPOT p99 ≤ 20 ms"
    # the default timeout covers a long answer within the targets
    assert default_timeout_s(TOKEN_SLA, 101) == pytest.approx(5 * (200 + 20 * 100) / 1000)
    assert long_output_tokens(TokenLengths(prompt=Fixed(tokens=8), output=Fixed(tokens=64))) == 64


def stream_load(ttfts_ms: list[float], tpots_ms: list[float], tokens: int = 11) -> LoadResult:
    """A one-second window of whole streams, one per request, with these figures, their
    goodput counted against TOKEN_SLA."""
    n = len(ttfts_ms)
    measures = [
        StreamMeasure(ttft, [tpot] * (tokens - 1), tpot, tokens)
        for ttft, tpot in zip(ttfts_ms, tpots_ms, strict=True)
    ]
    stream = summarise_stream(measures, sla=TokenSla(ttft_ms=200, tpot_ms=20), measured_s=1.0)
    offsets = [i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=float(n),
        window_s=1.0, offsets=offsets, outcomes=[OK] * n,
        latencies_ms=[t + 10 * p for t, p in zip(ttfts_ms, tpots_ms, strict=True)],
        lags_ms=[0.0] * n, done_at=[o + 0.001 for o in offsets], elapsed_s=1.0,
        interrupted=False, stream=stream,
    )  # fmt: skip


def test_a_stream_step_carries_its_tails_goodput_and_tokens() -> None:
    load = stream_load([100.0] * 200, [10.0] * 200)
    step = step_from_load(load, TOKEN_SLA)
    assert step.passed, step.reason
    assert step.ttft_p99_ms == pytest.approx(100.0, rel=0.01)
    assert step.tpot_p99_ms == pytest.approx(10.0, rel=0.01)
    assert step.goodput_rps == pytest.approx(200.0)
    assert step.output_tokens_per_s == pytest.approx(200 * 11)


def test_a_stream_step_fails_on_its_tpot_tail() -> None:
    # 3 % of the answers are slow per token: the p99 is theirs
    tpots = [10.0] * 194 + [40.0] * 6
    step = step_from_load(stream_load([100.0] * 200, tpots), TOKEN_SLA)
    assert not step.passed
    assert "TPOT p99 40.0 ms > SLA 20 ms" in step.reason
    assert step.goodput_rps == pytest.approx(194.0)


def test_a_short_stream_window_is_judged_on_the_upper_bounds_of_its_tails() -> None:
    load = stream_load([100.0] * 199 + [190.0], [10.0] * 200)
    assert step_from_load(load, TOKEN_SLA).passed
    short = step_from_load(load, TOKEN_SLA, min_requests=1000)
    tails = token_tails(load, bound=True)
    assert load.stream is not None
    assert tails is not None
    assert tails.ttft_p99_ms == p99_upper_bound_ms(
        LatencyHistogram.decode(load.stream.ttft_histogram)
    )
    assert short.ttft_p99_ms == tails.ttft_p99_ms
    assert short.ttft_p99_ms is not None
    assert short.ttft_p99_ms > 150.0


def test_the_effective_rate_of_a_stream_search_is_the_goodput() -> None:
    good = step_from_load(stream_load([100.0] * 200, [10.0] * 199 + [30.0]), TOKEN_SLA)
    assert good.passed
    assert good.goodput_rps is not None
    assert good.goodput_rps < good.achieved_rps
    result = summarise_steps([good], sla=TOKEN_SLA, precision=0.05)
    assert result.effective_rps == good.goodput_rps
    assert result.output_tokens_per_s == good.output_tokens_per_s
    assert result.tpot_p99_ms == good.tpot_p99_ms


def test_the_search_counts_goodput_against_the_slas_own_targets() -> None:
    lengths = TokenLengths(prompt=Fixed(tokens=8), output=Fixed(tokens=4))
    sent = openai_stream("m", lengths=lengths, sla=TokenSla(ttft_ms=999.0))
    with speaking(sent):
        judged = judged_protocol(TOKEN_SLA)
    assert judged is not None
    assert judged.stream is not None
    assert judged.stream.sla == TokenSla(ttft_ms=200, tpot_ms=20)
    assert judged.stream.lengths == lengths
    with speaking(REFERENCE), pytest.raises(ValueError, match="openai-stream or openai-chat"):
        judged_protocol(TOKEN_SLA)
    with pytest.raises(ValueError, match="judged on token streams"):
        judged_protocol(SLA(tpot_p99_ms=5))
    assert judged_protocol(SLA(p99_ms=5)) is None
