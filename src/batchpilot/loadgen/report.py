"""Human views of a LoadResult (the JSON is the result; this is a table of it)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.tokens import StreamSummary


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
    if result.stream is not None:
        for what, text in stream_rows(result.stream):
            table.add_row(what, text)
    console.print(table)


def stream_rows(stream: StreamSummary) -> list[tuple[str, str]]:
    """The table's rows for a token-stream run: TTFT, ITL and TPOT percentiles, output
    tokens per second and goodput, each tail against its target when one was set."""
    ttft, itl, tpot, sla = stream.ttft, stream.itl, stream.tpot, stream.sla
    rows = [
        (
            "TTFT p50 / p90 / p99",
            f"{ttft.p50_ms:,.2f} / {ttft.p90_ms:,.2f} / {ttft.p99_ms:,.2f} ms",
        ),
        ("ITL p50 / p99", f"{itl.p50_ms:,.2f} / {itl.p99_ms:,.2f} ms"),
        ("TPOT p50 / p99", f"{tpot.p50_ms:,.2f} / {tpot.p99_ms:,.2f} ms"),
        ("output tokens", f"{stream.output_tokens:,} ({stream.output_tokens_per_s:,.1f}/s)"),
    ]
    targets = [
        f"{name} ≤ {target:g} ms (p99 {'met' if met else 'broken'})"
        for name, target, met in (
            ("TTFT", sla.ttft_ms, stream.ttft_p99_met),
            ("TPOT", sla.tpot_ms, stream.tpot_p99_met),
        )
        if target is not None
    ]
    judged = ", ".join(targets) if targets else "no TTFT/TPOT target: every whole stream"
    good = f"{stream.good:,} of {stream.streams:,}"
    rows.append(("goodput", f"{stream.goodput_rps:,.2f} req/s ({good}; {judged})"))
    return rows
