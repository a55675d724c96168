"""Configurations worth measuring first: a coarse grid over the knobs, simulated, best
first. The tuner enqueues them as warm starts when the batch-cost curve is known."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Protocol

from pydantic import Field, model_validator

from batchpilot.models import (
    MAX_BATCH_SIZE_LIMIT,
    MAX_QUEUE_TIME_MS_LIMIT,
    SLA,
    BatchingConfig,
    CapacityResult,
    Frozen,
    RequestMix,
)
from batchpilot.simulator.arrivals import ArrivalProcess, Poisson
from batchpilot.simulator.capacity import DEFAULT_PRECISION, simulate_capacity
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.scenario import Scenario, Traffic

# Waits a person would try: the seed's rule-of-thumb bands (5-15, 10-50, >= 100 ms) and
# the ends. Between them the grid is coarse on purpose: it seeds a search, it is not one.
QUEUE_TIMES_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)

# Requests per simulated step when proposing: enough for a p99 of ~1% resolution, few
# enough that a whole grid simulates in about a second.
PROPOSE_REQUESTS = 4000


class KnobBounds(Frozen):
    max_batch_size: tuple[
        Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE_LIMIT)],
        Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE_LIMIT)],
    ] = (1, 64)
    max_queue_time_ms: tuple[
        Annotated[float, Field(ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT)],
        Annotated[float, Field(ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT)],
    ] = (0.0, 100.0)

    @model_validator(mode="after")
    def _ordered(self) -> KnobBounds:
        if self.max_batch_size[0] > self.max_batch_size[1]:
            raise ValueError(f"max_batch_size bounds {self.max_batch_size}: min must be <= max")
        if self.max_queue_time_ms[0] > self.max_queue_time_ms[1]:
            raise ValueError(
                f"max_queue_time_ms bounds {self.max_queue_time_ms}: min must be <= max"
            )
        return self


class HasBounds(Protocol):
    """What the tuner's SearchSpace offers."""

    @property
    def batch_bounds(self) -> tuple[int, int]: ...

    @property
    def queue_bounds(self) -> tuple[float, float]: ...


BoundsLike = KnobBounds | HasBounds | tuple[tuple[int, int], tuple[float, float]]


def as_bounds(bounds: BoundsLike) -> KnobBounds:
    if isinstance(bounds, KnobBounds):
        return bounds
    if isinstance(bounds, tuple):
        return KnobBounds(max_batch_size=bounds[0], max_queue_time_ms=bounds[1])
    return KnobBounds(max_batch_size=bounds.batch_bounds, max_queue_time_ms=bounds.queue_bounds)


def batch_grid(low: int, high: int) -> list[int]:
    """Powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, 16, ...) within
    the bounds, and the bounds themselves."""
    values = {low, high}
    power = 1
    while power <= high:
        for v in (power, power + power // 2):
            if low <= v <= high:
                values.add(v)
        power *= 2
    return sorted(values)


def queue_grid(low: float, high: float) -> list[float]:
    return sorted({low, high, *(q for q in QUEUE_TIMES_MS if low <= q <= high)})


def grid_configs(bounds: BoundsLike) -> list[BatchingConfig]:
    """The coarse grid, batch size major."""
    b = as_bounds(bounds)
    return [
        BatchingConfig(max_batch_size=size, max_queue_time_ms=wait)
        for size in batch_grid(*b.max_batch_size)
        for wait in queue_grid(*b.max_queue_time_ms)
    ]


def rank(results: Sequence[tuple[BatchingConfig, CapacityResult]]) -> list[BatchingConfig]:
    """Feasible configurations, most effective throughput first; on a tie the lower p99,
    then the shorter wait and the smaller batch (less latency for the same throughput)."""
    feasible = [(c, r) for c, r in results if r.feasible]
    feasible.sort(
        key=lambda cr: (
            -cr[1].effective_rps,
            cr[1].pruned,  # a pruned ramp's figure is only a lower bound
            cr[1].p99_ms if cr[1].p99_ms is not None else math.inf,
            cr[0].max_queue_time_ms,
            cr[0].max_batch_size,
        )
    )
    return [c for c, _ in feasible]


def simulate_grid(
    scenario: Scenario,
    sla: SLA,
    configs: Sequence[BatchingConfig],
    *,
    keep: int | None = None,
    precision: float = DEFAULT_PRECISION,
) -> list[tuple[BatchingConfig, CapacityResult]]:
    """Every configuration's simulated capacity on the same traffic. With `keep`, a
    configuration's ramp stops as soon as it cannot enter the best `keep` (pruning)."""
    traffic = Traffic(scenario)
    results: list[tuple[BatchingConfig, CapacityResult]] = []
    best: list[float] = []
    for config in configs:
        must_beat = best[keep - 1] if keep is not None and len(best) >= keep else None
        result = simulate_capacity(traffic, config, sla, precision=precision, must_beat=must_beat)
        results.append((config, result))
        if result.feasible and not result.pruned:
            best = sorted([*best, result.effective_rps], reverse=True)
    return results


def propose_configs(
    cost_model: LinearCost | TableCost,
    mix: RequestMix,
    sla: SLA,
    bounds: BoundsLike,
    n: int,
    *,
    arrival: ArrivalProcess | None = None,
    replicas: int = 1,
    seed: int = 0,
    ahead: int = 0,
    queue_limit: int | None = None,
) -> list[BatchingConfig]:
    """`n` configurations from the best of a simulated coarse grid, best first, with
    distinct batch sizes where possible (fewer when fewer are feasible)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    scenario = Scenario(
        cost=cost_model,
        mix=mix,
        arrival=arrival if arrival is not None else Poisson(),
        replicas=replicas,
        requests=PROPOSE_REQUESTS,
        seed=seed,
        ahead=ahead,
        queue_limit=queue_limit,
    )
    ranked = rank(simulate_grid(scenario, sla, grid_configs(bounds), keep=n))
    # At most one proposal per batch size while there are enough: warm starts that span
    # the good region teach the sampler more than several waits of one batch size, whose
    # figures under load differ by little.
    chosen: list[BatchingConfig] = []
    for config in ranked:
        if all(c.max_batch_size != config.max_batch_size for c in chosen):
            chosen.append(config)
    chosen += [c for c in ranked if c not in chosen]
    return chosen[:n]
