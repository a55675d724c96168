"""Token-level serving, simulated: a continuous-batching engine (vLLM's scheduler, in
outline) stepped one iteration at a time, so the capacity search and the warm start cover
generative services too.

Each engine step computes a set of tokens and takes `StepTime.ms(tokens)`, a fixed part
plus a part per token. A step first gives every running sequence that is decoding one
token, then feeds prompts (prefill) with what is left of the token budget
(`max_num_batched_tokens`): the running sequences' unfinished prompts first, then new
sequences admitted from the queue in arrival order while fewer than `max_num_seqs` run.
With chunked prefill a prompt may take whatever budget is left and finish in a later
step; without it a prompt must fit whole into one step's remaining budget (one longer
than the whole budget is refused, as vLLM refuses it). The step that computes a prompt's
last token also yields the first output token (TTFT: from arrival to the end of that
step); every later step of the sequence yields one more (TPOT: from the first token to
the last over the tokens between). A sequence leaves when it has its output tokens.

Why the knobs pull apart: a large budget finishes a long prompt in one step, so TTFT is
short, but that step is long for every sequence decoding beside it, so TPOT's tail grows;
a small budget spreads the prompt over several steps, decodes keep their pace and TTFT
pays. A larger `max_num_seqs` raises goodput until steps grow long enough to break TPOT.

`calibrate_step_time` fits the two step constants to what a real run measured (TTFT and
TPOT at a low rate), and `propose_caps` ranks batch caps by their simulated goodput."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from pydantic import Field

from batchpilot.capacity.search import search_capacity
from batchpilot.loadgen.arrivals import ArrivalKind, Poisson, arrival_times
from batchpilot.loadgen.lengths import TokenLengths, draw_lengths
from batchpilot.models import SLA, CapacityResult, Frozen, StepResult, TokenTails, step_passes

# Streams per simulated step: enough for a p99 of about 1 % resolution, few enough that a
# capacity search of a dozen steps takes well under a second.
STEP_STREAMS = 1500
# The first share of a step's streams is its warm-up, as in the whole-request simulator.
WARMUP_FRACTION = 0.1


class StepTime(Frozen):
    """An engine step's duration: `fixed_ms` (scheduling, the model's per-step work) plus
    `per_token_ms` for each token computed in it, prompt or decode."""

    fixed_ms: Annotated[float, Field(ge=0.0, le=60_000.0)]
    per_token_ms: Annotated[float, Field(ge=0.0, le=60_000.0)]

    def ms(self, tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * tokens


class TokenEngine(Frozen):
    """The scheduler's limits and the step time of one engine replica."""

    max_num_seqs: Annotated[int, Field(ge=1, le=4096)]
    token_budget: Annotated[int, Field(ge=1, le=1_048_576)]
    chunked_prefill: bool = True
    step: StepTime


@dataclass
class _Sequence:
    index: int
    arrival_s: float
    prompt: int
    output: int
    prefilled: int = 0
    produced: int = 0
    first_s: float = math.nan
    last_s: float = math.nan


@dataclass(frozen=True)
class StreamTimes:
    """Per stream, in arrival order: time to first token and time per output token (ms;
    NaN for a stream never finished: refused, or still running at the end), and when it
    ended (s)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    end_s: np.ndarray


def simulate_streams(
    engine: TokenEngine, arrivals_s: Sequence[float], lengths: Sequence[tuple[int, int]]
) -> StreamTimes:
    """Run the engine over streams arriving at `arrivals_s` (ascending) with (prompt,
    output) token counts `lengths`, until every stream is answered."""
    if len(arrivals_s) != len(lengths):
        raise ValueError("one (prompt, output) pair per arrival")
    n = len(arrivals_s)
    ttft = np.full(n, math.nan)
    tpot = np.full(n, math.nan)
    end = np.full(n, math.nan)
    pending = deque(
        _Sequence(i, float(t), max(1, p), max(1, o))
        for i, (t, (p, o)) in enumerate(zip(arrivals_s, lengths, strict=True))
    )
    waiting: deque[_Sequence] = deque()
    running: list[_Sequence] = []
    now = 0.0
    while pending or waiting or running:
        while pending and pending[0].arrival_s <= now:
            waiting.append(pending.popleft())
        if not waiting and not running:
            now = pending[0].arrival_s
            continue
        budget = engine.token_budget
        work: list[tuple[_Sequence, int]] = []
        for seq in running:  # decodes first: one token each
            if seq.prefilled == seq.prompt and budget > 0:
                work.append((seq, 1))
                budget -= 1
        for seq in running:  # then the running sequences' unfinished prompts
            if seq.prefilled < seq.prompt and budget > 0:
                chunk = min(seq.prompt - seq.prefilled, budget)
                work.append((seq, chunk))
                budget -= chunk
        while waiting and len(running) < engine.max_num_seqs and budget > 0:
            seq = waiting[0]
            if not engine.chunked_prefill and seq.prompt > engine.token_budget:
                waiting.popleft()  # vLLM refuses a prompt no step can hold
                continue
            if not engine.chunked_prefill and seq.prompt > budget:
                break  # it waits for a step with room for all of it
            waiting.popleft()
            chunk = min(seq.prompt, budget)
            running.append(seq)
            work.append((seq, chunk))
            budget -= chunk
        if not work:  # only refused prompts were waiting
            continue
        now += engine.step.ms(sum(tokens for _, tokens in work)) / 1000.0
        for seq, tokens in work:
            if seq.prefilled < seq.prompt:
                seq.prefilled += tokens
                if seq.prefilled < seq.prompt:
                    continue  # a chunk: no token yet
                seq.first_s = now
            seq.produced += 1
            seq.last_s = now
        still = []
        for seq in running:
            if seq.produced >= seq.output:
                ttft[seq.index] = (seq.first_s - seq.arrival_s) * 1000.0
                if seq.output > 1:
                    tpot[seq.index] = (seq.last_s - seq.first_s) * 1000.0 / (seq.output - 1)
                else:
                    tpot[seq.index] = 0.0
                end[seq.index] = seq.last_s
            else:
                still.append(seq)
        running = still
    return StreamTimes(ttft_ms=ttft, tpot_ms=tpot, end_s=end)


@dataclass(frozen=True)
class TokenTraffic:
    """What a simulated step offers: streams of `lengths` arriving by `arrival`, the
    same draws for every configuration and rate (a fixed seed)."""

    lengths: TokenLengths
    arrival: ArrivalKind = field(default_factory=Poisson)
    seed: int = 0
    streams: int = STEP_STREAMS

    def draws(self) -> list[tuple[int, int]]:
        return draw_lengths(self.lengths, self.streams, self.seed)


def simulate_token_step(
    engine: TokenEngine, traffic: TokenTraffic, sla: SLA, offered_rps: float
) -> StepResult:
    """The step of the capacity search at `offered_rps`, simulated: TTFT and TPOT p99 of
    the measured streams (after the warm-up share), goodput (streams within every target
    per second) and output tokens per second, judged by the measured steps' rule."""
    first = int(traffic.streams * WARMUP_FRACTION)
    arrivals = arrival_times(
        traffic.arrival, traffic.streams, offered_rps, traffic.seed, window_from=first
    )
    lengths = traffic.draws()
    times = simulate_streams(engine, [float(t) for t in arrivals], lengths)
    ttft = times.ttft_ms[first:]
    tpot = times.tpot_ms[first:]
    done = ~np.isnan(ttft)
    window_s = float(arrivals[-1] - arrivals[first])
    ends = times.end_s[first:][done]
    span_s = float(ends.max() - ends.min()) if ends.size else 0.0
    seconds = max(window_s, span_s, 1e-9)
    achieved = float(np.count_nonzero(done)) / seconds
    # a stream never answered counts as infinitely slow, as a failed request does
    ttft_all = np.where(done, ttft, math.inf)
    tpot_all = np.where(done, tpot, math.inf)
    ttft_p99 = float(np.percentile(ttft_all, 99.0))
    tpot_p99 = float(np.percentile(tpot_all, 99.0))
    met = done.copy()
    if sla.ttft_p99_ms is not None:
        met &= ttft_all <= sla.ttft_p99_ms
    if sla.tpot_p99_ms is not None:
        met &= tpot_all <= sla.tpot_p99_ms
    outputs = np.array([o for _, o in lengths[first:]], dtype=float)
    e2e = ttft_all + tpot_all * np.maximum(outputs - 1, 0)
    p50, p99 = (float(v) for v in np.percentile(e2e, [50.0, 99.0]))
    error_rate = 1.0 - float(np.count_nonzero(done)) / done.size
    passed, reason = step_passes(
        p99_ms=p99,
        error_rate=error_rate,
        offered_rps=offered_rps,
        achieved_rps=achieved,
        sla=sla,
        tokens=TokenTails(ttft_p99_ms=ttft_p99, tpot_p99_ms=tpot_p99),
    )
    return StepResult(
        offered_rps=offered_rps,
        achieved_rps=achieved,
        p50_ms=p50,
        p99_ms=p99,
        error_rate=error_rate,
        requests=int(done.size),
        passed=passed,
        reason=reason,
        duration_s=window_s,
        source="simulator",
        ttft_p99_ms=ttft_p99,
        tpot_p99_ms=tpot_p99,
        goodput_rps=float(np.count_nonzero(met)) / seconds,
        output_tokens_per_s=float(outputs[done].sum()) / seconds,
    )


def decode_bound_rps(engine: TokenEngine, lengths: Sequence[tuple[int, int]]) -> float:
    """Streams per second the engine could finish if every step were full of work: an
    upper bound of the rate a search needs to try."""
    prompt = float(np.mean([p for p, _ in lengths]))
    output = float(np.mean([o for _, o in lengths]))
    seqs = engine.max_num_seqs
    step_s = engine.step.ms(min(engine.token_budget, seqs + int(prompt))) / 1000.0
    tokens_per_step = min(engine.token_budget, seqs + prompt)
    return tokens_per_step / step_s / (prompt + output)


async def token_capacity_async(
    engine: TokenEngine, traffic: TokenTraffic, sla: SLA, *, precision: float = 0.05
) -> CapacityResult:
    bound = decode_bound_rps(engine, traffic.draws())

    async def measure(offered_rps: float) -> StepResult:
        return simulate_token_step(engine, traffic, sla, offered_rps)

    return await search_capacity(
        measure, sla=sla, start_rps=0.05 * bound, precision=precision, max_rps=2.0 * bound
    )


def token_capacity(
    engine: TokenEngine, traffic: TokenTraffic, sla: SLA, *, precision: float = 0.05
) -> CapacityResult:
    """The goodput-scored capacity of `engine` under `traffic`: the capacity search the
    measured runs use, over simulated steps."""
    from batchpilot.simulator.capacity import run_sync

    return run_sync(token_capacity_async(engine, traffic, sla, precision=precision))


def calibrate_step_time(
    *, ttft_ms: float, tpot_ms: float, prompt_tokens: int, concurrent: float = 1.0
) -> StepTime:
    """The step constants that reproduce a light-load measurement: a lone prompt of
    `prompt_tokens` prefilled in one step took `ttft_ms`, and a decode step beside
    `concurrent` running sequences took `tpot_ms`. Two equations, two constants:
    TTFT = a + b * P, TPOT = a + b * c. ValueError when they contradict (TTFT not above
    TPOT while the prompt is longer than the decode batch)."""
    if not (ttft_ms > 0 and tpot_ms > 0 and prompt_tokens >= 1 and concurrent >= 1):
        raise ValueError("need positive TTFT and TPOT, a prompt of 1+ tokens, 1+ sequences")
    span = prompt_tokens - concurrent
    if span <= 0 or ttft_ms <= tpot_ms:
        raise ValueError(
            f"cannot tell the per-token cost from TTFT {ttft_ms:g} ms and TPOT {tpot_ms:g} ms "
            f"with {prompt_tokens}-token prompts beside {concurrent:g} sequences: a prompt "
            "must be longer than the decode batch and take longer than a decode step"
        )
    per_token = (ttft_ms - tpot_ms) / span
    fixed = max(0.0, tpot_ms - per_token * concurrent)
    return StepTime(fixed_ms=fixed, per_token_ms=per_token)


def propose_caps(
    step: StepTime,
    traffic: TokenTraffic,
    sla: SLA,
    caps: Sequence[int],
    *,
    token_budget: int,
    chunked_prefill: bool = True,
    count: int = 2,
) -> list[tuple[int, CapacityResult]]:
    """The `count` batch caps (`max_num_seqs`) of `caps` with the most simulated goodput,
    best first, each with its simulated capacity; caps above the token budget are left
    out (vLLM refuses them)."""
    scored = []
    for cap in sorted(set(caps)):
        if cap > token_budget:
            continue
        engine = TokenEngine(
            max_num_seqs=cap, token_budget=token_budget, chunked_prefill=chunked_prefill, step=step
        )
        scored.append((cap, token_capacity(engine, traffic, sla, precision=0.1)))
    scored.sort(key=lambda item: (-item[1].effective_rps, item[0]))
    return scored[:count]


__all__ = [
    "StepTime",
    "StreamTimes",
    "TokenEngine",
    "TokenTraffic",
    "calibrate_step_time",
    "propose_caps",
    "simulate_streams",
    "simulate_token_step",
    "token_capacity",
]
