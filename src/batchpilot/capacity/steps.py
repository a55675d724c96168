"""Turning a measured window into a step decision (the step rule: docs/architecture.md,
"How a measurement flows")."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram
from batchpilot.loadgen.result import LoadResult, TimelineSecond
from batchpilot.models import SLA, StepResult, step_passes

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


def p99_upper_bound_ms(histogram: LatencyHistogram, level: float = P99_UCB_LEVEL) -> float:
    """The upper confidence bound of the p99 at `level` from a histogram's samples; the
    histogram's top when there are too few samples to bound it."""
    n = histogram.count
    rank = quantile_upper_rank(n, 0.99, level)
    if rank > n:
        return TOP_MS
    return histogram.percentile_ms(100.0 * rank / n)


# The trend test needs at least this many one-second points in a window's second half.
TREND_MIN_POINTS = 3


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line: the median of pairwise slopes, robust to
    a few outlying seconds that a least-squares fit would follow."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    if not slopes:
        raise ValueError("a trend needs at least two points at different times")
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in points)
    return slope, intercept


def rising_trend(timeline: Sequence[TimelineSecond], window_s: float, sla_p99_ms: float) -> str:
    """Why the window's latency is still climbing at its end (empty when it is not).

    The rule: over the seconds that reach into the window's second half (at least
    TREND_MIN_POINTS of them with answered requests), fit the Theil-Sen line to each
    second's median latency; the step is not sustained when the slope is positive and
    the line, carried one more window past the end, exceeds the SLA p99. A median still
    rising that fast means the queue is growing: the next window would breach even if
    this one did not."""
    half = window_s / 2.0
    # seconds that reach into the second half: 2, 3 and 4 of a 5 s window
    points = [
        (s.t_s + 0.5, s.p50_ms) for s in timeline if s.t_s + 1 > half and s.t_s < window_s and s.ok
    ]
    if len(points) < TREND_MIN_POINTS:
        return ""
    slope, intercept = theil_sen(points)
    projected = intercept + slope * 2.0 * window_s
    if slope <= 0 or projected <= sla_p99_ms:
        return ""
    return (
        f"not sustained: median latency rising {slope:.1f} ms/s over the second half, "
        f"{projected:.0f} ms one window on > SLA {sla_p99_ms:g} ms"
    )


def client_could_explain(load: LoadResult, sla: SLA, sla_p99_ms: float) -> bool:
    """Whether the client's own delays could have made a failing window fail.

    The client adds to a request at most its send lag and a stall of its loop while the
    response is read; the allowance is the p99 send lag plus the worst stall. The window
    is excused when, less that allowance, its p99 is within the SLA and, over the
    completions' span less the worst send lag and stall (by which the client alone can
    stretch it), its achieved rate keeps up, every request that timed out only because
    of the client counted as served. Non-OK requests stay
    infinitely slow -- so a window judged on an infinite p99 (more than 1 % non-OK, or
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
        if worst_ms >= timeout_ms or (left_ms is not None and left_ms <= sla.p99_ms):
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
    span_s = load.duration_s - load.warmup_s
    if load.ok_first_done_s is not None and load.ok_last_done_s is not None:
        # the last response may have been sent that late and read after that stall
        stretch_s = worst_ms / 1000.0
        span_s = max(span_s, load.ok_last_done_s - load.ok_first_done_s - stretch_s)
    achieved = (load.ok + excused) / span_s if span_s > 0 else 0.0
    passed, _ = step_passes(
        p99_ms=max(judged_ms - allowance_ms, 0.0),
        error_rate=non_ok / load.requests,
        offered_rps=load.offered_rps,
        achieved_rps=achieved,
        sla=sla,
    )
    return passed


def step_from_load(load: LoadResult, sla: SLA, *, min_requests: int = 0) -> StepResult:
    """The step rule applied to the client's own measurement of a window.

    A window that failed while its client was over its limits (ClientHealth.limit_reason)
    is invalid, neither a pass nor a failure, when the client's own delays could explain
    the failure (client_could_explain); one that passed stays a pass, since a stalled or
    busy client only adds latency to requests timed from their schedule. The SLA p99
    counts every non-OK request as infinitely slow; with fewer than `min_requests`
    requests it is the p99's upper confidence bound instead. A window whose latency
    still climbs at its end fails (see rising_trend)."""
    p99 = load.sla_p99_ms
    short = 0 < load.requests < min_requests
    bound_only = False
    if short:
        p99 = p99_upper_bound_ms(LatencyHistogram.decode(load.sla_histogram))
    limit = load.client.limit_reason(sla)
    if load.requests == 0:
        passed, reason = False, "no request completed"
    else:
        passed, reason = step_passes(
            p99_ms=p99,
            error_rate=load.error_rate,
            offered_rps=load.offered_rps,
            achieved_rps=load.achieved_rps,
            sla=sla,
        )
        trend = rising_trend(load.timeline, load.duration_s, sla.p99_ms)
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
            )[0]
        if bound_only:
            reason += (
                f" (upper {P99_UCB_LEVEL:.0%} bound of p99 from {load.requests} requests, "
                f"fewer than {min_requests})"
            )
    valid = True
    if limit and not passed:
        if client_could_explain(load, sla, p99):
            passed, reason, valid = False, f"invalid, client-bound: {limit}", False
        else:
            reason += f" (the client was over its limits too: {limit})"
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
    )
