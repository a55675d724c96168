"""The `tune --local` configuration file (YAML or JSON) and its defaults.

Every section and key is optional; command-line flags override the file. Unknown keys
are rejected, so a typo is an error rather than a silently ignored setting."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from batchpilot.datafiles import load_yaml_or_json
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    MAX_BATCH_SIZE_LIMIT,
    MAX_CONNECTIONS,
    MAX_LOAD_WORKERS,
    MAX_QUEUE_TIME_MS_LIMIT,
    SLA,
)

# The default SLA for the reference server on a small machine: its p99 at light load
# with the server's own defaults is ~50 ms on 2 shared cores (a batch of 8 mostly
# single-row requests computes in ~17 ms, and the client shares the CPU), so 100 ms
# leaves room for batching to pay off without making every configuration infeasible.
DEFAULT_SLA_P99_MS = 100.0

# The default SLA of a token-streaming runtime started here (vLLM's CPU build serving its
# tiny model): TTFT and TPOT p99 targets, no end-to-end bound (an answer's length sets
# that). Its streams of 256 prompt and 128 output tokens met TTFT p99 28-32 ms and TPOT
# p99 4-5 ms at 3-6 req/s with max_num_seqs 8 on two shared cores, and 437 ms and 6 ms
# at 12 req/s, past what that cap serves.
DEFAULT_STREAM_SLA = SLA(ttft_p99_ms=250.0, tpot_p99_ms=25.0)


# Adaptive confirmation's cap (as the operator's tuning.maxConfirmRounds).
DEFAULT_MAX_ROUNDS = 6


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bounds(Strict):
    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min {self.min:g} must be <= max {self.max:g}")
        return self


class IntBounds(Bounds):
    min: int
    max: int


class Parameters(Strict):
    # 64 is what "fits safely" for the reference MLP on a CPU: a batch of 64 typical
    # requests computes in roughly the default SLA. The queue-time bound covers the
    # seed's bands up to "throughput first" (>= 100 ms).
    max_batch_size: IntBounds = IntBounds(min=1, max=64)
    max_queue_time_ms: Bounds = Bounds(min=0, max=100)


class ServerSection(Strict):
    """The reference server that local mode starts; its starting configuration is the
    baseline, as a deployment's current settings are in cluster mode."""

    model: Literal["mlp", "encoder"] = "mlp"
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    max_batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE_LIMIT)] = 8
    max_queue_time_ms: Annotated[float, Field(ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT)] = 5.0


class Measurement(Strict):
    """How each trial's effective throughput is measured (the capacity search)."""

    # 4 s windows: at a few hundred req/s that is >1000 requests a step, so p99 rests
    # on ~10 samples above it rather than 2-3
    step_duration_s: Annotated[float, Field(gt=0.0, le=600.0)] = 4.0
    warmup_s: Annotated[float, Field(ge=0.0, le=600.0)] = 1.5
    precision: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.05
    timeout_s: Annotated[float, Field(gt=0.0, le=3600.0)] | None = None
    # Generator processes sharing each step's schedule. 1 by default: local mode runs
    # the server on the same machine, and on a 2-core box a second generator process
    # takes CPU from the server it measures; one process drives several thousand req/s,
    # far above what the reference server reaches there.
    workers: Annotated[int, Field(ge=1, le=MAX_LOAD_WORKERS)] = 1
    # A cap on the client's connections (requests in flight), split over the workers:
    # None, a pool sized for open loop. Under a cap a wait for a connection is the
    # client's limit (a client-bound step), e.g. when sparing a production server.
    max_connections: Annotated[int, Field(ge=1, le=MAX_CONNECTIONS)] | None = None
    # Measured requests a step holds at least: a step is stretched (up to 6-fold) until
    # it does, and one still short is judged on the upper bound of its p99
    # (capacity/http.py step_window_s, capacity/steps.py step_from_load).
    min_requests: Annotated[int, Field(ge=0, le=1_000_000)] = DEFAULT_MIN_REQUESTS


class Tuning(Strict):
    trials: Annotated[int, Field(ge=1, le=1000)] = 20
    sampler: str = "TPE"
    seed: int = 0
    rule_of_thumb: bool = True
    simulator_warm_starts: Annotated[int, Field(ge=0, le=20)] = 2
    # After the study, re-measure the top `finalists` and the baseline interleaved for
    # `rounds` rounds, then more while the verdict is undecided up to `max_rounds`
    # (tuner/confirm.py), and recommend a finalist only when the lower bound of its gain
    # over the baseline is at least `min_gain_percent` (tuner/verdict.py).
    confirm: bool = True
    # With `confirm`: the study's trials are screened at a coarse fidelity (`screening`:
    # short steps, precision 0.15) so the time budget holds many of them, and only the
    # finalists' re-measurement runs at `measurement`. Off: every trial at `measurement`.
    screen: bool = True
    finalists: Annotated[int, Field(ge=1, le=10)] = 3
    rounds: Annotated[int, Field(ge=3, le=20)] = 3
    max_rounds: Annotated[int, Field(ge=3, le=20)] = DEFAULT_MAX_ROUNDS
    min_gain_percent: Annotated[float, Field(ge=0.0, le=1000.0)] = 5.0
    # No new trial starts after this many seconds of study; the one in flight and the
    # interleaved re-measurement (12 capacity searches bracketed around the study's
    # figures, about 4 minutes) still run. Keeps the default run inside 10 minutes on a
    # busy 2-core machine whatever mix of full and pruned trials it meets.
    time_budget_s: Annotated[float, Field(gt=0.0, le=7 * 24 * 3600.0)] = 200.0

    @model_validator(mode="after")
    def _rounds_ordered(self) -> Self:
        check_rounds(self.rounds, self.max_rounds)
        return self


def check_rounds(rounds: int, max_rounds: int) -> None:
    if max_rounds < rounds:
        raise ValueError(
            f"max_rounds ({max_rounds}) must be >= rounds ({rounds}): adaptive confirmation "
            "adds rounds after the first `rounds`, it never measures fewer"
        )


class TuneConfig(Strict):
    server: ServerSection = ServerSection()
    sla: SLA = SLA(p99_ms=DEFAULT_SLA_P99_MS)
    mix: str | None = None  # a mix spec ("80:1,15:4,5:16") or file; None: the default mix
    # the arrival process every trial is measured under, in --arrival's syntax
    arrival: str = "poisson"
    parameters: Parameters = Parameters()
    measurement: Measurement = Measurement()
    tuning: Tuning = Tuning()


# --quick: a smoke run that still ends with a measured recommendation. Short windows
# and a coarse precision; enough trials for baseline, rule of thumb, one simulator
# proposal and a few sampler trials.
# A smoke run's steps hold 500 requests (a p99 over about five samples above it) so
# that they stay near their 1.2 s instead of stretching to 2,000 requests.
QUICK_MIN_REQUESTS = 500
QUICK_MEASUREMENT = Measurement(
    step_duration_s=1.2, warmup_s=0.5, precision=0.15, min_requests=QUICK_MIN_REQUESTS
)
QUICK_TRIALS = 6
# A token-streaming runtime's steps where nothing else is said: a few streams a second
# never fill whole-request steps' request counts, so each step is judged on its own
# streams' tails over windows long enough to hold dozens of them (--quick: half as long,
# at its coarse precision).
STREAM_MEASUREMENT = Measurement(step_duration_s=4.0, warmup_s=1.0, min_requests=0)
QUICK_STREAM_MEASUREMENT = Measurement(
    step_duration_s=2.0, warmup_s=0.5, precision=0.15, min_requests=0
)


def screening(measurement: Measurement) -> Measurement:
    """The measurement that screens a study's trials when its finalists are confirmed at
    `measurement`: the smoke run's short steps, warm-up, precision and step minimum,
    never finer nor longer than `measurement` itself."""
    return measurement.model_copy(
        update={
            "step_duration_s": min(measurement.step_duration_s, QUICK_MEASUREMENT.step_duration_s),
            "warmup_s": min(measurement.warmup_s, QUICK_MEASUREMENT.warmup_s),
            "precision": max(measurement.precision, QUICK_MEASUREMENT.precision),
            "min_requests": min(measurement.min_requests, QUICK_MEASUREMENT.min_requests),
        }
    )


QUICK_SIMULATOR_WARM_STARTS = 1
QUICK_TIME_BUDGET_S = 75.0
QUICK_FINALISTS = 2
# the smoke run keeps to a fixed count of rounds (no adaptive ones): its three minutes
QUICK_MAX_ROUNDS = 3


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message says where and why."""


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def parse_config(data: Any, source: str = "configuration") -> TuneConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a mapping of sections (server, sla, ...)")
    try:
        return TuneConfig.model_validate(data)
    except ValidationError as exc:
        allowed = ", ".join(TuneConfig.model_fields)
        raise ConfigError(f"{source}: {_describe(exc)} (sections: {allowed})") from None


def load_config(path: Path) -> TuneConfig:
    try:
        data = load_yaml_or_json(path, "config file")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return parse_config(data, f"config file {str(path)!r}")
