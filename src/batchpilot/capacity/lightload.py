"""Light load: the rates below a configuration's capacity that the capacity search never
visits, measured once the search has found that capacity.

Effective throughput is the highest rate below which every rate holds the SLA. The
search ramps from a start near the rate to beat, so it proves the SLA only at and above
its first passing step. With a batcher that is not enough: at moderate rates a batch
closes on its timer rather than full, every request in it waits most of
max_queue_time, and the p99 can peak there, above the SLA, although both a lighter
and a heavier load hold it. A few low rates, measured by the same step rule, catch
that peak.

A failing low rate caps the answer: the effective throughput becomes the goodput of the
highest passing step below it (the rule of `search.summarise_steps`), 0 req/s, that
is infeasible, when none passed below it. The configuration is not disqualified by name:
the cap follows from the definition, and a configuration whose p99 breaks the SLA only
near 60 % of its capacity keeps the figure it proved below that."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult

# Shares of the capacity the search found. 10 % is light traffic (nights, between
# bursts) where batches close on the timer; 30 % and 60 % sit where batches fill
# partly and a request waits for most of the timer behind a batch in flight. Three
# keep the cost to three steps at rates the search's own steps never go below.
LIGHT_LOAD_FRACTIONS: tuple[float, ...] = (0.1, 0.3, 0.6)

# During the study, only a configuration whose wait takes at least this share of the SLA
# p99 is probed at light load: a request then spends most of its budget waiting for a
# batch to fill, and whatever the batch itself takes can push it over. With a shorter
# wait the batch's own time would have to reach half the SLA to break it at light load,
# which the heavy-load steps, running fuller (slower) batches, already expose. The
# finalists are probed whatever their wait, before anything is written back.
LIGHT_LOAD_WAIT_SHARE = 0.5

# A rate within this share of a lower one measures the same load twice: left out.
SAME_RATE_SHARE = 0.05

# How the reason of a result capped by a low rate starts.
LIGHT_LOAD = "LightLoad"


@dataclass(frozen=True)
class LightLoad:
    """Which low rates to measure once the search has found a capacity C: each of
    `fractions` x C, and `production_rps` (the rate the service runs at) when known."""

    fractions: tuple[float, ...] = LIGHT_LOAD_FRACTIONS
    production_rps: float | None = None

    def __post_init__(self) -> None:
        if any(not (0.0 < f < 1.0) for f in self.fractions):
            raise ValueError(f"light-load fractions must lie in (0, 1), got {self.fractions}")
        if self.production_rps is not None and not (
            math.isfinite(self.production_rps) and self.production_rps > 0
        ):
            raise ValueError(f"production rate must be > 0 req/s, got {self.production_rps:g}")


@dataclass(frozen=True)
class LowRate:
    rate: float
    label: str  # "10 % of 2,903 req/s", "the production rate"


def light_load_rates(capacity_rps: float, light: LightLoad) -> list[LowRate]:
    """The low rates to measure below `capacity_rps`, lowest first, each labelled with
    where it comes from. A production rate at or above the capacity is left out (it is
    not light load: the capacity itself says the configuration cannot serve it), and so
    is any rate within SAME_RATE_SHARE of a lower one."""
    if not (capacity_rps > 0):
        return []
    candidates = [
        LowRate(f * capacity_rps, f"{100 * f:g} % of {capacity_rps:,.0f} req/s")
        for f in light.fractions
    ]
    if light.production_rps is not None and light.production_rps < capacity_rps:
        candidates.append(LowRate(light.production_rps, "the production rate"))
    chosen: list[LowRate] = []
    for low in sorted(candidates, key=lambda c: c.rate):
        if chosen and low.rate <= chosen[-1].rate * (1.0 + SAME_RATE_SHARE):
            continue
        chosen.append(low)
    return chosen


def wait_needs_light_load(config: BatchingConfig, sla: SLA) -> bool:
    """Whether a study's trial of `config` is probed at light load (LIGHT_LOAD_WAIT_SHARE).
    A batch cap of 1 never waits for a batch to fill."""
    return config.max_batch_size > 1 and config.max_queue_time_ms >= (
        LIGHT_LOAD_WAIT_SHARE * sla.scale_ms()
    )


def light_load_reason(failed: StepResult, label: str, capped_rps: float) -> str:
    """Why a result was capped: the low rate, where it comes from, what it measured."""
    tail = (
        f"effective throughput capped at {capped_rps:.1f} req/s, the highest rate below it "
        "that held the SLA"
        if capped_rps > 0
        else "no lower rate held the SLA"
    )
    return (
        f"{LIGHT_LOAD}: at {failed.offered_rps:.1f} req/s ({label}) p99 "
        f"{failed.p99_ms:.1f} ms, breaking the SLA ({failed.reason}); {tail}"
    )


def capped_by(
    result: CapacityResult,
    low_steps: Sequence[StepResult],
    failed: tuple[LowRate, StepResult] | None,
) -> CapacityResult:
    """`result` with the light-load steps added and, when `failed` names a low rate and
    the step that broke the SLA there, its effective throughput capped at the highest
    passing step below that rate. The failing step is passed, not looked up by rate: a
    real step's offered rate is what the client scheduled, close to the rate asked for
    but not equal to it."""
    steps = [*result.steps, *low_steps]
    if failed is None:
        return result.model_copy(update={"steps": steps})
    low, failing = failed
    best = max(
        (
            s
            for s in steps
            if s.valid and s.passed and s.offered_rps < min(low.rate, failing.offered_rps)
        ),
        key=lambda s: s.offered_rps,
        default=None,
    )
    effective = 0.0
    if best is not None:
        effective = best.achieved_rps if best.achieved_rps > 0 else best.offered_rps
    return result.model_copy(
        update={
            "steps": steps,
            "effective_rps": effective,
            "p99_ms": best.p99_ms if best is not None else None,
            "feasible": effective > 0,
            # a capped figure is measured, not a bound on what the client could drive
            "client_bound": False,
            "client_ceiling_rps": None,
            "short_of_precision": "",  # the figure is the light-load cap's, not a bracket's
            "light_load": light_load_reason(failing, low.label, effective),
        }
    )


MeasureLowRate = Callable[[float], Awaitable[StepResult]]


async def probe_light_load(
    measure_step: MeasureLowRate,
    result: CapacityResult,
    light: LightLoad,
    *,
    confirm_failures: bool = False,
) -> CapacityResult:
    """Measure the low rates below `result`'s capacity, lowest first, by the search's own
    step function, and cap `result` at the first that breaks the SLA (`capped_by`). A
    pruned or infeasible result is returned as it is: it cannot win, and a cap only
    lowers. With `confirm_failures` a failing low rate is measured once more and only a
    second failure counts, as the search treats a decisive failure. An invalid step
    (the client could not keep its schedule), or one that failed only on the bound of a
    short window's p99 (`breaks_sla`), decides nothing and the next rate follows.
    At most one step per rate, two with `confirm_failures`."""
    if result.pruned or not result.feasible:
        return result
    measured: list[StepResult] = []
    for low in light_load_rates(result.effective_rps, light):
        step = await measure_step(low.rate)
        measured.append(step)
        if confirm_failures and breaks_sla(step):
            again = await measure_step(low.rate)
            measured.append(again)
            if again.valid:
                step = again
        if breaks_sla(step):
            return capped_by(result, measured, (low, step))
    return capped_by(result, measured, None)


def breaks_sla(step: StepResult) -> bool:
    """Whether a low-rate step shows the SLA broken. A low rate holds few requests in a
    step's window, so the step rule may fail it on the upper confidence bound of its p99
    alone (`StepResult.failed_on_bound_only`): that proves the rate was not shown to hold
    the SLA, not that it breaks it, and a probe that caps a capacity the search already
    proved needs the measured p99 over the SLA."""
    return step.valid and not step.passed and not step.failed_on_bound_only
