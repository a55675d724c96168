"""One simulated step: a scenario (cost model, traffic, replicas) at one offered rate,
judged by the same rule as a measured step (`batchpilot.models.step_passes`)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import Field

from batchpilot.capacity.http import default_timeout_s
from batchpilot.loadgen.arrivals import ArrivalProcess, Poisson, arrival_times
from batchpilot.models import SLA, BatchingConfig, Frozen, RequestMix, StepResult, step_passes
from batchpilot.simulator.cost import CostModel
from batchpilot.simulator.engine import Policy, ServerModel, latencies

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The reference server's batcher (server/app.py): one full batch handed over ahead, at
# most 1024 requests waiting (its --queue-limit default).
REFERENCE_AHEAD = 1
REFERENCE_QUEUE_LIMIT = 1024

# A simulated step starts with an empty, idle server; the first requests see no queue.
# They are simulated but left out of the figures, as a warm-up window would be.
WARMUP_FRACTION = 0.1


class Scenario(Frozen):
    """Everything but the batching configuration and the offered rate."""

    cost: CostModel
    mix: RequestMix = Field(default_factory=RequestMix.default)
    arrival: ArrivalProcess = Field(default_factory=Poisson)
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    requests: Annotated[int, Field(ge=200, le=10_000_000)] = 20_000
    seed: Annotated[int, Field(ge=0)] = 0
    policy: Policy = "sequential"
    # Client timeout: a request slower than this is an error and counts as this latency,
    # as the load generator counts it. None: the measured capacity search's default.
    timeout_ms: Annotated[float, Field(gt=0.0)] | None = None
    # What the server does beyond the plain sequential batcher (engine.ServerModel): full
    # batches handed over while another computes, the spread of batch times (coefficient
    # of variation), the queue bound beyond which requests are refused (503). The
    # reference server: ahead 1, queue limit 1024 (REFERENCE_AHEAD, REFERENCE_QUEUE_LIMIT).
    ahead: Annotated[int, Field(ge=0, le=16)] = 0
    jitter: Annotated[float, Field(ge=0.0, le=5.0)] = 0.0
    queue_limit: Annotated[int, Field(ge=1)] | None = None

    def server(self) -> ServerModel:
        return ServerModel(ahead=self.ahead, queue_limit=self.queue_limit)

    def timeout_for(self, sla: SLA) -> float:
        if self.timeout_ms is not None:
            return self.timeout_ms
        return default_timeout_s(sla) * 1000.0

    def service_bound_rps(self, max_batch_size: int) -> float:
        """Throughput of the workers if every batch held `max_batch_size` requests of the
        mean size: the rate no configuration with that cap can exceed."""
        b = np.array([max_batch_size], dtype=np.int64)
        rows = np.array([max_batch_size * self.mix.mean_size()])
        ms = float(self.cost.batch_ms(b, rows)[0])
        return self.replicas * max_batch_size * 1000.0 / max(ms, 1e-6)


class Traffic:
    """The scenario's requests: sizes drawn once, arrival times per offered rate. Every
    rate and every configuration sees the same draws (common random numbers), so the
    difference between two configurations is theirs, not the dice's."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        rng = np.random.default_rng([scenario.seed, 1])
        sizes = np.array([c.size for c in scenario.mix.classes], dtype=np.int64)
        weights = np.array([c.weight for c in scenario.mix.classes])
        self.sizes: IntArray = rng.choice(sizes, size=scenario.requests, p=weights / weights.sum())
        # Batch-time factors of mean 1, one per batch (there are at most as many batches
        # as requests), drawn once: every configuration meets the same spread.
        self.jitter: FloatArray | None = None
        if scenario.jitter > 0:
            sigma = float(np.sqrt(np.log1p(scenario.jitter**2)))
            self.jitter = np.random.default_rng([scenario.seed, 3]).lognormal(
                -(sigma**2) / 2, sigma, size=scenario.requests
            )
        self._unit: FloatArray | None = None
        if scenario.arrival.scale_free:
            # Such a stream at rate r is the unit-rate stream with time divided by r.
            self._unit = self._schedule(1.0)

    def _schedule(self, rate: float) -> FloatArray:
        n = self.scenario.requests
        return arrival_times(
            self.scenario.arrival, n, rate, self.scenario.seed, window_from=measured_from(n)
        )

    def arrivals(self, rate: float) -> FloatArray:
        """Arrival times at `rate`: the load generator's schedule for the same process and
        seed, scaled so the measured window (after the warm-up share) holds exactly `rate`
        requests a second. The offered rate of a step is then the rate actually offered,
        not one off by the sampling noise of a few thousand draws (which would otherwise
        fail the "achieved >= 97% of offered" rule on some seeds)."""
        if self._unit is not None:
            return self._unit / rate
        return self._schedule(rate)


def measured_from(n: int) -> int:
    """Index of the first request the figures count (after the warm-up share)."""
    return int(n * WARMUP_FRACTION)


def simulate_step(
    traffic: Traffic, config: BatchingConfig, sla: SLA, offered_rps: float
) -> StepResult:
    """The step of the capacity search at `offered_rps`, simulated."""
    scenario = traffic.scenario
    arrivals = traffic.arrivals(offered_rps)
    latency_s = latencies(
        arrivals,
        traffic.sizes,
        max_batch_size=config.max_batch_size,
        max_queue_time_s=config.max_queue_time_ms / 1000.0,
        cost=scenario.cost,
        replicas=scenario.replicas,
        policy=scenario.policy,
        server=scenario.server(),
        jitter=traffic.jitter,
    )
    first = measured_from(arrivals.size)
    measured_ms = latency_s[first:] * 1000.0
    timeout_ms = scenario.timeout_for(sla)
    timed_out = measured_ms > timeout_ms
    clamped = np.minimum(measured_ms, timeout_ms)
    ok = ~timed_out
    # The load generator's rule: answers over the window, or over the span of the
    # answers when they trail past it (a saturated server drains its backlog late).
    window_s = float(arrivals[-1] - arrivals[first])
    done_s = (arrivals[first:] + latency_s[first:])[ok]
    span_s = float(done_s.max() - done_s.min()) if done_s.size else 0.0
    achieved = done_s.size / max(window_s, span_s) if done_s.size else 0.0
    p50, p99 = (float(v) for v in np.percentile(clamped, [50.0, 99.0]))
    error_rate = float(np.count_nonzero(timed_out)) / measured_ms.size
    passed, reason = step_passes(
        p99_ms=p99,
        error_rate=error_rate,
        offered_rps=offered_rps,
        achieved_rps=achieved,
        sla=sla,
    )
    return StepResult(
        offered_rps=offered_rps,
        achieved_rps=achieved,
        p50_ms=p50,
        p99_ms=p99,
        error_rate=error_rate,
        requests=int(measured_ms.size),
        passed=passed,
        reason=reason,
        duration_s=window_s,
        source="simulator",
    )
