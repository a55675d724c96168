"""Turning a measured window into a step decision (the step rule: docs/architecture.md,
"How a measurement flows")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram
from batchpilot.loadgen.result import LoadResult, TrendBin, trend_points
from batchpilot.loadgen.trend import mann_kendall_p, queue_growth_s, theil_sen
from batchpilot.models import (
    CLIENT_MIN_SEND_RATE_SHARE,
    SLA,
    StepResult,
    TokenTails,
    step_passes,
)

# A step with fewer measured requests than it asked for is judged on this one-sided
# upper confidence bound of its p99 (an order statistic, exact binomial), not on luck.
P99_UCB_LEVEL = 0.95


def quantile_upper_rank(n: int, q: float = 0.99, level: float = P99_UCB_LEVEL) -> int:
    """The smallest 1-based rank k such that the k-th smallest of n samples is at least
    the true q-quantile with probability ≥ `level`: P(Binomial(n, q) ≤ k - 1) ≥ level.
    Returns n + 1 when no sample bounds it (too few samples: the bound is infinite)."""
    if n < 0 or not (0 < q < 1) or not (0 < level < 1):
        raise ValueError(f"need n ≥ 0, 0 < q < 1, 0 < level < 1; got {n}, {q:g}, {level:g}")
    log_q, log_p = math.log(q), math.log1p(-q)
    cdf = 0.0
    for j in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(j + 1)
            - math.lgamma(n - j + 1)
            + j * log_q
            + (n - j) * log_p
        )
        cdf += math.exp(log_pmf)
        if cdf >= level:
            return j + 1
    return n + 1


def bounded_p99_min_requests(q: float = 0.99, level: float = P99_UCB_LEVEL) -> int:
    """The fewest samples whose largest bounds the true q-quantile at `level`: with
    fewer, a short step's p99 bound is infinite and the step cannot pass (299 for the
    p99 at 95 %)."""
    if not (0 < q < 1) or not (0 < level < 1):
        raise ValueError(f"need 0 < q < 1, 0 < level < 1; got {q:g}, {level:g}")
    # the largest of n samples bounds it when P(all n below the quantile) = q**n ≤ 1 - level
    return math.ceil(math.log1p(-level) / math.log(q))


def p99_upper_bound_ms(histogram: LatencyHistogram, level: float = P99_UCB_LEVEL) -> float:
    """The upper confidence bound of the p99 at `level` from a histogram's samples; the
    histogram's top when there are too few samples to bound it."""
    n = histogram.count
    rank = quantile_upper_rank(n, 0.99, level)
    if rank > n:
        return TOP_MS
    return histogram.percentile_ms(100.0 * rank / n)


def token_tails(load: LoadResult, *, bound: bool = False) -> TokenTails | None:
    """The TTFT and TPOT p99 of a token-stream window (None: not one), or with `bound`
    their upper confidence bounds (a window with too few requests, as its p99)."""
    stream = load.stream
    if stream is None:
        return None

    def tail(count: int, p99_ms: float, encoded: str) -> float | None:
        if count == 0:
            return None
        return p99_upper_bound_ms(LatencyHistogram.decode(encoded)) if bound else p99_ms

    return TokenTails(
        tail(stream.ttft.count, stream.ttft.p99_ms, stream.ttft_histogram),
        tail(stream.tpot.count, stream.tpot.p99_ms, stream.tpot_histogram),
    )


def window_scale_ms(load: LoadResult, sla: SLA) -> float:
    """The SLA's scale (`SLA.scale_ms`) in this window: with token targets alone, that of
    an answer of the window's mean output length."""
    stream = load.stream
    tokens = stream.output_tokens / stream.streams if stream is not None and stream.streams else 1.0
    return sla.scale_ms(tokens)


# The trend test needs at least this many slices with answered requests in the second
# half of the measured window (loadgen.result.TREND_BINS cut it).
TREND_MIN_POINTS = 3
# A steady rise across the whole measured window is a queue that grows: the offered rate
# is above capacity by about the rise's slope (a 3 % overload adds 30 ms of queueing per
# second, at any rate). It fails the step once the rise is significant (Mann-Kendall,
# one-sided, at this level) and at least this share of the SLA p99.
OVERLOAD_TREND_ALPHA = 0.01
OVERLOAD_RISE_SHARE = 0.10


def rising_trend(
    trend: Sequence[TrendBin], window_s: float, warmup_s: float, sla_p99_ms: float
) -> str:
    """Why the window's latency is still climbing at its end (empty when it is not).

    Two rules over the median latency of each slice of the measured window, against
    `sla_p99_ms`, the SLA's scale in this window (`window_scale_ms`). The second half:
    the Theil-Sen line through its slices (at least TREND_MIN_POINTS with answered
    requests), carried one more measured window past the end, exceeds the SLA p99 while
    rising: the next window would breach even if this one did not. The whole window: a
    significant steady rise (Mann-Kendall at OVERLOAD_TREND_ALPHA) of at least
    OVERLOAD_RISE_SHARE of the SLA across it: a queue that grows without bound however
    generous the SLA, which a short window would otherwise let pass."""
    answered = [(b.t_s, b.p50_ms) for b in trend if b.answered]
    measured_s = window_s - warmup_s
    if len(answered) < TREND_MIN_POINTS or measured_s <= 0:
        return ""
    middle = warmup_s + measured_s / 2.0
    late = [(t, y) for t, y in answered if t >= middle]
    if len(late) >= TREND_MIN_POINTS:
        slope, intercept = theil_sen(late)
        projected = intercept + slope * (window_s + measured_s)
        if slope > 0 and projected > sla_p99_ms:
            return (
                f"not sustained: median latency rising {slope:.1f} ms/s over the second "
                f"half, {projected:.0f} ms one window on > SLA {sla_p99_ms:g} ms"
            )
    slope, _ = theil_sen(answered)
    rise_ms = slope * measured_s
    p = mann_kendall_p([y for _, y in answered])
    if p < OVERLOAD_TREND_ALPHA and rise_ms >= OVERLOAD_RISE_SHARE * sla_p99_ms:
        return (
            f"not sustained: median latency rose steadily by {rise_ms:.0f} ms over the "
            f"window ({slope:.1f} ms/s, Mann-Kendall p={p:.3f}), ≥ "
            f"{OVERLOAD_RISE_SHARE:.0%} of SLA {sla_p99_ms:g} ms: a queue growing by "
            f"about {slope / 10.0:.1f} % of the offered rate"
        )
    return ""


def client_could_explain(
    load: LoadResult, sla: SLA, sla_p99_ms: float, tails: TokenTails | None = None
) -> bool:
    """Whether the client's own delays could have made a failing window fail.

    The client adds to a request at most its send lag and a stall of its loop while the
    response is read; the allowance is the p99 send lag plus the worst stall. The window
    is excused when, less that allowance, its p99 is within the SLA and its achieved
    rate keeps up, every request that timed out only because of the client counted as
    served; a token-stream window's TTFT and TPOT tails (`tails`) less it too (a stall
    adds to one gap, so to TPOT less than that: the excuse errs towards invalid). Non-OK
    requests stay infinitely slow -- so a window judged on an infinite p99 (more than 1 % non-OK, or
    too few requests to bound it) is never excused -- except timeouts once the client's
    worst lag plus its worst stall reached the request timeout, or once it held every
    request that timed out so long (ClientHealth.timeout_held_min_ms) that, less its
    worst stall, the server had at most the SLA p99 for it: then the client alone could
    have made them. A wait for a connection slot counts as send lag only when the
    user capped the client's connections (ClientHealth.connection_cap): the cap, not the
    server, then held the request back. In the generator's own pool, sized for open
    loop, a slot is taken only by a request the server has not answered yet, so there
    the wait stays charged to the server."""
    if load.requests == 0:
        return False
    scale_ms = window_scale_ms(load, sla)
    client = load.client
    slot_p99_ms = slot_max_ms = 0.0
    if client.connection_cap is not None:
        slot_p99_ms, slot_max_ms = client.conn_wait_p99_ms, client.conn_wait_max_ms
    allowance_ms = client.lag_p99_ms + slot_p99_ms + client.loop_delay_max_ms
    worst_ms = client.lag_max_ms + slot_max_ms + client.loop_delay_max_ms
    excused = 0
    if load.timeouts and load.timeout_s is not None:
        timeout_ms = 1000.0 * load.timeout_s
        # or every request that timed out was held so long by the client itself that the
        # server had at most the SLA's time for it, less the loop's worst stall
        held_ms = client.timeout_held_min_ms
        left_ms = None if held_ms is None else timeout_ms - held_ms - client.loop_delay_max_ms
        if worst_ms >= timeout_ms or (left_ms is not None and left_ms <= scale_ms):
            excused = load.timeouts
    non_ok = load.requests - load.ok - excused
    if excused:
        if non_ok > 0.01 * load.requests:
            return False
        judged_ms = load.latency.p99_ms  # answered requests and timeouts, from the schedule
    elif sla_p99_ms >= TOP_MS:
        return False
    else:
        judged_ms = sla_p99_ms
    # Requests the client made time out would have counted as served, also when the
    # client's stalls made every request of the window time out (no OK at all).
    # The queue's growth over the window stretches the time to answer it
    # (loadgen.result.achieved_rate), less what the client's own worst delay accounts for.
    measured_s = load.duration_s - load.warmup_s
    growth_s = queue_growth_s(trend_points(load.trend), measured_s) - worst_ms / 1000.0
    achieved = (load.ok + excused) / (measured_s + max(growth_s, 0.0)) if measured_s > 0 else 0.0
    if tails is not None:
        tails = TokenTails(*(None if ms is None else max(ms - allowance_ms, 0.0) for ms in tails))
    passed, _ = step_passes(
        p99_ms=max(judged_ms - allowance_ms, 0.0),
        error_rate=non_ok / load.requests,
        offered_rps=load.offered_rps,
        achieved_rps=achieved,
        sla=sla,
        tokens=tails,
    )
    return passed


def judge_client(
    load: LoadResult,
    sla: SLA,
    sla_p99_ms: float,
    passed: bool,
    reason: str,
    tails: TokenTails | None = None,
) -> tuple[bool, str, bool]:
    """(passed, reason, valid) once the client's health is weighed in, whatever decided
    the window (the client's figures or the server's own through Prometheus): a pass
    whose sends fell behind for good offered less than its rate, and a failure the
    client's own delays could explain is invalid."""
    limit = load.client.limit_reason(sla, window_scale_ms(load, sla))
    share = load.client.send_rate_share
    if passed and share < CLIENT_MIN_SEND_RATE_SHARE:
        # the server was offered less than the rate this pass would be credited with
        if load.client.server_held_sends():
            return (
                False,
                f"not sustained: sends fell behind the schedule waiting for connections "
                f"the server held ({share:.0%} of the rate was offered)",
                True,
            )
        return False, f"invalid, client-bound: {limit}", False
    if limit and not passed:
        if client_could_explain(load, sla, sla_p99_ms, tails):
            return False, f"invalid, client-bound: {limit}", False
        reason += f" (the client was over its limits too: {limit})"
    return passed, reason, True


def step_from_load(load: LoadResult, sla: SLA, *, min_requests: int = 0) -> StepResult:
    """The step rule applied to the client's own measurement of a window.

    A window that failed while its client was over its limits (ClientHealth.limit_reason)
    is invalid, neither a pass nor a failure, when the client's own delays could explain
    the failure (client_could_explain); one that passed stays a pass, since a stalled or
    busy client only adds latency to requests timed from their schedule, unless its
    sends fell behind the schedule for good (ClientHealth.send_rate_share): then the
    server was offered less than the rate, and the pass is invalid too. The SLA p99
    counts every non-OK request as infinitely slow; with fewer than `min_requests`
    requests it is the p99's upper confidence bound instead, and so are a token-stream
    window's TTFT and TPOT p99 (`token_tails`). A window whose latency still climbs at
    its end fails (see rising_trend, against the window's `window_scale_ms`)."""
    p99 = load.sla_p99_ms
    short = 0 < load.requests < min_requests
    bound_only = False
    tails = token_tails(load, bound=short)
    if short:
        p99 = p99_upper_bound_ms(LatencyHistogram.decode(load.sla_histogram))
    if load.requests == 0:
        passed, reason = False, "no request completed"
    else:
        passed, reason = step_passes(
            p99_ms=p99,
            error_rate=load.error_rate,
            offered_rps=load.offered_rps,
            achieved_rps=load.achieved_rps,
            sla=sla,
            tokens=tails,
        )
        scale_ms = window_scale_ms(load, sla)
        trend = rising_trend(load.trend, load.duration_s, load.warmup_s, scale_ms)
        if trend:
            passed, reason = False, "; ".join(r for r in (reason, trend) if r)
        if short and not passed and not trend:
            # would the window pass on its measured p99, rather than on the bound?
            bound_only = step_passes(
                p99_ms=load.sla_p99_ms,
                error_rate=load.error_rate,
                offered_rps=load.offered_rps,
                achieved_rps=load.achieved_rps,
                sla=sla,
                tokens=token_tails(load),
            )[0]
        if bound_only:
            reason += (
                f" (upper {P99_UCB_LEVEL:.0%} bound of p99 from {load.requests} requests, "
                f"fewer than {min_requests})"
            )
    passed, reason, valid = judge_client(load, sla, p99, passed, reason, tails)
    return StepResult(
        offered_rps=load.offered_rps,
        achieved_rps=load.achieved_rps,
        p50_ms=load.latency.p50_ms,
        p99_ms=p99,
        ok_p99_ms=load.latency.p99_ms,
        error_rate=load.error_rate,
        requests=load.requests,
        passed=passed,
        reason=reason,
        duration_s=load.duration_s,
        source="client",
        valid=valid,
        client=load.client,
        worker_clients=load.worker_clients,
        warmup_s=load.warmup_s,
        failed_on_bound_only=bound_only,
        **stream_figures(load, tails),
    )


def breach_stopped_step(load: LoadResult, sla: SLA) -> StepResult:
    """A window its breach rule stopped early (`LoadResult.breach_stop`): failed, its p99
    certain to break the SLA, or invalid when the client's own delays could explain the
    requests over the bound. Its figures are those of the requests answered before the
    stop."""
    step = step_from_load(load, sla)
    _, reason, valid = judge_client(load, sla, step.p99_ms, False, load.breach_stop or "")
    return step.model_copy(update={"passed": False, "reason": reason, "valid": valid})


class StreamFigures(TypedDict, total=False):
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    goodput_rps: float
    output_tokens_per_s: float


def stream_figures(load: LoadResult, tails: TokenTails | None) -> StreamFigures:
    """A token-stream window's fields of its StepResult (none for another window): the
    tails it was judged on, its goodput and its output tokens per second."""
    stream = load.stream
    if stream is None or tails is None:
        return {}
    return {
        "ttft_p99_ms": tails.ttft_p99_ms,
        "tpot_p99_ms": tails.tpot_p99_ms,
        "goodput_rps": stream.goodput_rps,
        "output_tokens_per_s": stream.output_tokens_per_s,
    }
