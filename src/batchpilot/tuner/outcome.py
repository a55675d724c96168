"""How a capacity measurement becomes a trial outcome: pure decisions, no Optuna."""

from __future__ import annotations

from typing import Literal

from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult

TrialState = Literal["Running", "Complete", "Pruned", "Infeasible", "Failed"]

# Name of the single Optuna constraint; > 0 means the trial broke the SLA.
SLA_CONSTRAINT = "sla"
# The reason of a trial whose capacity the client could not reach: its score is a lower
# bound. It stays a Complete trial (Optuna sees the bound) and is flagged as such.
CLIENT_BOUND = "ClientBound"
# The reason of a Complete trial one of whose steps was measured twice because a load
# worker died in the first window: the score stands, the incident is on record.
STEP_REPEATED = "StepRepeated"


def state_of(result: CapacityResult) -> TrialState:
    """Pruned wins over infeasible: a pruned ramp may have started above the lowest
    rate, so a failing first step does not prove the configuration can never meet the
    SLA; it only proves it cannot win."""
    if result.pruned:
        return "Pruned"
    if not result.feasible:
        return "Infeasible"
    return "Complete"


def light_load_violation(config: BatchingConfig, sla: SLA) -> str:
    """Why `config` breaks the SLA whenever traffic is too light to fill a batch, or ""
    when it need not. With a batch cap above 1, a request that arrives alone waits the
    whole max_queue_time before its batch runs, so its latency exceeds the wait; a wait
    at or above the SLA's p99 then breaks the SLA at light load (at night, between
    bursts), however well it scores under the capacity search's heavy load. The
    measured searches start near the rate to beat and never visit light load, so this
    is decided here, from the configuration alone. An SLA of token-stream targets alone
    is held to its scale (`SLA.scale_ms`): the wait delays the first token."""
    bound = sla.scale_ms()
    if config.max_batch_size > 1 and config.max_queue_time_ms >= bound:
        what = "p99" if sla.p99_ms is not None else "of the TTFT and TPOT targets"
        return (
            f"breaks the SLA at light load: a lone request waits the whole "
            f"{config.max_queue_time_ms:g} ms max_queue_time, at or above the "
            f"{bound:g} ms {what}"
        )
    return ""


def violation_of(state: TrialState) -> float:
    """The constraint value Optuna sees. Binary on purpose: it must be recomputable
    from a trial record alone when a study is rebuilt, and the record does not carry
    the SLA."""
    return 1.0 if state == "Infeasible" else 0.0


def reported_step(result: CapacityResult) -> StepResult | None:
    """The step whose figures describe the trial: the fastest passing step, or the
    slowest step when none passed (how badly it broke the SLA at its easiest)."""
    passed = [s for s in result.steps if s.passed]
    if passed:
        return max(passed, key=lambda s: s.offered_rps)
    return min(result.steps, key=lambda s: s.offered_rps, default=None)


def figures_of(result: CapacityResult) -> tuple[float, float | None, float | None]:
    """(effective req/s, p99 ms, error rate) for a trial record, rounded to what a
    measurement can tell apart. Rounding here, before Optuna sees the value, keeps a study
    rebuilt from stored records (e.g. the operator's status) identical to the live one,
    and keeps `kubectl get` columns readable."""
    step = reported_step(result)
    p99 = result.p99_ms if result.p99_ms is not None else (step.p99_ms if step else None)
    errors = step.error_rate if step else None
    return (
        round(result.effective_rps, 1),
        None if p99 is None else round(p99, 2),
        None if errors is None else round(errors, 6),
    )


def client_figures(result: CapacityResult) -> tuple[float | None, float | None]:
    """(worst p99 send lag ms, highest client CPU share) over the trial's steps, for a
    trial record: how close the client came to its limits while measuring."""
    health = [s.client for s in result.steps if s.client is not None]
    if not health:
        return None, None
    return (
        round(max(h.lag_p99_ms for h in health), 2),
        round(max(h.cpu for h in health), 3),
    )


def client_bound_reason(result: CapacityResult) -> str:
    """The ClientBound reason with the capacity bound and the invalid step's why."""
    invalid = next((s for s in result.steps if not s.valid), None)
    why = f": {invalid.reason}" if invalid is not None and invalid.reason else ""
    return f"{CLIENT_BOUND}: capacity {result.capacity_label()}{why}"


def unmeasured_reason(result: CapacityResult) -> str:
    """Why `result` says nothing of its configuration (empty when it says something):
    the client limited every step it took, so no rate passed and none failed on the
    server's account. Scored as breaking the SLA, such a trial would tell the sampler a
    region is bad on the strength of the client's stalls alone."""
    if result.pruned or not result.steps or any(s.valid for s in result.steps):
        return ""
    rates = [s.offered_rps for s in result.steps]
    why = next((s.reason for s in result.steps if s.reason), "")
    return (
        f"{CLIENT_BOUND}: no step could be judged, the client limited all "
        f"{len(rates)} ({min(rates):.1f}-{max(rates):.1f} req/s)" + (f": {why}" if why else "")
    )


def repeated_step_reason(result: CapacityResult) -> str:
    """The StepRepeated reason, or "" when no step of `result` had to be repeated."""
    repeated = next((s for s in result.steps if s.repeat), None)
    if repeated is None:
        return ""
    return f"{STEP_REPEATED} at {repeated.offered_rps:.1f} req/s: {repeated.reason}"
