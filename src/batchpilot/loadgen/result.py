"""The outcome of one open-loop run, and how per-request records become it.

Everything here is pure: the generator only fills arrays on its hot path and hands them to
`summarise` once the run is over."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram, merge_encoded
from batchpilot.loadgen.tokens import StreamSummary, merge_streams
from batchpilot.loadgen.trend import queue_growth_s
from batchpilot.models import ClientHealth, LatencySummary

OK = "ok"
TIMEOUT = "timeout"
CONNECTION = "connection"
TLS = "tls"  # the target's certificate was not verified (or the handshake failed)
CANCELLED = "cancelled"  # in flight when the run was interrupted: neither ok nor an error
OVERLOAD = "client_overload"  # not sent: the generator's in-flight bound was reached


class TimelineSecond(BaseModel):
    """Requests scheduled in one second of the run, by their scheduled time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    t_s: int
    scheduled: int
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_lag_ms: float


# The measured part of a window is cut into this many equal bins for the latency trend:
# enough points in its second half for a robust slope even in a 1 s step, whose
# one-second timeline holds a single point.
TREND_BINS = 8


class TrendBin(BaseModel):
    """Requests scheduled in one of the TREND_BINS equal slices of the measured window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    t_s: float  # the slice's middle, from the schedule's zero
    answered: int  # OK responses and timeouts: the requests it has a latency for
    p50_ms: float


class LoadResult(BaseModel):
    """Everything one run measured. `latency` covers successful responses and timeouts (a
    timeout counts as at least the timeout); other errors are counted, not timed, since a
    fast rejection would flatter the percentiles. `sla_p99_ms` goes further and counts
    every non-OK attempt as infinitely slow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    urls: list[str]
    arrival: str
    seed: int
    target_rps: float  # the rate asked for
    offered_rps: float  # requests actually scheduled per second of the window
    achieved_rps: float  # successful responses per second (see achieved_rate)
    duration_s: float  # the scheduling window that was run
    # requests scheduled in the window's first `warmup_s` were sent but left out of every
    # figure (rates, counts, percentiles); rates are over duration_s - warmup_s
    warmup_s: float = 0.0
    timeout_s: float | None = None  # a request's deadline from its scheduled time
    elapsed_s: float  # from the first send until the last response
    requests: int  # completed attempts: ok + errors
    ok: int
    error_rate: float
    errors: dict[str, int]  # by kind: HTTP status code, "timeout", "connection", "tls", ...
    timeouts: int
    latency: LatencySummary  # from each request's scheduled time: what users would see
    # From the moment each request actually left, as closed-loop tools measure it: the
    # gap to `latency` is what the generator's own lag added.
    latency_from_send: LatencySummary
    max_lag_ms: float  # how far the generator's sends fell behind their schedule
    mean_lag_ms: float
    interrupted: bool = False
    timeline: list[TimelineSecond]
    # the measured window's latency over time, in TREND_BINS slices (empty: too few
    # requests, or a result written without it)
    trend: list[TrendBin] = []
    histogram: str  # encoded HDR histogram of the latencies, for exact merging
    # p99 of every attempt with each non-OK one (error, timeout, give-up, not sent)
    # recorded at the histogram's top (an hour): the percentile the SLA is judged on.
    sla_p99_ms: float
    sla_histogram: str
    client: ClientHealth
    # completion times (s from the schedule's zero) of the first and last successful
    # measured request: generators sharing one schedule merge their goodput exactly
    ok_first_done_s: float | None = None
    ok_last_done_s: float | None = None
    # each generator process's own health when several shared the run (else empty)
    worker_clients: list[ClientHealth] = []
    # a token-stream run's TTFT, ITL, TPOT, output tokens and goodput (None: not one)
    stream: StreamSummary | None = None
    # why a breach rule stopped the run before its end (loadgen.breach); None: it did not
    breach_stop: str | None = None

    def latency_histogram(self) -> LatencyHistogram:
        return LatencyHistogram.decode(self.histogram)


def achieved_rate(ok: int, measured_s: float, trend: Sequence[tuple[float, float]] = ()) -> float:
    """Successful responses per second: over the measured window, stretched by how much
    the median latency grew across it (`trend`: (s, ms) points; trend.queue_growth_s).
    A server that keeps up answers a window's requests over the window, whatever its
    latency spread; one that falls behind by a share of the rate grows its queue, and
    its median latency, by that share of the window, and the stretch brings the rate
    down to what it served. Dividing by the span of completions instead would charge
    each configuration its spread (long waits, bursty arrivals) as lost throughput."""
    if measured_s <= 0:
        return 0.0
    return ok / (measured_s + queue_growth_s(trend, measured_s))


def trend_points(trend: Sequence[TrendBin]) -> list[tuple[float, float]]:
    """(time s, median ms) of the slices with answered requests."""
    return [(b.t_s, b.p50_ms) for b in trend if b.answered]


def summarise(
    *,
    urls: Sequence[str],
    arrival: str,
    seed: int,
    target_rps: float,
    window_s: float,
    offsets: Sequence[float],
    outcomes: Sequence[str | None],
    latencies_ms: Sequence[float],
    lags_ms: Sequence[float],
    done_at: Sequence[float],
    elapsed_s: float,
    interrupted: bool,
    conn_waits_ms: Sequence[float] = (),
    loop_delays_ms: Sequence[float] = (),
    cpu: float = 0.0,
    warmup_s: float = 0.0,
    timeout_s: float | None = None,
    connection_cap: int | None = None,
    slot_waits_ms: Sequence[float] = (),
    stream: StreamSummary | None = None,
    breach_stop: str | None = None,
) -> LoadResult:
    """Reduce per-request records (index i = i-th scheduled request; outcome None = never
    sent) to a LoadResult. `done_at` is the completion time relative to the start.

    Requests scheduled before `warmup_s` are the step's warm-up (connections opening, the
    server's batcher and caches settling, the previous step's backlog draining): they
    count in the timeline and the client's health, not in the figures. `slot_waits_ms`
    (index-aligned, empty: none) is each request's wait for a connection slot; under a
    `connection_cap` that wait is the client's, so it counts in how long the client held
    a request that timed out (ClientHealth.timeout_held_min_ms). `stream` is a
    token-stream run's own figures (`loadgen.tokens.summarise_stream`), carried as given."""
    if not (math.isfinite(warmup_s) and warmup_s >= 0):
        raise ValueError(f"warm-up must be ≥ 0 s, got {warmup_s:g}")
    measured_s = window_s - warmup_s
    histogram = LatencyHistogram()
    from_send = LatencyHistogram()
    sla_histogram = LatencyHistogram()
    kinds: Counter[str] = Counter()
    ok_done: list[float] = []
    lags: list[float] = []
    held_min_ms: float | None = None
    per_second: dict[int, _Second] = {}
    bin_s = measured_s / TREND_BINS
    bins: list[list[float]] = [[] for _ in range(TREND_BINS)]
    measured_sends: list[int] = []
    measured_sent = 0
    for i, outcome in enumerate(outcomes):
        if outcome is None:
            continue
        lags.append(lags_ms[i])
        second = per_second.setdefault(int(offsets[i]), _Second())
        second.scheduled += 1
        second.max_lag_ms = max(second.max_lag_ms, lags_ms[i])
        measured = offsets[i] >= warmup_s
        measured_sent += measured
        if measured:
            measured_sends.append(i)
        if outcome == CANCELLED:
            continue
        if outcome == OK:
            second.ok += 1
        else:
            second.errors += 1
        if outcome in (OK, TIMEOUT):
            second.latencies.append(latencies_ms[i])
        if not measured:
            continue
        kinds[outcome] += 1
        if outcome == TIMEOUT:
            held = lags_ms[i]
            if connection_cap is not None and slot_waits_ms:
                held += slot_waits_ms[i]
            held_min_ms = held if held_min_ms is None else min(held_min_ms, held)
        if outcome == OK:
            ok_done.append(done_at[i])
            sla_histogram.record_ms(latencies_ms[i])
        else:
            sla_histogram.record_ms(TOP_MS)
        if outcome in (OK, TIMEOUT):
            histogram.record_ms(latencies_ms[i])
            from_send.record_ms(max(latencies_ms[i] - lags_ms[i], 0.0))
            if bin_s > 0:
                slot = min(int((offsets[i] - warmup_s) / bin_s), TREND_BINS - 1)
                bins[slot].append(latencies_ms[i])
    ok = kinds.pop(OK, 0)
    requests = ok + sum(kinds.values())
    trend = [
        TrendBin(
            t_s=warmup_s + (k + 0.5) * bin_s,
            answered=len(latencies),
            p50_ms=_nearest_rank(sorted(latencies), 0.50),
        )
        for k, latencies in enumerate(bins)
        if bin_s > 0
    ]
    return LoadResult(
        urls=list(urls),
        arrival=arrival,
        seed=seed,
        target_rps=target_rps,
        offered_rps=measured_sent / measured_s if measured_s > 0 else 0.0,
        achieved_rps=achieved_rate(ok, measured_s, trend_points(trend)),
        duration_s=window_s,
        warmup_s=warmup_s,
        timeout_s=timeout_s,
        elapsed_s=elapsed_s,
        requests=requests,
        ok=ok,
        error_rate=(requests - ok) / requests if requests else 0.0,
        errors=dict(sorted(kinds.items())),
        timeouts=kinds.get(TIMEOUT, 0),
        latency=histogram.summary(),
        latency_from_send=from_send.summary(),
        max_lag_ms=max(lags, default=0.0),
        mean_lag_ms=math.fsum(lags) / len(lags) if lags else 0.0,
        interrupted=interrupted,
        breach_stop=breach_stop,
        timeline=[per_second[t].freeze(t) for t in sorted(per_second)],
        trend=trend,
        histogram=histogram.encode(),
        sla_p99_ms=sla_histogram.percentile_ms(99),
        sla_histogram=sla_histogram.encode(),
        client=ClientHealth(
            lag_p99_ms=_nearest_rank(sorted(lags), 0.99),
            lag_max_ms=max(lags, default=0.0),
            conn_wait_p99_ms=_nearest_rank(sorted(conn_waits_ms), 0.99),
            conn_wait_max_ms=max(conn_waits_ms, default=0.0),
            loop_delay_p99_ms=_nearest_rank(sorted(loop_delays_ms), 0.99),
            loop_delay_max_ms=max(loop_delays_ms, default=0.0),
            cpu=cpu,
            connection_cap=connection_cap,
            timeout_held_min_ms=held_min_ms,
            send_rate_share=send_rate_share(offsets, lags_ms, measured_sends),
        ),
        ok_first_done_s=min(ok_done, default=None),
        ok_last_done_s=max(ok_done, default=None),
        stream=stream,
    )


def send_rate_share(
    offsets: Sequence[float], lags_ms: Sequence[float], sent: Sequence[int]
) -> float:
    """How much of the scheduled rate the client really sent: the span between the
    sends scheduled at the 1st and the 99th percentile of `sent` (indices in schedule
    order), over the span between the times they actually left. A few late sends (one
    stall) move neither end; a client that fell further and further behind stretches
    the second. 1.0 when too few were sent to tell, at most 1.0."""
    if len(sent) < 3:
        return 1.0
    first = sent[int(0.01 * (len(sent) - 1))]
    last = sent[math.ceil(0.99 * (len(sent) - 1))]
    scheduled = offsets[last] - offsets[first]
    actual = scheduled + (lags_ms[last] - lags_ms[first]) / 1000.0
    if scheduled <= 0 or actual <= 0:
        return 1.0
    return min(1.0, scheduled / actual)


class _Second:
    __slots__ = ("errors", "latencies", "max_lag_ms", "ok", "scheduled")

    def __init__(self) -> None:
        self.scheduled = 0
        self.ok = 0
        self.errors = 0
        self.max_lag_ms = 0.0
        self.latencies: list[float] = []

    def freeze(self, t: int) -> TimelineSecond:
        ordered = sorted(self.latencies)
        return TimelineSecond(
            t_s=t,
            scheduled=self.scheduled,
            ok=self.ok,
            errors=self.errors,
            p50_ms=_nearest_rank(ordered, 0.50),
            p99_ms=_nearest_rank(ordered, 0.99),
            max_lag_ms=self.max_lag_ms,
        )


def _nearest_rank(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def merge_results(results: Sequence[LoadResult]) -> LoadResult:
    """Results of generators that ran at the same time (e.g. one per pod, or one per
    process sharing a schedule) as one run: counts add, histograms merge exactly, the
    goodputs add, the timeline adds second by second, and each part's client health is
    kept."""
    if not results:
        raise ValueError("merge_results needs at least one result")
    histogram = merge_encoded(r.histogram for r in results)
    sla_histogram = merge_encoded(r.sla_histogram for r in results)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.errors)
    requests = sum(r.requests for r in results)
    ok = sum(r.ok for r in results)
    seconds: dict[int, list[TimelineSecond]] = {}
    for r in results:
        for s in r.timeline:
            seconds.setdefault(s.t_s, []).append(s)
    sent = sum(r.offered_rps * (r.duration_s - r.warmup_s) for r in results)
    firsts = [r.ok_first_done_s for r in results if r.ok_first_done_s is not None]
    lasts = [r.ok_last_done_s for r in results if r.ok_last_done_s is not None]
    trend = _merge_trend(results)
    # each part's goodput with the queue growth it saw: slice medians do not merge
    # exactly, and the worst part's would stretch every part's window
    achieved = sum(r.achieved_rps for r in results)
    return LoadResult(
        urls=[u for r in results for u in r.urls],
        arrival=results[0].arrival,
        seed=results[0].seed,
        target_rps=sum(r.target_rps for r in results),
        offered_rps=sum(r.offered_rps for r in results),
        achieved_rps=achieved,
        duration_s=max(r.duration_s for r in results),
        warmup_s=max(r.warmup_s for r in results),
        timeout_s=results[0].timeout_s,
        elapsed_s=max(r.elapsed_s for r in results),
        requests=requests,
        ok=ok,
        error_rate=(requests - ok) / requests if requests else 0.0,
        errors=dict(sorted(errors.items())),
        timeouts=errors.get(TIMEOUT, 0),
        latency=histogram.summary(),
        # Only the scheduled-time histogram travels with a result; the from-send view of
        # the merge is that of the part that lagged most.
        latency_from_send=max(results, key=lambda r: r.max_lag_ms).latency_from_send,
        max_lag_ms=max(r.max_lag_ms for r in results),
        mean_lag_ms=(
            sum(r.mean_lag_ms * r.offered_rps * (r.duration_s - r.warmup_s) for r in results) / sent
            if sent
            else 0.0
        ),
        interrupted=any(r.interrupted for r in results),
        breach_stop=next((r.breach_stop for r in results if r.breach_stop), None),
        timeline=[_merge_second(t, seconds[t]) for t in sorted(seconds)],
        trend=trend,
        histogram=histogram.encode(),
        sla_p99_ms=sla_histogram.percentile_ms(99),
        sla_histogram=sla_histogram.encode(),
        client=merge_health([r.client for r in results]),
        ok_first_done_s=min(firsts, default=None),
        ok_last_done_s=max(lasts, default=None),
        worker_clients=[c for r in results for c in (r.worker_clients or [r.client])],
        stream=_merge_stream(results),
    )


def _merge_stream(results: Sequence[LoadResult]) -> StreamSummary | None:
    """The token figures of parts that all streamed tokens, merged exactly."""
    parts = [r.stream for r in results if r.stream is not None]
    if not parts:
        return None
    if len(parts) != len(results):
        raise ValueError("cannot merge the results of token-stream and other runs")
    return merge_streams(parts)


def merge_health(parts: Sequence[ClientHealth]) -> ClientHealth:
    """Client health of generators that ran side by side: CPU and workers add and the
    busiest process is kept; lag, connection wait and loop delay take the worst part,
    since one stalled generator is enough to make a step invalid."""
    return ClientHealth(
        lag_p99_ms=max(p.lag_p99_ms for p in parts),
        lag_max_ms=max(p.lag_max_ms for p in parts),
        conn_wait_p99_ms=max(p.conn_wait_p99_ms for p in parts),
        conn_wait_max_ms=max(p.conn_wait_max_ms for p in parts),
        loop_delay_p99_ms=max(p.loop_delay_p99_ms for p in parts),
        loop_delay_max_ms=max(p.loop_delay_max_ms for p in parts),
        cpu=sum(p.cpu for p in parts),
        workers=sum(p.workers for p in parts),
        cpu_max_worker=max(p.busiest_cpu() for p in parts),
        timeout_held_min_ms=min(
            (p.timeout_held_min_ms for p in parts if p.timeout_held_min_ms is not None),
            default=None,
        ),
        send_rate_share=min(p.send_rate_share for p in parts),
        # the parts' caps add up to the client's; one uncapped part leaves it uncapped
        connection_cap=(
            None
            if any(p.connection_cap is None for p in parts)
            else sum(p.connection_cap or 0 for p in parts)
        ),
    )


def _merge_second(t: int, parts: Sequence[TimelineSecond]) -> TimelineSecond:
    # Per-second percentiles cannot be merged exactly; the worst part is the honest bound.
    return TimelineSecond(
        t_s=t,
        scheduled=sum(p.scheduled for p in parts),
        ok=sum(p.ok for p in parts),
        errors=sum(p.errors for p in parts),
        p50_ms=max(p.p50_ms for p in parts),
        p99_ms=max(p.p99_ms for p in parts),
        max_lag_ms=max(p.max_lag_ms for p in parts),
    )


def _merge_trend(results: Sequence[LoadResult]) -> list[TrendBin]:
    """Slice by slice, when every part cut the same window the same way (generators
    sharing one schedule do); the worst part's median, as for the timeline. Empty when
    the parts' slices differ: no trend is better than a wrong one."""
    trends = [r.trend for r in results if r.trend]
    if not trends or len(trends) != len(results):
        return []
    times = [[b.t_s for b in t] for t in trends]
    if any(not _same_times(times[0], other) for other in times[1:]):
        return []
    return [
        TrendBin(
            t_s=parts[0].t_s,
            answered=sum(p.answered for p in parts),
            p50_ms=max(p.p50_ms for p in parts if p.answered)
            if any(p.answered for p in parts)
            else 0.0,
        )
        for parts in zip(*trends, strict=True)
    ]


def _same_times(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a, b, strict=True)
    )
