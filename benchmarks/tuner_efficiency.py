"""How many trials the tuner needs: samplers against the exhaustive grid, on the simulator.

Scenario families (short high-rate requests, long padded requests, mixed sizes, bursty
arrivals, a tight and a loose SLA) x seeds. Per instance: the optimum (the best
effective throughput of the coarse grid and of every trial any contender ran), then per
contender the number of trials until its best so far reaches 95%, 97% and 99% of it.
Contenders: the Tuner (what ships, through its ask/tell API, pruning included) with each
sampler it offers, cold; the Tuner as `tune --local` starts it (baseline, then the
rules of thumb, then TPE); the grid in plain order; the rules of thumb alone.

A trial is one simulated capacity search (4,000 requests a step, 2% precision): the
figures are the simulator's, not a server's. Steps are cached by (configuration,
offered rate), so repeated configurations and pruned replays cost nothing.

GP refits a Gaussian process every trial (about half a second a trial at these sizes,
against milliseconds for TPE), so it runs on the first `--gp-seeds` seeds of each family
only; its summary's note says on how many instances its medians rest.

    python benchmarks/tuner_efficiency.py [--json] [--seeds 5] [--trials 30] [--gp-seeds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from pydantic import BaseModel

from batchpilot.loadgen.mix import parse_mix
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.arrivals import MMPP, ArrivalProcess, Poisson
from batchpilot.simulator.capacity import StepCache, simulate_capacity
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.propose import grid_configs, propose_configs
from batchpilot.simulator.scenario import Scenario, Traffic
from batchpilot.tuner.rules import rules_of_thumb
from batchpilot.tuner.samplers import SAMPLERS
from batchpilot.tuner.study import SearchSpace, Tuner

REQUESTS_PER_STEP = 4000
PRECISION = 0.02
LEVELS = (0.95, 0.97, 0.99)
DEFAULT_SAMPLER = "TPE"  # the Tuner's default
BASELINE = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)  # the server's default
LOCAL = "TPE, tune --local order"
WITH_SIMULATOR = "TPE, tune --local order + simulator warm start"
PROPOSALS = 3
# The reference MLP on one CPU thread: ~2 ms a batch plus ~0.28 ms a row.
CPU_MLP = LinearCost(fixed_ms=1.85, per_row_ms=0.28)


@dataclass(frozen=True)
class Family:
    name: str
    cost: LinearCost
    mix: RequestMix
    sla: SLA
    batch_bounds: tuple[int, int]
    wait_bounds: tuple[float, float]
    arrival: ArrivalProcess = field(default_factory=Poisson)


FAMILIES = [
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


class Objective:
    """One instance (family, seed): simulated capacity of a configuration, cached."""

    def __init__(self, family: Family, seed: int) -> None:
        self.family = family
        self.traffic = Traffic(
            Scenario(
                cost=family.cost,
                mix=family.mix,
                arrival=family.arrival,
                requests=REQUESTS_PER_STEP,
                seed=seed,
            )
        )
        self.steps: StepCache = {}
        self.best_seen = 0.0

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


def best_so_far(values: Sequence[float]) -> list[float]:
    out: list[float] = []
    best = 0.0
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def run_tuner(
    objective: Objective,
    space: SearchSpace,
    sampler: str,
    seed: int,
    trials: int,
    *,
    baseline: BatchingConfig | None = None,
    warm_start: Sequence[BatchingConfig] = (),
) -> list[float]:
    """Best effective req/s after each trial of a Tuner run, as `tune --local` drives it
    (pruning against the best so far included)."""
    tuner = Tuner(space, sampler=sampler, seed=seed, baseline=baseline, warm_start=warm_start)
    for _ in range(trials):
        number, config, _ = tuner.ask()
        tuner.tell(number, objective(config, must_beat=tuner.must_beat()))
    values = [r.effective_rps or 0.0 if r.state == "Complete" else 0.0 for r in tuner.records()]
    return best_so_far(values)


def misfitted(cost: LinearCost, seed: int) -> LinearCost:
    """The cost model as a fit from a short, noisy profile might get it: each coefficient
    off by up to 25%, either way. Proposals from the true model would flatter them."""
    rng = random.Random(seed)
    return cost.model_copy(
        update={
            "fixed_ms": cost.fixed_ms * rng.uniform(0.75, 1.25),
            "per_row_ms": cost.per_row_ms * rng.uniform(0.75, 1.25),
        }
    )


def trials_to(curve: Sequence[float], target: float) -> float:
    """1-based trial count at which the curve first reaches target; inf when never."""
    for i, v in enumerate(curve):
        if v >= target:
            return float(i + 1)
    return math.inf


class SamplerSummary(BaseModel):
    median_trials_to_95pct: float | None
    median_trials_to_97pct: float | None
    median_trials_to_99pct: float | None
    reached_95pct: float  # share of instances that got there within the budget
    reached_97pct: float
    reached_99pct: float
    median_fraction_of_optimum: float  # best found / optimum, at the end of the run
    note: str = ""


class InstanceRow(BaseModel):
    family: str
    seed: int
    grid_best_rps: float
    grid_best_config: str
    optimum_rps: float
    trials_to_97pct: dict[str, float | None]


class Report(BaseModel):
    default_sampler: str
    samplers: dict[str, SamplerSummary]
    unavailable: dict[str, str]
    families: list[str]
    seeds: int
    trial_budget: int
    grid_size: dict[str, int]
    instances: list[InstanceRow]
    elapsed_s: float


def available_samplers() -> tuple[list[str], dict[str, str]]:
    names: list[str] = [name for name in ("TPE", "GP", "Random") if name in SAMPLERS]
    missing = {
        "QMC": "not offered by the Tuner: optuna's QMCSampler counts its points in the "
        "study's attributes, which a study rebuilt from its trials does not carry"
    }
    return names, missing


def _median(values: Sequence[float]) -> float | None:
    m = statistics.median(values)
    return None if math.isinf(m) else m


def measure(seeds: int, trials: int, gp_seeds: int) -> Report:
    started = time.monotonic()
    samplers, unavailable = available_samplers()
    if gp_seeds == 0 and "GP" in samplers:
        samplers.remove("GP")
        unavailable["GP"] = "not run (--gp-seeds 0)"
    contenders = [*samplers, LOCAL, WITH_SIMULATOR, "grid order", "rule of thumb"]
    reach: dict[str, dict[float, list[float]]] = {c: {lv: [] for lv in LEVELS} for c in contenders}
    final: dict[str, list[float]] = {c: [] for c in contenders}
    instances: list[InstanceRow] = []
    grid_sizes: dict[str, int] = {}
    for family in FAMILIES:
        space = SearchSpace.from_bounds(
            max_batch_size=family.batch_bounds, max_queue_time_ms=family.wait_bounds
        )
        grid = grid_configs(space)
        grid_sizes[family.name] = len(grid)
        for seed in range(seeds):
            objective = Objective(family, seed)
            grid_values = [objective(c).effective_rps for c in grid]
            grid_best = max(range(len(grid)), key=lambda i: grid_values[i])
            curves = {
                name: run_tuner(objective, space, name, seed, trials)
                for name in samplers
                if name != "GP" or seed < gp_seeds
            }
            rules = rules_of_thumb(space, family.sla)
            curves[LOCAL] = run_tuner(
                objective, space, "TPE", seed, trials, baseline=BASELINE, warm_start=rules
            )
            proposals = propose_configs(
                misfitted(family.cost, seed),
                family.mix,
                family.sla,
                space,
                PROPOSALS,
                arrival=family.arrival,
                seed=seed + 1000,  # other traffic than the objective's
            )
            curves[WITH_SIMULATOR] = run_tuner(
                objective,
                space,
                "TPE",
                seed,
                trials,
                baseline=BASELINE,
                warm_start=[*rules, *proposals],
            )
            # The grid in plain order runs to its end, whatever the budget of the others.
            curves["grid order"] = best_so_far(grid_values)
            curves["rule of thumb"] = best_so_far([objective(c).effective_rps for c in rules])
            optimum = objective.best_seen
            row_97: dict[str, float | None] = {}
            for name, curve in curves.items():
                for level in LEVELS:
                    reach[name][level].append(trials_to(curve, level * optimum))
                final[name].append(curve[-1] / optimum if optimum > 0 else 0.0)
                t97 = trials_to(curve, 0.97 * optimum)
                row_97[name] = None if math.isinf(t97) else t97
            instances.append(
                InstanceRow(
                    family=family.name,
                    seed=seed,
                    grid_best_rps=round(grid_values[grid_best], 1),
                    grid_best_config=grid[grid_best].label(),
                    optimum_rps=round(optimum, 1),
                    trials_to_97pct=row_97,
                )
            )
    summaries = {}
    for name in contenders:
        by_level = reach[name]
        summaries[name] = SamplerSummary(
            median_trials_to_95pct=_median(by_level[0.95]),
            median_trials_to_97pct=_median(by_level[0.97]),
            median_trials_to_99pct=_median(by_level[0.99]),
            reached_95pct=_share(by_level[0.95]),
            reached_97pct=_share(by_level[0.97]),
            reached_99pct=_share(by_level[0.99]),
            median_fraction_of_optimum=round(statistics.median(final[name]), 3),
            note=_note(name, len(reach[name][0.97]), len(FAMILIES) * seeds),
        )
    return Report(
        default_sampler=DEFAULT_SAMPLER,
        samplers=summaries,
        unavailable=unavailable,
        families=[f.name for f in FAMILIES],
        seeds=seeds,
        trial_budget=trials,
        grid_size=grid_sizes,
        instances=instances,
        elapsed_s=round(time.monotonic() - started, 1),
    )


_NOTES = {
    LOCAL: "baseline (batch 8, wait 5 ms), then the rules of thumb, then TPE",
    WITH_SIMULATOR: "as above, plus 3 simulator proposals from a cost model off by up to 25%",
    "grid order": "the whole coarse grid, batch size major, ascending (not cut at the budget)",
    "rule of thumb": "the seed's rules of thumb only (1-2 trials); null when they never get there",
}


def _note(name: str, instances: int, of: int) -> str:
    note = _NOTES.get(name, "")
    if instances < of:
        slow = "slow to suggest: " if name == "GP" else ""
        note = f"{note}{'; ' if note else ''}{slow}run on {instances} of {of} instances"
    return note


def _share(values: Sequence[float]) -> float:
    return round(sum(1 for v in values if not math.isinf(v)) / len(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=30, help="trial budget per run")
    parser.add_argument(
        "--gp-seeds", type=int, default=2, help="seeds per family for the (slow) GP sampler"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.seeds < 1 or args.trials < 1:
        parser.error("--seeds and --trials must be >= 1")
    if args.gp_seeds < 0:
        parser.error("--gp-seeds must be >= 0")
    report = measure(args.seeds, args.trials, min(args.gp_seeds, args.seeds))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
        return
    from rich.console import Console
    from rich.table import Table

    def cell(v: float | None, share: float) -> str:
        return "never" if v is None else f"{v:g}" + ("" if share == 1 else f" ({share:.0%} reach)")

    table = Table(
        title=f"median trials to reach x% of the optimum ({len(FAMILIES)} families x "
        f"{args.seeds} seeds, budget {args.trials})"
    )
    for column in ("contender", "95%", "97%", "99%", "best found / optimum"):
        table.add_column(column)
    for name, s in report.samplers.items():
        table.add_row(
            name + (" (default)" if name == report.default_sampler else ""),
            cell(s.median_trials_to_95pct, s.reached_95pct),
            cell(s.median_trials_to_97pct, s.reached_97pct),
            cell(s.median_trials_to_99pct, s.reached_99pct),
            f"{s.median_fraction_of_optimum:.3f}",
        )
    console = Console()
    console.print(table)
    for name, why in report.unavailable.items():
        console.print(f"{name}: not run ({why})")
    console.print(f"{report.elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
