"""`batchpilot loadtest`: one open-loop run against one or more endpoints."""

from __future__ import annotations

import asyncio
import sys

import click
from rich.console import Console

from batchpilot.clitools import SeeHelpErrors, fail, on_interrupt
from batchpilot.loadgen.arrival_option import arrival_option
from batchpilot.loadgen.arrivals import ArrivalKind
from batchpilot.loadgen.endpoints import UnreachableError, check_reachable, normalise_urls
from batchpilot.loadgen.generator import MAX_DURATION_S, MAX_RATE, run_load
from batchpilot.loadgen.mix import parse_mix
from batchpilot.loadgen.report import render_load
from batchpilot.loadgen.result import LoadResult
from batchpilot.models import RequestMix

INTERRUPTED_EXIT = 130


@click.command(cls=SeeHelpErrors)
@click.argument("urls", metavar="URL...", nargs=-1, required=True)
@click.option(
    "--rate",
    type=click.FloatRange(0, MAX_RATE, min_open=True),
    required=True,
    help="Offered requests per second.",
)
@click.option(
    "--duration",
    type=click.FloatRange(0, MAX_DURATION_S, min_open=True),
    required=True,
    help="Seconds of load.",
)
@click.option(
    "--mix",
    "mix_spec",
    default=None,
    help="Request sizes as WEIGHT:SIZE pairs ('8:16,2:256') or a YAML/JSON file "
    "(default: mostly 1, some 4, a few 16).",
)
@arrival_option()
@click.option(
    "--timeout",
    type=click.FloatRange(0, 3600, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds a request may take from its scheduled time before it counts as a timeout.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--path", default="/v1/predict", show_default=True, help="Request path.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def loadtest(
    urls: tuple[str, ...],
    rate: float,
    duration: float,
    mix_spec: str | None,
    arrival: ArrivalKind,
    timeout: float,
    seed: int,
    path: str,
    as_json: bool,
) -> None:
    """Offer an open-loop load to URL (several URLs share it round-robin) and report
    latency percentiles from each request's scheduled time, errors and achieved rate.
    Ctrl-C stops early and prints the partial result."""
    try:
        mix = parse_mix(mix_spec) if mix_spec is not None else RequestMix.default()
        bases = normalise_urls(urls)
        if not path.startswith("/"):
            raise ValueError(f"--path must start with '/', got {path!r}")
    except ValueError as e:
        raise fail(str(e)) from None
    try:
        result = asyncio.run(
            _run(
                bases,
                rate,
                duration,
                mix,
                arrival,
                timeout,
                seed,
                path,
            )
        )
    except (UnreachableError, ValueError) as e:
        raise fail(str(e)) from None
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        render_load(result, Console())
    if result.interrupted:
        sys.exit(INTERRUPTED_EXIT)


async def _run(
    urls: list[str],
    rate: float,
    duration: float,
    mix: RequestMix,
    arrival: ArrivalKind,
    timeout_s: float,
    seed: int,
    path: str,
) -> LoadResult:
    stop = asyncio.Event()
    on_interrupt(stop.set)
    await check_reachable(urls)
    return await run_load(
        urls,
        rate=rate,
        duration_s=duration,
        mix=mix,
        arrival=arrival,
        timeout_s=timeout_s,
        seed=seed,
        path=path,
        stop=stop,
    )
