"""Every benchmark run, recorded: its JSON result and the machine it ran on.

A benchmark calls `add_options` on its parser (`--results-dir`, `--no-save`), `start` once
its arguments are parsed (the load average at the start) and `Recorder.save` with its
result, which writes

    docs/benchmarks/results/<benchmark>/<UTC time>.json   the result and a `run` block
    docs/benchmarks/results/<benchmark>/<UTC time>.md     its main figures as tables

The `run` block holds the UTC time, the command line, the load average at the start and
the end, the CPU count, the memory, the platform, the Python version, the versions of
BatchPilot and the libraries that decide the figures, the runtimes the benchmark drives
where known, and the checkout's commit.

    python benchmarks/results.py index [--results-dir DIR]
        writes DIR/index.md: per benchmark the latest run's tables and the history
    python benchmarks/results.py wrap NAME [--results-dir DIR] [--no-save] -- COMMAND...
        runs a command that prints one JSON object (`batchpilot tune --local --json`),
        passes its output on and records it as the benchmark NAME
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "docs" / "benchmarks" / "results"
# the distributions whose versions decide the figures; torch is looked up, never imported
PACKAGES = ("batchpilot", "numpy", "optuna", "torch", "scipy", "pydantic", "aiohttp")
STAMP = "%Y-%m-%dT%H%M%SZ"  # file names: sort in time order, no colons
INDEX_TITLE = "Recorded benchmark runs"


@dataclasses.dataclass(frozen=True)
class Table:
    """A list of objects (or an object of objects, keyed in the first column) at `path`,
    shown with `columns` (dotted paths inside each item)."""

    title: str
    path: str
    columns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a benchmark's record shows: `figures` (label, dotted path), the first of which
    is the key figure of the history, and its tables."""

    page: str  # the docs page of the benchmark, relative to docs/benchmarks/
    figures: tuple[tuple[str, str], ...]
    tables: tuple[Table, ...] = ()
    command: str = ""  # how to run it, when not `python benchmarks/<benchmark>.py`


# One layout per benchmark: the results differ in shape. A path goes through objects by
# key and lists by index (-1: the last); `*` takes every item of a list, shown joined.
LAYOUTS: dict[str, Layout] = {
    "server_efficiency": Layout(
        "server-efficiency.md",
        (
            ("server / bound at the largest batch", "rows.-1.ratio"),
            ("meets target", "meets_target"),
            ("target ratio", "target_ratio"),
            ("from batch", "target_from_batch"),
            ("bound gain, batch 1 to 32", "bound_gain_1_to_32"),
            ("threads", "threads"),
            ("window s x repeats", "window_s"),
            ("repeats", "repeats"),
        ),
        (
            Table(
                "per batch size",
                "rows",
                (
                    "batch_size",
                    "bound_rps",
                    "server_rps",
                    "ratio",
                    "mean_batch",
                    "model_cpu_us_per_request",
                    "server_cpu_us_per_request",
                    "cpu_ratio",
                ),
            ),
        ),
    ),
    "capacity_spread": Layout(
        "loadgen-accuracy.md",
        (
            ("spread (max - min) / median", "spread"),
            ("median req/s", "median_rps"),
            ("max pairwise ratio", "max_pairwise_ratio"),
            ("max_batch_size", "config.max_batch_size"),
            ("max_queue_time_ms", "config.max_queue_time_ms"),
            ("SLA p99 ms", "sla_p99_ms"),
        ),
        (Table("runs", "runs", ("effective_rps", "p99_ms", "steps")),),
    ),
    "loadgen_accuracy": Layout(
        "loadgen-accuracy.md",
        (
            ("max sustained req/s, trivial endpoint", "trivial_endpoint.max_sustained_rps"),
            ("one-core ceiling req/s", "trivial_endpoint.one_core_ceiling_rps"),
            ("p99 ratio to vegeta", "versus_vegeta.p99_ratio"),
            ("max sustained req/s, reference server", "reference_server.max_sustained_rps"),
            ("target: max rate at least 3000", "targets.max_rate_at_least_3000"),
            ("target: one-core ceiling at least 3000", "targets.one_core_ceiling_at_least_3000"),
            ("target: p99 within 10 % of vegeta", "targets.p99_within_10pct_of_vegeta"),
        ),
    ),
    "loadgen_accuracy_triton": Layout(
        "perf-analyzer.md",
        (
            (
                "p50 and p99 within 10 % of Perf Analyzer",
                "targets.p50_p99_within_10pct_of_perf_analyzer",
            ),
            ("from send, within 10 %", "targets.from_send_p50_p99_within_10pct_of_perf_analyzer"),
            ("repeats", "versus_perf_analyzer.repeats"),
            ("request", "versus_perf_analyzer.request"),
        ),
        (
            Table(
                "ours against Perf Analyzer, ratios of the medians",
                "versus_perf_analyzer.rates",
                (
                    "rate_rps",
                    "p50_ratio.of_medians",
                    "p99_ratio.of_medians",
                    "from_send_p50_ratio.of_medians",
                    "from_send_p99_ratio.of_medians",
                ),
            ),
        ),
        command="python benchmarks/loadgen_accuracy.py --target triton",
    ),
    "genai_accuracy": Layout(
        "genai-accuracy.md",
        (
            (
                "TTFT and TPOT p50, p99 within 10 % of AIPerf",
                "targets.ttft_tpot_p50_p99_within_10pct_of_aiperf",
            ),
            ("repeats", "repeats"),
            ("requests per run", "requests_per_run"),
            ("request", "request"),
        ),
        (
            Table(
                "ours against AIPerf, ratios of the medians",
                "rates",
                (
                    "rate_rps",
                    "ttft_p50_ratio.of_medians",
                    "ttft_p99_ratio.of_medians",
                    "tpot_p50_ratio.of_medians",
                    "tpot_p99_ratio.of_medians",
                ),
            ),
            Table(
                "p99, ms, medians: each instrument's and the server's own during its runs",
                "rates",
                (
                    "rate_rps",
                    "batchpilot.ttft_p99_ms.median",
                    "aiperf.ttft_p99_ms.median",
                    "server_during_batchpilot.ttft_p99_ms.median",
                    "server_during_aiperf.ttft_p99_ms.median",
                    "batchpilot.tpot_p99_ms.median",
                    "aiperf.tpot_p99_ms.median",
                ),
            ),
        ),
    ),
    "token_budget": Layout(
        "token-budget.md",
        (
            ("max_num_seqs", "max_num_seqs"),
            ("repeats", "repeats"),
            ("request", "request"),
        ),
        (
            Table(
                "p99 by token budget and offered rate, medians of the repeats",
                "points",
                (
                    "token_budget",
                    "rate_rps",
                    "ttft_p99_ms",
                    "tpot_p99_ms",
                    "output_tokens_per_s",
                    "errors",
                ),
            ),
        ),
    ),
    "distributed_load": Layout(
        "distributed-load.md",
        (
            ("one worker's CPU µs a request", "one_worker_cpu_us_per_request"),
            ("offered req/s", "rate_rps"),
            ("seconds a run", "duration_s"),
            ("repeats", "repeats"),
            ("share spec bytes", "share_spec_b"),
        ),
        (
            Table(
                "by workers, medians of the repeats",
                "rows",
                (
                    "workers",
                    "achieved_rps",
                    "p99_ms",
                    "p99_vs_single_pct",
                    "max_lag_ms",
                    "client_cpu_us_per_request",
                ),
            ),
            Table(
                "encoded histograms",
                "histogram_sizes",
                ("samples", "histogram_b", "sla_histogram_b", "merge_cpu_ms"),
            ),
        ),
    ),
    "tune_local": Layout(
        "tune-local.md",
        (
            ("gain over the baseline", "gain_over_baseline"),
            ("gain over the rule of thumb", "gain_over_rule_of_thumb"),
            ("recommended max_batch_size", "recommended.max_batch_size"),
            ("recommended max_queue_time_ms", "recommended.max_queue_time_ms"),
            ("best req/s", "best.effective_rps"),
            ("baseline req/s", "baseline.effective_rps"),
            ("duration s", "duration_s"),
            ("sampler", "sampler"),
        ),
        command="python benchmarks/results.py wrap tune_local -- batchpilot tune --local --json",
    ),
    "tune_under_noise": Layout(
        "tune-under-noise.md",
        (
            ("runs with a false gain", "false_gain_runs"),
            ("runs not checked", "unchecked_runs"),
            ("runs", "settings.runs"),
            ("busy share of the noise", "noise.busy_share"),
            ("duration s", "duration_s"),
        ),
        (
            Table(
                "runs",
                "runs",
                (
                    "run",
                    "written",
                    "tune_gain_pct",
                    "tune_gain_low_pct",
                    "gain_pct",
                    "gain_lcb_pct",
                    "gain_ucb_pct",
                    "false_gain",
                    "checked",
                ),
            ),
        ),
    ),
    "decision_quality": Layout(
        "decision-quality.md",
        (
            ("false-gain share at the highest noise", "rows.-1.p_false_gain"),
            ("within 5 % at the highest noise", "rows.-1.p_within_5pct"),
            ("seeds per family and noise", "seeds"),
            ("families", "families"),
            ("elapsed s", "elapsed_s"),
        ),
        (
            Table(
                "by noise",
                "rows",
                (
                    "noise",
                    "p_within_5pct",
                    "p_false_gain",
                    "p_written",
                    "median_trials",
                    "median_rounds",
                    "median_measure_s",
                    "runs",
                ),
            ),
        ),
    ),
    "tuner_efficiency": Layout(
        "tuner-efficiency.md",
        (
            ("default sampler: median trials to 97 %", "samplers.TPE.median_trials_to_97pct"),
            ("default sampler", "default_sampler"),
            ("seeds", "seeds"),
            ("trial budget", "trial_budget"),
            ("elapsed s", "elapsed_s"),
        ),
        (
            Table(
                "smooth families, by sampler",
                "samplers",
                (
                    "median_trials_to_95pct",
                    "median_trials_to_97pct",
                    "median_trials_to_99pct",
                    "reached_97pct",
                    "median_fraction_of_optimum",
                ),
            ),
        ),
    ),
    "simulator_speed": Layout(
        "simulator-speed.md",
        (
            ("slowest case, requests per CPU-s", "min_requests_per_cpu_s"),
            ("meets target", "meets_target"),
            ("target", "target_requests_per_cpu_s"),
            ("requests", "requests"),
            ("repeats", "repeats"),
        ),
        (
            Table(
                "by case",
                "rows",
                (
                    "case",
                    "policy",
                    "engine_requests_per_cpu_s",
                    "reference_requests_per_cpu_s",
                    "speedup",
                ),
            ),
        ),
    ),
    "simulator_validation": Layout(
        "simulator-validation.md",
        (
            ("largest error", "max_abs_error"),
            ("within tolerance", "within_tolerance"),
            ("all within tolerance", "all_within_tolerance"),
            ("tolerance", "tolerance"),
            ("SLA p99 ms", "sla.p99_ms"),
            ("elapsed s", "elapsed_s"),
        ),
        (
            Table(
                "by configuration",
                "rows",
                (
                    "config.max_batch_size",
                    "config.max_queue_time_ms",
                    "measured_rps",
                    "predicted_rps",
                    "ratio",
                    "compute_only_ratio",
                ),
            ),
        ),
    ),
    "runtime_changes": Layout(
        "runtime-changes.md",
        (
            ("median change s, per runtime", "rows.*.change_s"),
            ("runtimes", "rows.*.runtime"),
            ("errors during changes", "rows.*.errors_during_change"),
            ("clients", "clients"),
        ),
        (
            Table(
                "by runtime",
                "rows",
                (
                    "runtime",
                    "changes",
                    "change_s",
                    "change_s_max",
                    "requests_during_change",
                    "errors_during_change",
                    "slowest_during_change_s",
                    "baseline_rps",
                    "tuned_rps",
                ),
            ),
        ),
    ),
    "operator_study": Layout(
        "operator-study.md",
        (
            ("wall s to Converged", "wall_s_to_converged"),
            ("trials", "trials"),
            ("gain, lower bound %", "gain_lcb_pct"),
            ("operator RSS MB, max", "operator_rss_mb_max"),
            ("API requests", "api_requests"),
            ("repeats", "repeats"),
        ),
        (
            Table(
                "studies",
                "runs",
                (
                    "phase",
                    "wall_s_to_converged",
                    "trials",
                    "baseline_rps",
                    "best_rps",
                    "gain_lcb_pct",
                    "api_requests",
                ),
            ),
        ),
    ),
}


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--results-dir` and `--no-save`, the same in every benchmark."""
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help="where the run's record goes, one folder per benchmark "
        "(default: docs/benchmarks/results)",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="record nothing (the result is still printed)"
    )


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        return None


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """The installed version of each distribution, None when absent: nothing is imported."""
    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit(repo: Path = REPO) -> dict[str, Any] | None:
    """The checkout's commit and whether it had changes, None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(status.strip())}


@dataclasses.dataclass
class Recorder:
    """One run of one benchmark, from its start: `save` writes its record."""

    benchmark: str
    argv: list[str]
    started: dt.datetime
    load_average_start: list[float] | None
    results_dir: Path | None  # None: --no-save
    runtimes: dict[str, str] = dataclasses.field(default_factory=dict)

    def run_block(self, **extra: Any) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "utc": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "finished_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "argv": self.argv,
            "load_average_start": self.load_average_start,
            "load_average_end": load_average(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": memory_bytes(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "versions": versions(),
            "runtimes": dict(self.runtimes),
            "git": git_commit(),
            **extra,
        }

    def save(self, result: Mapping[str, Any], **extra: Any) -> Path | None:
        """Writes the record and its tables; returns the JSON file (None with --no-save)."""
        if self.results_dir is None:
            return None
        record = {"result": dict(result), "run": self.run_block(**extra)}
        folder = self.results_dir / self.benchmark
        folder.mkdir(parents=True, exist_ok=True)
        stem = self.started.strftime(STAMP)
        path = folder / f"{stem}.json"
        n = 1
        while path.exists():  # two runs in one second
            n += 1
            path = folder / f"{stem}-{n}.json"
        path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
        path.with_suffix(".md").write_text(render_record(record, json_name=path.name))
        print(f"recorded {display(path)}", file=sys.stderr)
        return path


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def start(
    benchmark: str,
    args: argparse.Namespace,
    *,
    argv: Sequence[str] | None = None,
    runtimes: Mapping[str, str] | None = None,
) -> Recorder:
    """The record of a run beginning now (after `add_options`' options were parsed)."""
    return Recorder(
        benchmark=benchmark,
        argv=list(sys.argv if argv is None else argv),
        started=dt.datetime.now(dt.UTC),
        load_average_start=load_average(),
        results_dir=None if args.no_save else Path(args.results_dir),
        runtimes=dict(runtimes or {}),
    )


# rendering


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted path; None where it leads nowhere. `*` maps over a list."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == "*":
            if not isinstance(data, list):
                return None
            rest = ".".join(parts[i + 1 :])
            return [lookup(item, rest) if rest else item for item in data]
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list):
            try:
                data = data[int(part)]
            except (ValueError, IndexError):
                return None
        else:
            return None
    return data


def cell(value: Any) -> str:
    """A value as a table cell."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """The scalar leaves of a JSON value with their dotted paths (lists of scalars kept
    whole): the two-column table of a benchmark without a layout."""
    if isinstance(data, Mapping):
        items: list[tuple[str, Any]] = []
        for key, value in data.items():
            items += flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return items
    if isinstance(data, list) and any(isinstance(v, Mapping | list) for v in data):
        items = []
        for i, value in enumerate(data):
            items += flatten(value, f"{prefix}.{i}")
        return items
    return [(prefix, data)]


def layout_of(benchmark: str) -> Layout | None:
    return LAYOUTS.get(benchmark)


def figures(benchmark: str, result: Mapping[str, Any]) -> list[tuple[str, Any]]:
    layout = layout_of(benchmark)
    if layout is None:
        return flatten(result)
    return [(label, lookup(result, path)) for label, path in layout.figures]


def key_figure(benchmark: str, result: Mapping[str, Any]) -> tuple[str, Any]:
    """The one figure the history shows."""
    layout = layout_of(benchmark)
    if layout is None:
        leaves = flatten(result)
        return leaves[0] if leaves else ("", None)
    label, path = layout.figures[0]
    return label, lookup(result, path)


def render_tables(benchmark: str, result: Mapping[str, Any], level: str = "##") -> str:
    """The result's figures and its tables."""
    parts = [
        markdown_table(("figure", "value"), [(k, cell(v)) for k, v in figures(benchmark, result)])
    ]
    layout = layout_of(benchmark)
    for table in layout.tables if layout else ():
        data = lookup(result, table.path)
        if isinstance(data, Mapping):
            header = ["", *table.columns]
            rows = [[str(k), *(cell(lookup(v, c)) for c in table.columns)] for k, v in data.items()]
        elif isinstance(data, list):
            header = list(table.columns)
            rows = [[cell(lookup(item, c)) for c in table.columns] for item in data]
        else:
            continue
        parts.append(f"{level} {table.title}\n\n" + markdown_table(header, rows))
    return "\n".join(parts)


def describe_run(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run block as rows: when, how, on what."""

    def load(values: Any) -> str:
        return " / ".join(f"{v:g}" for v in values) if isinstance(values, list) else "-"

    memory = run.get("memory_bytes")
    git = run.get("git") or {}
    installed = {k: v for k, v in (run.get("versions") or {}).items() if v}
    rows = [
        ("UTC", str(run.get("utc", "-"))),
        ("command", "`" + shlex.join(run.get("argv", [])).replace("`", "'") + "`"),
        (
            "load average (1, 5, 15 min)",
            f"start {load(run.get('load_average_start'))}; end {load(run.get('load_average_end'))}",
        ),
        ("CPUs", cell(run.get("cpu_count"))),
        ("memory", f"{memory / 2**30:.1f} GiB" if isinstance(memory, int) else "-"),
        ("platform", f"{run.get('platform', '-')}, Python {run.get('python', '-')}"),
        ("versions", ", ".join(f"{k} {v}" for k, v in installed.items()) or "-"),
    ]
    if run.get("runtimes"):
        rows.append(("runtimes", cell(run["runtimes"])))
    if git:
        rows.append(
            (
                "commit",
                f"{str(git.get('commit', ''))[:12]}"
                + (" (with changes)" if git.get("dirty") else ""),
            )
        )
    return rows


def render_record(record: Mapping[str, Any], json_name: str) -> str:
    """The Markdown beside a record: the run, then the figures."""
    run, result = record["run"], record["result"]
    benchmark = run["benchmark"]
    return (
        f"# {benchmark}, {run['utc']}\n\n"
        f"The record: [{json_name}]({json_name}).\n\n"
        + markdown_table(("run", ""), describe_run(run))
        + "\n## Figures\n\n"
        + render_tables(benchmark, result)
    )


# the index


@dataclasses.dataclass(frozen=True)
class Entry:
    benchmark: str
    stem: str  # the file name without .json
    record: dict[str, Any]


def load_records(results_dir: Path) -> dict[str, list[Entry]]:
    """Every record under results_dir, per benchmark, oldest first."""
    found: dict[str, list[Entry]] = {}
    if not results_dir.is_dir():
        return found
    for folder in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        entries = []
        for path in folder.glob("*.json"):
            record = json.loads(path.read_text())
            entries.append(Entry(folder.name, path.stem, record))
        entries.sort(key=lambda e: (e.record["run"]["utc"], e.stem))
        if entries:
            found[folder.name] = entries
    return found


def render_index(results_dir: Path) -> str:
    """index.md: every benchmark (those without a run too), its latest run, its history."""
    records = load_records(results_dir)
    names = list(LAYOUTS) + sorted(set(records) - set(LAYOUTS))
    out = [
        f"# {INDEX_TITLE}\n",
        "Written by `python benchmarks/results.py index` from the records the benchmarks "
        "write here (`docs/benchmarks/results/<benchmark>/<UTC time>.json`, with a table "
        "beside each); do not edit it by hand. Each record holds the benchmark's JSON "
        "result and its run: the command, the load average at the start and the end, the "
        "CPUs, the memory, the platform and the versions. How to record a run: "
        "[Benchmarks](../index.md#recording-a-run).\n",
    ]
    for name in names:
        layout = layout_of(name)
        page = f" ([the benchmark](../{layout.page}))" if layout else ""
        command = (layout.command if layout else "") or f"python benchmarks/{name}.py"
        out.append(f"## {name}\n\n`{command}`{page}\n")
        entries = records.get(name, [])
        if not entries:
            out.append("No run recorded yet.\n")
            continue
        latest = entries[-1]
        run = latest.record["run"]
        out.append(
            f"### Latest: {run['utc']}\n\n"
            f"[{latest.stem}.json]({name}/{latest.stem}.json), "
            f"[table]({name}/{latest.stem}.md)\n\n"
            + markdown_table(("run", ""), describe_run(run))
            + "\n"
            + render_tables(name, latest.record["result"], level="####")
        )
        label = key_figure(name, latest.record["result"])[0]
        rows = []
        for entry in reversed(entries):  # newest first
            run = entry.record["run"]
            start_load = run.get("load_average_start")
            end_load = run.get("load_average_end")
            rows.append(
                (
                    str(run["utc"]),
                    f"{start_load[0]:g} → {end_load[0]:g}" if start_load and end_load else "-",
                    cell(key_figure(name, entry.record["result"])[1]),
                    f"[{entry.stem}.json]({name}/{entry.stem}.json)",
                )
            )
        out.append(
            "### History\n\n"
            + markdown_table(("UTC", "load average (1 min)", label or "key figure", "record"), rows)
        )
    return "\n".join(out)


def write_index(results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / "index.md"
    path.write_text(render_index(results_dir))
    return path


def wrap(name: str, command: Sequence[str], args: argparse.Namespace) -> int:
    """Runs a command that prints one JSON object, passes its output on, records it."""
    recorder = start(name, args, argv=command)
    done = subprocess.run(list(command), stdout=subprocess.PIPE, text=True, check=False)
    sys.stdout.write(done.stdout)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"not recorded: {command[0]} printed no JSON object", file=sys.stderr)
        return done.returncode or 1
    if isinstance(result, dict):
        recorder.save(result, exit_code=done.returncode)
    else:
        print(f"not recorded: {command[0]} printed no JSON object", file=sys.stderr)
    return done.returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    index = commands.add_parser("index", help="write DIR/index.md")
    index.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    wrapped = commands.add_parser("wrap", help="run a command and record its JSON")
    wrapped.add_argument("name", help="the benchmark's name, e.g. tune_local")
    add_options(wrapped)
    argv = list(sys.argv[1:] if argv is None else argv)
    # what follows `--` is the command to run, untouched by this parser
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if args.command == "index":
        print(display(write_index(args.results_dir)))
        return 0
    command = argv[split + 1 :]
    if not command:
        parser.error("wrap needs a command after --")
    return wrap(args.name, command, args)


if __name__ == "__main__":
    sys.exit(main())
