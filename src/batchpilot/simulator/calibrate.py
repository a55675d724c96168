"""Calibrating a profile-fitted cost model against measured capacities, in both
directions.

A server's batch profile times each batch from hand-over to reply. Two things it gets
wrong, in opposite directions:
- the server spends CPU per request outside the forward pass (HTTP, JSON, scattering
  results) that competes with the model on a CPU-bound machine: a model without it
  *over*predicts batched configurations (`per_request_ms`, lowers predictions);
- part of each profiled batch time is the round trip to the model process, which the
  server hides by handing full batches over while another computes (`ahead`): a model
  that charges it to every batch *under*predicts (`handover_ms`, raises predictions; it
  acts only in a scenario with `ahead` >= 1, as the reference server's).

One measured configuration fixes one of them: the per-request cost when the profile
overpredicts, the hand-over when it underpredicts. Two or more fix both: every hand-over
on a grid up to the batch's fixed time is paired with the per-request cost that matches
the first (anchor) configuration exactly, and the pair with the smallest squared log
error over all configurations wins. The latency outside the worker (`overhead_ms`) comes
from the anchor's lowest measured step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from batchpilot.models import SLA, BatchingConfig, CapacityResult
from batchpilot.simulator.capacity import simulate_capacity
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.scenario import Scenario, Traffic, simulate_step

PER_REQUEST_MS_MAX = 50.0
BISECTION_ROUNDS = 14  # 50 ms / 2^14: about 3 µs
CALIBRATION_PRECISION = 0.01
HANDOVER_GRID = 8  # hand-over candidates: 0, 1/8, ..., 8/8 of the fixed batch time

Point = tuple[BatchingConfig, CapacityResult]


def calibrate_cost(
    scenario: Scenario,
    config: BatchingConfig,
    measured: CapacityResult,
    sla: SLA,
    *,
    more: Sequence[Point] = (),
) -> LinearCost | TableCost:
    """The scenario's cost model (linear or a table) with `per_request_ms`, `handover_ms` and
    `overhead_ms` fitted to the measurement of `config` (the anchor) and of the
    configurations in `more`; its other coefficients as they were."""
    cost = scenario.cost
    # the hand-over is part of every batch's time, so at most the smallest batch's
    smallest_batch_ms = cost.fixed_ms if isinstance(cost, LinearCost) else cost.compute_ms[0]
    points: list[Point] = [(config, measured), *more]
    for point_config, result in points:
        if not result.feasible or not result.steps:
            raise ValueError(
                f"calibration needs feasible measurements (effective_rps > 0); "
                f"{point_config.label()} has none"
            )
    lowest = min(measured.steps, key=lambda s: s.offered_rps)

    def with_costs(per_request_ms: float, handover_ms: float, overhead_ms: float) -> Scenario:
        update = {
            "per_request_ms": per_request_ms,
            "handover_ms": handover_ms,
            "overhead_ms": overhead_ms,
        }
        return scenario.model_copy(update={"cost": cost.model_copy(update=update)})

    def capacity(trial: Scenario, point_config: BatchingConfig) -> float:
        return simulate_capacity(
            trial, point_config, sla, precision=CALIBRATION_PRECISION
        ).effective_rps

    def overhead_for(per_request_ms: float, handover_ms: float) -> float:
        """Measured p50 at the anchor's lowest rate (no queue) minus the simulated p50."""
        bare = with_costs(per_request_ms, handover_ms, 0.0)
        simulated = simulate_step(Traffic(bare), config, sla, lowest.offered_rps)
        return max(lowest.p50_ms - simulated.p50_ms, 0.0)

    def per_request_for(handover_ms: float, overhead_ms: float) -> float:
        """Capacity only falls as the per-request cost grows: bisect for the anchor."""
        return _bisect_down(
            lambda x: capacity(with_costs(x, handover_ms, overhead_ms), config),
            measured.effective_rps,
            PER_REQUEST_MS_MAX,
        )

    hideable = scenario.ahead >= 1
    handover_ms = cost.handover_ms
    overhead_ms = overhead_for(0.0, handover_ms)
    if hideable and len(points) == 1:
        # One point: lower by the per-request cost or raise by the hidden hand-over.
        if capacity(with_costs(0.0, 0.0, overhead_ms), config) <= measured.effective_rps:
            handover_ms = _bisect_up(
                lambda h: capacity(with_costs(0.0, h, overhead_ms), config),
                measured.effective_rps,
                smallest_batch_ms,
            )
        else:
            handover_ms = 0.0
    elif hideable:
        handover_ms = _best_handover(
            [smallest_batch_ms * k / HANDOVER_GRID for k in range(HANDOVER_GRID + 1)],
            lambda h: per_request_for(h, overhead_ms),
            lambda h, x: _log_error(points, lambda c: capacity(with_costs(x, h, overhead_ms), c)),
        )
    # The per-request cost and the overhead interact (overhead adds to p99, per-request
    # work to the low-rate p50), so alternate: twice is enough for both to settle.
    per_request_ms = 0.0
    for _ in range(2):
        per_request_ms = per_request_for(handover_ms, overhead_ms)
        overhead_ms = overhead_for(per_request_ms, handover_ms)
    return cost.model_copy(
        update={
            "per_request_ms": per_request_ms,
            "handover_ms": handover_ms,
            "overhead_ms": overhead_ms,
        }
    )


def _best_handover(
    candidates: Sequence[float],
    per_request_for: Callable[[float], float],
    error: Callable[[float, float], float],
) -> float:
    scored = []
    for handover_ms in candidates:
        per_request_ms = per_request_for(handover_ms)
        scored.append((error(handover_ms, per_request_ms), handover_ms))
    return min(scored)[1]


def _log_error(points: Sequence[Point], predict: Callable[[BatchingConfig], float]) -> float:
    total = 0.0
    for config, measured in points:
        predicted = predict(config)
        ratio = predicted / measured.effective_rps if predicted > 0 else 1e-6
        total += math.log(ratio) ** 2
    return total


def _bisect_down(capacity: Callable[[float], float], target: float, high: float) -> float:
    """The x in [0, high] where a capacity falling in x meets `target` (0 if it is at or
    under it already)."""
    if capacity(0.0) <= target:
        return 0.0
    lo, hi = 0.0, high
    for _ in range(BISECTION_ROUNDS):
        mid = (lo + hi) / 2
        if capacity(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _bisect_up(capacity: Callable[[float], float], target: float, high: float) -> float:
    """The x in [0, high] where a capacity rising in x meets `target` (`high` if it
    never does)."""
    if capacity(high) <= target:
        return high
    lo, hi = 0.0, high
    for _ in range(BISECTION_ROUNDS):
        mid = (lo + hi) / 2
        if capacity(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
