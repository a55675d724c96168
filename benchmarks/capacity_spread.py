"""How reproducible is `batchpilot capacity`? The same configuration of the reference
server, measured several times in a row against one server process (so only the
measurement varies, not the warm-up of a new process).

Prints one JSON object: every run's effective req/s and p99, their median, and the
spread (max - min) / median. The issue's target: two runs agree within 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from typing import Any

import results
from batchpilot.capacity.http import measure_capacity
from batchpilot.models import SLA, RequestMix
from batchpilot.server.process import ServerProcess


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    sla = SLA(p99_ms=args.p99_ms)
    mix = RequestMix.default()
    runs: list[dict[str, Any]] = []
    async with ServerProcess(
        max_batch_size=args.max_batch_size, max_queue_time_ms=args.max_queue_time_ms
    ) as server:
        for run in range(args.runs):
            result = await measure_capacity(
                server.url,
                sla=sla,
                mix=mix,
                precision=args.precision,
                step_duration_s=args.step_s,
                seed=run,
            )
            runs.append(
                {
                    "effective_rps": result.effective_rps,
                    "p99_ms": result.p99_ms,
                    "steps": len(result.steps),
                }
            )
    rates = [r["effective_rps"] for r in runs]
    median = statistics.median(rates)
    return {
        "config": {
            "max_batch_size": args.max_batch_size,
            "max_queue_time_ms": args.max_queue_time_ms,
        },
        "sla_p99_ms": args.p99_ms,
        "precision": args.precision,
        "step_s": args.step_s,
        "runs": runs,
        "median_rps": median,
        "spread": (max(rates) - min(rates)) / median if median > 0 else None,
        "max_pairwise_ratio": max(rates) / min(rates) if min(rates) > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-queue-time-ms", type=float, default=10.0)
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--step-s", type=float, default=3.0)
    results.add_options(parser)
    args = parser.parse_args()
    if args.runs < 2:
        sys.exit("--runs must be at least 2 to measure a spread")
    recorder = results.start("capacity_spread", args)
    out = asyncio.run(measure(args))
    recorder.save(out)
    if args.json:
        print(json.dumps(out))
        return
    for i, run in enumerate(out["runs"]):
        print(f"run {i}: {run['effective_rps']:.0f} req/s, p99 {run['p99_ms']} ms")
    print(f"median {out['median_rps']:.0f} req/s, spread {out['spread']:.1%}")


if __name__ == "__main__":
    main()
