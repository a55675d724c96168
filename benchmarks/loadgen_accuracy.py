"""How fast and how truthful the load generator is.

1. Client choice: closed-loop request rate and CPU per request of the generator's own
   HTTP/1.1 client (loadgen.http1), aiohttp and httpx against the same trivial endpoint.
2. Highest offered rate the generator sustains on one core (achieved ≥ 99% of offered)
   against a trivial endpoint (the stub server, no delay) and against the reference
   server, with its CPU time per request (1e6 / that = what one whole core would carry).
3. At a moderate rate, p50/p99 beside those of vegeta (an independent open-loop tool,
   built from the Go module proxy into a cache outside the repository), same target,
   alternating runs in the same session; medians of the rounds.

With `--target triton` instead: the KServe v2 load against NVIDIA's own instrument.
A local Triton 2.51 (the project's launcher and bundled model) is measured by Perf
Analyzer 2.51 (request-rate mode, Poisson arrivals, `--async`; installed by
scripts/perf-analyzer) and by our generator (same rates, Poisson, the v2 protocol, the
same request body), interleaved over several repeats at a few rates; p50/p99 of each side
by side, their ratios, medians and spread over the repeats.

The generator runs in this process, pinned to CPU 0; servers and vegeta's target are
pinned to CPU 1 when there are two or more CPUs. Figures on a shared machine are noisy:
compare the ratios, which are measured in the same run.

    python benchmarks/loadgen_accuracy.py [--json] [--quick]
    python benchmarks/loadgen_accuracy.py --target triton [--json] [--quick]
        [--rates 50,100,200] [--repeats 5] [--tensor-format json|binary]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table
from yarl import URL

import results
import versus_perf_analyzer
from batchpilot.loadgen.generator import run_load, synthetic_body
from batchpilot.loadgen.http1 import Http1Client, prepare
from batchpilot.models import RequestMix
from batchpilot.runtimes.triton.install import TRITON_VERSION
from batchpilot.server.process import ServerProcess
from perf_analyzer import PERF_ANALYZER_VERSION
from suite_support import StubServerProcess

VEGETA_VERSION = "v12.12.0"
VEGETA_MODULE = "github.com/tsenart/vegeta/v12"
TARGET_RPS = 3000.0
CLIENTS = ("batchpilot", "aiohttp", "httpx")
# --target triton: requests a run holds at least, so that its p99 is not its fifth slowest
MIN_REQUESTS = 2000
P99_TOLERANCE = 0.10
MIX = RequestMix.uniform(1)
GENERATOR_CPU = 0
SERVER_CPU = 1


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pin(pid: int, cpu: int) -> None:
    if len(os.sched_getaffinity(0)) > 1 or pid == 0:
        os.sched_setaffinity(pid, {cpu})


# --- 1. client choice ---------------------------------------------------------------


async def closed_loop(name: str, url: str, requests: int, concurrency: int) -> dict[str, float]:
    body = synthetic_body(1)
    headers = {"Content-Type": "application/json"}
    per_worker = requests // concurrency

    async def run(one: Callable[[], Awaitable[None]]) -> dict[str, float]:
        async def worker() -> None:
            for _ in range(per_worker):
                await one()

        await asyncio.gather(*(one() for _ in range(concurrency)))  # open the connections
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        done = per_worker * concurrency
        return {"rps": done / wall, "cpu_us_per_request": cpu / done * 1e6}

    if name == "batchpilot":
        async with Http1Client(limit=concurrency) as ours:
            prepared = prepare(URL(url), body, headers)

            async def one_ours() -> None:
                await ours.request(prepared)

            return await run(one_ours)
    if name == "aiohttp":
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one_aiohttp() -> None:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()

            return await run(one_aiohttp)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=10.0) as client:

        async def one_httpx() -> None:
            response = await client.post(url, content=body, headers=headers)
            response.read()

        return await run(one_httpx)


async def client_choice(url: str, requests: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
    for _ in range(3):  # alternate, so drifting background load hits all alike
        for name in results:
            results[name].append(await closed_loop(name, url + "/v1/predict", requests, 32))
    summary: dict[str, Any] = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    summary["aiohttp_over_httpx_rps"] = summary["aiohttp"]["rps"] / summary["httpx"]["rps"]
    summary["batchpilot_over_aiohttp_rps"] = (
        summary["batchpilot"]["rps"] / summary["aiohttp"]["rps"]
    )
    summary["fastest"] = max(CLIENTS, key=lambda name: summary[name]["rps"])
    return summary


# --- 2. highest sustained rate -------------------------------------------------------


async def sustained(url: str, rates: list[float], duration_s: float) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    best = 0.0
    for rate in rates:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        result = await run_load(
            url, rate=rate, duration_s=duration_s, mix=MIX, arrival="constant", timeout_s=5.0
        )
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        ok = result.achieved_rps >= 0.99 * result.offered_rps and result.error_rate == 0
        steps.append(
            {
                "offered_rps": result.offered_rps,
                "achieved_rps": result.achieved_rps,
                "p50_ms": result.latency.p50_ms,
                "p99_ms": result.latency.p99_ms,
                "max_lag_ms": result.max_lag_ms,
                "errors": result.errors,
                "cpu_us_per_request": cpu / max(result.requests, 1) * 1e6,
                # Share of one core this process got while running: below 1 means the
                # machine's other work took the rest.
                "cpu_share": cpu / wall,
                "sustained": ok,
            }
        )
        if not ok:
            break
        best = rate
        await asyncio.sleep(0.5)
    # CPU per request falls as the rate rises (fixed costs spread over more requests),
    # so the cheapest step without errors is the fairest estimate of the marginal cost;
    # every request of a step is processed, sustained or not.
    cpu_costs = [s["cpu_us_per_request"] for s in steps if not s["errors"]]
    per_request = min(cpu_costs) if cpu_costs else None
    return {
        "max_sustained_rps": best,
        "cpu_us_per_request": per_request,
        "one_core_ceiling_rps": 1e6 / per_request if per_request else None,
        "steps": steps,
    }


# --- 3. vegeta -----------------------------------------------------------------------


def vegeta_binary() -> tuple[str | None, str]:
    cache = Path.home() / ".cache" / "batchpilot" / "tools" / f"vegeta-{VEGETA_VERSION}"
    binary = cache / "vegeta"
    if binary.exists():
        return str(binary), "cached"
    go = shutil.which("go")
    if go is None:
        return None, "go is not installed"
    cache.mkdir(parents=True, exist_ok=True)
    build = subprocess.run(
        [go, "install", f"{VEGETA_MODULE}@{VEGETA_VERSION}"],
        env={**os.environ, "GOBIN": str(cache)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if build.returncode != 0 or not binary.exists():
        return None, f"go install failed: {build.stderr.strip()[-300:]}"
    return str(binary), "built"


async def run_vegeta(binary: str, url: str, rate: int, duration_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        body.write_bytes(synthetic_body(1))
        targets = f"POST {url}/v1/predict\nContent-Type: application/json\n@{body}\n"
        attack = await asyncio.create_subprocess_exec(
            binary, "attack", f"-rate={rate}/s", f"-duration={duration_s}s", "-timeout=10s",
            "-keepalive=true",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        pin(attack.pid, GENERATOR_CPU)
        results, _ = await asyncio.wait_for(attack.communicate(targets.encode()), duration_s + 60)
        report = await asyncio.create_subprocess_exec(
            binary, "report", "-type=json",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(report.communicate(results), 60)
    data = json.loads(out)
    return {
        "p50_ms": data["latencies"]["50th"] / 1e6,
        "p99_ms": data["latencies"]["99th"] / 1e6,
        "throughput_rps": data["throughput"],
        "success": data["success"],
    }


async def versus_vegeta(url: str, rate: int, duration_s: float, rounds: int) -> dict[str, Any]:
    binary, how = vegeta_binary()
    if binary is None:
        return {"skipped": how}
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(rounds):
        result = await run_load(
            url, rate=rate, duration_s=duration_s, mix=MIX, arrival="constant", timeout_s=10.0
        )
        ours.append(
            {
                "p50_ms": result.latency.p50_ms,
                "p99_ms": result.latency.p99_ms,
                # vegeta times each request from when it left, not from its schedule
                "from_send_p50_ms": result.latency_from_send.p50_ms,
                "from_send_p99_ms": result.latency_from_send.p99_ms,
                "max_lag_ms": result.max_lag_ms,
            }
        )
        theirs.append(await run_vegeta(binary, url, rate, duration_s))
    med = {
        "batchpilot": {k: statistics.median(r[k] for r in ours) for k in ours[0]},
        "vegeta": {k: statistics.median(r[k] for r in theirs) for k in ("p50_ms", "p99_ms")},
    }
    return {
        "vegeta": f"{VEGETA_MODULE}@{VEGETA_VERSION} ({how})",
        "rate_rps": rate,
        "duration_s": duration_s,
        "rounds": rounds,
        **med,
        "p50_ratio": med["batchpilot"]["p50_ms"] / med["vegeta"]["p50_ms"],
        "p99_ratio": med["batchpilot"]["p99_ms"] / med["vegeta"]["p99_ms"],
        "from_send_p99_ratio": med["batchpilot"]["from_send_p99_ms"] / med["vegeta"]["p99_ms"],
        "runs": {"batchpilot": ours, "vegeta": theirs},
    }


# --- main ----------------------------------------------------------------------------


async def main(quick: bool) -> dict[str, Any]:
    pin(0, GENERATOR_CPU)
    step_s = 2.0 if quick else 3.0
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    async with StubServerProcess(cpus={SERVER_CPU}) as trivial:
        report["client_choice"] = await client_choice(trivial.url, 1000 if quick else 3000)
        report["trivial_endpoint"] = await sustained(
            trivial.url, [500, 1000, 2000, 3000, 4000, 6000, 8000, 10000, 12000], step_s
        )
    async with StubServerProcess(delay_ms=10, cpus={SERVER_CPU}) as delayed:
        report["versus_vegeta"] = await versus_vegeta(
            delayed.url, rate=500, duration_s=3.0 if quick else 5.0, rounds=2 if quick else 3
        )
    server = ServerProcess(max_batch_size=32, max_queue_time_ms=5.0, threads=1)
    async with server:
        pin(server.pid, SERVER_CPU)
        report["reference_server"] = await sustained(
            server.url, [50, 100, 200, 400, 800, 1600, 3200], step_s
        )
    report["loadavg_after"] = os.getloadavg()
    vegeta = report["versus_vegeta"]
    report["targets"] = {
        "max_rate_at_least_3000": report["trivial_endpoint"]["max_sustained_rps"] >= TARGET_RPS,
        "one_core_ceiling_at_least_3000": (
            (report["trivial_endpoint"]["one_core_ceiling_rps"] or 0) >= TARGET_RPS
        ),
        "p99_within_10pct_of_vegeta": (
            abs(vegeta["p99_ratio"] - 1) <= P99_TOLERANCE if "p99_ratio" in vegeta else None
        ),
    }
    return report


def show(report: dict[str, Any]) -> None:
    console = Console()
    choice = report["client_choice"]
    table = Table(title="HTTP client, closed loop against the trivial endpoint (medians)")
    for column in ("client", "req/s", "CPU µs/request"):
        table.add_column(column, justify="right")
    for name in CLIENTS:
        table.add_row(
            name, f"{choice[name]['rps']:,.0f}", f"{choice[name]['cpu_us_per_request']:,.0f}"
        )
    console.print(table)
    for key, title in (
        ("trivial_endpoint", "trivial endpoint"),
        ("reference_server", "reference server"),
    ):
        part = report[key]
        table = Table(title=f"Open-loop steps against the {title}")
        for column in (
            "offered",
            "achieved",
            "p50 ms",
            "p99 ms",
            "max lag ms",
            "CPU µs/req",
            "CPU share",
            "sustained",
        ):
            table.add_column(column, justify="right")
        for s in part["steps"]:
            table.add_row(
                f"{s['offered_rps']:,.0f}", f"{s['achieved_rps']:,.0f}", f"{s['p50_ms']:.2f}",
                f"{s['p99_ms']:.2f}", f"{s['max_lag_ms']:.1f}", f"{s['cpu_us_per_request']:.0f}",
                f"{s['cpu_share']:.2f}", "yes" if s["sustained"] else "no",
            )  # fmt: skip
        console.print(table)
        ceiling = part["one_core_ceiling_rps"]
        console.print(
            f"max sustained {part['max_sustained_rps']:,.0f} req/s; one-core ceiling from CPU "
            f"per request: {ceiling:,.0f} req/s"
            if ceiling
            else "no rate sustained"
        )
    vegeta = report["versus_vegeta"]
    if "skipped" in vegeta:
        console.print(f"vegeta comparison skipped: {vegeta['skipped']}")
    else:
        console.print(
            f"At {vegeta['rate_rps']} req/s (medians of {vegeta['rounds']}): batchpilot p50 "
            f"{vegeta['batchpilot']['p50_ms']:.2f} / p99 {vegeta['batchpilot']['p99_ms']:.2f} ms, "
            f"vegeta p50 {vegeta['vegeta']['p50_ms']:.2f} / "
            f"p99 {vegeta['vegeta']['p99_ms']:.2f} ms "
            f"(p99 ratio {vegeta['p99_ratio']:.3f}; timed from the actual send as vegeta "
            f"does: p99 {vegeta['batchpilot']['from_send_p99_ms']:.2f} ms, ratio "
            f"{vegeta['from_send_p99_ratio']:.3f})"
        )
    console.print(f"targets: {report['targets']}")


def rates_option(text: str) -> list[float]:
    """`--rates 50,100,200`: positive req/s."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rates must be comma-separated numbers of req/s, e.g. 50,100,200; got {text!r}"
        ) from None
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"rates must be > 0 req/s, got {text!r}")
    return rates


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="shorter steps, fewer rounds")
    parser.add_argument(
        "--target",
        choices=("reference", "triton"),
        default="reference",
        help="reference: the sections above; triton: the KServe v2 load beside Perf Analyzer",
    )
    parser.add_argument(
        "--rates",
        type=rates_option,
        default=None,
        help="triton: comma-separated req/s (default 50,100,200,400; --quick 100,200)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="triton: runs per side and rate (default 5)"
    )
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=None,
        help="triton: Perf Analyzer's window; each run measures three (default 3000)",
    )
    parser.add_argument(
        "--min-requests",
        type=int,
        default=None,
        help="triton: lengthen the windows at a rate so each run holds at least this many "
        "requests (default 2000; --quick 0: the windows as given)",
    )
    parser.add_argument(
        "--tensor-format",
        choices=("json", "binary"),
        default="json",
        help="triton: how both sides send tensors (json: as the tuner does)",
    )
    results.add_options(parser)
    args = parser.parse_args()
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.interval_ms is not None and args.interval_ms < 100:
        parser.error(f"--interval-ms must be >= 100, got {args.interval_ms}")
    if args.min_requests is not None and args.min_requests < 0:
        parser.error(f"--min-requests must be >= 0, got {args.min_requests}")
    # A terminated benchmark still stops the servers it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    recorder = (
        results.start(
            "loadgen_accuracy_triton",
            args,
            runtimes={
                "triton": TRITON_VERSION,
                "perf_analyzer": PERF_ANALYZER_VERSION,
            },
        )
        if args.target == "triton"
        else results.start("loadgen_accuracy", args)
    )
    if args.target == "triton":
        pin(0, GENERATOR_CPU)
        result = asyncio.run(
            versus_perf_analyzer.main(
                args.rates or ([100.0, 200.0] if args.quick else [50.0, 100.0, 200.0, 400.0]),
                args.repeats or (3 if args.quick else 5),
                args.interval_ms or (2000 if args.quick else 3000),
                args.tensor_format,
                min_requests=(
                    args.min_requests
                    if args.min_requests is not None
                    else (0 if args.quick else MIN_REQUESTS)
                ),
                pin=pin,
                generator_cpu=GENERATOR_CPU,
                server_cpu=SERVER_CPU,
            )
        )
        show_result: Callable[[dict[str, Any]], None] = versus_perf_analyzer.show
    else:
        result = asyncio.run(main(args.quick))
        show_result = show
    if args.target == "triton" and "rates" not in result["versus_perf_analyzer"]:
        print("not recorded: the comparison did not run", file=sys.stderr)
    else:
        recorder.save(result)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        show_result(result)
