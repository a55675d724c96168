"""`batchpilot simulate`: predicted effective throughput of one configuration (or a grid)
from a batch-cost model, in the JSON shape of `batchpilot capacity`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import click
from pydantic import ValidationError

from batchpilot.clitools import OneLineErrors, fail
from batchpilot.loadgen.arrival_option import ARRIVAL_HELP
from batchpilot.loadgen.arrivals import (
    ARRIVAL_SYNTAX,
    ArrivalKind,
    Trace,
    TraceError,
    parse_arrival,
)
from batchpilot.loadgen.mix import parse_mix
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.capacity import DEFAULT_PRECISION, simulate_capacity
from batchpilot.simulator.cost import LinearCost, ProfileError, TableCost
from batchpilot.simulator.profile import cost_model_from_json, fetch_profile, load_cost_model
from batchpilot.simulator.propose import KnobBounds, grid_configs, rank, simulate_grid
from batchpilot.simulator.scenario import Scenario, Traffic


class SimulateCommand(OneLineErrors):
    error_prefix: ClassVar[str] = "batchpilot simulate: error: "
    fail_exit_code: ClassVar[int] = 2


def arrival_from_option(spec: str) -> ArrivalKind:
    """--arrival, in the load generator's syntax (one traffic model for both)."""
    try:
        return parse_arrival(spec)
    except TraceError:
        raise  # a trace file problem is reported as it is, without the syntax
    except ValueError as exc:
        message = str(exc)
        if ARRIVAL_SYNTAX not in message:
            message = f"{message}; allowed: {ARRIVAL_SYNTAX}"
        raise click.BadParameter(message, param_hint="'--arrival'") from None


def describe_scenario(scenario: Scenario) -> dict[str, Any]:
    """The scenario for the JSON output; a trace as its size and rate, not every gap."""
    described = scenario.model_dump(mode="json", exclude={"cost"})
    if isinstance(scenario.arrival, Trace):
        described["arrival"] = {
            "kind": "trace",
            "recorded_requests": len(scenario.arrival.gaps_s) + 1,
            "recorded_rps": scenario.arrival.native_rate,
        }
    return described


def parse_bounds(spec: str, *, integer: bool, name: str) -> tuple[float, float]:
    low, sep, high = spec.partition(":")
    try:
        lo, hi = (int(low), int(high)) if integer else (float(low), float(high))
    except ValueError:
        lo = hi = -1
    if not sep or lo < 0 or hi < lo:
        kind = "integers" if integer else "numbers"
        raise click.BadParameter(
            f"{spec!r}: expected LOW:HIGH, {kind} with 0 <= LOW <= HIGH", param_hint=name
        )
    return lo, hi


def _mix(spec: str | None) -> RequestMix:
    if spec is None:
        return RequestMix.default()
    try:
        return parse_mix(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--mix'") from None


async def _cost_from_url(url: str, overhead_ms: float) -> LinearCost | TableCost:
    return cost_model_from_json(await fetch_profile(url), overhead_ms=overhead_ms)


def _human_single(config: BatchingConfig, result: CapacityResult, scenario: Scenario) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simulated steps, {config.label()}")
    for column in ("offered req/s", "achieved req/s", "p50 ms", "p99 ms", "errors", "pass"):
        table.add_column(column, justify="right")
    for step in result.steps:
        table.add_row(
            f"{step.offered_rps:.1f}",
            f"{step.achieved_rps:.1f}",
            f"{step.p50_ms:.1f}",
            f"{step.p99_ms:.1f}",
            f"{step.error_rate:.4f}",
            "yes" if step.passed else f"no: {step.reason}",
        )
    console = Console()
    console.print(table)
    verdict = (
        f"effective throughput {result.effective_rps:.1f} req/s (p99 {result.p99_ms:.1f} ms)"
        if result.feasible and result.p99_ms is not None
        else "infeasible: no rate meets the SLA"
    )
    console.print(f"{verdict}; cost model {scenario.cost.label()}; {scenario.replicas} replica(s)")


def _human_grid(ranked: Sequence[tuple[BatchingConfig, CapacityResult]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulated grid, best first")
    for column in ("max_batch_size", "max_queue_time_ms", "effective req/s", "p99 ms"):
        table.add_column(column, justify="right")
    for config, result in ranked:
        table.add_row(
            str(config.max_batch_size),
            f"{config.max_queue_time_ms:g}",
            f"{result.effective_rps:.1f}" if result.feasible else "infeasible",
            f"{result.p99_ms:.1f}" if result.p99_ms is not None else "-",
        )
    Console().print(table)


@click.command(cls=SimulateCommand)
@click.option("--p99-ms", type=float, required=True, help="SLA: p99 latency bound in ms.")
@click.option("--max-error-rate", type=float, default=0.001, show_default=True)
@click.option(
    "--max-batch-size", type=int, help="Configuration to simulate (with --max-queue-time-ms)."
)
@click.option("--max-queue-time-ms", type=float, help="Configuration to simulate.")
@click.option("--grid", is_flag=True, help="Simulate a coarse grid instead of one configuration.")
@click.option(
    "--batch-bounds", default="1:64", show_default=True, help="Grid: LOW:HIGH batch sizes."
)
@click.option("--wait-bounds", default="0:100", show_default=True, help="Grid: LOW:HIGH ms.")
@click.option(
    "--cost-model",
    "cost_file",
    type=click.Path(path_type=Path),
    help="JSON cost model, or a saved GET /admin/profile answer to fit one from.",
)
@click.option("--profile-url", help="Fit the cost model from this server's GET /admin/profile.")
@click.option(
    "--overhead-ms",
    type=float,
    default=0.0,
    show_default=True,
    help="Latency each request pays outside the worker (HTTP, parsing).",
)
@click.option(
    "--mix",
    "mix_spec",
    help="Request sizes: WEIGHT:SIZE,... or a YAML/JSON file (default: 80:1,15:4,5:16).",
)
@click.option("--arrival", default="poisson", show_default=True, help=ARRIVAL_HELP)
@click.option("--replicas", type=int, default=1, show_default=True, help="Round-robin replicas.")
@click.option("--requests", type=int, default=20_000, show_default=True, help="Requests per step.")
@click.option(
    "--policy",
    type=click.Choice(["sequential", "pipelined"]),
    default="sequential",
    show_default=True,
    help="sequential: the next batch is collected when the worker is free (the reference "
    "server); pipelined: batches close on their own and queue for the worker.",
)
@click.option(
    "--ahead",
    type=int,
    default=0,
    show_default=True,
    help="Full batches handed over while another computes (the reference server: 1).",
)
@click.option(
    "--jitter",
    type=float,
    default=0.0,
    show_default=True,
    help="Spread of batch times: coefficient of variation of a mean-1 factor.",
)
@click.option(
    "--queue-limit",
    type=int,
    default=None,
    help="Requests that may wait; more are refused with 503 (the reference server: 1024).",
)
@click.option("--precision", type=float, default=DEFAULT_PRECISION, show_default=True)
@click.option(
    "--timeout-ms",
    type=float,
    help="Client timeout in ms (default: as `capacity`: 5x the SLA, >= 1 s).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate(**options: Any) -> None:
    """Predict effective throughput with the queueing simulator."""
    try:
        _run(**options)
    except (ProfileError, TraceError) as exc:
        raise fail(str(exc)) from None
    except click.BadParameter as exc:
        raise fail(exc.format_message()) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]).replace("_", "-")
        raise fail(f"invalid value for --{where}: {first['msg']}") from None


def _run(
    *,
    p99_ms: float,
    max_error_rate: float,
    max_batch_size: int | None,
    max_queue_time_ms: float | None,
    grid: bool,
    batch_bounds: str,
    wait_bounds: str,
    cost_file: Path | None,
    profile_url: str | None,
    overhead_ms: float,
    mix_spec: str | None,
    arrival: str,
    replicas: int,
    requests: int,
    policy: str,
    ahead: int,
    jitter: float,
    queue_limit: int | None,
    precision: float,
    timeout_ms: float | None,
    seed: int,
    as_json: bool,
) -> None:
    if p99_ms <= 0:
        raise click.BadParameter(f"{p99_ms:g}: must be > 0 ms", param_hint="'--p99-ms'")
    if not 0 <= max_error_rate < 1:
        raise click.BadParameter(
            f"{max_error_rate:g}: must be in [0, 1)", param_hint="'--max-error-rate'"
        )
    if not 0 < precision < 1:
        raise click.BadParameter(f"{precision:g}: must be in (0, 1)", param_hint="'--precision'")
    if overhead_ms < 0:
        raise click.BadParameter(f"{overhead_ms:g}: must be >= 0", param_hint="'--overhead-ms'")
    if (cost_file is None) == (profile_url is None):
        raise click.BadParameter(
            "give exactly one of --cost-model FILE or --profile-url URL",
            param_hint="'--cost-model' / '--profile-url'",
        )
    single = max_batch_size is not None or max_queue_time_ms is not None
    if grid == single or (single and (max_batch_size is None or max_queue_time_ms is None)):
        raise click.BadParameter(
            "give either --max-batch-size N and --max-queue-time-ms T together, or --grid",
            param_hint="'--max-batch-size' / '--max-queue-time-ms' / '--grid'",
        )
    cost = (
        load_cost_model(cost_file, overhead_ms=overhead_ms)
        if cost_file is not None
        else asyncio.run(_cost_from_url(str(profile_url), overhead_ms))
    )
    sla = SLA(p99_ms=p99_ms, max_error_rate=max_error_rate)
    scenario = Scenario(
        cost=cost,
        mix=_mix(mix_spec),
        arrival=arrival_from_option(arrival),
        replicas=replicas,
        requests=requests,
        seed=seed,
        policy="pipelined" if policy == "pipelined" else "sequential",
        timeout_ms=timeout_ms,
        ahead=ahead,
        jitter=jitter,
        queue_limit=queue_limit,
    )
    described = {
        "source": "simulator",
        "cost_model": cost.model_dump(mode="json"),
        "scenario": describe_scenario(scenario),
    }
    if max_batch_size is not None and max_queue_time_ms is not None:
        config = BatchingConfig(max_batch_size=max_batch_size, max_queue_time_ms=max_queue_time_ms)
        result = simulate_capacity(Traffic(scenario), config, sla, precision=precision)
        if as_json:
            click.echo(
                json.dumps(
                    {**result.model_dump(mode="json"), "config": config.model_dump(), **described}
                )
            )
        else:
            _human_single(config, result, scenario)
        return
    b_lo, b_hi = parse_bounds(batch_bounds, integer=True, name="'--batch-bounds'")
    w_lo, w_hi = parse_bounds(wait_bounds, integer=False, name="'--wait-bounds'")
    bounds = KnobBounds(max_batch_size=(int(b_lo), int(b_hi)), max_queue_time_ms=(w_lo, w_hi))
    results = simulate_grid(scenario, sla, grid_configs(bounds), precision=precision)
    order = {c: i for i, c in enumerate(rank(results))}
    ranked = sorted(results, key=lambda cr: order.get(cr[0], len(order)))
    if as_json:
        best = ranked[0] if ranked and ranked[0][1].feasible else None
        click.echo(
            json.dumps(
                {
                    "best": None
                    if best is None
                    else {**best[0].model_dump(), **best[1].model_dump(mode="json")},
                    "results": [{**c.model_dump(), **r.model_dump(mode="json")} for c, r in ranked],
                    **described,
                }
            )
        )
    else:
        _human_grid(ranked)
