"""NVIDIA's Perf Analyzer 2.51 as an instrument for benchmarks/loadgen_accuracy.py: where
`scripts/perf-analyzer` installed it, the command line of one open-loop run (request
rate, Poisson arrivals, `--async`) against a Triton model, and its results read back
from the CSV it writes with `-f`.

The perf-analyzer 2.58+ wheels need glibc 2.38; the binary in tritonclient[all] 2.51
runs on glibc 2.36 with Debian's libb64 and the CUDA runtime library (a PyPI wheel, no GPU
needed) on LD_LIBRARY_PATH."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchpilot.runtimes.venvs import cache_root

PERF_ANALYZER_VERSION = "2.51"
INSTALL_HINT = "install it with scripts/perf-analyzer"
# The CSV's latency columns are in microseconds.
LATENCY_COLUMNS = {
    "p50_ms": "p50 latency",
    "p90_ms": "p90 latency",
    "p95_ms": "p95 latency",
    "p99_ms": "p99 latency",
}
# Perf Analyzer's breakdown of where the average request spent its time, µs.
BREAKDOWN_COLUMNS = (
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
)
_DELAYED = re.compile(r"([0-9.]+)% of the requests were delayed")
TENSOR_FORMATS = ("json", "binary")


class PerfAnalyzerError(RuntimeError):
    """Perf Analyzer is missing, failed, or wrote a report that cannot be read."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """An installed Perf Analyzer: the binary and the library directory it needs."""

    binary: Path
    cudart_dir: Path

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        inherited = [env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(self.cudart_dir), *inherited])
        return env


def install_dir() -> Path:
    return cache_root() / "tools" / f"perf-analyzer-{PERF_ANALYZER_VERSION}"


def find_perf_analyzer(root: Path | None = None) -> PerfAnalyzer:
    """The install under `root` (default: `install_dir()`); PerfAnalyzerError says what is
    missing and how to install it."""
    root = root or install_dir()
    binary = root / "bin" / "perf_analyzer"
    found = sorted(root.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if not binary.is_file() or not found:
        raise PerfAnalyzerError(
            f"Perf Analyzer {PERF_ANALYZER_VERSION} is not installed in {root}: {INSTALL_HINT}"
        )
    return PerfAnalyzer(binary=binary, cudart_dir=found[0])


def input_data(input_name: str, values: Sequence[float]) -> str:
    """Perf Analyzer's `--input-data` JSON for one input of one batch-1 request with these
    values (shape without the batch dimension), so its bodies hold what ours do."""
    return json.dumps({"data": [{input_name: {"content": list(values), "shape": [len(values)]}}]})


def run_args(
    *,
    model: str,
    url: str,
    rate: float,
    input_name: str,
    width: int,
    input_file: Path,
    csv_file: Path,
    measurement_interval_ms: int,
    windows: int = 3,
    tensor_format: str = "json",
) -> list[str]:
    """The arguments (after the binary) of one open-loop run at `rate` req/s: Poisson
    arrivals, asynchronous requests, HTTP, one request of shape [1, width] each, p99 as the
    reported percentile. Stability is not waited for: `windows` windows are measured and
    reported whatever their spread, so every run lasts as long as its twin run of ours."""
    if tensor_format not in TENSOR_FORMATS:
        raise ValueError(f"tensor format must be one of {TENSOR_FORMATS}, got {tensor_format!r}")
    if rate <= 0 or width < 1 or measurement_interval_ms < 1 or windows < 3:
        raise ValueError(
            "rate must be > 0, width and the interval >= 1, and windows >= 3 (Perf Analyzer "
            f"reports the last three), got {rate}, {width}, {measurement_interval_ms}, {windows}"
        )
    host = url.removeprefix("http://").rstrip("/")
    return [
        "-m", model, "-u", host, "-i", "http", "--async",
        f"--request-rate-range={rate:g}", "--request-distribution=poisson",
        f"--measurement-interval={measurement_interval_ms}", "--percentile=99",
        "--stability-percentage=1000000", f"--max-trials={windows}",
        "--shape", f"{input_name}:{width}", "--input-data", str(input_file),
        f"--input-tensor-format={tensor_format}", f"--output-tensor-format={tensor_format}",
        "-f", str(csv_file),
    ]  # fmt: skip


def parse_csv(text: str) -> list[dict[str, float]]:
    """The rows of Perf Analyzer's `-f` report, one per rate, every column as a number
    (latencies stay in µs as written). Raises PerfAnalyzerError for an empty report or a
    cell that is not a number."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise PerfAnalyzerError(f"Perf Analyzer's CSV report has no rows: {text[:200]!r}")
    parsed: list[dict[str, float]] = []
    for row in rows:
        values: dict[str, float] = {}
        for column, cell in row.items():
            if column is None or cell is None:
                raise PerfAnalyzerError(f"Perf Analyzer's CSV row does not match its header: {row}")
            try:
                values[column.strip()] = float(cell)
            except ValueError:
                raise PerfAnalyzerError(
                    f"Perf Analyzer's CSV column {column!r} holds {cell!r}, not a number"
                ) from None
        parsed.append(values)
    return parsed


def figures(row: Mapping[str, float]) -> dict[str, float]:
    """One CSV row as the benchmark reports it: the offered rate, the throughput, the
    latency percentiles in ms and the average breakdown in ms."""
    needed = ["Request Rate", "Inferences/Second", *LATENCY_COLUMNS.values()]
    missing = [column for column in needed if column not in row]
    if missing:
        raise PerfAnalyzerError(
            f"Perf Analyzer's CSV lacks {', '.join(missing)} (has {', '.join(row)}); was it "
            "run with --request-rate-range and --percentile?"
        )
    result = {
        "offered_rps": row["Request Rate"],
        "throughput_rps": row["Inferences/Second"],
        **{key: row[column] / 1000 for key, column in LATENCY_COLUMNS.items()},
    }
    for column in BREAKDOWN_COLUMNS:
        if column in row:
            result[f"avg {column} ms"] = row[column] / 1000
    return result


def delayed_percent(output: str) -> float:
    """The share of requests Perf Analyzer sent late (it warns when it falls behind its
    schedule), 0 when it did not warn."""
    found = _DELAYED.findall(output)
    return max((float(share) for share in found), default=0.0)


async def run(
    analyzer: PerfAnalyzer, args: Sequence[str], csv_file: Path, *, timeout_s: float
) -> tuple[dict[str, float], str]:
    """Run Perf Analyzer, wait for it (at most `timeout_s`), and return the figures of its
    one CSV row and its console output. PerfAnalyzerError carries the tail of the output
    when it fails."""
    proc = await asyncio.create_subprocess_exec(
        str(analyzer.binary),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=analyzer.environment(os.environ),
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PerfAnalyzerError(f"Perf Analyzer did not finish within {timeout_s:g} s") from None
    output = out.decode(errors="replace")
    if proc.returncode != 0:
        raise PerfAnalyzerError(
            f"Perf Analyzer exited with code {proc.returncode}; its output ends:\n{output[-1500:]}"
        )
    return await asyncio.to_thread(report_figures, csv_file), output


def report_figures(csv_file: Path) -> dict[str, float]:
    """The figures of the one rate in the report Perf Analyzer wrote to `csv_file`."""
    if not csv_file.exists():
        raise PerfAnalyzerError(f"Perf Analyzer wrote no report to {csv_file}")
    rows = parse_csv(csv_file.read_text(encoding="utf-8"))
    if len(rows) != 1:
        raise PerfAnalyzerError(f"expected one rate in Perf Analyzer's report, got {len(rows)}")
    return figures(rows[0])
