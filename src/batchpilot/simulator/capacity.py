"""Effective throughput of a configuration, simulated: the capacity search of
`batchpilot.capacity.search` (the very same function the measured search runs) driven by
simulated steps, so `simulate` and `capacity` answer in the same shape by the same rule."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

from batchpilot.capacity.lightload import LightLoad
from batchpilot.capacity.search import search_capacity
from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult
from batchpilot.simulator.scenario import Scenario, Traffic, simulate_step

T = TypeVar("T")

DEFAULT_PRECISION = 0.05

StepCache = dict[tuple[BatchingConfig, float], StepResult]


def _start_rps(scenario: Scenario) -> float:
    """Half of what unbatched replicas could serve: low enough that a feasible
    configuration passes the first step, high enough that the ramp is short."""
    return 0.5 * scenario.service_bound_rps(1)


async def simulate_capacity_async(
    traffic: Traffic,
    config: BatchingConfig,
    sla: SLA,
    *,
    precision: float = DEFAULT_PRECISION,
    must_beat: float | None = None,
    step_cache: StepCache | None = None,
    start_rps: float | None = None,
    light_load: LightLoad | None = None,
) -> CapacityResult:
    """As `simulate_capacity`; `start_rps` overrides where the ramp starts (a measured
    trial starts near the rate to beat), `light_load` measures low rates below the
    capacity found (`capacity.lightload`)."""

    async def measure(offered_rps: float) -> StepResult:
        if step_cache is None:
            return simulate_step(traffic, config, sla, offered_rps)
        key = (config, offered_rps)
        step = step_cache.get(key)
        if step is None:
            step = step_cache[key] = simulate_step(traffic, config, sla, offered_rps)
        return step

    scenario = traffic.scenario
    return await search_capacity(
        measure,
        sla=sla,
        start_rps=_start_rps(scenario) if start_rps is None else start_rps,
        precision=precision,
        # Nothing serves faster than full batches back to back; twice that is out of reach.
        max_rps=2.0 * scenario.service_bound_rps(config.max_batch_size),
        must_beat=must_beat,
        light_load=light_load,
    )


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, also when the caller is itself
    inside a running event loop (the tuner's warm start may be): then on a helper thread
    with a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def simulate_capacity(
    scenario: Scenario | Traffic,
    config: BatchingConfig,
    sla: SLA,
    *,
    precision: float = DEFAULT_PRECISION,
    must_beat: float | None = None,
    step_cache: StepCache | None = None,
    start_rps: float | None = None,
    light_load: LightLoad | None = None,
) -> CapacityResult:
    """Effective throughput of `config` in `scenario`, with every simulated step.

    `step_cache` (one per traffic and SLA) remembers steps by (config, offered rate): a
    search that repeats a configuration, pruned or not, replays its steps for free,
    since a simulated step is a pure function of them."""
    traffic = scenario if isinstance(scenario, Traffic) else Traffic(scenario)
    return run_sync(
        simulate_capacity_async(
            traffic,
            config,
            sla,
            precision=precision,
            must_beat=must_beat,
            step_cache=step_cache,
            start_rps=start_rps,
            light_load=light_load,
        )
    )
