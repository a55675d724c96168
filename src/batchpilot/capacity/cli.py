"""`batchpilot capacity`: the effective throughput of a live endpoint, every step shown."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from batchpilot.capacity.http import measure_capacity
from batchpilot.capacity.prometheus import PrometheusQueryError, PrometheusStepSource
from batchpilot.capacity.report import capacity_json, render_capacity, step_line
from batchpilot.capacity.search import summarise_steps
from batchpilot.clitools import SeeHelpErrors, fail, on_interrupt
from batchpilot.extras import matplotlib_missing
from batchpilot.loadgen.arrival_option import arrival_option
from batchpilot.loadgen.arrivals import ArrivalKind
from batchpilot.loadgen.connections_option import max_connections_option
from batchpilot.loadgen.endpoints import UnreachableError, check_reachable, normalise_urls
from batchpilot.loadgen.mix import parse_mix
from batchpilot.loadgen.protocol_option import (
    build_protocol,
    protocol_options,
    reads_metadata,
    refusal_hint,
    with_ca_bundle,
)
from batchpilot.loadgen.protocols import RequestProtocol, speaking
from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.workers import WorkerError
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    MAX_LOAD_WORKERS,
    SLA,
    CapacityResult,
    RequestMix,
    StepResult,
)

INTERRUPTED_EXIT = 130
_POSITIVE = click.FloatRange(0, min_open=True)


@click.command(cls=SeeHelpErrors)
@click.argument("urls", metavar="URL...", nargs=-1, required=True)
@click.option(
    "--p99-ms", type=click.FloatRange(0, 3_600_000, min_open=True), default=None,
    help="SLA: p99 end-to-end latency bound in milliseconds (required unless "
    "--ttft-p99-ms or --tpot-p99-ms is given).",
)  # fmt: skip
@click.option(
    "--max-error-rate", type=click.FloatRange(0, 1, max_open=True), default=0.001,
    show_default=True, help="SLA: largest allowed fraction of failed requests.",
)  # fmt: skip
@click.option("--mix", "mix_spec", default=None, help="WEIGHT:SIZE pairs or a YAML/JSON file.")
@click.option(
    "--precision", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
    show_default=True, help="Stop bisecting when (hi - lo) / lo is at most this.",
)  # fmt: skip
@click.option("--step-seconds", type=_POSITIVE, default=5.0, show_default=True)
@click.option(
    "--min-requests", type=click.IntRange(0), default=DEFAULT_MIN_REQUESTS, show_default=True,
    help="Stretch a step (up to 6x) until it holds this many requests; a step still "
    "short is judged on the upper 95 % bound of its p99.",
)  # fmt: skip
@click.option("--warmup-seconds", type=click.FloatRange(0), default=2.0, show_default=True)
@click.option(
    "--workers", type=click.IntRange(1, MAX_LOAD_WORKERS), default=1, show_default=True,
    help="Load generator processes sharing each step's one schedule, to lift the client's "
    "ceiling; each one's health is in the JSON.",
)  # fmt: skip
@max_connections_option(split=", split over --workers")
@click.option("--start-rps", type=_POSITIVE, default=None, help="Default: from the warm-up.")
@click.option(
    "--timeout", type=_POSITIVE, default=None,
    help="Default: max(5 x SLA, 1 s); with token targets alone, 5 x a long answer within them.",
)  # fmt: skip
@arrival_option()
@click.option("--seed", type=int, default=0, show_default=True)
@protocol_options(
    "SLA: a step fails when the TTFT p99 is over it, and the capacity is the goodput, the "
    "requests per second within it and --tpot-p99-ms"
)
@click.option("--replicas", type=click.IntRange(1), default=1, show_default=True)
@click.option("--accelerators-per-replica", type=click.IntRange(1), default=1, show_default=True)
@click.option("--prometheus", "prometheus_url", default=None, help="Decide steps from PromQL.")
@click.option("--prometheus-selector", default="", help="Label matchers, e.g. 'job=\"x\"'.")
@click.option(
    "--prometheus-ca-bundle", type=click.Path(exists=True, dir_okay=False), default=None,
    help="PEM file of the CA certificates an https --prometheus is verified against "
    "[default: the system's trust store]; verification is never turned off.",
)  # fmt: skip
@click.option(
    "--prometheus-scrape-interval", type=_POSITIVE, default=None,
    help="Seconds between scrapes of the target (default: from Prometheus's configuration); "
    "steps shorter than 4 intervals are refused.",
)  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def capacity(
    urls: tuple[str, ...],
    p99_ms: float | None,
    max_error_rate: float,
    mix_spec: str | None,
    precision: float,
    step_seconds: float,
    min_requests: int,
    warmup_seconds: float,
    workers: int,
    max_connections: int | None,
    start_rps: float | None,
    timeout: float | None,
    arrival: ArrivalKind,
    seed: int,
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
    replicas: int,
    accelerators_per_replica: int,
    prometheus_url: str | None,
    prometheus_selector: str,
    prometheus_ca_bundle: str | None,
    prometheus_scrape_interval: float | None,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """Find the effective throughput of URL: the highest offered rate whose p99 and error
    rate stay within the SLA. Warm-up, geometric ramp, bisection; every step reported.
    With a token-stream --protocol the SLA may be TTFT and TPOT targets, and the figure
    searched is the goodput. Ctrl-C stops and prints the steps so far."""
    try:
        request = with_ca_bundle(
            build_protocol(
                protocol=protocol, model=model, max_tokens=max_tokens, input_name=input_name,
                features=features, body_template=body_template, headers=headers, path=path,
                prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                ttft_p99_ms=ttft_p99_ms, tpot_p99_ms=tpot_p99_ms,
            ),
            ca_bundle,
        )  # fmt: skip
        metadata_of = (
            model
            if reads_metadata(protocol=protocol, input_name=input_name, features=features)
            else None
        )
        if p99_ms is None and ttft_p99_ms is None and tpot_p99_ms is None:
            raise ValueError(
                "give the SLA: --p99-ms, or with a token-stream --protocol --ttft-p99-ms "
                "and/or --tpot-p99-ms (beside --p99-ms or alone)"
            )
        if request.stream is not None and mix_spec is not None:
            raise ValueError(
                f"--mix applies to sized requests, not --protocol {request.name}: its "
                "lengths come from --prompt-tokens and --output-tokens"
            )
        mix = parse_mix(mix_spec) if mix_spec is not None else RequestMix.default()
        bases = normalise_urls(urls)
        source = None
        if prometheus_url is not None:
            source = PrometheusStepSource(
                prometheus_url,
                selector=prometheus_selector,
                scrape_interval_s=prometheus_scrape_interval,
                ca_file=prometheus_ca_bundle,
            )
        elif prometheus_ca_bundle is not None:
            raise ValueError("--prometheus-ca-bundle applies with --prometheus only")
        if plot_path is not None and Path(plot_path).suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ValueError(f"--plot must name a .png, .svg or .pdf file, got {plot_path!r}")
        # before any load: a run whose plot cannot be drawn would be wasted
        if plot_path is not None and (missing := matplotlib_missing("capacity --plot")):
            raise ValueError(missing)
    except ValueError as e:
        raise fail(str(e)) from None
    sla = SLA(
        p99_ms=p99_ms, max_error_rate=max_error_rate, ttft_p99_ms=ttft_p99_ms,
        tpot_p99_ms=tpot_p99_ms,
    )  # fmt: skip
    console = Console(stderr=True)
    steps: list[StepResult] = []

    def progress(step: StepResult, load: LoadResult) -> None:
        steps.append(step)
        if not as_json:
            console.print(step_line(len(steps), step), highlight=False)

    async def run() -> tuple[CapacityResult, bool]:
        task = asyncio.current_task()
        assert task is not None
        on_interrupt(task.cancel)
        try:
            await check_reachable(bases)
            if source is not None:
                await source.check_reachable()
                await source.check_step(step_seconds)
            sent = await requests_taken(bases[0], request, metadata_of, mix, seed)
            with speaking(sent):
                result = await measure_capacity(
                    bases, sla=sla, mix=mix, precision=precision, step_duration_s=step_seconds,
                    warmup_s=warmup_seconds, start_rps=start_rps, timeout_s=timeout, seed=seed,
                    source=source, arrival=arrival, path=sent.path,
                    on_step=progress, min_requests=min_requests, workers=workers,
                    max_connections=max_connections,
                )  # fmt: skip
            return result, False
        except asyncio.CancelledError:
            return summarise_steps(steps, sla=sla, precision=precision), True

    try:
        result, interrupted = asyncio.run(run())
    except PrometheusQueryError as e:
        # the CLI's user may see the body (a tenant reading Events may not: see the source)
        said = f" (it said: {' '.join(e.body_excerpt.split())})" if e.body_excerpt else ""
        raise fail(f"{e}{said}") from None
    except (UnreachableError, WorkerError, ValueError) as e:
        raise fail(str(e)) from None
    written = None
    if plot_path is not None and result.steps:
        # matplotlib costs seconds to import: only when a plot is asked for.
        from batchpilot.capacity.plot import plot_capacity

        written = str(plot_capacity({", ".join(bases): result}, plot_path))
    data: dict[str, Any] = capacity_json(
        result, urls=bases, replicas=replicas, accelerators_per_replica=accelerators_per_replica,
        interrupted=interrupted, plot=written, workers=workers,
    )  # fmt: skip
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        render_capacity(data, Console())
    if interrupted:
        sys.exit(INTERRUPTED_EXIT)


async def requests_taken(
    url: str, request: RequestProtocol, metadata_of: str | None, mix: RequestMix, seed: int
) -> RequestProtocol:
    """The requests the search sends, tried first on `url`: `request`, or v2 requests
    built from model `metadata_of`'s metadata. ValueError, before any load, when the
    server refuses them with a 4xx (its words and the flags that set the requests) or
    the metadata says too little."""
    from batchpilot.loadgen.firstrequests import first_refusal
    from batchpilot.loadgen.v2model import metadata_request

    if metadata_of is not None:
        request = await metadata_request(request, url, metadata_of, seed=seed)
    sizes = [c.size for c in mix.classes]
    refusal = await first_refusal(url, request, sizes, seed=seed)
    if refusal is not None:
        raise ValueError(
            f"the server refused the first requests ({request.name}): {refusal}; give "
            f"{refusal_hint(request.name)}"
        )
    return request
