"""`tune --simulator`: the whole tuner (baseline, rules of thumb, sampler, refinement)
against the simulator, for what-if planning before touching a service. The target is a
configuration held in memory, the probe a simulated capacity search
(`simulator.capacity`) of the same SLA and precision as a measured trial. Simulated
steps are deterministic, so the back-to-back re-measurement of `tune --local` would
repeat the same figures and is not run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rich.console import Console

from batchpilot.capacity.lightload import LightLoad, wait_needs_light_load
from batchpilot.models import BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.arrivals import ArrivalProcess
from batchpilot.simulator.capacity import StepCache, simulate_capacity_async
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.scenario import Scenario, Traffic
from batchpilot.tuner.config import TuneConfig
from batchpilot.tuner.progress import TrialProgress
from batchpilot.tuner.rules import rules_of_thumb
from batchpilot.tuner.runner import TrialDone, TrialStart, run_trials
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import Tuner
from batchpilot.tuner.summary import TuneSummary, label_of, summary_of_study

# Requests per simulated step: a p99 from 4,000 is resolved to about 1 %, and a trial
# (one capacity search, ~10 steps) simulates in tens of milliseconds.
SIMULATED_REQUESTS = 4000
STUDY_NAME = "batchpilot-simulated"


@dataclass(frozen=True)
class SimulatedRun:
    config: TuneConfig
    space: SearchSpace
    mix: RequestMix
    cost: LinearCost | TableCost
    arrival: ArrivalProcess
    replicas: int = 1


class SimulatedTarget:
    """Holds the configuration a simulated service runs; applying never fails."""

    def __init__(self, start: BatchingConfig) -> None:
        self.live = start

    async def current(self) -> BatchingConfig:
        return self.live

    async def apply(self, config: BatchingConfig) -> None:
        self.live = config


class SimulatedProbe:
    """A simulated capacity search of what the target runs, pruned like a measured one.
    Steps are cached by (configuration, rate): a repeated configuration costs nothing."""

    def __init__(self, traffic: Traffic, run: SimulatedRun) -> None:
        self.traffic = traffic
        self.sla = run.config.sla
        self.precision = run.config.measurement.precision
        self.steps: StepCache = {}

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        start_rps: float | None = None,
        light_load: bool | None = None,
    ) -> CapacityResult:
        """As `LocalProbe.measure`: `start_rps` overrides the simulator's start, and
        `light_load` (by default: a wait that is a large share of the SLA) measures rates
        below the capacity found."""
        if light_load is None:
            light_load = wait_needs_light_load(config, self.sla)
        return await simulate_capacity_async(
            self.traffic,
            config,
            self.sla,
            precision=self.precision,
            must_beat=must_beat,
            step_cache=self.steps,
            start_rps=start_rps,
            light_load=LightLoad() if light_load else None,
        )


def scenario_of(run: SimulatedRun) -> Scenario:
    return Scenario(
        cost=run.cost,
        mix=run.mix,
        arrival=run.arrival,
        replicas=run.replicas,
        requests=SIMULATED_REQUESTS,
        seed=run.config.tuning.seed,
    )


async def tune_simulated(run: SimulatedRun, console: Console) -> TuneSummary:
    cfg = run.config
    started = time.monotonic()
    rules = rules_of_thumb(run.space, cfg.sla) if cfg.tuning.rule_of_thumb else []
    # The baseline is what the reference server starts with, as in `tune --local`.
    baseline = BatchingConfig(
        max_batch_size=cfg.server.max_batch_size,
        max_queue_time_ms=cfg.server.max_queue_time_ms,
    )
    tuner = Tuner(
        run.space,
        sampler=cfg.tuning.sampler,
        seed=cfg.tuning.seed,
        baseline=baseline,
        warm_start=rules,
        study_name=STUDY_NAME,
        max_trials=cfg.tuning.trials,
    )
    traffic = await asyncio.to_thread(Traffic, scenario_of(run))
    target = SimulatedTarget(baseline)
    probe = SimulatedProbe(traffic, run)
    console.print(
        f"Simulated service: {run.cost.label()}; {run.replicas} replica(s); SLA "
        f"{cfg.sla.describe('<=')}, errors <= {cfg.sla.max_error_rate:g}; space "
        f"{run.space.describe()}; {cfg.tuning.trials} trials ({cfg.tuning.sampler}, seed "
        f"{cfg.tuning.seed})",
        highlight=False,
    )
    progress = TrialProgress(console, cfg.tuning.trials)

    def on_start(event: TrialStart) -> None:
        progress.start(event, label_of(tuner.records()[event.number], rules))

    def on_done(event: TrialDone) -> None:
        progress.done(event, label_of(event.record, rules), tuner.measured_count())

    await run_trials(
        tuner,
        target,
        probe,
        trials=cfg.tuning.trials,
        full=rules,
        on_start=on_start,
        on_done=on_done,
    )
    progress.stop()
    return summary_of_study(
        tuner,
        cfg,
        space=run.space,
        rules=rules,
        interrupted=False,
        duration_s=time.monotonic() - started,
    )
