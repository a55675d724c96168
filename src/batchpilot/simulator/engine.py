"""The discrete-event core: latencies of requests through dynamic-batching replicas.

A batch opens with the first queued request and closes when it holds `max_batch_size`
requests or when `max_queue_time` has passed since that first request. One worker runs
one batch at a time. Two collection policies:

- "sequential" (the reference server's batcher, and the default): the collector waits
  for the worker to finish before it closes the next batch, so under load the next batch
  is taken from the backlog, up to `max_batch_size`, as soon as the worker is free.
  Batch membership depends on the worker, so this is a loop over batches (not
  requests) on plain Python floats: about 0.5 µs a batch.
- "pipelined": batches close on arrivals and timers alone and a closed batch waits for
  the worker. Membership does not depend on the worker, so it is two array passes:
  with `nxt[i] = min(i + B, first j with a[j] > a[i] + T)` the batches start at
  0, nxt[0], nxt[nxt[0]], ... (enumerated by pointer doubling), and the worker follows
  Lindley's recursion end_k = max(close_k, end_{k-1}) + t_k, whose closed form is a
  cumulative sum and a running maximum.

The two agree whenever the worker is idle when a batch closes (light load, or batch
size 1).

What the reference server's batcher does beyond "sequential" (`ServerModel`, one loop
over batches with requests admitted one by one, `server_schedule`):
- ahead: up to `ahead` full batches are handed to the model process while another still
  computes; the model starts each the moment the one before it ends, so the hand-over
  round trip (`handover_ms` of the cost model, part of each profiled batch time) is paid
  once for a run of back-to-back full batches instead of once per batch;
- jitter: each batch's service time times a seeded factor of mean 1 (lognormal, the
  given coefficient of variation): real batch times spread, and queues feel it;
- queue limit: a request that finds `queue_limit` requests waiting is refused at once
  (503) and never served.

Replicas split the arrivals round robin (request i goes to replica i mod R), as a
round-robin load balancer in front of identical replicas does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from batchpilot.simulator.cost import LinearCost, TableCost

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Batches:
    """Batch boundaries over an arrival array: batch k holds requests
    starts[k] .. stops[k]-1 and closes at close_s[k]."""

    starts: IntArray
    stops: IntArray
    close_s: FloatArray

    @property
    def sizes(self) -> IntArray:
        return self.stops - self.starts


def batch_chain(nxt: IntArray) -> IntArray:
    """The start index of every batch: 0, nxt[0], nxt[nxt[0]], ... while < n, where
    nxt has n + 1 entries, nxt[i] > i for i < n and nxt[n] = n (the end absorbs).

    Pointer doubling: with `chain` the first m starts and `jump` = nxt applied m times,
    jump[chain] are the next m starts; then jump = jump[jump]."""
    n = nxt.size - 1
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    chain = np.zeros(1, dtype=np.int64)
    jump = nxt
    while True:
        following = jump[chain]
        if following[-1] >= n:
            return np.concatenate([chain, following[following < n]])
        chain = np.concatenate([chain, following])
        jump = jump[jump]


def form_batches(arrivals_s: FloatArray, max_batch_size: int, max_queue_time_s: float) -> Batches:
    """Batch boundaries and closing times for sorted arrival times."""
    nxt = _timer_limits(arrivals_s, max_batch_size, max_queue_time_s)
    starts = batch_chain(nxt)
    stops = nxt[starts]
    full = (stops - starts) == max_batch_size
    # A full batch closes when its last member arrives; any other closes on its timer.
    close_s = np.where(full, arrivals_s[stops - 1], arrivals_s[starts] + max_queue_time_s)
    return Batches(starts=starts, stops=stops, close_s=close_s)


def batch_rows(batches: Batches, sizes: IntArray, basis: str) -> FloatArray:
    """Rows the worker computes per batch: the sum of the request sizes, or the batch
    size times its longest request when the model pads."""
    if basis == "padded":
        longest: IntArray = np.maximum.reduceat(sizes, batches.starts)
        padded: FloatArray = (longest * batches.sizes).astype(np.float64)
        return padded
    cumulative: IntArray = np.concatenate([[0], np.cumsum(sizes)])
    summed: FloatArray = (cumulative[batches.stops] - cumulative[batches.starts]).astype(np.float64)
    return summed


def worker_finish_times(close_s: FloatArray, service_s: FloatArray) -> FloatArray:
    """Lindley's recursion end_k = max(close_k, end_{k-1}) + service_k in closed form."""
    total = np.cumsum(service_s)
    before = total - service_s
    finish: FloatArray = total + np.maximum.accumulate(close_s - before)
    return finish


def _timer_limits(arrivals_s: FloatArray, max_batch_size: int, max_queue_time_s: float) -> IntArray:
    """nxt[i]: where a batch opened by request i would stop if the worker were free."""
    n = arrivals_s.size
    timer_limit = np.searchsorted(arrivals_s, arrivals_s + max_queue_time_s, side="right")
    nxt = np.empty(n + 1, dtype=np.int64)
    np.minimum(np.arange(n, dtype=np.int64) + max_batch_size, timer_limit, out=nxt[:n])
    nxt[n] = n
    return nxt


def pipelined_schedule(
    arrivals_s: FloatArray,
    sizes: IntArray,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
) -> tuple[IntArray, FloatArray]:
    """(batch sizes, finish times) when batches close independently of the worker."""
    batches = form_batches(arrivals_s, max_batch_size, max_queue_time_s)
    rows = batch_rows(batches, sizes, cost.rows_basis)
    service_s = cost.batch_ms(batches.sizes, rows) / 1000.0
    return batches.sizes, worker_finish_times(batches.close_s, service_s)


def sequential_schedule(
    arrivals_s: FloatArray,
    sizes: IntArray,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
) -> tuple[IntArray, FloatArray]:
    """(batch sizes, finish times) when the next batch is collected only once the worker
    is free: it closes at the later of its natural close (full, or timer) and the
    worker's finish, holding whatever has arrived by then, up to max_batch_size."""
    n = arrivals_s.size
    nxt = _timer_limits(arrivals_s, max_batch_size, max_queue_time_s).tolist()
    arrivals = arrivals_s.tolist()
    padded = cost.rows_basis == "padded"
    size_list = sizes.tolist()
    cumulative = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    service = cost.scalar_s()
    batch_sizes: list[int] = []
    finish: list[float] = []
    free_at = -math.inf
    i = 0
    while i < n:
        stop = nxt[i]
        count = stop - i
        natural = arrivals[stop - 1] if count == max_batch_size else arrivals[i] + max_queue_time_s
        if natural < free_at:
            close = free_at
            if count < max_batch_size:  # the backlog kept growing while the worker ran
                stop = bisect.bisect_right(arrivals, free_at, stop, min(i + max_batch_size, n))
                count = stop - i
        else:
            close = natural
        rows = max(size_list[i:stop]) * count if padded else cumulative[stop] - cumulative[i]
        free_at = close + service(count, rows)
        batch_sizes.append(count)
        finish.append(free_at)
        i = stop
    return np.asarray(batch_sizes, dtype=np.int64), np.asarray(finish)


@dataclass(frozen=True)
class ServerModel:
    """What the server does beyond the sequential batcher (see the module's notes)."""

    ahead: int = 0
    queue_limit: int | None = None

    @property
    def plain(self) -> bool:
        return self.ahead == 0 and self.queue_limit is None


def server_schedule(
    arrivals_s: FloatArray,
    sizes: IntArray,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
    server: ServerModel,
    jitter: FloatArray | None = None,
) -> tuple[IntArray, FloatArray]:
    """(batch of each request, or -1 when refused; visible finish time of each batch) for
    the reference server's batcher: the collector acts while at most `ahead` batches are
    in flight; a full batch closes at once, one that is not full only when the model is
    free and its oldest request has waited `max_queue_time`."""
    n = arrivals_s.size
    arrivals = arrivals_s.tolist()
    size_list = sizes.tolist()
    padded = cost.rows_basis == "padded"
    service = cost.scalar_s()
    handover = cost.handover_ms / 1e3
    factors = jitter.tolist() if jitter is not None else None
    limit = server.queue_limit if server.queue_limit is not None else n + 1
    batch_of = [-1] * n
    accepted: list[int] = []  # admitted requests in arrival order; waiting from `head`
    head = 0
    following = 0  # the next arrival not yet admitted or refused
    finish: list[float] = []  # when each batch's reply is back (the collector sees it)
    model_end = -math.inf  # when the model process finished the last batch
    inf = math.inf

    def admit_until(t: float, most: int) -> None:
        nonlocal following
        while following < n and arrivals[following] <= t and len(accepted) - head < most:
            if len(accepted) - head < limit:
                accepted.append(following)
            following += 1

    while True:
        if head == len(accepted):
            if following >= n:
                break
            admit_until(arrivals[following], n + 1)
            continue
        busy_until = finish[-1] if finish else -inf
        # the collector may hand over a batch once at most `ahead` are in flight
        gate = finish[-1 - server.ahead] if len(finish) > server.ahead else -inf
        timer = max(arrivals[accepted[head]] + max_queue_time_s, busy_until)
        admit_until(timer, max_batch_size)  # nothing leaves the queue before the close
        waiting = len(accepted) - head
        full_at = (
            max(arrivals[accepted[head + max_batch_size - 1]], gate)
            if waiting >= max_batch_size
            else inf
        )
        close = min(full_at, timer)
        admit_until(close, n + 1)
        count = min(max_batch_size, len(accepted) - head)
        members = accepted[head : head + count]
        head += count
        if padded:
            rows = float(max(size_list[j] for j in members) * count)
        else:
            rows = float(sum(size_list[j] for j in members))
        seconds = service(count, rows)
        if factors is not None:
            seconds *= factors[len(finish) % len(factors)]
        # The model runs batches in order: this one starts when it arrives there or when
        # the one before it ends. Its reply takes the hand-over time to come back.
        start = max(close, model_end)
        model_end = start + max(seconds - handover, 0.0)
        for j in members:
            batch_of[j] = len(finish)
        finish.append(model_end + handover)
    return np.asarray(batch_of, dtype=np.int64), np.asarray(finish)


Policy = Literal["sequential", "pipelined"]
_SCHEDULES = {"sequential": sequential_schedule, "pipelined": pipelined_schedule}


def replica_latencies(
    arrivals_s: FloatArray,
    sizes: IntArray,
    *,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
    policy: Policy = "sequential",
    server: ServerModel | None = None,
    jitter: FloatArray | None = None,
) -> FloatArray:
    """End-to-end latency (seconds) of each request through one replica; a request the
    server refused (queue full) has an infinite latency."""
    if arrivals_s.size == 0:
        return np.zeros(0)
    # Without ahead, jitter or a queue limit the server is the plain sequential batcher
    # (a hand-over time then only adds to each batch, as it is in the profile).
    if policy == "sequential" and ((server is not None and not server.plain) or jitter is not None):
        batch_of, finish = server_schedule(
            arrivals_s,
            sizes,
            max_batch_size,
            max_queue_time_s,
            cost,
            server or ServerModel(),
            jitter,
        )
        served = batch_of >= 0
        out: FloatArray = np.full(arrivals_s.size, np.inf)
        out[served] = finish[batch_of[served]] - arrivals_s[served] + cost.overhead_ms / 1e3
        return out
    batch_sizes, finish_s = _SCHEDULES[policy](
        arrivals_s, sizes, max_batch_size, max_queue_time_s, cost
    )
    latency: FloatArray = np.repeat(finish_s, batch_sizes) - arrivals_s + cost.overhead_ms / 1e3
    return latency


def latencies(
    arrivals_s: FloatArray,
    sizes: IntArray,
    *,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
    replicas: int = 1,
    policy: Policy = "sequential",
    server: ServerModel | None = None,
    jitter: FloatArray | None = None,
) -> FloatArray:
    """End-to-end latency of each request (same order as `arrivals_s`) through
    `replicas` identical replicas behind a round-robin balancer. `jitter`: service-time
    factors, one per batch (cycled), shared out among the replicas."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    out = np.empty(arrivals_s.size)
    for r in range(replicas):
        out[r::replicas] = replica_latencies(
            arrivals_s[r::replicas],
            sizes[r::replicas],
            max_batch_size=max_batch_size,
            max_queue_time_s=max_queue_time_s,
            cost=cost,
            policy=policy,
            server=server,
            jitter=None if jitter is None else jitter[r::replicas],
        )
    return out
