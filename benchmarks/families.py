"""Objective families for the tuner benchmarks: simulated services, each an instance per
seed, whose effective throughput of a batching configuration is one simulated capacity
search.

Smooth families have a linear batch cost. Discontinuous ones have the cliffs real
accelerators have, as a table of compute time per row count (each request one row, so
rows are the batch size): a tile/wave boundary where the cost jumps past 16, 32 and 48,
padding of every batch to a multiple of 8, and "captured sizes" where only the batch
sizes a runtime captured graphs for are fast. Their best batch size sits on an edge; each
family lists its edges so an optimum can be searched there as well as on the coarse grid.

`NoisyObjective` adds what a busy machine adds: every measured window (step) sees the
service slower or faster by a multiplicative factor, log-normal with the given spread,
and a slow drift that grows with the windows measured so far. `truth` gives the
noise-free figure the noisy ones scatter around.

Imported by name: `FAMILIES`, `SMOOTH_FAMILIES`, `DISCONTINUOUS_FAMILIES`, `family`,
`Objective`, `NoisyObjective`, `misfitted`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from batchpilot.capacity.search import search_capacity
from batchpilot.loadgen.mix import parse_mix
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix, StepResult
from batchpilot.simulator.arrivals import MMPP, ArrivalProcess, Poisson
from batchpilot.simulator.capacity import (
    StepCache,
    run_sync,
    simulate_capacity,
)
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.scenario import Scenario, Traffic, simulate_step

REQUESTS_PER_STEP = 4000
PRECISION = 0.02
# The reference MLP on one CPU thread: ~2 ms a batch plus ~0.28 ms a row.
CPU_MLP = LinearCost(fixed_ms=1.85, per_row_ms=0.28)

Kind = Literal["smooth", "discontinuous"]


@dataclass(frozen=True)
class Family:
    name: str
    cost: LinearCost | TableCost
    mix: RequestMix
    sla: SLA
    batch_bounds: tuple[int, int]
    wait_bounds: tuple[float, float]
    arrival: ArrivalProcess = field(default_factory=Poisson)
    kind: Kind = "smooth"
    # Batch sizes right at a cliff (the last size before the cost jumps): where the
    # optimum of a discontinuous family lies, and a coarse grid may not look.
    edges: tuple[int, ...] = ()


def table_cost(compute_ms: Callable[[int], float], max_rows: int) -> TableCost:
    """A batch cost given per whole row count 1..max_rows. Batches of unit-size requests
    only ever have whole row counts, so the table's interpolation never smooths a cliff."""
    rows = tuple(float(r) for r in range(1, max_rows + 1))
    return TableCost(rows=rows, compute_ms=tuple(compute_ms(r) for r in range(1, max_rows + 1)))


def tile_cliffs(rows: int) -> float:
    """1 ms + 0.15 ms a row, and 2.5 ms more past each of 16, 32 and 48 rows (one more
    wave of tiles)."""
    return 1.0 + 0.15 * rows + 2.5 * sum(1 for edge in (16, 32, 48) if rows > edge)


def padded_to_8(rows: int) -> float:
    """Every batch padded to the next multiple of 8 rows: 1.5 ms + 0.25 ms a padded row."""
    return 1.5 + 0.25 * 8 * math.ceil(rows / 8)


CAPTURED = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def captured_sizes(rows: int) -> float:
    """Graphs captured for a few batch sizes: those run at 1 ms + 0.12 ms a row, any
    other size runs eagerly at 4 ms more."""
    return 1.0 + 0.12 * rows + (0.0 if rows in CAPTURED else 4.0)


UNIT = parse_mix("100:1")

SMOOTH_FAMILIES = [
    Family(
        "short high-rate",
        LinearCost(fixed_ms=2.0, per_row_ms=0.05),
        parse_mix("90:1,10:2"),
        SLA(p99_ms=50.0),
        (1, 128),
        (0.0, 100.0),
    ),
    Family(
        "long (padded)",
        LinearCost(fixed_ms=5.0, per_row_ms=0.02, rows_basis="padded"),
        parse_mix("60:128,30:256,10:512"),
        SLA(p99_ms=1000.0),
        (1, 64),
        (0.0, 200.0),
    ),
    Family(
        "mixed sizes",
        CPU_MLP,
        parse_mix("80:1,15:4,5:16"),
        SLA(p99_ms=100.0),
        (1, 64),
        (0.0, 100.0),
    ),
    Family(
        "bursty (MMPP)",
        CPU_MLP,
        parse_mix("80:1,15:4,5:16"),
        SLA(p99_ms=100.0),
        (1, 64),
        (0.0, 100.0),
        MMPP(burst_factor=4.0, high_fraction=0.2, mean_burst_s=0.5),
    ),
    Family(
        "tight SLA", CPU_MLP, parse_mix("80:1,15:4,5:16"), SLA(p99_ms=15.0), (1, 64), (0.0, 100.0)
    ),
    Family(
        "loose SLA",
        CPU_MLP,
        parse_mix("80:1,15:4,5:16"),
        SLA(p99_ms=1000.0),
        (1, 128),
        (0.0, 500.0),
    ),
]

DISCONTINUOUS_FAMILIES = [
    Family(
        "tile cliffs 16/32/48",
        table_cost(tile_cliffs, 128),
        UNIT,
        SLA(p99_ms=40.0),
        (1, 128),
        (0.0, 100.0),
        kind="discontinuous",
        edges=(16, 32, 48),
    ),
    Family(
        "padded to x8",
        table_cost(padded_to_8, 128),
        UNIT,
        SLA(p99_ms=50.0),
        (1, 128),
        (0.0, 100.0),
        kind="discontinuous",
        edges=tuple(range(8, 129, 8)),
    ),
    Family(
        "captured sizes",
        table_cost(captured_sizes, 128),
        UNIT,
        SLA(p99_ms=30.0),
        (1, 128),
        (0.0, 100.0),
        kind="discontinuous",
        edges=CAPTURED,
    ),
]

FAMILIES = [*SMOOTH_FAMILIES, *DISCONTINUOUS_FAMILIES]


def family(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(f"no family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")


def scenario_of(fam: Family, seed: int) -> Scenario:
    return Scenario(
        cost=fam.cost, mix=fam.mix, arrival=fam.arrival, requests=REQUESTS_PER_STEP, seed=seed
    )


class Objective:
    """One instance (family, seed): simulated capacity of a configuration, cached."""

    def __init__(self, fam: Family, seed: int) -> None:
        self.family = fam
        self.seed = seed
        self.traffic = Traffic(scenario_of(fam, seed))
        self.steps: StepCache = {}
        self.best_seen = 0.0

    def truth(self, config: BatchingConfig) -> float:
        """The noise-free effective req/s of a configuration (0 when infeasible)."""
        result = simulate_capacity(
            self.traffic, config, self.family.sla, precision=PRECISION, step_cache=self.steps
        )
        return result.effective_rps if result.feasible else 0.0

    def __call__(self, config: BatchingConfig, must_beat: float | None = None) -> CapacityResult:
        result = simulate_capacity(
            self.traffic,
            config,
            self.family.sla,
            precision=PRECISION,
            must_beat=must_beat,
            step_cache=self.steps,
        )
        if result.feasible and not result.pruned:
            self.best_seen = max(self.best_seen, result.effective_rps)
        return result


class NoisyObjective(Objective):
    """As `Objective`, measured on a busy machine: window w runs the service slower by a
    factor exp(noise * z_w) * (1 + drift/100 * w/100), z_w standard normal from the
    instance's seed, w counting every window measured so far (so the drift is slow: in
    per cent per hundred windows). A window at offered rate r is the noise-free service
    at r times that factor, reported at r: its capacity comes out divided by the factor.
    `best_seen` tracks the true figure of what was measured, never the noisy one."""

    def __init__(
        self,
        fam: Family,
        seed: int,
        *,
        noise: float,
        drift: float = 0.0,
        noise_seed: int | None = None,
        rate_resolution: float = 0.0,
        service: Objective | None = None,
    ) -> None:
        """`noise_seed` draws the windows' factors (default: `seed`). `service` shares
        another instance's traffic and step cache: the same service, measured on another
        day. `rate_resolution` > 0 rounds a window's effective rate to that relative
        grid (0.002: 0.2 %), so windows of nearly the same rate share one simulation; far
        below any noise studied, and what keeps thousands of noisy runs affordable."""
        super().__init__(fam, seed)
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise:g}")
        if rate_resolution < 0:
            raise ValueError(f"rate_resolution must be >= 0, got {rate_resolution:g}")
        if service is not None:
            self.traffic = service.traffic
            self.steps = service.steps
        self.noise = noise
        self.drift = drift
        self.rate_resolution = rate_resolution
        self.windows = 0
        self._rng = np.random.default_rng([seed if noise_seed is None else noise_seed, 7])

    def factor(self) -> float:
        """The next window's slow-down factor (advances the window count)."""
        z = float(self._rng.standard_normal())
        # drift is in per cent per hundred windows, as documented
        f = math.exp(self.noise * z) * (1.0 + self.drift / 100.0 * self.windows / 100.0)
        self.windows += 1
        return max(f, 1e-3)

    def measure_step(self, config: BatchingConfig, offered_rps: float) -> StepResult:
        f = self.factor()
        rate = offered_rps * f
        if self.rate_resolution > 0:
            grid = math.log1p(self.rate_resolution)
            rate = math.exp(round(math.log(rate) / grid) * grid)
        key = (config, round(rate, 6))
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = simulate_step(self.traffic, config, self.family.sla, key[1])
        return step.model_copy(
            update={"offered_rps": offered_rps, "achieved_rps": step.achieved_rps / f}
        )

    def __call__(self, config: BatchingConfig, must_beat: float | None = None) -> CapacityResult:
        async def measure(offered_rps: float) -> StepResult:
            return self.measure_step(config, offered_rps)

        scenario = self.traffic.scenario
        result = run_sync(
            search_capacity(
                measure,
                sla=self.family.sla,
                start_rps=0.5 * scenario.service_bound_rps(1),
                precision=PRECISION,
                max_rps=2.0 * scenario.service_bound_rps(config.max_batch_size),
                must_beat=must_beat,
            )
        )
        if result.feasible and not result.pruned:
            self.best_seen = max(self.best_seen, self.truth(config))
        return result


def misfitted(cost: LinearCost | TableCost, seed: int) -> LinearCost | TableCost:
    """The cost model as a fit from a short, noisy profile might get it: off by up to
    25% either way (a linear model's coefficients each; a table's level and tilt).
    Proposals from the true model would flatter them."""
    rng = random.Random(seed)
    if isinstance(cost, LinearCost):
        return cost.model_copy(
            update={
                "fixed_ms": cost.fixed_ms * rng.uniform(0.75, 1.25),
                "per_row_ms": cost.per_row_ms * rng.uniform(0.75, 1.25),
            }
        )
    low, high = rng.uniform(0.75, 1.25), rng.uniform(0.75, 1.25)
    top = cost.rows[-1]
    return cost.model_copy(
        update={
            "compute_ms": tuple(
                ms * (low + (high - low) * r / top)
                for r, ms in zip(cost.rows, cost.compute_ms, strict=True)
            )
        }
    )


def edge_configs(fam: Family, waits: Sequence[float]) -> list[BatchingConfig]:
    """The family's edge batch sizes at the given waits (inside the bounds)."""
    lo, hi = fam.batch_bounds
    return [
        BatchingConfig(max_batch_size=b, max_queue_time_ms=w)
        for b in fam.edges
        if lo <= b <= hi
        for w in waits
    ]
