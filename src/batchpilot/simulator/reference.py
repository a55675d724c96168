"""A plain event-by-event simulation of one batching replica: slow (a heap operation per
event, Python per request) and written to mirror the server's batcher step by step, so
that the fast engine can be checked against it and its speed-up measured."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import numpy.typing as npt

from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.engine import Policy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Event kinds, in the order simultaneous events are handled: an arrival at the very
# instant a timer fires still makes the batch (the engine's `<=`).
ARRIVAL, TIMER, DONE = 0, 1, 2


def reference_latencies(
    arrivals_s: FloatArray,
    sizes: IntArray,
    *,
    max_batch_size: int,
    max_queue_time_s: float,
    cost: LinearCost | TableCost,
    policy: Policy = "sequential",
) -> FloatArray:
    n = arrivals_s.size
    service = cost.scalar_s()
    padded = cost.rows_basis == "padded"
    events: list[tuple[float, int, int]] = [
        (float(t), ARRIVAL, i) for i, t in enumerate(arrivals_s)
    ]
    heapq.heapify(events)
    queue: deque[int] = deque()  # requests not yet in a closed batch
    closed: deque[list[int]] = deque()  # pipelined: closed batches waiting for the worker
    running: list[int] | None = None
    latency = np.empty(n)
    armed_for = -1  # the head request a timer is pending for

    def batch_time(batch: list[int]) -> float:
        batch_sizes = [int(sizes[j]) for j in batch]
        rows = max(batch_sizes) * len(batch) if padded else sum(batch_sizes)
        return service(len(batch), float(rows))

    def take() -> list[int]:
        return [queue.popleft() for _ in range(min(max_batch_size, len(queue)))]

    while events:
        now, kind, item = heapq.heappop(events)
        if kind == ARRIVAL:
            queue.append(item)
        elif kind == DONE:
            assert running is not None
            for j in running:
                latency[j] = now - arrivals_s[j]
            running = None
        # The collector: close what is due.
        if policy == "pipelined":
            while queue and (
                len(queue) >= max_batch_size or now >= arrivals_s[queue[0]] + max_queue_time_s
            ):
                closed.append(take())
        elif running is None and queue:
            due = now >= arrivals_s[queue[0]] + max_queue_time_s
            if len(queue) >= max_batch_size or due:
                closed.append(take())
        # The worker.
        if running is None and closed:
            running = closed.popleft()
            heapq.heappush(events, (now + batch_time(running), DONE, 0))
        # A timer for the head of the queue, if nothing else will wake the collector.
        if queue and armed_for != queue[0]:
            armed_for = queue[0]
            heapq.heappush(events, (float(arrivals_s[queue[0]] + max_queue_time_s), TIMER, 0))
    return latency + cost.overhead_ms / 1000.0
