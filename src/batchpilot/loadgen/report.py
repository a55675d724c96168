"""Human views of a LoadResult (the JSON is the result; this is a table of it)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from batchpilot.loadgen.result import LoadResult


def render_load(result: LoadResult, console: Console) -> None:
    title = "Load test" + (" (interrupted: partial result)" if result.interrupted else "")
    table = Table(title=title, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("target", ", ".join(result.urls))
    table.add_row("arrivals", f"{result.arrival} (seed {result.seed})")
    table.add_row("offered", f"{result.offered_rps:,.1f} req/s over {result.duration_s:g} s")
    table.add_row("achieved", f"{result.achieved_rps:,.1f} req/s")
    table.add_row("requests", f"{result.requests:,} ({result.ok:,} ok)")
    errors = ", ".join(f"{kind}: {n:,}" for kind, n in result.errors.items()) or "none"
    table.add_row("errors", f"{result.error_rate:.2%}  ({errors})")
    lat = result.latency
    for name, value in (
        ("p50", lat.p50_ms),
        ("p90", lat.p90_ms),
        ("p95", lat.p95_ms),
        ("p99", lat.p99_ms),
        ("p99.9", lat.p999_ms),
        ("max", lat.max_ms),
        ("mean", lat.mean_ms),
    ):
        table.add_row(f"latency {name}", f"{value:,.2f} ms")
    table.add_row(
        "generator lag", f"max {result.max_lag_ms:,.1f} ms, mean {result.mean_lag_ms:.2f} ms"
    )
    console.print(table)
