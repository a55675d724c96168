"""How fast the queueing simulator runs: simulated requests per CPU-second.

For each collection policy and load level, the median over several repeats of
requests / process CPU time for one million requests; beside it the plain event-by-event
simulation (`batchpilot.simulator.reference`) on the same traffic, and the ratio of the
two measured in the same run. Target: at least 1M requests per CPU-second.

CPU time, not wall time, so other processes on a shared machine matter less; the
figures still move by some tens of percent from run to run, the ratios less.

    python benchmarks/simulator_speed.py [--json] [--requests N] [--repeats K]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

import results
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.engine import Policy, latencies
from batchpilot.simulator.reference import reference_latencies

TARGET = 1_000_000.0
COST = LinearCost(fixed_ms=2.0, per_row_ms=0.05)  # about the reference MLP's shape
SIZES = np.array([1, 4, 16], dtype=np.int64)
SIZE_WEIGHTS = np.array([0.8, 0.15, 0.05])
# (name, offered rate req/s, max_batch_size, max_queue_time_ms). Light load with a big
# cap is the engine's worst case: nearly every batch holds one request.
CASES = [
    ("light: rate 100, batch 32, wait 5 ms", 100.0, 32, 5.0),
    ("busy: rate 1500, batch 16, wait 10 ms", 1500.0, 16, 10.0),
    ("heavy: rate 4000, batch 64, wait 20 ms", 4000.0, 64, 20.0),
]
POLICIES: tuple[Policy, ...] = ("sequential", "pipelined")


def _traffic(rate: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    sizes = rng.choice(SIZES, size=n, p=SIZE_WEIGHTS)
    return arrivals, sizes


def _cpu_rate(run: Callable[[], object], n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        rates.append(n / max(time.process_time() - start, 1e-9))
    return statistics.median(rates)


class Row(BaseModel):
    case: str
    policy: Policy
    engine_requests_per_cpu_s: int
    reference_requests_per_cpu_s: int
    speedup: float


class Report(BaseModel):
    requests: int
    reference_requests: int
    repeats: int
    target_requests_per_cpu_s: float
    min_requests_per_cpu_s: int
    meets_target: bool
    rows: list[Row]


def measure(requests: int, repeats: int, reference_requests: int) -> Report:
    rows = []
    for name, rate, batch, wait_ms in CASES:
        arrivals, sizes = _traffic(rate, requests, seed=1)
        ref_arrivals, ref_sizes = arrivals[:reference_requests], sizes[:reference_requests]
        for policy in POLICIES:
            fast = functools.partial(
                latencies,
                arrivals,
                sizes,
                max_batch_size=batch,
                max_queue_time_s=wait_ms / 1e3,
                cost=COST,
                policy=policy,
            )
            slow = functools.partial(
                reference_latencies,
                ref_arrivals,
                ref_sizes,
                max_batch_size=batch,
                max_queue_time_s=wait_ms / 1e3,
                cost=COST,
                policy=policy,
            )
            engine_rate = _cpu_rate(fast, requests, repeats)
            reference_rate = _cpu_rate(slow, reference_requests, max(1, repeats // 2))
            rows.append(
                Row(
                    case=name,
                    policy=policy,
                    engine_requests_per_cpu_s=round(engine_rate),
                    reference_requests_per_cpu_s=round(reference_rate),
                    speedup=round(engine_rate / reference_rate, 1),
                )
            )
    slowest = min(r.engine_requests_per_cpu_s for r in rows)
    return Report(
        requests=requests,
        reference_requests=reference_requests,
        repeats=repeats,
        target_requests_per_cpu_s=TARGET,
        min_requests_per_cpu_s=slowest,
        meets_target=slowest >= TARGET,
        rows=rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--reference-requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    results.add_options(parser)
    args = parser.parse_args()
    if args.requests < 1000 or args.reference_requests < 100 or args.repeats < 1:
        parser.error("need --requests >= 1000, --reference-requests >= 100, --repeats >= 1")
    recorder = results.start("simulator_speed", args)
    result = measure(args.requests, args.repeats, min(args.reference_requests, args.requests))
    recorder.save(result.model_dump(mode="json"))
    if args.json:
        print(json.dumps(result.model_dump(mode="json")))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulated requests per CPU-second (median of repeats)")
    for column in ("case", "policy", "engine", "event-by-event", "speed-up"):
        table.add_column(column)
    for row in result.rows:
        table.add_row(
            row.case,
            row.policy,
            f"{row.engine_requests_per_cpu_s:,}",
            f"{row.reference_requests_per_cpu_s:,}",
            f"{row.speedup}x",
        )
    console = Console()
    console.print(table)
    console.print(
        f"slowest case {result.min_requests_per_cpu_s:,} req/CPU-s; target "
        f"{TARGET:,.0f}: {'met' if result.meets_target else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
