"""The capacity result as JSON (with the cost line) and as a table for people."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from batchpilot.models import CapacityResult, StepResult, accelerator_hours_per_million


def capacity_json(
    result: CapacityResult,
    *,
    urls: list[str],
    replicas: int,
    accelerators_per_replica: int,
    interrupted: bool = False,
    plot: str | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """The result's JSON plus the cost line (accelerator-hours per million effective
    requests) and how it was obtained."""
    cost = accelerator_hours_per_million(
        result.effective_rps, replicas=replicas, accelerators_per_replica=accelerators_per_replica
    )
    data = result.model_dump(mode="json")
    data.update(
        urls=urls,
        replicas=replicas,
        accelerators_per_replica=accelerators_per_replica,
        accelerator_hours_per_million=cost if math.isfinite(cost) else None,
        interrupted=interrupted,
        plot=plot,
        workers=workers,
    )
    return data


def step_line(index: int, step: StepResult) -> str:
    verdict = "pass" if step.passed else f"FAIL ({step.reason})"
    if not step.valid:
        verdict = f"INVALID ({step.reason})"
    tokens = ""
    if step.goodput_rps is not None:
        tokens = (
            f", TTFT p99 {_ms(step.ttft_p99_ms)}, TPOT p99 {_ms(step.tpot_p99_ms)}, goodput "
            f"{step.goodput_rps:,.1f} req/s, {step.output_tokens_per_s or 0:,.0f} tokens/s"
        )
    return (
        f"step {index}: offered {step.offered_rps:,.1f} req/s → achieved "
        f"{step.achieved_rps:,.1f}, p50 {step.p50_ms:,.1f} ms, p99 {step.p99_ms:,.1f} ms"
        f"{tokens}, errors {step.error_rate:.2%}: {verdict}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def _held(result: CapacityResult) -> str:
    """What the step the capacity rests on kept, e.g. 'p99 80.1 ms ≤ SLA 100 ms'."""
    sla = result.sla
    held = []
    if sla.p99_ms is not None:
        held.append(f"p99 {result.p99_ms or 0:,.1f} ms ≤ SLA {sla.p99_ms:g} ms")
    for name, measured, target in (
        ("TTFT", result.ttft_p99_ms, sla.ttft_p99_ms),
        ("TPOT", result.tpot_p99_ms, sla.tpot_p99_ms),
    ):
        if target is not None:
            held.append(f"{name} p99 {_ms(measured)} ≤ SLA {target:g} ms")
    if result.output_tokens_per_s is not None:
        held.append(f"{result.output_tokens_per_s:,.0f} output tokens/s")
    return ", ".join(held)


def render_capacity(data: dict[str, Any], console: Console) -> None:
    result = CapacityResult.model_validate(
        {k: v for k, v in data.items() if k in CapacityResult.model_fields}
    )
    title = "Capacity search" + (" (interrupted: partial result)" if data["interrupted"] else "")
    table = Table(title=title)
    streamed = any(s.goodput_rps is not None for s in result.steps)
    tokens = ("TTFT p99 ms", "TPOT p99 ms", "goodput req/s", "tokens/s") if streamed else ()
    names = ("#", "offered req/s", "achieved req/s", "p50 ms", "p99 ms", *tokens, "errors", "step")
    for name in names:
        table.add_column(name, justify="right" if name != "step" else "left")
    for index, step in enumerate(result.steps, start=1):
        figures = (
            (
                _ms(step.ttft_p99_ms).removesuffix(" ms"),
                _ms(step.tpot_p99_ms).removesuffix(" ms"),
                "-" if step.goodput_rps is None else f"{step.goodput_rps:,.1f}",
                "-" if step.output_tokens_per_s is None else f"{step.output_tokens_per_s:,.0f}",
            )
            if streamed
            else ()
        )
        table.add_row(
            str(index),
            f"{step.offered_rps:,.1f}",
            f"{step.achieved_rps:,.1f}",
            f"{step.p50_ms:,.1f}",
            f"{step.p99_ms:,.1f}",
            *figures,
            f"{step.error_rate:.2%}",
            "[green]pass[/]"
            if step.passed
            else f"[red]fail[/] {step.reason}"
            if step.valid
            else f"[yellow]invalid[/] {step.reason}",
        )
    console.print(table)
    sla = result.sla
    if result.feasible:
        console.print(
            f"Effective throughput (goodput): [bold]{result.capacity_label()}[/] "
            f"({_held(result)}, errors ≤ "
            f"{sla.max_error_rate:g}; precision {result.precision:.0%})"
            + (" — pruned early" if result.pruned else "")
        )
        if result.client_bound:
            capped = any(
                s.client is not None and s.client.connection_cap is not None
                for s in result.steps
                if not s.valid
            )
            console.print(
                "[yellow]The client could not drive a higher rate[/] (see the invalid step): "
                + (
                    "raise --max-connections, or run the load from more workers or another "
                    "machine, to find the real capacity"
                    if capped
                    else "run the load from more workers or another machine to find the "
                    "real capacity"
                )
            )
        if result.short_of_precision:
            console.print(
                f"[yellow]The search ended short of its {result.precision:.0%} precision[/]: "
                f"{result.short_of_precision}; the capacity is at least this figure"
            )
        console.print(
            f"Cost: {data['accelerator_hours_per_million']:,.3f} accelerator-hours per million "
            f"effective requests ({data['replicas']} replica(s) x "
            f"{data['accelerators_per_replica']} accelerator(s))"
        )
    else:
        console.print(
            f"[red]No offered rate met the SLA[/] ({sla.describe()}, errors ≤ "
            f"{sla.max_error_rate:g}): effective throughput 0"
        )
        if result.unjudged:
            console.print(f"[yellow]The search stopped ramping down[/]: {result.unjudged}")
    if data.get("plot"):
        console.print(f"Plot written to {data['plot']}")
