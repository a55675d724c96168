"""`batchpilot tune --local` and `tune --simulator`: flags, the configuration file,
output and exit codes."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from optuna.storages import BaseStorage
from rich.console import Console

from batchpilot.clitools import OneLineErrors
from batchpilot.extras import gp_sampler_missing, matplotlib_missing
from batchpilot.loadgen.arrival_option import ARRIVAL_HELP
from batchpilot.loadgen.arrivals import ARRIVAL_SYNTAX, ArrivalKind
from batchpilot.loadgen.connections_option import max_connections_option
from batchpilot.loadgen.protocol_option import build_protocol, runtime_protocol_options
from batchpilot.loadgen.protocols import (
    STREAM_PROTOCOLS,
    RequestProtocol,
    body_template_text,
    parse_headers,
    template_protocol,
)
from batchpilot.models import DEFAULT_MIN_REQUESTS, MAX_LOAD_WORKERS, SLA, RequestMix
from batchpilot.runtimes.registry import DEFAULT_RUNTIME, runtime_names
from batchpilot.runtimes.vllm.knobs import DEFAULT_TOKEN_BUDGET
from batchpilot.tuner.config import (
    DEFAULT_STREAM_SLA,
    QUICK_FINALISTS,
    QUICK_MAX_ROUNDS,
    QUICK_MEASUREMENT,
    QUICK_MIN_REQUESTS,
    QUICK_SIMULATOR_WARM_STARTS,
    QUICK_STREAM_MEASUREMENT,
    QUICK_TIME_BUDGET_S,
    QUICK_TRIALS,
    STREAM_MEASUREMENT,
    Bounds,
    ConfigError,
    IntBounds,
    Parameters,
    TuneConfig,
    check_rounds,
    load_config,
)
from batchpilot.tuner.edges import parse_range
from batchpilot.tuner.samplers import SAMPLERS, sampler_factory
from batchpilot.tuner.space import SearchSpace

if TYPE_CHECKING:
    from batchpilot.runtimes.base import Runtime
    from batchpilot.runtimes.http import HttpAccess

EXIT_INTERRUPTED = 130


class TuneError(click.ClickException):
    """One line on stderr, exit 2: bad input the user can fix."""

    exit_code = 2


def build_config(
    base: TuneConfig,
    *,
    trials: int | None,
    sla_p99_ms: float | None,
    seed: int | None,
    sampler: str | None,
    mix: str | None,
    quick: bool,
    ttft_p99_ms: float | None = None,
    tpot_p99_ms: float | None = None,
    arrival: str | None = None,
    finalists: int | None = None,
    rounds: int | None = None,
    min_gain_percent: float | None = None,
    workers: int | None = None,
    max_rounds: int | None = None,
    max_connections: int | None = None,
    min_requests: int | None = None,
    batch_range: str | None = None,
    wait_range_ms: str | None = None,
) -> TuneConfig:
    """The file's configuration with the flags applied; --quick first, so an explicit
    --trials still wins over it."""
    tuning = base.tuning
    measurement = base.measurement
    if quick:
        measurement = QUICK_MEASUREMENT.model_copy(
            update={
                "workers": measurement.workers,
                "max_connections": measurement.max_connections,
            }
        )
        tuning = tuning.model_copy(
            update={
                "trials": QUICK_TRIALS,
                "simulator_warm_starts": QUICK_SIMULATOR_WARM_STARTS,
                "finalists": QUICK_FINALISTS,  # the smoke run keeps to its three minutes
                "max_rounds": max(QUICK_MAX_ROUNDS, tuning.rounds),
                "time_budget_s": QUICK_TIME_BUDGET_S,
            }
        )
    updates: dict[str, object] = {}
    if trials is not None:
        updates["trials"] = trials
    if seed is not None:
        updates["seed"] = seed
    if sampler is not None:
        updates["sampler"] = sampler
    if finalists is not None:
        updates["finalists"] = finalists
    if rounds is not None:
        updates["rounds"] = rounds
        # a higher --rounds lifts the adaptive cap with it unless --max-rounds says
        updates["max_rounds"] = max(rounds, tuning.max_rounds)
    if max_rounds is not None:
        updates["max_rounds"] = max_rounds
    if min_gain_percent is not None:
        updates["min_gain_percent"] = min_gain_percent
    tuning = tuning.model_copy(update=updates)
    if workers is not None:
        measurement = measurement.model_copy(update={"workers": workers})
    if max_connections is not None:
        measurement = measurement.model_copy(update={"max_connections": max_connections})
    if min_requests is not None:
        measurement = measurement.model_copy(update={"min_requests": min_requests})
    check_rounds(tuning.rounds, tuning.max_rounds)
    parameters = base.parameters
    if batch_range is not None:
        low, high = parse_range(batch_range, "--batch-range", integer=True)
        parameters = parameters.model_copy(
            update={"max_batch_size": IntBounds(min=int(low), max=int(high))}
        )
    if wait_range_ms is not None:
        low, high = parse_range(wait_range_ms, "--wait-range-ms", integer=False)
        parameters = parameters.model_copy(update={"max_queue_time_ms": Bounds(min=low, max=high)})
    sla = base.sla
    if sla_p99_ms is not None or ttft_p99_ms is not None or tpot_p99_ms is not None:
        # token targets from the flags replace the default end-to-end bound, not the file's
        keep_p99 = "sla" in base.model_fields_set or (ttft_p99_ms is None and tpot_p99_ms is None)
        sla = SLA(
            p99_ms=sla_p99_ms if sla_p99_ms is not None else sla.p99_ms if keep_p99 else None,
            max_error_rate=sla.max_error_rate,
            ttft_p99_ms=ttft_p99_ms if ttft_p99_ms is not None else sla.ttft_p99_ms,
            tpot_p99_ms=tpot_p99_ms if tpot_p99_ms is not None else sla.tpot_p99_ms,
        )
    return base.model_copy(
        update={
            "tuning": tuning,
            "measurement": measurement,
            "sla": sla,
            "parameters": parameters,
            "mix": mix if mix is not None else base.mix,
            "arrival": arrival if arrival is not None else base.arrival,
        }
    )


def resolve(config: TuneConfig) -> tuple[SearchSpace, RequestMix]:
    """The search space and mix a configuration names; ValueError says what is wrong."""
    sampler_factory(config.tuning.sampler)  # an unknown name fails here, not mid-run
    if config.tuning.sampler.upper() == "GP" and (missing := gp_sampler_missing()) is not None:
        raise ValueError(missing)
    p = config.parameters
    space = SearchSpace.from_bounds(
        max_batch_size=(p.max_batch_size.min, p.max_batch_size.max),
        max_queue_time_ms=(p.max_queue_time_ms.min, p.max_queue_time_ms.max),
    )
    if config.mix is None:
        return space, RequestMix.default()
    from batchpilot.loadgen.mix import parse_mix

    return space, parse_mix(config.mix)


def resolve_arrival(config: TuneConfig) -> ArrivalKind:
    """The arrival process a configuration names; ValueError says what is allowed."""
    from batchpilot.loadgen.arrivals import parse_arrival

    try:
        return parse_arrival(config.arrival)
    except ValueError as exc:
        message = str(exc)
        if ARRIVAL_SYNTAX not in message:
            message = f"{message}; allowed: {ARRIVAL_SYNTAX}"
        raise ValueError(f"arrival: {message}") from None


def _storage(spec: str | None) -> str | BaseStorage | None:
    """Opened before the server starts, so a bad URL costs nothing and says why."""
    if spec is None:
        return None
    from optuna.storages import RDBStorage

    from batchpilot.tuner.study import open_storage

    try:
        storage = open_storage(spec)
    except OSError as exc:
        raise TuneError(f"--storage {spec}: cannot open the journal file: {exc}") from None
    if isinstance(storage, str):
        try:
            return RDBStorage(storage)
        except Exception as exc:  # any driver's refusal: one line for the user
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TuneError(
                f"--storage {spec}: {first} (give a database URL such as sqlite:///tune.db "
                "or a journal file path)"
            ) from None
    return storage


@click.command(cls=OneLineErrors)
@click.option(
    "--local",
    "local",
    is_flag=True,
    help="Start a server on this machine (the reference server, or --runtime) and tune it.",
)
@click.option(
    "--url",
    "attach_url",
    default=None,
    help="Tune the server already running at this base URL (--runtime says which kind; "
    "its configuration is changed live and put back at the end).",
)
@click.option(
    "--runtime",
    "runtime_name",
    type=click.Choice(runtime_names(), case_sensitive=False),
    default=None,
    help="Inference runtime --local starts with its bundled model, or the kind --url "
    "tunes [default reference].",
)
@click.option(
    "--model",
    default=None,
    help="--url: the model to tune on that server [default: the runtime's bundled one]; "
    "with --protocol also the requests' model field.",
)
@click.option(
    "--model-dir",
    "model_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="--local: serve your own model from this folder instead of the runtime's bundled "
    "one, starting at the batching values of its own settings (--runtime mlserver: "
    "model-settings.json with name, implementation and inputs, beside the model's Python "
    "file; the folder is copied, never changed).",
)
@click.option(
    "--model-archive",
    "model_archive",
    type=click.Path(path_type=Path),
    default=None,
    help="--local --runtime torchserve: serve your own model archive (.mar, from "
    "torch-model-archiver) instead of the bundled handler, starting at the batchSize and "
    "maxBatchDelay of its model-config.yaml (else TorchServe's 1 and 100 ms); requests "
    "from --body-template. The file is read, never changed.",
)
@click.option(
    "--token-budget",
    "token_budget",
    type=click.IntRange(1, 1_048_576),
    default=None,
    help="--local --runtime vllm: max_num_batched_tokens, the prompt and decode tokens one "
    "engine step may compute, the same in every trial [default 2048, vLLM's own on a CPU].",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    default=None,
    help="--url: decide each step on the server's own metrics (p99 from its latency "
    "histogram, request rates from its counters) in the Prometheus at this URL, which "
    "scrapes the server.",
)
@click.option(
    "--prometheus-selector",
    default="",
    help="--prometheus: label matchers that pick the server's series, e.g. "
    '\'job="triton",namespace="prod"\' [default: none].',
)
@click.option(
    "--control-url",
    default=None,
    help="--url: the runtime's control endpoint where it is not at its default: Triton's "
    "metrics port, Ray's dashboard, the reference server's control API [default: the "
    "runtime's own port on the --url host].",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="--url: a header every call to the server carries, to its inference and its "
    "control endpoints alike (a gateway's 'Authorization: Bearer TOKEN'); repeatable. "
    "Never printed.",
)
@click.option(
    "--ca-bundle",
    type=click.Path(dir_okay=False),
    default=None,
    help="--url: verify the server's https, inference and control alike, against only the "
    "CA certificates in this PEM file [default: the system's trust store]. Certificates "
    "are always verified.",
)
@click.option(
    "--body-template",
    "body_template",
    metavar="JSON|FILE",
    default=None,
    help="--local, --url: send this JSON (or a file's) as every request's body (a {size} in "
    "it becomes the request's size) instead of the requests built from the model's "
    "metadata (Triton, MLServer) or the runtime's own; for inputs such as BYTES, or a "
    "payload of your own.",
)
@click.option(
    "--keep-winner",
    is_flag=True,
    help="--url: leave the recommended configuration live at the end instead of putting "
    "back the one found running.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML/JSON file: server, sla, mix, parameters, measurement, tuning.",
)
@click.option(
    "--simulator",
    "cost_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Tune a simulated service instead: a JSON cost model, or a saved GET /admin/profile "
    "answer to fit one from (as `simulate --cost-model` takes it).",
)
@click.option(
    "--profile-url",
    default=None,
    help="Tune a simulated service whose cost model is fitted from this running reference "
    "server's GET /admin/profile.",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 1024),
    default=None,
    help="Simulated runs: round-robin replicas [default 1].",
)
@click.option(
    "--trials",
    "--max-trials",
    "trials",
    type=click.IntRange(1, 1000),
    default=None,
    help="Trials to measure, baseline and warm starts included [default 20].",
)
@click.option(
    "--sla-p99-ms",
    "--p99-ms",
    "sla_p99_ms",
    type=click.FloatRange(0, 3_600_000, min_open=True),
    default=None,
    help="p99 end-to-end latency SLA in ms [default 100; none when --ttft-p99-ms or "
    "--tpot-p99-ms is given].",
)
@runtime_protocol_options(
    "SLA: a step fails when the TTFT p99 is over it, and each trial scores its goodput, the "
    "requests per second within it and --tpot-p99-ms (--url)"
)
@click.option(
    "--batch-range",
    default=None,
    help="MIN..MAX: the max_batch_size range searched [default 1..64; "
    "parameters.max_batch_size in --config].",
)
@click.option(
    "--wait-range-ms",
    default=None,
    help="MIN..MAX: the max_queue_time_ms range searched, in ms [default 0..100; "
    "parameters.max_queue_time_ms in --config].",
)
@click.option(
    "--storage",
    default=None,
    help="Optuna storage URL (sqlite:///tune.db) or a journal file: resumes a run.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout."
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write report.json and PNG plots into this directory.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Short measurement windows, 6 trials, 2 finalists, 3 rounds: about 3 minutes.",
)
@click.option(
    "--finalists",
    type=click.IntRange(1, 10),
    default=None,
    help="Best configurations of the study re-measured against the baseline [default 3].",
)
@click.option(
    "--rounds",
    type=click.IntRange(3, 20),
    default=None,
    help="Interleaved rounds of that re-measurement [default 3].",
)
@click.option(
    "--max-rounds",
    type=click.IntRange(3, 20),
    default=None,
    help="Adaptive confirmation: more rounds while the verdict is undecided, up to this "
    "many in all [default 6; --rounds when higher].",
)
@click.option(
    "--min-gain-percent",
    type=click.FloatRange(0, 1000),
    default=None,
    help="Recommend a change only when the lower bound of its gain over the baseline "
    "is at least this [default 5].",
)
@click.option(
    "--mix",
    default=None,
    help="Request mix: WEIGHT:SIZE pairs ('80:1,15:4,5:16') or a YAML/JSON file.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_LOAD_WORKERS),
    default=None,
    help="Load generator processes sharing each step's schedule (--local) [default 1: "
    "the server runs on this machine too].",
)
@max_connections_option(split=", split over --workers (--local, --url)")
@click.option(
    "--min-requests",
    type=click.IntRange(0, 1_000_000),
    default=None,
    help="Measured requests a step holds at least: it is stretched up to 6-fold until it "
    "does, and one still short is judged on the upper bound of its p99 (--local, --url) "
    f"[default {DEFAULT_MIN_REQUESTS:,}; {QUICK_MIN_REQUESTS} with --quick].",
)
@click.option("--arrival", default=None, help=ARRIVAL_HELP + " [default poisson]")
@click.option("--seed", type=int, default=None, help="Seed of the sampler and the load.")
@click.option(
    "--sampler",
    type=click.Choice(sorted(SAMPLERS), case_sensitive=False),
    default=None,
    help="Optuna sampler [default TPE].",
)
def tune(**given: Any) -> None:
    """Find the dynamic-batching configuration with the most effective throughput
    within the p99 SLA, measured in the same run against the baseline and the rule of
    thumb (--local, or --url for a server already running), or simulated from a cost
    model (--simulator, --profile-url)."""
    flags = TuneFlags(**given)
    check_flags(flags)
    config = config_of(flags)
    streaming = flags.local and local_token_streams(flags.runtime)
    if streaming:
        config = streaming_config(config, flags)
    requests = tune_requests(flags, config, streaming)
    try:
        space, request_mix = resolve(config)
        process = resolve_arrival(config)
    except (ConfigError, ValueError) as exc:
        raise TuneError(str(exc)) from None
    check_config(flags, config, requests)

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if flags.simulated:
        _tune_simulated(
            config,
            space,
            request_mix,
            cost_file=flags.cost_file,
            profile_url=flags.profile_url,
            arrival=process,
            replicas=flags.replicas or 1,
            as_json=flags.as_json,
            report_dir=flags.report_dir,
        )
        return
    _tune_measured(flags, config, space, request_mix, process, requests)


@dataclass(frozen=True)
class TuneFlags:
    """Every flag of `tune`, as click parses them (None: not given)."""

    local: bool
    attach_url: str | None
    runtime_name: str | None
    model: str | None
    model_dir: Path | None
    model_archive: Path | None
    token_budget: int | None
    prometheus_url: str | None
    prometheus_selector: str
    control_url: str | None
    headers: tuple[str, ...]
    ca_bundle: str | None
    body_template: str | None
    keep_winner: bool
    cost_file: Path | None
    profile_url: str | None
    replicas: int | None
    config_path: Path | None
    trials: int | None
    sla_p99_ms: float | None
    protocol: str | None
    max_tokens: int | None
    input_name: str | None
    features: int | None
    prompt_tokens: str | None
    output_tokens: str | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    batch_range: str | None
    wait_range_ms: str | None
    storage: str | None
    as_json: bool
    report_dir: Path | None
    quick: bool
    mix: str | None
    arrival: str | None
    seed: int | None
    sampler: str | None
    finalists: int | None
    rounds: int | None
    max_rounds: int | None
    min_gain_percent: float | None
    workers: int | None
    max_connections: int | None
    min_requests: int | None

    @property
    def simulated(self) -> bool:
        return self.cost_file is not None or self.profile_url is not None

    @property
    def runtime(self) -> str:
        return (self.runtime_name or DEFAULT_RUNTIME).lower()

    @property
    def user_model(self) -> tuple[str, Path | None]:
        """The flag that gives a model of the user's own, and its path (None: none)."""
        if self.model_archive is None:
            return "--model-dir", self.model_dir
        return "--model-archive", self.model_archive


def check_flags(flags: TuneFlags) -> None:
    """One mode, and only the flags that mode reads; TuneError says which flag is out
    of place and what it belongs to."""
    modes = [
        flag
        for flag, given in (
            ("--local", flags.local),
            ("--url", flags.attach_url is not None),
            ("--simulator", flags.cost_file is not None),
            ("--profile-url", flags.profile_url is not None),
        )
        if given
    ]
    if len(modes) != 1:
        raise TuneError(
            (
                "give one of "
                if not modes
                else f"{' and '.join(modes)} exclude each other; give one of "
            )
            + "--local (tune the bundled reference server here), --url URL (tune a server "
            "running there), --simulator COST_MODEL or "
            "--profile-url URL (tune a simulated service); services in a cluster are tuned "
            "by the operator through an InferenceService resource"
        )
    if flags.simulated and flags.runtime_name is not None:
        raise TuneError("--runtime applies to --local runs; a simulated service has no runtime")
    streaming = flags.local and local_token_streams(flags.runtime)
    _check_request_flags(flags, streaming)
    if flags.token_budget is not None and not (flags.local and flags.runtime == "vllm"):
        raise TuneError(
            "--token-budget applies to --local --runtime vllm: it is the max_num_batched_tokens "
            "vLLM starts with"
        )
    if streaming:
        given = [
            flag
            for flag, value in (
                ("--mix", flags.mix),
                ("--body-template", flags.body_template),
                ("--model-dir", flags.model_dir),
                ("--model-archive", flags.model_archive),
            )
            if value is not None
        ]
        if given:
            raise TuneError(
                f"{given[0]} does not apply to --runtime {flags.runtime}: its load is streamed "
                "completions of the model it writes, lengths from --prompt-tokens and "
                "--output-tokens"
            )
    url_only = [
        flag
        for flag, given in (
            ("--model", flags.model is not None),
            ("--keep-winner", flags.keep_winner),
            ("--prometheus", flags.prometheus_url is not None),
            ("--control-url", flags.control_url is not None),
            ("--header", bool(flags.headers)),
            ("--ca-bundle", flags.ca_bundle is not None),
        )
        if given
    ]
    if flags.attach_url is None and url_only:
        raise TuneError(
            f"{url_only[0]} applies to --url runs: --local tunes the runtime's bundled "
            "model, measured by the client, and stops the server at the end"
        )
    if flags.model_dir is not None and flags.model_archive is not None:
        raise TuneError("--model-dir and --model-archive exclude each other: give your model once")
    user_flag, user_model = flags.user_model
    if user_model is not None and not flags.local:
        raise TuneError(
            f"{user_flag} applies to --local runs: it is the model the runtime started here "
            "serves (a server at --url serves its own; name it with --model)"
        )
    if flags.simulated and flags.body_template is not None:
        raise TuneError(
            "--body-template applies to --local and --url runs; a simulated run sends no load"
        )
    if flags.protocol is not None and flags.protocol.lower() in STREAM_PROTOCOLS and flags.mix:
        raise TuneError(
            f"--mix applies to sized requests, not --protocol {flags.protocol}: its lengths "
            "come from --prompt-tokens and --output-tokens"
        )
    if not flags.simulated:
        if flags.replicas is not None:
            raise TuneError("--replicas applies to simulated runs (--simulator, --profile-url)")
        return
    load_flags = (
        ("--storage", flags.storage, "--local runs; a simulated run takes seconds"),
        ("--workers", flags.workers, "--local runs; a simulated run sends no load"),
        (
            "--max-connections",
            flags.max_connections,
            "--local and --url runs; a simulated run sends no load",
        ),
        (
            "--min-requests",
            flags.min_requests,
            "--local and --url runs; a simulated run sends no load",
        ),
    )
    for flag, value, where in load_flags:
        if value is not None:
            raise TuneError(f"{flag} applies to {where}")


def local_token_streams(runtime_name: str) -> bool:
    """Whether the runtime `--local` starts is served with token streams (vLLM)."""
    from batchpilot.runtimes.registry import get_runtime

    return runtime_name in runtime_names() and get_runtime(runtime_name).streams_tokens


def _check_request_flags(flags: TuneFlags, streaming: bool) -> None:
    """--protocol and the flags that shape the requests by hand, where the mode reads
    them; TuneError names the flag and where it applies."""
    kind = (flags.protocol or "").lower()
    shaping = [
        flag
        for flag, value in (
            ("--protocol", flags.protocol),
            ("--input-name", flags.input_name),
            ("--features", flags.features),
            ("--max-tokens", flags.max_tokens),
        )
        if value is not None
    ]
    if not shaping:
        return
    if flags.simulated:
        raise TuneError(
            f"{shaping[0]} applies to --local and --url runs; a simulated run sends no load"
        )
    if flags.body_template is not None:
        raise TuneError(
            f"--body-template and {shaping[0]} exclude each other: give the requests one way"
        )
    if not flags.local:
        return
    if streaming:
        if kind and kind not in STREAM_PROTOCOLS:
            raise TuneError(
                f"--protocol {kind} does not apply to --local --runtime {flags.runtime}: its "
                f"load is token streams (--protocol {' or '.join(STREAM_PROTOCOLS)})"
            )
        return
    if kind and kind != "v2":
        raise TuneError(
            f"--protocol {kind} applies to --url runs and to --local --runtime vllm: the other "
            "runtimes --local starts serve their model's requests, not completions"
        )
    by_hand = [flag for flag in shaping if flag != "--max-tokens"]
    _, user_model = flags.user_model
    if by_hand and user_model is None:
        raise TuneError(
            f"{by_hand[0]} applies to --url runs and to --local with a model of your own "
            "(--model-dir): the requests of a bundled model are built for it"
        )


def tune_requests(flags: TuneFlags, config: TuneConfig, streaming: bool) -> RequestProtocol | None:
    """The requests --protocol and its flags describe; None: the runtime's own (built from
    the model's metadata for Triton and MLServer) or --body-template's. TuneError names the
    flag that is wrong and what is allowed."""
    if flags.simulated:
        return None
    from batchpilot.loadgen.protocols import APPLIES_TO
    from batchpilot.runtimes.registry import get_runtime

    runtime = get_runtime(flags.runtime)
    own = runtime.protocol().name
    tensor = flags.input_name is not None or flags.features is not None
    kind = (flags.protocol or "").lower()
    if streaming and not kind:
        kind = "openai-stream"
    if tensor and not kind:
        kind = "v2"
    if kind == "v2" and own != "v2":
        speakers = [n for n in runtime_names() if get_runtime(n).protocol().name == "v2"]
        flag = "--protocol v2" if flags.protocol else "--input-name and --features"
        raise TuneError(
            f"{flag} applies to the runtimes that serve KServe v2 inference "
            f"({', '.join(speakers)}); the {flags.runtime} runtime takes its own requests, "
            "or a body of yours with --body-template"
        )
    if not kind or (kind == "v2" and not tensor):
        # the runtime's own requests: only a body of the user's changes their shape
        for flag, value in (
            ("--max-tokens", flags.max_tokens),
            ("--prompt-tokens", flags.prompt_tokens),
            ("--output-tokens", flags.output_tokens),
            ("--ttft-p99-ms", flags.ttft_p99_ms),
            ("--tpot-p99-ms", flags.tpot_p99_ms),
        ):
            if value is not None:
                raise TuneError(
                    f"{flag} applies to --protocol {' or '.join(APPLIES_TO[flag])}, not to "
                    f"the {flags.runtime} runtime's own requests"
                )
        return None
    if kind == "v2":
        model: str | None = _served_model(flags, runtime) or runtime.default_model
    else:
        model = runtime.default_model if streaming else flags.model
    try:
        return build_protocol(
            protocol=kind,
            model=model,
            max_tokens=flags.max_tokens,
            input_name=flags.input_name,
            features=flags.features,
            body_template=None,
            headers=(),
            path=None,
            prompt_tokens=flags.prompt_tokens,
            output_tokens=flags.output_tokens,
            ttft_p99_ms=config.sla.ttft_p99_ms if streaming else flags.ttft_p99_ms,
            tpot_p99_ms=config.sla.tpot_p99_ms if streaming else flags.tpot_p99_ms,
        )
    except ValueError as exc:
        raise TuneError(str(exc)) from None


def _served_model(flags: TuneFlags, runtime: Runtime) -> str | None:
    """The model the requests name: the user's own that --local serves (its settings
    say its name), else --model."""
    _, user_model = flags.user_model
    if user_model is not None:
        return runtime.user_model(user_model)
    return flags.model


def _file_config(flags: TuneFlags) -> TuneConfig | None:
    """The --config file as written (None: no file)."""
    if flags.config_path is None:
        return None
    try:
        return load_config(flags.config_path)
    except (ConfigError, ValueError) as exc:
        raise TuneError(str(exc)) from None


def _set_in(config: TuneConfig | None, section: str, key: str | None = None) -> bool:
    """Whether the --config file sets `section` (or its `key`)."""
    if config is None or section not in config.model_fields_set:
        return False
    return key is None or key in getattr(config, section).model_fields_set


def streaming_config(config: TuneConfig, flags: TuneFlags) -> TuneConfig:
    """`config` for a runtime served with token streams (`tune --local --runtime vllm`):
    the queue-time axis pinned at 0 (continuous batching has none), a token budget that
    holds the largest batch searched, and where neither a flag nor the --config file
    says otherwise: TTFT and TPOT targets for the SLA, and steps judged on their own
    streams (`STREAM_MEASUREMENT`: a few streams a second never fill the thousands of
    requests whole-request steps hold) without the short screening steps."""
    wait = config.parameters.max_queue_time_ms
    start_wait = config.server.max_queue_time_ms
    wait_set = flags.wait_range_ms is not None or wait != Parameters().max_queue_time_ms
    if (wait_set and wait.max > 0) or (
        "max_queue_time_ms" in config.server.model_fields_set and start_wait > 0
    ):
        raise TuneError(
            f"--runtime {flags.runtime} batches continuously: a request joins the running "
            "batch at the next engine step, there is no queue wait to tune (leave "
            "--wait-range-ms, parameters.max_queue_time_ms and server.max_queue_time_ms out)"
        )
    budget = flags.token_budget or DEFAULT_TOKEN_BUDGET
    top = config.parameters.max_batch_size.max
    if budget < top:
        raise TuneError(
            f"--token-budget {budget} is below the largest batch searched ({top}): vLLM needs "
            "max_num_batched_tokens >= max_num_seqs, as every running sequence takes a token "
            "of each step; raise --token-budget or lower --batch-range"
        )
    written = _file_config(flags)
    defaults = QUICK_STREAM_MEASUREMENT if flags.quick else STREAM_MEASUREMENT
    stream_defaults = {
        key: value
        for key, value in defaults.model_dump().items()
        if key in defaults.model_fields_set and not _set_in(written, "measurement", key)
    }
    if flags.min_requests is not None:
        stream_defaults.pop("min_requests", None)
    updates: dict[str, object] = {
        "parameters": config.parameters.model_copy(
            update={"max_queue_time_ms": Bounds(min=0, max=0)}
        ),
        "server": config.server.model_copy(update={"max_queue_time_ms": 0.0}),
        "measurement": config.measurement.model_copy(update=stream_defaults),
    }
    if not _set_in(written, "tuning", "screen"):
        updates["tuning"] = config.tuning.model_copy(update={"screen": False})
    sla_flags = (flags.sla_p99_ms, flags.ttft_p99_ms, flags.tpot_p99_ms)
    if all(v is None for v in sla_flags) and not _set_in(written, "sla"):
        updates["sla"] = DEFAULT_STREAM_SLA
    return config.model_copy(update=updates)


def config_of(flags: TuneFlags) -> TuneConfig:
    """The --config file's configuration (else the defaults) with the flags applied."""
    try:
        base = load_config(flags.config_path) if flags.config_path is not None else TuneConfig()
        return build_config(
            base,
            trials=flags.trials,
            sla_p99_ms=flags.sla_p99_ms,
            seed=flags.seed,
            sampler=flags.sampler,
            mix=flags.mix,
            quick=flags.quick,
            ttft_p99_ms=flags.ttft_p99_ms,
            tpot_p99_ms=flags.tpot_p99_ms,
            arrival=flags.arrival,
            finalists=flags.finalists,
            rounds=flags.rounds,
            min_gain_percent=flags.min_gain_percent,
            workers=flags.workers,
            max_rounds=flags.max_rounds,
            max_connections=flags.max_connections,
            min_requests=flags.min_requests,
            batch_range=flags.batch_range,
            wait_range_ms=flags.wait_range_ms,
        )
    except (ConfigError, ValueError) as exc:
        raise TuneError(str(exc)) from None


def check_config(flags: TuneFlags, config: TuneConfig, requests: RequestProtocol | None) -> None:
    """What the flags and the configuration file say together, before anything starts."""
    if config.sla.token_targets and (requests is None or requests.stream is None):
        raise TuneError(
            "the SLA's TTFT and TPOT targets (--ttft-p99-ms, --tpot-p99-ms, sla.ttft_p99_ms "
            "and sla.tpot_p99_ms in --config) are judged on token streams: give --url with "
            f"--protocol {' or '.join(STREAM_PROTOCOLS)}"
        )
    runtime = flags.runtime
    if flags.attach_url is not None and "model" in config.server.model_fields_set:
        raise TuneError(
            "server.model picks the model --local starts; a server at --url serves its "
            "own (leave server.model out, and name the one to tune with --model)"
        )
    if runtime != DEFAULT_RUNTIME and "model" in config.server.model_fields_set:
        raise TuneError(
            f"server.model picks the reference server's model; the {runtime} runtime serves "
            "its own bundled model (leave server.model out)"
        )
    user_flag, user_model = flags.user_model
    if user_model is not None:
        _check_user_model(user_flag, user_model, runtime, config, flags.body_template)
    report_dir = flags.report_dir
    if report_dir is not None and report_dir.exists() and not report_dir.is_dir():
        raise TuneError(f"--report {report_dir}: exists and is not a directory")
    # before any trial: a run whose report cannot be drawn would be wasted
    if report_dir is not None and (missing := matplotlib_missing("tune --report (its plots)")):
        raise click.ClickException(missing)


def _tune_measured(
    flags: TuneFlags,
    config: TuneConfig,
    space: SearchSpace,
    request_mix: RequestMix,
    process: ArrivalKind,
    requests: RequestProtocol | None,
) -> None:
    """`tune --local` and `tune --url`: a server measured by the load generator;
    `requests` None: the runtime's own."""
    from batchpilot.errors import RequestShapeError, TargetError
    from batchpilot.runtimes.base import LaunchError
    from batchpilot.runtimes.registry import get_runtime
    from batchpilot.server.process import ServerStartError
    from batchpilot.tuner.localmode import LocalRun, tune_local
    from batchpilot.tuner.progress import render_summary

    # soft_wrap: progress lines stay whole in logs and pipes instead of breaking at 80
    console = Console(stderr=True, soft_wrap=True)
    runtime = flags.runtime
    what = "the reference server" if runtime == DEFAULT_RUNTIME else get_runtime(runtime).title
    attach = None
    source = None
    if flags.attach_url is not None:
        from batchpilot.tuner.urlmode import attach_to, prometheus_source

        adapter = get_runtime(runtime)
        attach = attach_to(
            flags.attach_url,
            adapter,
            model=flags.model,
            keep_winner=flags.keep_winner,
            control_url=flags.control_url,
            access=_access(flags),
        )
        what = f"{what} at {attach.url}"
        if flags.prometheus_url is not None:
            source = prometheus_source(
                flags.prometheus_url,
                adapter,
                model=flags.model,
                selector=flags.prometheus_selector,
                step_s=config.measurement.step_duration_s,
            )
    _, user_model = flags.user_model
    if flags.body_template is not None:
        adapter = get_runtime(runtime)
        requests = _body_template(flags.body_template, adapter, _served_model(flags, adapter))
    run = LocalRun(
        model_dir=user_model,
        requests=requests,
        config=config,
        space=space,
        mix=request_mix,
        storage=_storage(flags.storage),
        arrival=process,
        runtime=runtime,
        attach=attach,
        source=source,
        token_budget=flags.token_budget,
    )
    try:
        summary = asyncio.run(tune_local(run, console))
    except (ServerStartError, LaunchError) as exc:
        first = str(exc).splitlines()[0]
        raise click.ClickException(
            f"{what}: {first}" if attach is not None else f"{what} did not start: {first}"
        ) from None
    except RequestShapeError as exc:  # the requests are wrong, not the server
        hint = credentials_hint(str(exc), headers_given=bool(flags.headers))
        raise click.ClickException(f"{what}: {exc}{hint}") from None
    except TargetError as exc:
        why = f"{what}: {exc}" if attach is not None else f"{what} misbehaved: {exc}"
        hint = credentials_hint(str(exc), headers_given=bool(flags.headers))
        raise click.ClickException(why + hint) from None
    except ConnectionError as exc:  # the load generator found the server gone
        raise click.ClickException(f"{what} stopped answering: {exc}") from None
    except ValueError as exc:  # a stored study that does not fit this run
        raise TuneError(str(exc).splitlines()[0]) from None
    render_summary(console, summary)
    if flags.report_dir is not None:
        from batchpilot.tuner.report import write_report

        paths = write_report(summary, flags.report_dir)
        console.print(f"Report: {', '.join(str(p) for p in paths)}", highlight=False)
    if flags.as_json:
        sys.stdout.write(summary.model_dump_json() + "\n")
    if summary.interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _tune_simulated(
    config: TuneConfig,
    space: SearchSpace,
    mix: RequestMix,
    *,
    cost_file: Path | None,
    profile_url: str | None,
    arrival: ArrivalKind,
    replicas: int,
    as_json: bool,
    report_dir: Path | None,
) -> None:
    from batchpilot.simulator.cost import ProfileError
    from batchpilot.simulator.profile import cost_model_from_json, fetch_profile, load_cost_model
    from batchpilot.tuner.progress import render_summary
    from batchpilot.tuner.simulated import SimulatedRun, tune_simulated

    try:
        if cost_file is not None:
            cost = load_cost_model(cost_file)
        else:
            cost = cost_model_from_json(asyncio.run(fetch_profile(str(profile_url))))
    except ProfileError as exc:
        flag = (
            f"--simulator {cost_file}" if cost_file is not None else f"--profile-url {profile_url}"
        )
        raise TuneError(f"{flag}: {exc}") from None
    console = Console(stderr=True, soft_wrap=True)
    run = SimulatedRun(
        config=config, space=space, mix=mix, cost=cost, arrival=arrival, replicas=replicas
    )
    summary = asyncio.run(tune_simulated(run, console))
    render_summary(console, summary)
    if report_dir is not None:
        from batchpilot.tuner.report import write_report

        paths = write_report(summary, report_dir)
        console.print(f"Report: {', '.join(str(p) for p in paths)}", highlight=False)
    if as_json:
        sys.stdout.write(summary.model_dump_json() + "\n")


def _check_user_model(
    flag: str, path: Path, runtime_name: str, config: TuneConfig, body_template: str | None
) -> None:
    """`tune --local --model-dir DIR` or `--model-archive FILE`: a runtime that serves a
    user's model given by that flag, one it can serve, no start values from elsewhere
    (the model's own settings are the baseline) and requests where it cannot build them."""
    from batchpilot.runtimes.registry import get_runtime

    runtime = get_runtime(runtime_name)
    if runtime.user_model_dir is None or runtime.user_model_flag != flag:
        if runtime.user_model_dir is not None:
            raise TuneError(
                f"{flag}: the {runtime_name} runtime takes your own model as "
                f"{runtime.user_model_flag}: {runtime.user_model_dir}"
            )
        takers = [
            n
            for n in runtime_names()
            if get_runtime(n).user_model_dir is not None and get_runtime(n).user_model_flag == flag
        ]
        what = "a model folder" if flag == "--model-dir" else "a model archive"
        raise TuneError(
            f"{flag}: the {runtime_name} runtime serves its bundled model only; "
            f"--runtime {' or '.join(takers)} serves {what} of your own"
        )
    starts = {"max_batch_size", "max_queue_time_ms"} & config.server.model_fields_set
    if starts:
        raise TuneError(
            f"server.{sorted(starts)[0]} sets the start of a bundled model; with {flag} "
            "the baseline is what your model's own settings say (leave it out)"
        )
    try:
        runtime.user_model(path)
    except ValueError as exc:
        raise TuneError(f"{flag} {path}: {exc}") from None
    if runtime.user_model_body is not None and body_template is None:
        raise TuneError(
            f"{flag} {path}: {runtime.user_model_body}, so BatchPilot cannot build its "
            "requests: pass --body-template FILE with one request body your model accepts "
            "(a {size} in it becomes each request's size)"
        )


def credentials_hint(message: str, *, headers_given: bool) -> str:
    """What to add to a message about a server refusing with HTTP 401 or 403 ("" for
    any other): how to give credentials, or that the ones given were refused."""
    if re.search(r"HTTP 40[13]\b", message) is None:
        return ""
    if headers_given:
        return "; the server (or a gateway in front of it) refused the credentials --header gave"
    return (
        "; a server behind a gateway takes its credentials with --header, e.g. "
        "--header 'Authorization: Bearer TOKEN'"
    )


def _access(flags: TuneFlags) -> HttpAccess:
    """How every call to the server at --url is made: --header, --ca-bundle."""
    from batchpilot.runtimes.http import HttpAccess

    try:
        headers = parse_headers(flags.headers)
    except ValueError as exc:
        raise TuneError(f"--header: {exc}") from None
    access = HttpAccess(headers=headers, ca_file=flags.ca_bundle)
    try:
        access.tls()
    except ValueError as exc:
        raise TuneError(f"--ca-bundle: {exc}") from None
    return access


def _body_template(value: str, runtime: Runtime, model: str | None) -> RequestProtocol:
    """The requests of `tune --body-template JSON|FILE`: that JSON to the runtime's
    inference path for `model`."""
    inference = runtime.protocol(model or runtime.default_model).path
    try:
        return template_protocol(body_template_text(value), path=inference, require_size=False)
    except ValueError as exc:
        raise TuneError(f"--body-template: {exc}") from None
