"""What a study does with a spec edit it adopts (see specdiff): a finished study with
more trials to run reopens (a changed writeBack: decisions.write_back_action)."""

from __future__ import annotations

from batchpilot.operator import decisions
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import InferenceServiceStatus


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
