"""What a study does with a spec edit it adopts (see specdiff): a finished study with
more trials to run reopens; a changed writeBack applies or withholds its result."""

from __future__ import annotations

from typing import Literal

from batchpilot.operator import decisions
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.status import InferenceServiceStatus

WriteBackAction = Literal["apply", "withhold"]


def reopened(status: InferenceServiceStatus) -> InferenceServiceStatus:
    """A converged study made active again: its trials kept, the confirmation and what
    it did to the target forgotten, so the end of the new trials decides afresh."""
    return status.model_copy(
        update={"phase": "Tuning", "confirmation": None, "applied": False, "restored": False}
    )


def reopens(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> bool:
    """A converged study whose trials the edited spec would continue (maxTrials raised,
    patience lengthened)."""
    if status.phase != "Converged":
        return False
    generation = status.observed_generation or 0
    return decisions.plan(spec, reopened(status), generation).kind == "trial"


def chosen_params(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> Params | None:
    """The configuration the finished study would write back: the confirmed winner when
    its gain was proven, the best trial when nothing was confirmed and it measured
    minGainPercent above the incumbent, else None (also when that best trial is the
    incumbent's own configuration: writing it would only take the target's fields over)."""
    confirmation = status.confirmation
    if confirmation is not None:
        verdict = decisions.verdict_of(confirmation, spec)
        return decisions.params_of(confirmation, verdict.chosen) if verdict.significant else None
    best = decisions.best_trial(status.trials)
    if (
        best is None
        or decisions.incumbent_unbeaten(spec, status.trials, best)
        or decisions.study_gain_shortfall(spec, status.trials, best) is not None
    ):
        return None
    return dict(best.params)


def write_back_action(
    spec: InferenceServiceSpec, status: InferenceServiceStatus
) -> WriteBackAction | None:
    """For a converged study under an edited writeBack: `apply` the chosen configuration
    now (Recommend → Apply), `withhold` it by putting the original back (Apply →
    Recommend after it was written), or nothing."""
    if status.phase != "Converged":
        return None
    if spec.tuning.write_back == "Apply" and not status.applied:
        return "apply" if chosen_params(spec, status) is not None else None
    if spec.tuning.write_back == "Recommend" and status.applied:
        return "withhold" if status.original is not None else None
    return None
