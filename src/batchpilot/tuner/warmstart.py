"""The cost model behind the simulator's warm-start proposals.

A server's batch profile times each batch from hand-over to reply; fitted from it, the
simulator overrates batching (the per-request work outside the forward pass is missing)
and underrates full batches handed over ahead (their hand-over is hidden). The trials
measured so far in the same run (the baseline, the rules of thumb) are what
`calibrate_cost` needs to fix both: one configuration fixes one term, two fix both."""

from __future__ import annotations

from collections.abc import Sequence

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
    more: Sequence[tuple[BatchingConfig, CapacityResult]] = (),
    ahead: int = 0,
    queue_limit: int | None = None,
) -> tuple[LinearCost | TableCost, str]:
    """`cost` calibrated against the baseline's measured capacity, and a note saying
    what was done. The profile's fit is returned as it is, with the reason, when the
    baseline gives nothing to calibrate against (infeasible, or pruned: a pruned figure
    is only a lower bound). `more`: other measured
    configurations (infeasible or pruned ones are left out); `ahead`, `queue_limit`: the
    server's batcher, as in `Scenario`."""
    if not measured.feasible:
        return cost, "not calibrated: the baseline has no feasible measurement"
    if measured.pruned:
        return cost, "not calibrated: the baseline's measurement was cut short"
    scenario = Scenario(
        cost=cost,
        mix=mix,
        arrival=arrival if arrival is not None else Poisson(),
        requests=PROPOSE_REQUESTS,
        seed=seed,
        ahead=ahead,
        queue_limit=queue_limit,
    )
    usable = [(c, m) for c, m in more if m.feasible and not m.pruned and c != baseline]
    try:
        fitted = calibrate_cost(scenario, baseline, measured, sla, more=usable)
    except ValueError as exc:
        return cost, f"not calibrated: {exc}"
    others = "".join(f", {m.effective_rps:.0f} req/s ({c.label()})" for c, m in usable)
    return fitted, (
        f"calibrated to the baseline's {measured.effective_rps:.0f} req/s ({baseline.label()})"
        + others
    )
