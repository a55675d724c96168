"""Distributed load: do 1, 2 and 4 generator processes sharing one schedule report the
same figures against one server?

Each run sends the SAME seeded schedule (same rate, seed, arrival, mix) through
`run_load_workers` with 1, 2 or 4 worker processes -- the code path `capacity
--workers N` and the operator's worker pods share -- and merges their results. The
worker counts are interleaved (1 2 4, 2 4 1, 4 1 2, ...) so drift on a shared machine
hits all of them alike; each figure is the median of the repeats, with its spread
((max - min) / median).

The server is the stub with a fixed delay, not the reference server: its latency is
the same whichever process sent a request and it needs almost no CPU, so a gap
between worker counts is the client's own. The reference server batches and computes
on the same two cores the workers use, so its latency would move with how much CPU the
extra worker processes take from it: a figure about the machine, not about the merge.
On 2 cores the point is agreement, not speed-up: the rate is one that a single worker
sustains.

Besides the figures: each worker count's CPU per request (client CPU seconds / request,
all workers); one worker's CPU per request at 2,000 req/s against a stub that answers
at once, which gives the per-core ceiling of one worker process on this machine; the
first run's encoded sizes (HDR histograms, timeline, the whole result), what one worker
reports per step; and the encoded size of a wide latency histogram of 2k, 100k and 1M
samples (docs/operator/load-scaling.md uses these).

    python benchmarks/distributed_load.py [--json] [--quick] [--rate 500] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

import results
from batchpilot.loadgen.arrivals import as_arrival
from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram, merge_encoded
from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.workers import ShareSpec, run_load_workers
from batchpilot.models import CLIENT_MAX_CPU, RequestMix
from suite_support import StubServerProcess

WORKER_COUNTS = (1, 2, 4)
CEILING_RATE = 2000.0  # one worker against a stub with no delay, for its CPU per request
# samples per step for the histogram sizes: a 1 s step at 2k, a 10 s step at 10k and
# at 100k req/s
HISTOGRAM_SAMPLES = (2_000, 100_000, 1_000_000)
MERGE_REPEATS = 20
DELAY_MS = 10.0
SEED = 13
MIX = RequestMix.default()


def spread(values: list[float]) -> float:
    """(max - min) / median; 0 when the median is 0."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def order(round_index: int) -> list[int]:
    """Round r starts at the r-th worker count, so each count runs first, middle, last."""
    shift = round_index % len(WORKER_COUNTS)
    return list(WORKER_COUNTS[shift:] + WORKER_COUNTS[:shift])


def run_figures(result: LoadResult) -> dict[str, float]:
    client = result.client
    return {
        "offered_rps": result.offered_rps,
        "achieved_rps": result.achieved_rps,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "max_lag_ms": result.max_lag_ms,
        "lag_p99_ms": client.lag_p99_ms,
        "loop_delay_p99_ms": client.loop_delay_p99_ms,
        "cpu": client.cpu,
        "busiest_worker_cpu": client.busiest_cpu(),
        "errors": float(result.requests - result.ok),
        "requests": float(result.requests),
        # every request sent, warm-up included, and the run's wall time: the CPU share
        # covers both
        "sent": float(sum(s.scheduled for s in result.timeline)),
        "elapsed_s": result.elapsed_s,
    }


def payload_sizes(result: LoadResult) -> dict[str, int]:
    """Bytes one worker sends back per step, as JSON (what a worker pod would POST)."""
    timeline = json.dumps([s.model_dump(mode="json") for s in result.timeline])
    return {
        "histogram_b": len(result.histogram),
        "sla_histogram_b": len(result.sla_histogram),
        "timeline_b": len(timeline),
        "timeline_seconds": len(result.timeline),
        "result_json_b": len(result.model_dump_json()),
    }


async def measure(rate: float, duration_s: float, warmup_s: float, repeats: int) -> dict[str, Any]:
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in WORKER_COUNTS}
    sizes: dict[str, int] = {}
    async with StubServerProcess(delay_ms=DELAY_MS, queue_limit=100_000) as stub:
        # one untimed run opens the stub's sockets and imports everything once
        await run_load_workers(
            stub.url, workers=1, rate=rate, duration_s=1.0, mix=MIX, seed=SEED + 1
        )
        for round_index in range(repeats):
            for workers in order(round_index):
                result = await run_load_workers(
                    stub.url, workers=workers, rate=rate, duration_s=duration_s, mix=MIX,
                    arrival="poisson", timeout_s=5.0, seed=SEED, warmup_s=warmup_s,
                )  # fmt: skip
                runs[workers].append(run_figures(result))
                if workers == 1 and not sizes:
                    sizes = payload_sizes(result)
    single_p99 = statistics.median(r["p99_ms"] for r in runs[1])
    rows: list[dict[str, Any]] = []
    for workers in WORKER_COUNTS:
        mine = runs[workers]
        median = {k: statistics.median(r[k] for r in mine) for k in mine[0]}
        cpu_us = statistics.median(
            r["cpu"] * r["elapsed_s"] / r["sent"] * 1e6 for r in mine if r["sent"]
        )
        rows.append(
            {
                "workers": workers,
                "offered_rps": round(median["offered_rps"], 1),
                "achieved_rps": round(median["achieved_rps"], 1),
                "p99_ms": round(median["p99_ms"], 2),
                "p99_vs_single_pct": round(100.0 * (median["p99_ms"] / single_p99 - 1.0), 1),
                "max_lag_ms": round(median["max_lag_ms"], 2),
                "p50_ms": round(median["p50_ms"], 2),
                "p99_spread": round(spread([r["p99_ms"] for r in mine]), 3),
                "achieved_spread": round(spread([r["achieved_rps"] for r in mine]), 3),
                "lag_p99_ms": round(median["lag_p99_ms"], 2),
                "loop_delay_p99_ms": round(median["loop_delay_p99_ms"], 2),
                "client_cpu": round(median["cpu"], 3),
                "busiest_worker_cpu": round(median["busiest_worker_cpu"], 3),
                "client_cpu_us_per_request": round(cpu_us, 1),
                "errors": median["errors"],
                "runs": mine,
            }
        )
    return {
        "server": f"stub, fixed {DELAY_MS:g} ms delay, unlimited concurrency",
        "rate_rps": rate,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "repeats": repeats,
        "arrival": "poisson",
        "seed": SEED,
        "cpus": os.cpu_count(),
        "rows": rows,
        # CPU a request costs one worker process at this rate (the ceiling below is
        # measured at a higher one, where fixed costs weigh less)
        "one_worker_cpu_us_per_request": rows[0]["client_cpu_us_per_request"],
        "worker_result_sizes": sizes,
    }


async def ceiling(duration_s: float, repeats: int) -> dict[str, Any]:
    """CPU a request costs one worker process at a rate well above the figures' rate
    (fixed costs spread thinner), against an endpoint that answers at once; medians."""
    costs: list[float] = []
    achieved: list[float] = []
    async with StubServerProcess(queue_limit=100_000) as stub:
        for repeat in range(repeats):
            result = await run_load_workers(
                stub.url, workers=1, rate=CEILING_RATE, duration_s=duration_s, mix=MIX,
                arrival="constant", timeout_s=5.0, seed=SEED + 2 + repeat,
            )  # fmt: skip
            sent = sum(s.scheduled for s in result.timeline)
            costs.append(result.client.cpu * result.elapsed_s / sent * 1e6)
            achieved.append(result.achieved_rps)
    cpu_us = statistics.median(costs)
    return {
        "rate_rps": CEILING_RATE,
        "achieved_rps": round(statistics.median(achieved), 1),
        "cpu_us_per_request": round(cpu_us, 1),
        "cpu_us_spread": round(spread(costs), 3),
        "one_core_rps": round(1e6 / cpu_us),
        # a worker at or above the client CPU limit makes its step invalid
        "at_client_limit_rps": round(CLIENT_MAX_CPU * 1e6 / cpu_us),
        # the operator's sizing target: 60 % of that ceiling (docs/operator/load-workers.md)
        "at_60pct_of_ceiling_rps": round(0.6 * CLIENT_MAX_CPU * 1e6 / cpu_us),
    }


def histogram_sizes() -> list[dict[str, Any]]:
    """Encoded sizes of a step's latency histogram (what a worker sends back) for more
    and more samples, latencies log-normal around 20 ms (a wide spread: many buckets),
    and of its SLA histogram with 0.1 % non-OK requests at the top."""
    rows = []
    generator = np.random.default_rng(SEED)
    for samples in HISTOGRAM_SAMPLES:
        latencies_us = np.rint(generator.lognormal(np.log(20_000.0), 0.6, samples))
        values, counts = np.unique(latencies_us, return_counts=True)
        histogram = LatencyHistogram()
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            histogram.record_ms(value / 1000.0, count)
        encoded = histogram.encode()
        # the operator's work per worker and step: decode a histogram and add it (CPU
        # time, which a busy machine stretches less than wall time)
        cpu0 = time.process_time()
        merge_encoded([encoded] * MERGE_REPEATS)
        merge_ms = (time.process_time() - cpu0) / MERGE_REPEATS * 1000.0
        histogram.record_ms(TOP_MS, max(1, samples // 1000))
        rows.append(
            {
                "samples": samples,
                "distinct_us_values": len(values),
                "histogram_b": len(encoded),
                "sla_histogram_b": len(histogram.encode()),
                "merge_cpu_ms": round(merge_ms, 2),
            }
        )
    return rows


def share_spec_size(rate: float, duration_s: float) -> int:
    """Bytes of the spec one worker is sent per step (the reference protocol: no bodies
    to forward), as JSON."""
    spec = ShareSpec(
        urls=["http://10.0.0.7:8080"], rate=rate, duration_s=duration_s, mix=MIX,
        arrival=as_arrival("poisson"), timeout_s=5.0, seed=SEED, warmup_s=1.0, index=3, of=4,
    )  # fmt: skip
    return len(spec.model_dump_json())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    duration_s = 3.0 if args.quick else 5.0
    repeats = args.repeats or (2 if args.quick else 5)
    report: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    report.update(await measure(args.rate, duration_s, 1.0, repeats))
    report["one_worker_ceiling"] = await ceiling(duration_s, 3 if not args.quick else 1)
    report["histogram_sizes"] = histogram_sizes()
    report["share_spec_b"] = share_spec_size(args.rate, duration_s)
    report["loadavg_after"] = os.getloadavg()
    return report


def show(report: dict[str, Any]) -> None:
    table = Table(
        title=f"One schedule ({report['rate_rps']:g} req/s Poisson, {report['duration_s']:g} s) "
        f"from 1, 2, 4 workers against the {report['server']}; medians of {report['repeats']}"
    )
    columns = (
        "workers", "offered_rps", "achieved_rps", "p99_ms", "p99_vs_single_pct",
        "max_lag_ms", "p99_spread", "client_cpu", "client_cpu_us_per_request",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in report["rows"]:
        table.add_row(*(f"{row[c]:g}" for c in columns))
    console = Console()
    console.print(table)
    console.print(
        f"one worker: {report['one_worker_cpu_us_per_request']:g} µs CPU a request; its "
        f"result per step: {report['worker_result_sizes']}; spec {report['share_spec_b']} B"
    )
    console.print(f"one worker at {CEILING_RATE:g} req/s: {report['one_worker_ceiling']}")
    for row in report["histogram_sizes"]:
        console.print(f"encoded histogram: {row}")


def positive_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rate must be a number of req/s, got {text!r}") from None
    if not 0 < rate <= 20_000:
        raise argparse.ArgumentTypeError(f"rate must be > 0 and ≤ 20000 req/s, got {text!r}")
    return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="3 s runs, 2 repeats")
    parser.add_argument("--rate", type=positive_rate, default=500.0, help="offered req/s")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5)")
    results.add_options(parser)
    args = parser.parse_args()
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    # A terminated benchmark still stops the server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    recorder = results.start("distributed_load", args)
    result = asyncio.run(main(args))
    recorder.save(result)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        show(result)
