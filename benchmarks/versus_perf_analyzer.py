"""Our generator's KServe v2 load beside NVIDIA's Perf Analyzer against the same local
Triton (benchmarks/loadgen_accuracy.py --target triton).

Both sides offer the same rate with Poisson arrivals, open loop, over HTTP, each request
one FP32 row of all ones, shape [1, WIDTH], to the bundled model; runs alternate (which
side goes first flips every repeat, so drifting background load hits both alike). The
tensors travel as JSON by default, as the tuner's own Triton protocol sends them, with
Perf Analyzer told to send and ask for JSON too (`--input-tensor-format=json
--output-tensor-format=json`); `binary` compares both with the binary tensor extension,
Perf Analyzer's default.

Perf Analyzer times each request from when it actually left; our generator times it from
its scheduled send (so a late send counts against the latency, as a user would see it) and
also from the actual send. `p99_ratio` compares the former, `from_send_p99_ratio` the
latter, ours over theirs."""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import perf_analyzer as pa
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import RequestProtocol, speaking, v2_path
from batchpilot.models import RequestMix
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.triton.adapter import triton_protocol
from batchpilot.runtimes.triton.control import TritonControl, TritonCounters
from batchpilot.runtimes.triton.process import TritonProcess
from batchpilot.runtimes.triton.repository import (
    BATCH_SIZE_OUTPUT,
    INPUT_NAME,
    MODEL_NAME,
    OUTPUT_NAME,
    TritonBatching,
)

# The bundled model's row width: one matrix row per request.
WIDTH = 256
# Batches form (the queue delay dominates the latency at low rates), and on a 2-core CPU
# Triton keeps up with every rate below.
BATCHING = TritonBatching(max_batch_size=16, max_queue_delay_microseconds=2000)
P99_TOLERANCE = 0.10
# Perf Analyzer measures three windows (it reports the last three).
WINDOWS = 3
# A JSON header padded to a fixed length keeps Inference-Header-Content-Length one value
# for every request size, so it can be one of the protocol's fixed headers.
BINARY_HEADER_BYTES = 512

Pin = Callable[[int, int], None]


def binary_row_body(size: int) -> bytes:
    """The v2 binary tensor extension's body for one FP32 row of `size` ones: the JSON
    header (padded to BINARY_HEADER_BYTES) asking for binary outputs, then the raw
    little-endian floats."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    data = b"\x00\x00\x80\x3f" * size  # 1.0f, little-endian
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": INPUT_NAME,
                    "shape": [1, size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [
                {"name": OUTPUT_NAME, "parameters": {"binary_data": True}},
                {"name": BATCH_SIZE_OUTPUT, "parameters": {"binary_data": True}},
            ],
        }
    ).encode()
    if len(header) > BINARY_HEADER_BYTES:
        raise ValueError(f"the JSON header of a request of size {size} is too long")
    return header.ljust(BINARY_HEADER_BYTES) + data


def protocol_for(tensor_format: str) -> RequestProtocol:
    if tensor_format == "json":
        return triton_protocol(MODEL_NAME)
    if tensor_format == "binary":
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(BINARY_HEADER_BYTES),
        }
        return RequestProtocol("v2-binary", v2_path(MODEL_NAME), binary_row_body, headers)
    raise ValueError(f"tensor format must be one of {pa.TENSOR_FORMATS}, got {tensor_format!r}")


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, extremes and (max - min) / median of one figure over the repeats."""
    med = statistics.median(values)
    low, high = min(values), max(values)
    return {
        "median": med,
        "min": low,
        "max": high,
        "relative_spread": (high - low) / med if med else 0.0,
    }


async def ours(
    url: str, rate: float, duration_s: float, seed: int, protocol: RequestProtocol
) -> dict[str, float]:
    cpu0 = cpu_seconds(resource.RUSAGE_SELF)
    with speaking(protocol):
        result = await run_load(
            url,
            rate=rate,
            duration_s=duration_s,
            mix=RequestMix.uniform(WIDTH),
            arrival="poisson",
            timeout_s=10.0,
            seed=seed,
        )
    return {
        "offered_rps": result.offered_rps,
        "throughput_rps": result.achieved_rps,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "from_send_p50_ms": result.latency_from_send.p50_ms,
        "from_send_p99_ms": result.latency_from_send.p99_ms,
        "max_lag_ms": result.max_lag_ms,
        "mean_lag_ms": result.mean_lag_ms,
        # how late the generator's event loop woke: the CPU it did not get when it needed it
        "loop_delay_p99_ms": result.client.loop_delay_p99_ms,
        "errors": float(sum(result.errors.values())),
        "cpu_us_per_request": per_request(
            cpu_seconds(resource.RUSAGE_SELF) - cpu0, result.requests
        ),
    }


async def theirs(
    analyzer: pa.PerfAnalyzer,
    url: str,
    rate: float,
    interval_ms: int,
    input_file: Path,
    tensor_format: str,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="batchpilot-pa-") as tmp:
        csv_file = Path(tmp) / "report.csv"
        args = pa.run_args(
            model=MODEL_NAME,
            url=url,
            rate=rate,
            input_name=INPUT_NAME,
            width=WIDTH,
            input_file=input_file,
            csv_file=csv_file,
            measurement_interval_ms=interval_ms,
            windows=WINDOWS,
            tensor_format=tensor_format,
        )
        # Triton, the other child, runs on: only Perf Analyzer's use ends up here.
        cpu0 = cpu_seconds(resource.RUSAGE_CHILDREN)
        figures, output = await pa.run(
            analyzer, args, csv_file, timeout_s=WINDOWS * interval_ms / 1000 * 4 + 60
        )
        cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu0
    # the whole run, not only the windows the figures cover
    sent = figures["throughput_rps"] * WINDOWS * interval_ms / 1000
    return {
        **figures,
        "delayed_percent": pa.delayed_percent(output),
        "cpu_us_per_request": per_request(cpu, round(sent)),
    }


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def per_request(cpu_s: float, requests: int) -> float:
    return cpu_s / requests * 1e6 if requests else float("nan")


async def server_side(
    control: TritonControl, run: Callable[[], Awaitable[dict[str, float]]]
) -> dict[str, float]:
    """`run`'s figures with Triton's own view of the same requests: the mean time a
    request spent inside the server and the mean batch executed. Equal server figures
    beside different client ones put a difference on the clients' side."""
    before = await control.counters()
    figures = await run()
    served = server_figures((await control.counters()).since(before))
    return {**figures, **served}


def server_figures(delta: TritonCounters) -> dict[str, float]:
    requests = delta.success + delta.failure
    return {
        "server_mean_ms": delta.request_us / requests / 1000 if requests else float("nan"),
        "server_mean_batch": delta.mean_batch,
    }


def has(runs: Sequence[Mapping[str, float]], key: str) -> bool:
    return all(key in run for run in runs)


def summarise(
    rate: float, ours_runs: list[dict[str, float]], theirs_runs: list[dict[str, float]]
) -> dict[str, Any]:
    """Medians and spread of each side at one rate, and ours over theirs: of the medians,
    and per repeat (paired runs)."""
    keys = ("p50_ms", "p99_ms", "throughput_rps", "cpu_us_per_request", "server_mean_ms")
    ours_keys = (
        *keys,
        "from_send_p50_ms",
        "from_send_p99_ms",
        "max_lag_ms",
        "mean_lag_ms",
        "loop_delay_p99_ms",
    )
    ours_summary = {k: spread([r[k] for r in ours_runs]) for k in ours_keys if has(ours_runs, k)}
    theirs_keys = (*keys, "delayed_percent")
    theirs_summary = {
        k: spread([r[k] for r in theirs_runs]) for k in theirs_keys if has(theirs_runs, k)
    }

    def ratio(our_key: str, their_key: str) -> dict[str, Any]:
        paired = [o[our_key] / t[their_key] for o, t in zip(ours_runs, theirs_runs, strict=True)]
        return {
            "of_medians": ours_summary[our_key]["median"] / theirs_summary[their_key]["median"],
            "per_repeat": paired,
            "median_per_repeat": statistics.median(paired),
        }

    ratios = {
        "p50_ratio": ratio("p50_ms", "p50_ms"),
        "p99_ratio": ratio("p99_ms", "p99_ms"),
        "from_send_p50_ratio": ratio("from_send_p50_ms", "p50_ms"),
        "from_send_p99_ratio": ratio("from_send_p99_ms", "p99_ms"),
    }
    return {
        "rate_rps": rate,
        "batchpilot": ours_summary,
        "perf_analyzer": theirs_summary,
        **ratios,
        "within_10pct": {
            name: abs(r["of_medians"] - 1) <= P99_TOLERANCE for name, r in ratios.items()
        },
        "runs": {"batchpilot": ours_runs, "perf_analyzer": theirs_runs},
    }


def window_ms(rate: float, interval_ms: int, min_requests: int) -> int:
    """Perf Analyzer's window at `rate`: `interval_ms`, lengthened so that a run (WINDOWS
    windows, ours as long) holds at least `min_requests` requests. A p99 over a few hundred
    requests is about the fifth slowest, and moves by tens of percent between runs."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate:g}")
    return max(interval_ms, math.ceil(min_requests * 1000 / (WINDOWS * rate)))


async def versus_perf_analyzer(
    rates: Sequence[float],
    repeats: int,
    interval_ms: int,
    tensor_format: str,
    *,
    min_requests: int = 0,
    pin: Pin,
    generator_cpu: int,
    server_cpu: int,
) -> dict[str, Any]:
    """The whole comparison; {"skipped": why} when Perf Analyzer or Triton is missing."""
    try:
        analyzer = pa.find_perf_analyzer()
    except pa.PerfAnalyzerError as exc:
        return {"skipped": str(exc)}
    protocol = protocol_for(tensor_format)
    triton = TritonProcess(BATCHING, threads=1)
    # Triton's threads and its python stub inherit this process's CPU at their start.
    pin(0, server_cpu)
    try:
        await triton.start()
    except LaunchError as exc:
        return {"skipped": str(exc)}
    finally:
        pin(0, generator_cpu)  # Perf Analyzer inherits this one
    per_rate: list[dict[str, Any]] = []
    control = TritonControl(triton.url, triton.metrics_url, MODEL_NAME, timeout_s=30.0)
    try:
        with tempfile.TemporaryDirectory(prefix="batchpilot-pa-") as tmp:
            input_file = Path(tmp) / "input.json"
            input_file.write_text(pa.input_data(INPUT_NAME, [1.0] * WIDTH), encoding="utf-8")
            # Warm both paths (model, connections, Perf Analyzer's libraries) unmeasured.
            await ours(triton.url, rates[0], 1.0, 10_000, protocol)
            await theirs(analyzer, triton.url, rates[0], 500, input_file, tensor_format)
            for rate in rates:
                window = window_ms(rate, interval_ms, min_requests)
                duration_s = WINDOWS * window / 1000
                ours_runs: list[dict[str, float]] = []
                theirs_runs: list[dict[str, float]] = []
                for repeat in range(repeats):

                    async def our_run(
                        seed: int = repeat, rate: float = rate, duration_s: float = duration_s
                    ) -> dict[str, float]:
                        return await ours(triton.url, rate, duration_s, seed, protocol)

                    async def their_run(
                        rate: float = rate, window: int = window
                    ) -> dict[str, float]:
                        return await theirs(
                            analyzer, triton.url, rate, window, input_file, tensor_format
                        )

                    if repeat % 2 == 0:
                        ours_runs.append(await server_side(control, our_run))
                    theirs_runs.append(await server_side(control, their_run))
                    if repeat % 2 == 1:
                        ours_runs.append(await server_side(control, our_run))
                per_rate.append(
                    {**summarise(rate, ours_runs, theirs_runs), "measured_s_per_run": duration_s}
                )
    except pa.PerfAnalyzerError as exc:
        return {"failed": str(exc), "triton_log": triton.stderr_tail(1500)}
    finally:
        await triton.stop()
    return {
        "perf_analyzer": f"perf_analyzer {pa.PERF_ANALYZER_VERSION} ({analyzer.binary.name})",
        "server": (
            f"Triton 2.51, bundled model, max_batch_size {BATCHING.max_batch_size}, "
            f"max_queue_delay_microseconds {BATCHING.max_queue_delay_microseconds}"
        ),
        "request": f"{INPUT_NAME} FP32 [1, {WIDTH}] of ones, tensors as {tensor_format}",
        "arrivals": "poisson, open loop (--async)",
        "min_requests_per_run": min_requests,
        "repeats": repeats,
        "rates": per_rate,
    }


def targets(result: Mapping[str, Any]) -> dict[str, Any]:
    """Whether p50 and p99 are within 10 % of Perf Analyzer's at every rate (None when the
    comparison did not run)."""
    rates = result.get("rates")
    if not rates:
        return {"p50_p99_within_10pct_of_perf_analyzer": None}
    return {
        "p50_p99_within_10pct_of_perf_analyzer": all(
            r["within_10pct"]["p50_ratio"] and r["within_10pct"]["p99_ratio"] for r in rates
        ),
        "from_send_p50_p99_within_10pct_of_perf_analyzer": all(
            r["within_10pct"]["from_send_p50_ratio"] and r["within_10pct"]["from_send_p99_ratio"]
            for r in rates
        ),
    }


async def main(
    rates: Sequence[float],
    repeats: int,
    interval_ms: int,
    tensor_format: str,
    *,
    min_requests: int = 0,
    pin: Pin,
    generator_cpu: int,
    server_cpu: int,
) -> dict[str, Any]:
    report: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()}
    result = await versus_perf_analyzer(
        rates,
        repeats,
        interval_ms,
        tensor_format,
        min_requests=min_requests,
        pin=pin,
        generator_cpu=generator_cpu,
        server_cpu=server_cpu,
    )
    report["versus_perf_analyzer"] = result
    report["loadavg_after"] = os.getloadavg()
    report["targets"] = targets(result)
    return report


def pair(at_rate: Mapping[str, Any], key: str, digits: int) -> str:
    """ "ours / theirs" of one figure's medians at one rate."""
    ours_, theirs_ = at_rate["batchpilot"][key], at_rate["perf_analyzer"][key]
    return f"{ours_['median']:.{digits}f} / {theirs_['median']:.{digits}f}"


def show(report: Mapping[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    result = report["versus_perf_analyzer"]
    if "rates" not in result:
        console.print(f"Perf Analyzer comparison did not run: {result}")
        return
    table = Table(
        title=f"Against Triton, medians of {result['repeats']} repeats ({result['request']})"
    )
    for column in (
        "req/s",
        "p50 ms ours / PA",
        "ratio",
        "p99 ms ours / PA",
        "ratio",
        "from send p50, p99",
        "Triton mean ms",
        "CPU µs/req",
    ):
        table.add_column(column, justify="right")
    for r in result["rates"]:
        table.add_row(
            f"{r['rate_rps']:g}",
            pair(r, "p50_ms", 2),
            f"{r['p50_ratio']['of_medians']:.2f}",
            pair(r, "p99_ms", 1),
            f"{r['p99_ratio']['of_medians']:.2f}",
            f"{r['from_send_p50_ratio']['of_medians']:.2f}, "
            f"{r['from_send_p99_ratio']['of_medians']:.2f}",
            pair(r, "server_mean_ms", 2),
            pair(r, "cpu_us_per_request", 0),
        )
    console.print(table)
    for r in result["rates"]:
        ours_, theirs_ = r["batchpilot"], r["perf_analyzer"]
        console.print(
            f"{r['rate_rps']:g} req/s: p99 spread over repeats, (max - min) / median: ours "
            f"{ours_['p99_ms']['relative_spread']:.2f}, Perf Analyzer "
            f"{theirs_['p99_ms']['relative_spread']:.2f}; Perf Analyzer sent "
            f"{theirs_['delayed_percent']['median']:.1f} % late; our mean lag "
            f"{ours_['mean_lag_ms']['median']:.2f} ms, loop stalls p99 "
            f"{ours_['loop_delay_p99_ms']['median']:.1f} ms"
        )
    console.print(f"targets: {report['targets']}")
