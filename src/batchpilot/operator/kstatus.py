"""The kstatus conditions (Ready, Reconciling, Stalled) and the summary fields that
kubectl, Flux and Argo CD read, derived from the phase on every status write.

Flux's health checks and `kubectl wait` follow the kstatus convention: Reconciling=True
while work is under way, Stalled=True when it cannot finish without a change from the
user, Ready=True when done, each with the observedGeneration it speaks for. A failed
study would otherwise look "in progress" forever.

The other conditions (TargetReady, Measuring, SpecValid, ...) are set where they happen
with `studystate.StudyState.condition` or `decisions.set_condition`; this module only
adds the three derived ones. A `Degraded=True` condition keeps a converged study not Ready.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from batchpilot.operator import decisions
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import Condition, InferenceServiceStatus

ConditionStatus = Literal["True", "False", "Unknown"]


def _find(conditions: list[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)


def _put(
    conditions: list[Condition],
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
    *,
    keep_reason: bool = False,
) -> list[Condition]:
    """Set a condition; with `keep_reason`, one already at `status` keeps the reason and
    message its setter gave (Converged, NoSignificantGain, ...) and only takes the
    generation."""
    current = _find(conditions, type)
    if keep_reason and current is not None and current.status == status:
        reason, message = current.reason, current.message
    return decisions.set_condition(
        conditions,
        type=type,
        status=status,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
    )


def _failure_reason(conditions: list[Condition]) -> str:
    spec_valid = _find(conditions, "SpecValid")
    if spec_valid is not None and spec_valid.status == "False":
        return spec_valid.reason or "InvalidSpec"
    return "StudyFailed"


# TargetReady reasons no retry can clear: the target does not exist, or another
# InferenceService tunes it. The study waits (and picks up a fix at once), Stalled.
USER_BLOCKED = frozenset({"TargetNotFound", "TargetTaken"})


def _blocked_on_the_user(conditions: list[Condition]) -> Condition | None:
    target = _find(conditions, "TargetReady")
    if target is not None and target.status == "False" and target.reason in USER_BLOCKED:
        return target
    return None


def with_kstatus(status: InferenceServiceStatus, now: datetime) -> InferenceServiceStatus:
    """`status` with Ready, Reconciling and Stalled set from its phase."""
    generation = status.observed_generation
    conditions = list(status.conditions)
    phase, message = status.phase, status.message
    degraded = _find(conditions, "Degraded")
    window = _find(conditions, "InWindow")
    if status.suspended and phase not in ("Failed", "RolledBack"):
        # paused on purpose: not done, not at work, and not waiting for a fix either
        ready: tuple[ConditionStatus, str] = ("False", "Suspended")
        reconciling: tuple[ConditionStatus, str] = ("False", "Suspended")
        stalled: tuple[ConditionStatus, str] = ("False", "Suspended")
    elif phase == "Failed":
        reason = _failure_reason(conditions)
        ready = ("False", reason)
        reconciling = ("False", reason)
        stalled = ("True", reason)
    elif phase == "RolledBack":
        # over, and not what was asked for: the target runs its original values again
        # until the user changes the spec (Flux reports it rather than waiting)
        ready = ("False", "RolledBack")
        reconciling = ("False", "RolledBack")
        stalled = ("True", "RolledBack")
    elif phase == "Converged":
        ready = ("True", "Converged")
        if degraded is not None and degraded.status == "True":
            ready = ("False", degraded.reason or "Degraded")
        reconciling = ("False", "Converged")
        stalled = ("False", "Converged")
    elif (blocked := _blocked_on_the_user(conditions)) is not None:
        # waiting on something only the user can change: Flux and `kubectl wait` must
        # report it, not wait for ever
        ready = ("False", blocked.reason)
        reconciling = ("False", blocked.reason)
        stalled = ("True", blocked.reason)
        message = blocked.message or message
    else:
        # a study waiting for its maintenance window is still under way
        waiting = window is not None and window.status == "False"
        reason = window.reason if waiting and window is not None else phase
        ready = ("False", reason)
        reconciling = ("True", reason)
        stalled = ("False", reason)
    conditions = _put(
        conditions, "Ready", *ready, message, generation, now, keep_reason=ready[0] == "True"
    )
    conditions = _put(conditions, "Reconciling", *reconciling, message, generation, now)
    conditions = _put(conditions, "Stalled", *stalled, message, generation, now)
    return status.model_copy(update={"conditions": conditions})


def finished_trials(status: InferenceServiceStatus) -> int:
    done = sum(1 for t in status.trials if t.state in decisions.FINISHED_STATES)
    return done + (status.trials_summary.complete if status.trials_summary else 0)


def gain_percent(status: InferenceServiceStatus) -> float | None:
    """The best's gain over the baseline: the confirmation's figure when it ran (same
    load, interleaved), else from the trials' own scores."""
    best, baseline = status.best, status.baseline
    if best is None:
        return None
    if best.gain_percent is not None:
        return best.gain_percent
    if baseline is None or not baseline.effective_rps or best.effective_rps is None:
        return None
    return round(100.0 * (best.effective_rps / baseline.effective_rps - 1.0), 1)


def rate_scope(pods: int | None) -> str | None:
    """One word, for a kubectl column: `per-pod` when one pod took the load, `fleet`
    when the figures are several pods' together (the Pods column says how many)."""
    if pods is None:
        return None
    return "per-pod" if pods == 1 else "fleet"


def with_summary(
    status: InferenceServiceStatus, spec: InferenceServiceSpec, measured_pods: int | None
) -> InferenceServiceStatus:
    """The printer columns' fields: trials done/max, the gain, what req/s cover."""
    pods = measured_pods if measured_pods is not None else status.measured_pods
    return status.model_copy(
        update={
            "trials_progress": f"{finished_trials(status)}/{spec.tuning.max_trials}",
            "gain_percent": gain_percent(status),
            "measured_pods": pods,
            "rate_scope": rate_scope(pods),
        }
    )
