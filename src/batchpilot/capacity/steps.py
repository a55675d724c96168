"""Turning a measured window into a step decision (DESIGN.md §6)."""

from __future__ import annotations

from batchpilot.loadgen.result import LoadResult
from batchpilot.models import SLA, StepResult, step_passes


def step_from_load(load: LoadResult, sla: SLA) -> StepResult:
    """The step rule applied to the client's own measurement of a window."""
    if load.requests == 0:
        passed, reason = False, "no request completed"
    else:
        passed, reason = step_passes(
            p99_ms=load.latency.p99_ms,
            error_rate=load.error_rate,
            offered_rps=load.offered_rps,
            achieved_rps=load.achieved_rps,
            sla=sla,
        )
    return StepResult(
        offered_rps=load.offered_rps,
        achieved_rps=load.achieved_rps,
        p50_ms=load.latency.p50_ms,
        p99_ms=load.latency.p99_ms,
        error_rate=load.error_rate,
        requests=load.requests,
        passed=passed,
        reason=reason,
        duration_s=load.duration_s,
        source="client",
    )
