"""Decision quality under noise: how often the whole pipeline recommends a configuration
near the optimum, and how often it writes back one that is truly worse than what ran.

The pipeline is the product's, run end to end per instance: the Tuner as `tune --local`
and `tune --simulator` drive it (the incumbent as baseline, the rules of thumb, TPE,
refinement, pruning against the best so far; the trial loop `runner.run_trials`; no
simulator warm start, as in `tune --simulator`), then
the confirmation (`tuner/confirm.py`: the top finalists and the incumbent re-measured
interleaved by `runner.remeasure_interleaved`, each round bracketed around the study's
figure as `tune --local` does, adaptive rounds while the verdict cannot decide) and the
verdict (`tuner/verdict.py` `decide`). The knobs are the operator's defaults (CRD
`tuning.maxTrials`, `finalists`, `confirmRounds`, `maxConfirmRounds`, `minGainPercent`,
`load.precision`): the operator is what writes back.

The service: each family of `families` (6 smooth, 3 discontinuous) simulated at one
fixed traffic, measured on a busy machine: every window (step) sees the service slower
or faster by a log-normal factor of the given spread (0, 5, 10, 20 %) and a slow drift
(2 % per hundred windows; a run measures about 200). A measured capacity search
repeats a decisive failing window (`confirm_failures`), as the measured search does.
Seeds vary the noise, the sampler and the incumbent.

The incumbent (what ran before the study): on even seeds the product's rule of thumb
(`rules.rule_of_thumb`), which is within 5 % of the optimum on five of the nine
families, so the NoSignificantGain path is exercised; on odd seeds a random
configuration of the space.

Per run: the recommendation (the written winner when the verdict proves the gain, else
the incumbent) scored by its true (noise-free) effective throughput. Rows per noise:
- p_within_5pct: share of runs whose recommendation is within 5 % of the optimum (the
  best true figure of the family's coarse grid, its edge batch sizes and every
  recommendation made);
- p_false_gain: share of runs that write back a configuration truly worse than the
  incumbent;
- p_written: share of runs that write back at all;
- median_trials: trials the study used;
- median_measure_s: load time the run would spend on a real service, by the model
  windows x `load.stepSeconds` + capacity searches x `load.warmupSeconds` (the CRD's
  defaults, 5 s and 2 s), every window counted: pruned ramps, repeated failures and
  the confirmation rounds included.

    python benchmarks/decision_quality.py [--json] [--seeds 20] [--seed-base 0]
        [--noise 0,5,10,20] [--families NAME,...] [--max-rounds 6] [--jobs CPUS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import optuna
from pydantic import BaseModel

import results
from batchpilot.capacity.search import search_capacity
from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult
from batchpilot.operator.spec import LoadSpec, TuningSpec
from batchpilot.simulator.propose import grid_configs, queue_grid
from batchpilot.tuner.confirm import bracket_start, confirm_study, looks_of, study_figures
from batchpilot.tuner.local import start_rate
from batchpilot.tuner.rules import rule_of_thumb, rules_of_thumb
from batchpilot.tuner.runner import Remeasured, remeasure_interleaved, run_trials
from batchpilot.tuner.simulated import SimulatedTarget
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import PRUNE_MARGIN, Tuner
from batchpilot.tuner.verdict import Verdict, decide, undecided
from families import FAMILIES, Family, NoisyObjective, Objective, edge_configs, family

NOISES = (0.0, 0.05, 0.10, 0.20)
DRIFT = 2.0  # % slower per hundred windows
SERVICE_SEED = 0  # one traffic per family: the seeds vary the day, not the service
RATE_RESOLUTION = 0.005
NEAR = 0.95  # "within 5 % of the optimum"
MAX_ROUNDS_LIMIT = 20  # as the CRD's
# The operator's defaults: what a study does unless its spec says otherwise.
TUNING = TuningSpec.model_validate({})
LOAD_STEP_S = LoadSpec.model_fields["step_seconds"].default
LOAD_WARMUP_S = LoadSpec.model_fields["warmup_seconds"].default
PRECISION = LoadSpec.model_fields["precision"].default


@dataclass(frozen=True)
class Settings:
    trials: int = TUNING.max_trials
    finalists: int = TUNING.finalists
    rounds: int = TUNING.confirm_rounds
    max_rounds: int = TUNING.max_confirm_rounds
    min_gain_percent: float = TUNING.min_gain_percent
    drift: float = DRIFT


class NoisyProbe:
    """A measured capacity search of the noisy service: the product's search with its
    measured-search settings (precision, decisive failures repeated, the ramp starting
    at half the rate to beat). Counts the searches, for the time model."""

    def __init__(self, service: NoisyObjective) -> None:
        self.service = service
        self.searches = 0

    async def measure(
        self, config: BatchingConfig, *, must_beat: float | None, start_rps: float | None = None
    ) -> CapacityResult:
        self.searches += 1
        service = self.service
        scenario = service.traffic.scenario

        async def step(offered_rps: float) -> StepResult:
            return service.measure_step(config, offered_rps)

        start = start_rps or start_rate(must_beat) or 0.5 * scenario.service_bound_rps(1)
        return await search_capacity(
            step,
            sla=service.family.sla,
            start_rps=start,
            precision=PRECISION,
            max_rps=2.0 * scenario.service_bound_rps(config.max_batch_size),
            must_beat=must_beat,
            confirm_failures=True,
        )


class RunRow(BaseModel):
    family: str
    kind: str
    noise: float
    seed: int
    incumbent: str
    incumbent_kind: str  # "rule of thumb" or "random"
    recommended: str
    written: bool
    true_incumbent_rps: float
    true_recommended_rps: float
    trials: int
    rounds: int
    windows: int
    searches: int
    measure_s: float


class NoiseRow(BaseModel):
    noise: float
    p_within_5pct: float
    p_false_gain: float
    p_written: float
    median_trials: float
    median_measure_s: float
    median_rounds: float
    runs: int


class PruningRow(BaseModel):
    noise: float
    challenger_gain: float  # the challenger's true capacity over the incumbent's
    peers: int  # noisy scores of the incumbent's capacity the best so far is the top of
    p_pruned_best_score: float  # pruned when must_beat is that best noisy score
    p_pruned_lower_bound: float  # pruned against the tuner's must_beat (a lower bound)
    runs: int


class IdenticalRow(BaseModel):
    noise: float
    finalists: int  # identical to each other and to the incumbent
    precision: float  # the capacity search's
    p_false_write_back: float  # runs whose verdict called a gain: every one is false
    median_rounds: float
    runs: int


class Report(BaseModel):
    rows: list[NoiseRow]
    # the verdict's false-positive rate: K finalists no better than the incumbent
    identical: list[IdenticalRow] = []
    # how often pruning stops a truly better challenger (issue: noise prunes for good)
    pruning: list[PruningRow] = []
    by_family: dict[str, list[NoiseRow]]
    families: list[str]
    seeds: int
    seed_base: int
    drift_percent_per_100_windows: float
    settings: dict[str, float | int]
    time_model: str
    incumbent: str
    optimum: dict[str, float]  # per family, true effective req/s
    runs: list[RunRow]
    elapsed_s: float


@dataclass
class Truth:
    """A family's noise-free service: the optimum and any configuration's true figure."""

    objective: Objective
    space: SearchSpace
    optimum: float

    def __call__(self, config: BatchingConfig) -> float:
        return self.objective.truth(config)


def truth_of(fam: Family) -> Truth:
    objective = Objective(fam, SERVICE_SEED)
    space = SearchSpace.from_bounds(
        max_batch_size=fam.batch_bounds, max_queue_time_ms=fam.wait_bounds
    )
    candidates = [*grid_configs(space), *edge_configs(fam, queue_grid(*space.queue_bounds))]
    optimum = max(objective.truth(c) for c in candidates)
    return Truth(objective, space, optimum)


def incumbent_of(truth: Truth, seed: int) -> tuple[BatchingConfig, str]:
    """The rule of thumb on even seeds, a random configuration on odd ones."""
    space, sla = truth.space, truth.objective.family.sla
    if seed % 2 == 0:
        return rule_of_thumb(space, sla), "rule of thumb"
    rng = random.Random(seed)
    b_lo, b_hi = space.batch_bounds
    q_lo, q_hi = space.queue_bounds
    config = BatchingConfig(
        max_batch_size=rng.randint(b_lo, b_hi),
        max_queue_time_ms=round(rng.uniform(q_lo, q_hi), 1),
    )
    return config, "random"


async def pipeline(truth: Truth, noise: float, seed: int, settings: Settings) -> RunRow:
    """One run of the product's pipeline on the noisy service."""
    fam = truth.objective.family
    service = NoisyObjective(
        fam,
        SERVICE_SEED,
        noise=noise,
        drift=settings.drift,
        noise_seed=seed,
        rate_resolution=RATE_RESOLUTION,
        service=truth.objective,
    )
    probe = NoisyProbe(service)
    incumbent, kind = incumbent_of(truth, seed)
    rules = rules_of_thumb(truth.space, fam.sla)
    tuner = Tuner(
        truth.space,
        sampler="TPE",
        seed=seed,
        baseline=incumbent,
        warm_start=rules,
        max_trials=settings.trials,
    )
    target = SimulatedTarget(incumbent)
    await run_trials(tuner, target, probe, trials=settings.trials, full=rules)
    figures = study_figures(tuner.records())

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        figure = figures.get(config)
        return await probe.measure(
            config,
            must_beat=None,
            start_rps=bracket_start(figure, config, round_index, seed) if figure else None,
        )

    confirmed = await confirm_study(
        tuner.records(),
        incumbent,
        target,
        measure,
        finalists_wanted=settings.finalists,
        rounds=settings.rounds,
        max_rounds=settings.max_rounds,
        min_gain_percent=settings.min_gain_percent,
        seed=seed,
    )
    chosen = confirmed.verdict.chosen if confirmed is not None else incumbent
    written = confirmed is not None and confirmed.verdict.significant
    rounds = confirmed.remeasured.completed_rounds() if confirmed is not None else 0
    return RunRow(
        family=fam.name,
        kind=fam.kind,
        noise=noise,
        seed=seed,
        incumbent=incumbent.label(),
        incumbent_kind=kind,
        recommended=chosen.label(),
        written=written,
        true_incumbent_rps=round(truth(incumbent), 1),
        true_recommended_rps=round(truth(chosen), 1),
        trials=tuner.measured_count(),
        rounds=rounds,
        windows=service.windows,
        searches=probe.searches,
        measure_s=service.windows * LOAD_STEP_S + probe.searches * LOAD_WARMUP_S,
    )


def summarise(noise: float, runs: Sequence[RunRow], optimum: dict[str, float]) -> NoiseRow:
    n = len(runs)
    near = sum(1 for r in runs if r.true_recommended_rps >= NEAR * optimum[r.family])
    false_gain = sum(1 for r in runs if r.written and r.true_recommended_rps < r.true_incumbent_rps)
    return NoiseRow(
        noise=noise,
        p_within_5pct=round(near / n, 3),
        p_false_gain=round(false_gain / n, 3),
        p_written=round(sum(r.written for r in runs) / n, 3),
        median_trials=statistics.median(r.trials for r in runs),
        median_measure_s=statistics.median(r.measure_s for r in runs),
        median_rounds=statistics.median(r.rounds for r in runs),
        runs=n,
    )


def measure_family(
    name: str, noises: Sequence[float], seeds: Sequence[int], settings: Settings
) -> tuple[float, list[RunRow]]:
    """One family's runs and its optimum: every recommendation is a configuration
    measured, so the optimum covers it too. Runs of one family share one step cache
    (and so one process); families are independent."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    truth = truth_of(family(name))
    runs = [
        asyncio.run(pipeline(truth, noise, seed, settings)) for noise in noises for seed in seeds
    ]
    return max(truth.optimum, *(r.true_recommended_rps for r in runs)), runs


def measure_all(
    families: Sequence[Family],
    noises: Sequence[float],
    seeds: Sequence[int],
    settings: Settings,
    jobs: int = 1,
) -> Report:
    """Every family's runs, `jobs` families at a time in worker processes. The figures
    do not depend on `jobs`: each run is a pure function of (family, noise, seed)."""
    started = time.monotonic()
    names = [f.name for f in families]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            n = len(names)
            done = list(pool.map(measure_family, names, [noises] * n, [seeds] * n, [settings] * n))
    else:
        done = [measure_family(name, noises, seeds, settings) for name in names]
    optimum = {name: best for name, (best, _) in zip(names, done, strict=True)}
    runs = [run for _, family_runs in done for run in family_runs]
    rows = [summarise(n, [r for r in runs if r.noise == n], optimum) for n in noises]
    by_family = {
        fam.name: [
            summarise(n, [r for r in runs if r.noise == n and r.family == fam.name], optimum)
            for n in noises
        ]
        for fam in families
    }
    return Report(
        rows=rows,
        by_family=by_family,
        families=[f.name for f in families],
        seeds=len(seeds),
        seed_base=seeds[0],
        drift_percent_per_100_windows=settings.drift,
        settings={
            "trials": settings.trials,
            "finalists": settings.finalists,
            "rounds": settings.rounds,
            "max_rounds": settings.max_rounds,
            "min_gain_percent": settings.min_gain_percent,
            "precision": PRECISION,
        },
        time_model=(
            f"windows x {LOAD_STEP_S:g} s (load.stepSeconds) + capacity searches x "
            f"{LOAD_WARMUP_S:g} s (load.warmupSeconds)"
        ),
        incumbent="the rule of thumb on even seeds, a random configuration on odd seeds",
        optimum={k: round(v, 1) for k, v in optimum.items()},
        runs=runs,
        elapsed_s=round(time.monotonic() - started, 1),
    )


PRUNING_PEERS = 5
PRUNING_GAIN = 1.10
PRUNING_CAPACITY = 1000.0
PRUNING_SLA = SLA(p99_ms=100.0)


def _knee(true_rps: float, noise: float, rng: random.Random) -> Callable[[float], Any]:
    """A service whose every window holds the SLA up to its capacity times a log-normal
    factor of spread `noise`, drawn afresh per window."""

    async def step(offered_rps: float) -> StepResult:
        passed = offered_rps <= true_rps * math.exp(noise * rng.gauss(0.0, 1.0))
        return StepResult(
            offered_rps=offered_rps,
            achieved_rps=offered_rps,
            p50_ms=20.0,
            p99_ms=50.0 if passed else 500.0,
            error_rate=0.0,
            requests=2000,
            passed=passed,
            reason="" if passed else "p99 500.0 ms > SLA 100 ms",
            duration_s=LOAD_STEP_S,
        )

    return step


async def _pruned(challenger_rps: float, must_beat: float, noise: float, seed: int) -> bool:
    result = await search_capacity(
        _knee(challenger_rps, noise, random.Random(seed)),
        sla=PRUNING_SLA,
        start_rps=start_rate(must_beat) or must_beat,
        precision=PRECISION,
        must_beat=must_beat,
        confirm_failures=True,
    )
    return result.pruned


async def pruning_case(noise: float, seed: int) -> tuple[bool, bool]:
    """(pruned against the best noisy score, pruned against the tuner's must_beat) for
    a challenger `PRUNING_GAIN` better than an incumbent whose best so far is the top
    of `PRUNING_PEERS` noisy searches. The challenger's windows are the same draws
    under both rules (common random numbers), so the two rates differ by the rule
    alone."""
    rng = random.Random(seed)
    peers = [
        (
            await search_capacity(
                _knee(PRUNING_CAPACITY, noise, rng),
                sla=PRUNING_SLA,
                start_rps=0.5 * PRUNING_CAPACITY,
                precision=PRECISION,
                confirm_failures=True,
            )
        ).effective_rps
        for _ in range(PRUNING_PEERS)
    ]
    best = max(peers)
    challenger = PRUNING_GAIN * PRUNING_CAPACITY
    return (
        await _pruned(challenger, best, noise, seed + 1),
        await _pruned(challenger, best * (1.0 - PRUNE_MARGIN), noise, seed + 1),
    )


def pruning_rows(noises: Sequence[float], runs: int, seed_base: int) -> list[PruningRow]:
    rows: list[PruningRow] = []
    for noise in noises:
        cases = [
            asyncio.run(pruning_case(noise, 1_000_003 * seed_base + 2 * k)) for k in range(runs)
        ]
        rows.append(
            PruningRow(
                noise=noise,
                challenger_gain=PRUNING_GAIN,
                peers=PRUNING_PEERS,
                p_pruned_best_score=round(sum(a for a, _ in cases) / runs, 3),
                p_pruned_lower_bound=round(sum(b for _, b in cases) / runs, 3),
                runs=runs,
            )
        )
    return rows


IDENTICAL_FINALISTS = (1, 3, 10)
QUICK_PRECISION = 0.15  # tune --quick's


async def identical_case(
    finalists: int, noise: float, precision: float, seed: int, settings: Settings
) -> tuple[bool, int]:
    """(written back, rounds) for `finalists` configurations exactly as good as the
    incumbent, confirmed as the product confirms (interleaved rounds in a seeded order
    per round, each search started near 80 % of a study figure with its jitter,
    adaptive rounds while undecided, the verdict with its simultaneous intervals): a
    write-back is a false one by construction. The study figures are one noisy search
    each, as a study would have left them."""
    rng = random.Random(seed)
    incumbent = BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0)
    chosen = [
        BatchingConfig(max_batch_size=2 ** (k + 1), max_queue_time_ms=1.0) for k in range(finalists)
    ]

    async def search(start: float) -> CapacityResult:
        return await search_capacity(
            _knee(PRUNING_CAPACITY, noise, rng),
            sla=PRUNING_SLA,
            start_rps=start,
            precision=precision,
            confirm_failures=True,
        )

    figures = {
        c: (await search(0.5 * PRUNING_CAPACITY)).effective_rps for c in [*chosen, incumbent]
    }

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        return await search(bracket_start(figures[config], config, round_index, seed))

    looks = looks_of(settings.rounds, settings.max_rounds)

    def judge(so_far: Remeasured) -> Verdict:
        return decide(
            so_far.rounds(), incumbent, min_gain_percent=settings.min_gain_percent, looks=looks
        )

    remeasured = await remeasure_interleaved(
        SimulatedTarget(incumbent),
        measure,
        chosen,
        incumbent,
        rounds=settings.rounds,
        max_rounds=settings.max_rounds,
        undecided=lambda so_far: undecided(judge(so_far)),
        shuffle_seed=seed,
    )
    return judge(remeasured).significant, remeasured.completed_rounds()


def identical_rows(
    noises: Sequence[float], runs: int, seed_base: int, settings: Settings
) -> list[IdenticalRow]:
    rows: list[IdenticalRow] = []
    for noise in [n for n in noises if n > 0]:
        for k in IDENTICAL_FINALISTS:
            for precision in (PRECISION, QUICK_PRECISION):
                cases = [
                    asyncio.run(identical_case(k, noise, precision, seed_base + i, settings))
                    for i in range(runs)
                ]
                rows.append(
                    IdenticalRow(
                        noise=noise,
                        finalists=k,
                        precision=precision,
                        p_false_write_back=round(sum(w for w, _ in cases) / runs, 3),
                        median_rounds=statistics.median(r for _, r in cases),
                        runs=runs,
                    )
                )
    return rows


def _noises(text: str) -> list[float]:
    try:
        values = [float(v) / 100.0 for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--noise takes per cent values separated by commas (e.g. 0,5,10,20), got {text!r}"
        ) from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"--noise values must lie between 0 and 100 per cent, got {text!r}"
        )
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per family and noise")
    parser.add_argument("--seed-base", type=int, default=0, help="first seed")
    parser.add_argument(
        "--noise",
        type=_noises,
        default=list(NOISES),
        help="per-window noise levels in per cent, comma-separated [0,5,10,20]",
    )
    parser.add_argument("--families", default="", help="comma-separated family names [all of them]")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="families measured at once in worker processes [the CPU count]",
    )
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=TUNING.max_confirm_rounds,
        help="adaptive confirmation's cap (tuning.maxConfirmRounds); "
        f"{TUNING.confirm_rounds}: fixed rounds [{TUNING.max_confirm_rounds}]",
    )
    results.add_options(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.seed_base < 0:
        parser.error("--seed-base must be >= 0")
    if not TUNING.confirm_rounds <= args.max_rounds <= MAX_ROUNDS_LIMIT:
        parser.error(
            f"--max-rounds must lie between {TUNING.confirm_rounds} and {MAX_ROUNDS_LIMIT}"
        )
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    known = {f.name: f for f in FAMILIES}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(known)}")
    families = [known[n] for n in names] if names else list(FAMILIES)
    seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    recorder = results.start("decision_quality", args)
    report = measure_all(
        families, args.noise, seeds, Settings(max_rounds=args.max_rounds), jobs=args.jobs
    )
    report.pruning = pruning_rows(args.noise, 10 * args.seeds, args.seed_base)
    report.identical = identical_rows(
        args.noise, 10 * args.seeds, args.seed_base, Settings(max_rounds=args.max_rounds)
    )
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Decision quality ({len(families)} families x {args.seeds} seeds, drift "
        f"{DRIFT:g} %/100 windows, up to {args.max_rounds} rounds)"
    )
    for column in (
        "noise",
        "within 5 %",
        "false gain",
        "written",
        "trials",
        "rounds",
        "load time (model)",
    ):
        table.add_column(column)
    for row in report.rows:
        table.add_row(
            f"{row.noise:.0%}",
            f"{row.p_within_5pct:.2f}",
            f"{row.p_false_gain:.3f}",
            f"{row.p_written:.2f}",
            f"{row.median_trials:g}",
            f"{row.median_rounds:g}",
            f"{row.median_measure_s / 60:.0f} min",
        )
    console = Console()
    console.print(table)
    pruning = Table(
        title=f"Pruning a challenger {PRUNING_GAIN - 1:.0%} better than the best of "
        f"{PRUNING_PEERS} noisy scores"
    )
    for column in ("noise", "pruned (against the best score)", "pruned (must_beat)", "runs"):
        pruning.add_column(column)
    for p in report.pruning:
        pruning.add_row(
            f"{p.noise:.0%}", f"{p.p_pruned_best_score:.3f}", f"{p.p_pruned_lower_bound:.3f}",
            str(p.runs),
        )  # fmt: skip
    console.print(pruning)
    identical = Table(title="False write-back: finalists no better than the incumbent")
    for column in ("noise", "finalists", "precision", "false write-back", "rounds", "runs"):
        identical.add_column(column)
    for i in report.identical:
        identical.add_row(
            f"{i.noise:.0%}", str(i.finalists), f"{i.precision:.0%}",
            f"{i.p_false_write_back:.3f}", f"{i.median_rounds:g}", str(i.runs),
        )  # fmt: skip
    console.print(identical)
    console.print(f"{report.elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
