"""`batchpilot loadtest`: one open-loop run against one or more endpoints."""

from __future__ import annotations

import asyncio
import math
import sys

import click
from rich.console import Console

from batchpilot.clitools import SeeHelpErrors, fail, on_interrupt
from batchpilot.loadgen.arrival_option import arrival_option
from batchpilot.loadgen.arrivals import ArrivalKind
from batchpilot.loadgen.connections_option import max_connections_option
from batchpilot.loadgen.endpoints import UnreachableError, check_reachable, normalise_urls
from batchpilot.loadgen.generator import MAX_DURATION_S, MAX_RATE, run_load
from batchpilot.loadgen.mix import parse_mix
from batchpilot.loadgen.protocol_option import (
    build_protocol,
    protocol_options,
    reads_metadata,
    with_ca_bundle,
)
from batchpilot.loadgen.protocols import RequestProtocol, speaking
from batchpilot.loadgen.report import render_load
from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.v2model import metadata_request
from batchpilot.models import MAX_LOAD_WORKERS, RequestMix

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
@max_connections_option()
@protocol_options()
@click.option(
    "--worker",
    "worker_spec",
    default=None,
    metavar="I/N",
    help="Send only share I of N (0 <= I < N) of the seeded schedule: requests I, I+N, ... "
    "at their times and sizes; N such runs with one --start-at send the whole schedule "
    "and their --json results merge exactly.",
)
@click.option(
    "--start-at",
    type=float,
    default=None,
    metavar="UNIX_S",
    help="Wall-clock time (Unix seconds) of the schedule's zero [default: now].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def loadtest(
    urls: tuple[str, ...],
    rate: float,
    duration: float,
    mix_spec: str | None,
    arrival: ArrivalKind,
    timeout: float,
    seed: int,
    max_connections: int | None,
    protocol: str | None,
    model: str | None,
    max_tokens: int | None,
    prompt_tokens: str | None,
    output_tokens: str | None,
    ttft_p99_ms: float | None,
    tpot_p99_ms: float | None,
    input_name: str | None,
    features: int | None,
    body_template: str | None,
    headers: tuple[str, ...],
    ca_bundle: str | None,
    path: str | None,
    worker_spec: str | None,
    start_at: float | None,
    as_json: bool,
) -> None:
    """Offer an open-loop load to URL (several URLs share it round-robin) and report
    latency percentiles from each request's scheduled time, errors and achieved rate;
    with a token-stream protocol also TTFT, ITL, TPOT, output tokens/s and goodput.
    Ctrl-C stops early and prints the partial result."""
    try:
        mix = parse_mix(mix_spec) if mix_spec is not None else RequestMix.default()
        bases = normalise_urls(urls)
        request = with_ca_bundle(
            build_protocol(
                protocol=protocol,
                model=model,
                max_tokens=max_tokens,
                input_name=input_name,
                features=features,
                body_template=body_template,
                headers=headers,
                path=path,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                ttft_p99_ms=ttft_p99_ms,
                tpot_p99_ms=tpot_p99_ms,
            ),
            ca_bundle,
        )
        if request.stream is not None and mix_spec is not None:
            raise ValueError(
                f"--mix applies to sized requests, not --protocol {request.name}: its "
                "lengths come from --prompt-tokens and --output-tokens"
            )
        share = parse_share(worker_spec) if worker_spec is not None else (0, 1)
        if start_at is not None and not math.isfinite(start_at):
            raise ValueError(f"--start-at must be a Unix time in seconds, got {start_at}")
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
                request,
                share,
                start_at,
                max_connections,
                model
                if reads_metadata(protocol=protocol, input_name=input_name, features=features)
                else None,
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
    request: RequestProtocol,
    share: tuple[int, int],
    start_at: float | None,
    max_connections: int | None,
    metadata_of: str | None = None,
) -> LoadResult:
    """`metadata_of`: the v2 model whose metadata (read from the first URL) shapes the
    requests, None to send `request` as it is."""
    stop = asyncio.Event()
    on_interrupt(stop.set)
    await check_reachable(urls)
    if metadata_of is not None:
        # MetadataError is a ValueError: one line, before any load
        request = await metadata_request(request, urls[0], metadata_of, seed=seed)
    with speaking(request):
        return await run_load(
            urls,
            rate=rate,
            duration_s=duration,
            mix=mix,
            arrival=arrival,
            timeout_s=timeout_s,
            seed=seed,
            stop=stop,
            share=share,
            start_at=start_at,
            max_connections=max_connections,
        )


def parse_share(text: str) -> tuple[int, int]:
    """`I/N` as (I, N), with 0 <= I < N <= MAX_LOAD_WORKERS."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or not 0 <= i < n <= MAX_LOAD_WORKERS:
        raise ValueError(
            f"--worker takes I/N with 0 <= I < N <= {MAX_LOAD_WORKERS} (e.g. 0/2), got {text!r}"
        )
    return i, n
