"""How many trials the tuner needs: samplers against the exhaustive grid, on the simulator.

Scenario families (`families`): smooth ones (short high-rate requests, long padded
requests, mixed sizes, bursty arrivals, a tight and a loose SLA), discontinuous ones
(cliffs in the batch cost past 16/32/48 rows, padding to multiples of 8, only captured
batch sizes fast) and noisy ones (a smooth and a discontinuous family measured with 10%
multiplicative noise per window and a slow drift) x seeds. Per instance: the optimum
(the best true effective throughput of the coarse grid, of the family's edge batch sizes
at the grid's waits, and of every configuration any contender measured), then per
contender the number of trials until the configuration it holds best is truly at 95%,
97% and 99% of it (with noise, a lucky measurement of a worse configuration counts as
what it truly is). Contenders: the Tuner (what ships, through its ask/tell API, pruning
and refinement included) with each sampler it offers, cold; the Tuner as `tune --local`
starts it (baseline, then the rules of thumb, then TPE), also without refinement; the
grid in plain order; the rules of thumb alone. `samplers` summarises the smooth families
(as before the other kinds existed); `by_kind` each kind.

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
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from pydantic import BaseModel

import results
from batchpilot.models import BatchingConfig
from batchpilot.simulator.propose import grid_configs, propose_configs, queue_grid
from batchpilot.tuner.rules import rules_of_thumb
from batchpilot.tuner.samplers import SAMPLERS
from batchpilot.tuner.study import SearchSpace, Tuner
from families import (
    FAMILIES,
    Family,
    NoisyObjective,
    Objective,
    edge_configs,
    family,
    misfitted,
)

LEVELS = (0.95, 0.97, 0.99)
DEFAULT_SAMPLER = "TPE"  # the Tuner's default
BASELINE = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)  # the server's default
LOCAL = "TPE, tune --local order"
WITH_SIMULATOR = "TPE, tune --local order + simulator warm start"
NO_REFINE = "TPE, tune --local order, no refinement"
PROPOSALS = 3
DISCONTINUOUS_BUDGET = 20  # the discontinuous families' target: 95% within this many trials
# Noisy instances: these families measured with this per-window noise and drift.
NOISY = (("mixed sizes", 0.10, 2.0), ("tile cliffs 16/32/48", 0.10, 2.0))


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
    refine: bool = True,
) -> list[float]:
    """After each trial of a Tuner run, as `tune --local` drives it (pruning against the
    best so far included): the true effective req/s of the configuration the tuner holds
    best. Without noise that is the best so far; with noise a lucky measurement of a
    worse configuration counts as what it truly is."""
    tuner = Tuner(
        space,
        sampler=sampler,
        seed=seed,
        baseline=baseline,
        warm_start=warm_start,
        refine=refine,
        max_trials=trials,
    )
    curve: list[float] = []
    for _ in range(trials):
        number, config, _ = tuner.ask()
        tuner.tell(number, objective(config, must_beat=tuner.must_beat()))
        best = tuner.best()
        curve.append(objective.truth(best.config()) if best is not None else 0.0)
    return curve


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
    # share of instances at 95% of the optimum within DISCONTINUOUS_BUDGET trials
    reached_95pct_within_20: float = 0.0
    note: str = ""


class InstanceRow(BaseModel):
    family: str
    kind: str  # smooth, discontinuous, noisy
    seed: int
    grid_best_rps: float
    grid_best_config: str
    optimum_rps: float
    optimum_config: str
    trials_to_97pct: dict[str, float | None]


class Report(BaseModel):
    default_sampler: str
    samplers: dict[str, SamplerSummary]  # over the smooth families (as before)
    by_kind: dict[str, dict[str, SamplerSummary]]  # smooth, discontinuous, noisy
    unavailable: dict[str, str]
    families: list[str]
    family_kinds: dict[str, str]
    noisy: list[str]  # "family, noise %, drift %/100 windows"
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


@dataclass
class Instance:
    fam: Family
    kind: str
    label: str
    noise: float = 0.0
    drift: float = 0.0


def instances_of() -> list[Instance]:
    out = [Instance(f, f.kind, f.name) for f in FAMILIES]
    for name, noise, drift in NOISY:
        out.append(
            Instance(
                family(name),
                "noisy",
                f"{name}, noise {noise:.0%}, drift {drift:g}%/100 windows",
                noise,
                drift,
            )
        )
    return out


@dataclass
class Tally:
    reach: dict[float, list[float]] = field(default_factory=lambda: {lv: [] for lv in LEVELS})
    final: list[float] = field(default_factory=list)
    within_20: list[bool] = field(default_factory=list)


def _summary(name: str, tally: Tally, of: int) -> SamplerSummary:
    by_level = tally.reach
    return SamplerSummary(
        median_trials_to_95pct=_median(by_level[0.95]),
        median_trials_to_97pct=_median(by_level[0.97]),
        median_trials_to_99pct=_median(by_level[0.99]),
        reached_95pct=_share(by_level[0.95]),
        reached_97pct=_share(by_level[0.97]),
        reached_99pct=_share(by_level[0.99]),
        median_fraction_of_optimum=round(statistics.median(tally.final), 3),
        reached_95pct_within_20=round(sum(tally.within_20) / len(tally.within_20), 3),
        note=_note(name, len(by_level[0.97]), of),
    )


def measure(seeds: int, trials: int, gp_seeds: int) -> Report:
    started = time.monotonic()
    samplers, unavailable = available_samplers()
    if gp_seeds == 0 and "GP" in samplers:
        samplers.remove("GP")
        unavailable["GP"] = "not run (--gp-seeds 0)"
    contenders = [*samplers, LOCAL, NO_REFINE, WITH_SIMULATOR, "grid order", "rule of thumb"]
    tallies: dict[str, dict[str, Tally]] = {}
    counts: dict[str, int] = {}
    rows: list[InstanceRow] = []
    grid_sizes: dict[str, int] = {}
    for inst in instances_of():
        fam = inst.fam
        noisy = inst.kind == "noisy"
        space = SearchSpace.from_bounds(
            max_batch_size=fam.batch_bounds, max_queue_time_ms=fam.wait_bounds
        )
        grid = grid_configs(space)
        grid_sizes[inst.label] = len(grid)
        group = tallies.setdefault(inst.kind, {})
        for seed in range(seeds):
            counts[inst.kind] = counts.get(inst.kind, 0) + 1
            objective: Objective = (
                NoisyObjective(fam, seed, noise=inst.noise, drift=inst.drift)
                if noisy
                else Objective(fam, seed)
            )
            grid_values = [objective.truth(c) for c in grid]
            grid_best = max(range(len(grid)), key=lambda i: grid_values[i])
            # The optimum of a discontinuous family lies on an edge the grid may miss.
            edges = edge_configs(fam, queue_grid(*space.queue_bounds))
            candidates = {c: objective.truth(c) for c in [*grid, *edges]}
            run = [name for name in samplers if name != "GP" or seed < gp_seeds]
            if noisy:
                run = [DEFAULT_SAMPLER]
            curves = {name: run_tuner(objective, space, name, seed, trials) for name in run}
            rules = rules_of_thumb(space, fam.sla)
            curves[LOCAL] = run_tuner(
                objective, space, "TPE", seed, trials, baseline=BASELINE, warm_start=rules
            )
            curves[NO_REFINE] = run_tuner(
                objective,
                space,
                "TPE",
                seed,
                trials,
                baseline=BASELINE,
                warm_start=rules,
                refine=False,
            )
            if not noisy:
                proposals = propose_configs(
                    misfitted(fam.cost, seed),
                    fam.mix,
                    fam.sla,
                    space,
                    PROPOSALS,
                    arrival=fam.arrival,
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
                curves["rule of thumb"] = best_so_far([objective.truth(c) for c in rules])
            # every configuration any contender measured, at its true figure
            for config, _ in list(objective.steps):
                if config not in candidates:
                    candidates[config] = objective.truth(config)
            best_config = max(candidates, key=lambda c: candidates[c])
            optimum = max(candidates[best_config], objective.best_seen)
            row_97: dict[str, float | None] = {}
            for name, curve in curves.items():
                tally = group.setdefault(name, Tally())
                for level in LEVELS:
                    tally.reach[level].append(trials_to(curve, level * optimum))
                tally.final.append(curve[-1] / optimum if optimum > 0 else 0.0)
                tally.within_20.append(trials_to(curve, 0.95 * optimum) <= DISCONTINUOUS_BUDGET)
                t97 = trials_to(curve, 0.97 * optimum)
                row_97[name] = None if math.isinf(t97) else t97
            rows.append(
                InstanceRow(
                    family=inst.label,
                    kind=inst.kind,
                    seed=seed,
                    grid_best_rps=round(grid_values[grid_best], 1),
                    grid_best_config=grid[grid_best].label(),
                    optimum_rps=round(optimum, 1),
                    optimum_config=best_config.label(),
                    trials_to_97pct=row_97,
                )
            )
    by_kind = {
        kind: {
            name: _summary(name, group[name], counts[kind]) for name in contenders if name in group
        }
        for kind, group in tallies.items()
    }
    return Report(
        default_sampler=DEFAULT_SAMPLER,
        samplers=by_kind["smooth"],
        by_kind=by_kind,
        unavailable=unavailable,
        families=[f.name for f in FAMILIES],
        family_kinds={f.name: f.kind for f in FAMILIES},
        noisy=[i.label for i in instances_of() if i.kind == "noisy"],
        seeds=seeds,
        trial_budget=trials,
        grid_size=grid_sizes,
        instances=rows,
        elapsed_s=round(time.monotonic() - started, 1),
    )


_NOTES = {
    LOCAL: "baseline (batch 8, wait 5 ms), then the rules of thumb, then TPE with refinement",
    NO_REFINE: "as above without the refinement phase",
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
    results.add_options(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.seeds < 1 or args.trials < 1:
        parser.error("--seeds and --trials must be >= 1")
    if args.gp_seeds < 0:
        parser.error("--gp-seeds must be >= 0")
    recorder = results.start("tuner_efficiency", args)
    report = measure(args.seeds, args.trials, min(args.gp_seeds, args.seeds))
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
        return
    from rich.console import Console
    from rich.table import Table

    def cell(v: float | None, share: float) -> str:
        return "never" if v is None else f"{v:g}" + ("" if share == 1 else f" ({share:.0%} reach)")

    console = Console()
    for kind, summaries in report.by_kind.items():
        table = Table(
            title=f"{kind}: median trials to reach x% of the optimum ({args.seeds} seeds, "
            f"budget {args.trials})"
        )
        for column in ("contender", "95%", "97%", "99%", "95% in 20", "best found / optimum"):
            table.add_column(column)
        for name, s in summaries.items():
            table.add_row(
                name + (" (default)" if name == report.default_sampler else ""),
                cell(s.median_trials_to_95pct, s.reached_95pct),
                cell(s.median_trials_to_97pct, s.reached_97pct),
                cell(s.median_trials_to_99pct, s.reached_99pct),
                f"{s.reached_95pct_within_20:.0%}",
                f"{s.median_fraction_of_optimum:.3f}",
            )
        console.print(table)
    for name, why in report.unavailable.items():
        console.print(f"{name}: not run ({why})")
    console.print(f"{report.elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
