"""The simulator's warm start for a token-streaming engine (`tune --local --runtime vllm`):
after the baseline is measured, the token-level simulator (`simulator.tokens`) is fitted
to it and ranks batch caps by simulated goodput; the best ones are measured first.

The fit has two parts. The shape of a step's time (a fixed part and a part per token)
comes from the baseline's lowest measured rate, where streams barely queue: there a lone
prompt's TTFT is about one prefill step and TPOT one decode step beside the few sequences
running (Little's law: rate times end-to-end time). Both figures are the step's p99s, so the
shape is pessimistic; the scale is then set so that the simulated baseline reaches the
goodput the baseline measured (bisection on a factor over both constants)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from batchpilot.loadgen.arrivals import ArrivalKind
from batchpilot.loadgen.streaming import OpenAIStream
from batchpilot.models import SLA, BatchingConfig, CapacityResult
from batchpilot.simulator.tokens import (
    StepTime,
    TokenEngine,
    TokenTraffic,
    calibrate_step_time,
    propose_caps,
    token_capacity,
)

# the scale factor's search: bounds and bisection steps (ln(4096) / 2^10: under 1 % apart)
_SCALE_BOUNDS = (1 / 64, 64.0)
_SCALE_STEPS = 10


def light_step_time(measured: CapacityResult, prompt_tokens: float) -> StepTime:
    """The step time's shape from the lowest-rate step with token tails; ValueError
    when there is none, or its figures cannot be told apart."""
    steps = [
        s
        for s in measured.steps
        if s.valid and s.ttft_p99_ms is not None and s.tpot_p99_ms is not None
    ]
    if not steps:
        raise ValueError("the baseline has no step with TTFT and TPOT measured")
    light = min(steps, key=lambda s: s.offered_rps)
    assert light.ttft_p99_ms is not None
    assert light.tpot_p99_ms is not None
    concurrent = max(1.0, light.offered_rps * light.p50_ms / 1000.0)
    return calibrate_step_time(
        ttft_ms=light.ttft_p99_ms,
        tpot_ms=light.tpot_p99_ms,
        prompt_tokens=max(1, round(prompt_tokens)),
        concurrent=concurrent,
    )


def scaled(step: StepTime, factor: float) -> StepTime:
    return StepTime(fixed_ms=step.fixed_ms * factor, per_token_ms=step.per_token_ms * factor)


def fit_scale(
    step: StepTime,
    engine_of: TokenEngine,
    traffic: TokenTraffic,
    sla: SLA,
    measured_rps: float,
) -> tuple[StepTime, float]:
    """`step` scaled so that `engine_of` (the baseline's limits) simulates to the
    measured goodput; the factor. A slower step serves less, so the simulated capacity
    falls as the factor grows: bisection on its logarithm."""
    low, high = (math.log(b) for b in _SCALE_BOUNDS)
    for _ in range(_SCALE_STEPS):
        middle = (low + high) / 2
        engine = engine_of.model_copy(update={"step": scaled(step, math.exp(middle))})
        simulated = token_capacity(engine, traffic, sla, precision=0.1).effective_rps
        if simulated > measured_rps:
            low = middle  # too fast: make steps slower
        else:
            high = middle
    factor = math.exp((low + high) / 2)
    return scaled(step, factor), factor


def candidate_caps(bounds: tuple[int, int]) -> list[int]:
    """Powers of two inside `bounds`, and the bounds themselves."""
    low, high = bounds
    caps = {low, high}
    cap = 1
    while cap <= high:
        if cap >= low:
            caps.add(cap)
        cap *= 2
    return sorted(caps)


def propose_token_configs(
    measured: CapacityResult,
    baseline: BatchingConfig,
    stream: OpenAIStream,
    sla: SLA,
    batch_bounds: tuple[int, int],
    *,
    token_budget: int,
    arrival: ArrivalKind,
    seed: int,
    count: int,
    lengths_sample: Sequence[tuple[int, int]],
    measured_caps: Collection[int] = (),
) -> tuple[list[BatchingConfig], str]:
    """Up to `count` batch caps (the queue wait pinned at 0) worth measuring first, none
    of `measured_caps`, and how the simulator was fitted, for the log. ValueError when it
    cannot be fitted."""
    prompt = sum(p for p, _ in lengths_sample) / len(lengths_sample)
    shape = light_step_time(measured, prompt)
    traffic = TokenTraffic(stream.lengths, arrival=arrival, seed=seed)
    engine = TokenEngine(
        max_num_seqs=baseline.max_batch_size, token_budget=token_budget, step=shape
    )
    step, factor = fit_scale(shape, engine, traffic, sla, measured.effective_rps)
    caps = [cap for cap in candidate_caps(batch_bounds) if cap not in measured_caps]
    top = propose_caps(step, traffic, sla, caps, token_budget=token_budget, count=count)
    note = (
        f"step time {step.fixed_ms:.2f} ms + {step.per_token_ms:.4f} ms/token (shape from "
        f"the baseline's lightest step, scaled x{factor:.2f} to its {measured.effective_rps:.1f}"
        " req/s); simulated goodput "
        + ", ".join(f"max_num_seqs {cap}: {result.effective_rps:.1f} req/s" for cap, result in top)
    )
    return [BatchingConfig(max_batch_size=cap, max_queue_time_ms=0.0) for cap, _ in top], note
