"""The cost model behind the simulator's warm-start proposals.

A server's batch profile times the forward pass alone; fitted from it, the simulator
overrates batching (the per-request work outside the forward pass is missing) and its
proposals are poor. The baseline trial has just measured one configuration's capacity
in the same run, which is what `calibrate_cost` needs to fix that term."""

from __future__ import annotations

from batchpilot.loadgen.arrivals import ArrivalKind, Poisson
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.calibrate import calibrate_cost
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.propose import PROPOSE_REQUESTS
from batchpilot.simulator.scenario import Scenario


def calibrated_cost(
    cost: LinearCost | TableCost,
    *,
    mix: RequestMix,
    sla: SLA,
    baseline: BatchingConfig,
    measured: CapacityResult,
    seed: int = 0,
    arrival: ArrivalKind | None = None,
) -> tuple[LinearCost | TableCost, str]:
    """`cost` calibrated against the baseline's measured capacity, and a note saying
    what was done. The profile's fit is returned as it is, with the reason, when the
    baseline gives nothing to calibrate against (infeasible, or pruned: a pruned figure
    is only a lower bound) or the model is a table."""
    if not measured.feasible:
        return cost, "not calibrated: the baseline has no feasible measurement"
    if measured.pruned:
        return cost, "not calibrated: the baseline's measurement was cut short"
    if not isinstance(cost, LinearCost):
        return cost, "not calibrated: a table cost model has no per-request term"
    scenario = Scenario(
        cost=cost,
        mix=mix,
        arrival=arrival if arrival is not None else Poisson(),
        requests=PROPOSE_REQUESTS,
        seed=seed,
    )
    try:
        fitted = calibrate_cost(scenario, baseline, measured, sla)
    except ValueError as exc:
        return cost, f"not calibrated: {exc}"
    return fitted, (
        f"calibrated to the baseline's {measured.effective_rps:.0f} req/s ({baseline.label()})"
    )
