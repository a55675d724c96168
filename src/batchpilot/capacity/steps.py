"""Turning a measured window into a step decision (DESIGN.md §6)."""

from __future__ import annotations

import math

from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram
from batchpilot.loadgen.result import LoadResult
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


def step_from_load(load: LoadResult, sla: SLA, *, min_requests: int = 0) -> StepResult:
    """The step rule applied to the client's own measurement of a window.

    A window whose client could not keep its schedule is invalid: neither a pass nor a
    failure. The SLA p99 counts every non-OK request as infinitely slow; with fewer than
    `min_requests` requests it is the p99's upper confidence bound instead."""
    p99 = load.sla_p99_ms
    short = 0 < load.requests < min_requests
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
        if short and not passed and load.sla_p99_ms <= sla.p99_ms:
            reason += (
                f" (upper {P99_UCB_LEVEL:.0%} bound of p99 from {load.requests} requests, "
                f"fewer than {min_requests})"
            )
    if limit:
        passed, reason = False, f"invalid, client-bound: {limit}"
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
        valid=not limit,
        client=load.client,
    )
