"""kstatus conditions, the spec split (restart or adopt), adopting an edit, and the
event limiter: pure functions, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from batchpilot.operator import adopt, decisions, kstatus, specdiff
from batchpilot.operator.events import EventLimiter
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.status import (
    Condition,
    InferenceServiceStatus,
    OriginalConfig,
    Result,
    TrialEntry,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BASE: dict[str, Any] = {
    "target": {"name": "resnet", "container": "server"},
    "sla": {"p99LatencyMs": 300},
    "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
    "tuning": {"maxTrials": 3, "finalists": 0},
}


def spec(**changes: Any) -> InferenceServiceSpec:
    raw = {**BASE, **{k: v for k, v in changes.items() if k != "tuning"}}
    raw["tuning"] = {**BASE["tuning"], **changes.get("tuning", {})}
    return parse_spec(raw)


def conditions(status: InferenceServiceStatus) -> dict[str, Condition]:
    return {c.type: c for c in status.conditions}


@pytest.mark.parametrize(
    ("phase", "ready", "reconciling", "stalled"),
    [
        ("Pending", "False", "True", "False"),
        ("Baseline", "False", "True", "False"),
        ("Tuning", "False", "True", "False"),
        ("Confirming", "False", "True", "False"),
        ("Converged", "True", "False", "False"),
        ("Failed", "False", "False", "True"),
        ("RolledBack", "False", "False", "True"),
    ],
)
def test_kstatus_conditions_follow_the_phase(
    phase: str, ready: str, reconciling: str, stalled: str
) -> None:
    status = InferenceServiceStatus(phase=phase, observed_generation=4, message="news")  # type: ignore[arg-type]
    found = conditions(kstatus.with_kstatus(status, NOW))
    assert (found["Ready"].status, found["Reconciling"].status, found["Stalled"].status) == (
        ready,
        reconciling,
        stalled,
    )
    assert {c.observed_generation for c in found.values()} == {4}
    assert found["Reconciling"].message == "news"


@pytest.mark.parametrize("reason", ["TargetNotFound", "TargetTaken"])
def test_a_study_blocked_on_the_user_is_stalled_not_reconciling(reason: str) -> None:
    blocked = decisions.set_condition(
        [],
        type="TargetReady",
        status="False",
        reason=reason,
        message="deployment resnet not found in namespace ml",
        generation=2,
        now=NOW,
    )
    status = InferenceServiceStatus(
        phase="Pending", observed_generation=2, message="waiting", conditions=blocked
    )
    found = conditions(kstatus.with_kstatus(status, NOW))
    assert (found["Ready"].status, found["Reconciling"].status, found["Stalled"].status) == (
        "False",
        "False",
        "True",
    )
    assert found["Stalled"].reason == reason
    assert found["Stalled"].message == "deployment resnet not found in namespace ml"
    # a target problem a retry can clear stays in progress
    transient = [c.model_copy(update={"reason": "Unreachable"}) for c in blocked]
    status = status.model_copy(update={"conditions": transient})
    assert conditions(kstatus.with_kstatus(status, NOW))["Reconciling"].status == "True"


def test_ready_keeps_the_reason_its_setter_gave() -> None:
    given = decisions.set_condition(
        [], type="Ready", status="True", reason="NoSignificantGain", message="stays",
        generation=1, now=NOW,
    )  # fmt: skip
    status = InferenceServiceStatus(phase="Converged", observed_generation=2, conditions=given)
    ready = conditions(kstatus.with_kstatus(status, NOW + timedelta(hours=1)))["Ready"]
    assert (ready.reason, ready.message, ready.observed_generation) == (
        "NoSignificantGain",
        "stays",
        2,
    )
    assert ready.last_transition_time == NOW  # status did not change


def test_stalled_names_an_invalid_spec_and_degraded_is_not_ready() -> None:
    invalid = decisions.set_condition(
        [], type="SpecValid", status="False", reason="InvalidSpec", message="bad",
        generation=3, now=NOW,
    )  # fmt: skip
    status = InferenceServiceStatus(phase="Failed", observed_generation=3, conditions=invalid)
    assert conditions(kstatus.with_kstatus(status, NOW))["Stalled"].reason == "InvalidSpec"
    degraded = decisions.set_condition(
        [], type="Degraded", status="True", reason="RolledBack", message="crash loop",
        generation=3, now=NOW,
    )  # fmt: skip
    status = InferenceServiceStatus(phase="Converged", observed_generation=3, conditions=degraded)
    ready = conditions(kstatus.with_kstatus(status, NOW))["Ready"]
    assert (ready.status, ready.reason) == ("False", "RolledBack")


def trial(number: int, rps: float, batch: int = 8) -> TrialEntry:
    return TrialEntry(
        number=number,
        params={"max_batch_size": batch, "max_queue_time_ms": 5.0},
        source="baseline" if number == 0 else "sampler",
        state="Complete",
        effective_rps=rps,
    )


def result(rps: float, gain: float | None = None) -> Result:
    return Result(max_batch_size=8, max_queue_time_ms=5.0, effective_rps=rps, gain_percent=gain)


def test_summary_fields_for_the_printer_columns() -> None:
    status = InferenceServiceStatus(
        trials=[trial(0, 100.0), trial(1, 125.0)], best=result(125.0), baseline=result(100.0)
    )
    summary = kstatus.with_summary(status, spec(tuning={"maxTrials": 20}), measured_pods=3)
    assert summary.trials_progress == "2/20"
    assert summary.gain_percent == 25.0  # from the trials when nothing was confirmed
    assert (summary.measured_pods, summary.rate_scope) == (3, "fleet")
    confirmed = status.model_copy(update={"best": result(125.0, gain=21.5)})
    one = kstatus.with_summary(confirmed, spec(), measured_pods=1)
    assert (one.gain_percent, one.rate_scope) == (21.5, "per-pod")
    # a write without a measurement keeps what the last one counted
    assert kstatus.with_summary(summary, spec(), measured_pods=None).measured_pods == 3


@pytest.mark.parametrize(
    "tuning",
    [
        {"writeBack": "Recommend"},
        {"maxTrials": 30},
        {"patience": 4},
        {"maxFailures": 9},
        {"trialDeadlineSeconds": 60},
    ],
)
def test_steering_edits_do_not_restart_the_study(tuning: dict[str, Any]) -> None:
    old, new = spec(), spec(tuning=tuning)
    assert specdiff.restarting_changes(old, new) == []
    assert specdiff.study_fingerprint(old) == specdiff.study_fingerprint(new)


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"target": {"name": "other", "container": "server"}}, "target.name"),
        ({"sla": {"p99LatencyMs": 200}}, "sla.p99LatencyMs"),
        ({"parameters": {"maxBatchSize": {"min": 2, "max": 64}}}, "parameters.maxBatchSize.min"),
        ({"apply": {"method": "Live", "live": {"port": 9, "path": "/a"}}}, "apply.live"),
        ({"load": {**BASE["load"], "stepSeconds": 9}}, "load.stepSeconds"),
        ({"load": {**BASE["load"], "maxRps": 50}}, "load.maxRps"),
        (
            {"tuning": {"strategy": "InPlace"}, "load": {**BASE["load"], "maxRps": 50}},
            "tuning.strategy",
        ),
        ({"tuning": {"seed": 3}}, "tuning.seed"),
    ],
)
def test_measurement_edits_restart_the_study(changes: dict[str, Any], path: str) -> None:
    old, new = spec(), spec(**changes)
    assert path in specdiff.restarting_changes(old, new)
    assert specdiff.restarts_study(old, new)


def converged(**changes: Any) -> InferenceServiceStatus:
    base = InferenceServiceStatus(
        phase="Converged",
        observed_generation=1,
        original=OriginalConfig(params={"max_batch_size": 4, "max_queue_time_ms": 1.0}),
        trials=[trial(0, 100.0, batch=4), trial(1, 150.0, batch=8), trial(2, 120.0, batch=16)],
        study_fingerprint=specdiff.study_fingerprint(spec()),
    )
    return base.model_copy(update=changes)


def test_plan_adopts_a_steering_edit_and_restarts_on_the_rest() -> None:
    status = converged()
    assert decisions.plan(spec(tuning={"writeBack": "Recommend"}), status, 2).kind == "adopt-spec"
    assert decisions.plan(spec(sla={"p99LatencyMs": 9}), status, 2).kind == "new-study"
    # a failed study is rerun by any edit; a status from before fingerprints restarts too
    assert decisions.plan(spec(), status.model_copy(update={"phase": "Failed"}), 2).kind == (
        "new-study"
    )
    unmarked = status.model_copy(update={"study_fingerprint": None})
    assert decisions.plan(spec(), unmarked, 2).kind == "new-study"


def test_write_back_follows_an_edited_write_back() -> None:
    recommend_done = converged(applied=False)
    assert (
        decisions.write_back_action(spec(tuning={"writeBack": "Apply"}), recommend_done) == "apply"
    )
    assert decisions.chosen_params(spec(), recommend_done) == {
        "max_batch_size": 8,
        "max_queue_time_ms": 5.0,
    }
    applied = converged(applied=True)
    assert (
        decisions.write_back_action(spec(tuning={"writeBack": "Recommend"}), applied) == "withhold"
    )
    assert decisions.write_back_action(spec(tuning={"writeBack": "Apply"}), applied) is None
    running = converged(phase="Tuning")
    assert decisions.write_back_action(spec(), running) is None


def test_an_edited_write_back_never_writes_an_unbeaten_incumbent() -> None:
    # the study ended NoSignificantGain with no finalist: its best trial is the baseline
    unbeaten = converged(applied=False, trials=[trial(0, 150.0, batch=4), trial(1, 100.0, batch=8)])
    apply = spec(tuning={"writeBack": "Apply", "finalists": 1})
    assert decisions.chosen_params(apply, unbeaten) is None
    assert decisions.write_back_action(apply, unbeaten) is None
    # without a confirmation asked for, the gain gate holds on the study's figures: the
    # incumbent's own configuration gains 0 %, below minGainPercent 5
    no_confirmation = spec(tuning={"writeBack": "Apply", "finalists": 0})
    assert decisions.chosen_params(no_confirmation, unbeaten) is None
    assert decisions.write_back_action(no_confirmation, unbeaten) is None
    # with no gain asked for, the best trial is the study's answer
    any_gain = spec(tuning={"writeBack": "Apply", "finalists": 0, "minGainPercent": 0})
    assert decisions.chosen_params(any_gain, unbeaten) == {
        "max_batch_size": 4,
        "max_queue_time_ms": 5.0,
    }


def test_more_trials_reopen_a_converged_study() -> None:
    status = converged(applied=True)
    assert not adopt.reopens(spec(), status)  # 3 of 3 done
    more = spec(tuning={"maxTrials": 5})
    assert adopt.reopens(more, status)
    reopened = adopt.reopened(status)
    assert (reopened.phase, reopened.applied, reopened.trials) == ("Tuning", False, status.trials)
    assert decisions.plan(more, reopened, 1).kind == "trial"


def test_a_repeated_warning_is_posted_once_per_window() -> None:
    now = [0.0]
    limiter = EventLimiter(window_s=600.0, clock=lambda: now[0])
    assert limiter.admit("Warning", "APIError", "500: a") == "500: a"
    for attempt in range(5):
        now[0] += 10.0
        assert limiter.admit("Warning", "APIError", f"500: retry {attempt}") is None
    assert limiter.admit("Warning", "TargetNotFound", "gone") == "gone"  # per reason
    assert limiter.admit("Normal", "TrialStarted", "Trial 1") == "Trial 1"
    assert limiter.admit("Warning", "Trial", "Trial 2 failed") == "Trial 2 failed"
    assert limiter.admit("Warning", "Trial", "Trial 3 failed") == "Trial 3 failed"
    now[0] += 600.0
    assert limiter.admit("Warning", "APIError", "500: b") == (
        "500: b (5 more like it in the last 10 min)"
    )


def test_a_normal_event_repeated_on_every_trial_is_posted_once_per_window() -> None:
    now = [0.0]
    limiter = EventLimiter(window_s=600.0, clock=lambda: now[0])
    assert limiter.admit("Normal", "LiveTraffic", "30.0 req/s") == "30.0 req/s"
    for trial in range(3):
        now[0] += 60.0
        assert limiter.admit("Normal", "LiveTraffic", f"3{trial}.5 req/s") is None
    assert limiter.admit("Normal", "CanaryIsolated", "a") == "a"
    assert limiter.admit("Normal", "CanaryIsolated", "a") == "a"
    now[0] += 600.0
    assert limiter.admit("Normal", "LiveTraffic", "31.0 req/s") == (
        "31.0 req/s (3 more like it in the last 10 min)"
    )
