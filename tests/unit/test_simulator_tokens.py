"""The token-level simulator: an engine stepped one iteration at a time (decodes first, then
prompts within the token budget, new sequences admitted up to the batch cap), its TTFT
and TPOT exact on hand-computed cases, the prefill/decode trade-off of the token budget,
the calibration from a light-load measurement, and the warm start's fit and candidates."""

from __future__ import annotations

import math

import pytest

from batchpilot.loadgen.lengths import Fixed, TokenLengths
from batchpilot.models import SLA, BatchingConfig
from batchpilot.simulator.tokens import (
    StepTime,
    TokenEngine,
    TokenTraffic,
    calibrate_step_time,
    propose_caps,
    simulate_streams,
    simulate_token_step,
    token_capacity,
)
from batchpilot.tuner.tokenwarm import candidate_caps, fit_scale

STEP = StepTime(fixed_ms=1.0, per_token_ms=0.1)


def engine(cap: int = 4, budget: int = 100, *, chunked: bool = True) -> TokenEngine:
    return TokenEngine(max_num_seqs=cap, token_budget=budget, chunked_prefill=chunked, step=STEP)


def test_a_lone_stream_prefills_in_one_step_then_decodes_one_token_a_step() -> None:
    times = simulate_streams(engine(), [0.0], [(10, 3)])
    # prefill of 10 tokens: 1 + 1.0 ms, then two decode steps of 1.1 ms
    assert times.ttft_ms[0] == pytest.approx(2.0)
    assert times.tpot_ms[0] == pytest.approx(1.1)
    assert times.end_s[0] == pytest.approx(0.0042)


def test_a_prompt_longer_than_the_budget_is_chunked_over_steps() -> None:
    times = simulate_streams(engine(budget=4), [0.0], [(10, 2)])
    # chunks of 4, 4 and 2 tokens: 1.4 + 1.4 + 1.2 ms, the first token with the last chunk
    assert times.ttft_ms[0] == pytest.approx(4.0)
    assert times.tpot_ms[0] == pytest.approx(1.1)


def test_without_chunked_prefill_a_prompt_no_step_holds_is_refused() -> None:
    times = simulate_streams(engine(budget=4, chunked=False), [0.0, 0.0], [(10, 2), (3, 2)])
    assert math.isnan(times.ttft_ms[0])
    assert times.ttft_ms[1] == pytest.approx(1.3)


def test_the_cap_holds_a_stream_back_until_a_running_one_leaves() -> None:
    times = simulate_streams(engine(cap=2), [0.0, 0.0, 0.0], [(2, 3), (2, 3), (2, 3)])
    # the first two prefill together (1.4 ms) and decode twice (1.2 ms each); the third
    # is admitted in the step after they leave
    assert times.ttft_ms[0] == pytest.approx(1.4)
    assert times.ttft_ms[1] == pytest.approx(1.4)
    assert times.ttft_ms[2] == pytest.approx(1.4 + 1.2 + 1.2 + 1.2)


def test_decodes_share_a_step_with_a_prefill_and_wait_for_it() -> None:
    # stream 0 decodes while stream 1's 50-token prompt lands in the same step
    times = simulate_streams(engine(), [0.0, 0.0025], [(1, 4), (50, 2)])
    assert times.ttft_ms[0] == pytest.approx(1.1)
    assert times.tpot_ms[0] > 1.1  # one of its gaps holds the 51-token step


LONG_PROMPTS = TokenTraffic(TokenLengths(prompt=Fixed(tokens=384), output=Fixed(tokens=64)))
TARGETS = SLA(ttft_p99_ms=250, tpot_p99_ms=25)
REAL_STEP = StepTime(fixed_ms=3.0, per_token_ms=0.05)


def test_a_small_budget_trades_time_to_first_token_for_decode_pace() -> None:
    small = TokenEngine(max_num_seqs=16, token_budget=64, step=REAL_STEP)
    large = TokenEngine(max_num_seqs=16, token_budget=1024, step=REAL_STEP)
    at = {
        budget.token_budget: simulate_token_step(budget, LONG_PROMPTS, TARGETS, 8.0)
        for budget in (small, large)
    }
    assert at[64].ttft_p99_ms is not None
    assert at[1024].ttft_p99_ms is not None
    assert at[64].tpot_p99_ms is not None
    assert at[1024].tpot_p99_ms is not None
    assert at[64].ttft_p99_ms > 1.5 * at[1024].ttft_p99_ms
    assert at[64].tpot_p99_ms < at[1024].tpot_p99_ms
    assert all(step.source == "simulator" and step.passed for step in at.values())


def test_capacity_is_goodput_and_grows_with_the_cap_until_steps_break_tpot() -> None:
    caps = {
        cap: token_capacity(
            TokenEngine(max_num_seqs=cap, token_budget=2048, step=REAL_STEP),
            LONG_PROMPTS,
            TARGETS,
            precision=0.1,
        ).effective_rps
        for cap in (1, 4, 16)
    }
    assert 0 < caps[1] < caps[4] < caps[16]
    ranked = propose_caps(
        REAL_STEP, LONG_PROMPTS, TARGETS, [1, 4, 16, 4096], token_budget=2048, count=5
    )
    # best first; 4096 is above the token budget, which vLLM refuses: left out
    assert [cap for cap, _ in ranked] == [16, 4, 1]


def test_calibration_recovers_the_step_from_a_light_load_measurement() -> None:
    step = StepTime(fixed_ms=2.0, per_token_ms=0.1)
    ttft, tpot = step.ms(100), step.ms(3)
    fitted = calibrate_step_time(ttft_ms=ttft, tpot_ms=tpot, prompt_tokens=100, concurrent=3)
    assert (fitted.fixed_ms, fitted.per_token_ms) == pytest.approx((2.0, 0.1))
    with pytest.raises(ValueError, match="cannot tell the per-token cost"):
        calibrate_step_time(ttft_ms=2.0, tpot_ms=3.0, prompt_tokens=100)


def test_the_warm_start_scales_the_step_to_the_measured_baseline() -> None:
    baseline = TokenEngine(max_num_seqs=8, token_budget=2048, step=REAL_STEP)
    measured = token_capacity(baseline, LONG_PROMPTS, TARGETS, precision=0.1).effective_rps
    shape = StepTime(fixed_ms=6.0, per_token_ms=0.1)  # the right shape, twice as slow
    fitted, factor = fit_scale(shape, baseline, LONG_PROMPTS, TARGETS, measured)
    assert factor == pytest.approx(0.5, rel=0.15)
    assert fitted.fixed_ms == pytest.approx(6.0 * factor)


def test_candidate_caps_are_powers_of_two_and_the_bounds() -> None:
    assert candidate_caps((1, 64)) == [1, 2, 4, 8, 16, 32, 64]
    assert candidate_caps((3, 20)) == [3, 4, 8, 16, 20]
    assert BatchingConfig(max_batch_size=16, max_queue_time_ms=0.0).max_queue_time_ms == 0.0


def test_the_warm_start_proposes_caps_not_measured_yet() -> None:
    from batchpilot.loadgen.streaming import OpenAIStream
    from batchpilot.tuner.tokenwarm import propose_token_configs

    baseline = TokenEngine(max_num_seqs=4, token_budget=2048, step=REAL_STEP)
    measured = token_capacity(baseline, LONG_PROMPTS, TARGETS, precision=0.1)
    stream = OpenAIStream(model="m", lengths=LONG_PROMPTS.lengths)

    def proposed(measured_caps: set[int]) -> list[int]:
        configs, note = propose_token_configs(
            measured,
            BatchingConfig(max_batch_size=4, max_queue_time_ms=0.0),
            stream,
            TARGETS,
            (1, 16),
            token_budget=2048,
            arrival=LONG_PROMPTS.arrival,
            seed=0,
            count=1,
            lengths_sample=[(384, 64)],
            measured_caps=measured_caps,
        )
        assert "max_num_seqs" in note
        assert all(c.max_queue_time_ms == 0.0 for c in configs)
        return [c.max_batch_size for c in configs]

    assert proposed(set()) == [16]  # the most goodput: the largest cap under these targets
    assert proposed({4, 16}) == [8]  # the best of what is left
