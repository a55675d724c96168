"""Maintenance windows, re-tune decisions and suspend as pure functions of the spec, the
status and an injected clock: cron parsing, window state, the trial gate, should-retune,
the spec's rules, what an edit restarts and what kstatus says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from batchpilot.operator import kstatus, schedule, specdiff
from batchpilot.operator.cron import Cron, CronError
from batchpilot.operator.spec import (
    InferenceServiceSpec,
    WindowSpec,
    duration_seconds,
    explain_validation_error,
    parse_spec,
)
from batchpilot.operator.status import Condition, InferenceServiceStatus

TUESDAY = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BASE: dict[str, Any] = {
    "target": {"name": "resnet", "container": "server"},
    "sla": {"p99LatencyMs": 300},
    "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
    "tuning": {"maxTrials": 3, "finalists": 0, "trialDeadlineSeconds": 900},
}
PROMETHEUS_LOAD: dict[str, Any] = {
    "endpoint": {"port": 8080, "path": "/v1/predict"},
    "source": "prometheus",
    "prometheus": {"url": "http://prometheus:9090"},
}


def spec(
    load: dict[str, Any] | None = None, suspend: bool = False, **tuning: Any
) -> InferenceServiceSpec:
    raw = {**BASE, "tuning": {**BASE["tuning"], **tuning}, "suspend": suspend}
    if load is not None:
        raw["load"] = load
    return parse_spec(raw)


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC)


# --- cron -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "after", "expected"),
    [
        ("0 2 * * *", at(1, 12), at(2, 2)),
        ("0 2 * * *", at(1, 1, 59), at(1, 2)),
        ("0 2 * * sat", TUESDAY, at(5, 2)),  # 2026-12-05 is a Saturday
        ("*/15 * * * *", at(1, 12, 7), at(1, 12, 15)),
        ("*/15 * * * *", at(1, 12, 15), at(1, 12, 30)),  # strictly after
        ("30 9-17/4 * * mon-fri", at(1, 10), at(1, 13, 30)),
        ("0 0 1 jan *", TUESDAY, datetime(2027, 1, 1, tzinfo=UTC)),
        # both day fields restricted: either matches (the 15th, or a Sunday: the 6th)
        ("0 0 15 * 0", TUESDAY, at(6, 0)),
        ("0 0 * * 7", TUESDAY, at(6, 0)),  # 7 is Sunday too
        ("0 0 29 feb *", TUESDAY, datetime(2028, 2, 29, tzinfo=UTC)),
    ],
)
def test_cron_next_fire(text: str, after: datetime, expected: datetime) -> None:
    assert Cron.parse(text).next_after(after) == expected


def test_cron_reads_the_wall_clock_of_its_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 02:00 in Berlin is 01:00 UTC in winter
    assert Cron.parse("0 2 * * *").next_after(TUESDAY, berlin) == at(2, 1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0 2 * *", "has 4 fields; a cron expression has 5"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("0 24 * * *", "hour: 24 is outside 0-23"),
        ("*/0 * * * *", "step '0' must be a positive number"),
        ("5-1 * * * *", "range '5-1' runs backwards"),
        ("0 2 * * funday", "is not a number 0-7 or a name (sun, mon"),
        ("0 2 * smarch *", "month: 'smarch' is not a number 1-12 or a name"),
        ("0 2 30 feb *", "never fires"),
        ("0,,5 * * * *", "empty list item"),
    ],
)
def test_cron_refuses_bad_expressions_saying_what_is_allowed(text: str, says: str) -> None:
    with pytest.raises(CronError) as caught:
        Cron.parse(text)
    assert says in str(caught.value)


# --- windows --------------------------------------------------------------------------


NIGHTLY = WindowSpec(start="0 2 * * *", duration_minutes=120)


def test_window_state_before_inside_and_after() -> None:
    before = schedule.window_state(NIGHTLY, at(1, 1), horizon_s=900)
    assert (before.open, before.opens_at) == (False, at(1, 2))
    inside = schedule.window_state(NIGHTLY, at(1, 2, 30), horizon_s=900)
    assert (inside.open, inside.closes_at) == (True, at(1, 4))
    closed_at_the_close = schedule.window_state(NIGHTLY, at(1, 4), horizon_s=900)
    assert (closed_at_the_close.open, closed_at_the_close.opens_at) == (False, at(2, 2))


def test_touching_windows_are_one() -> None:
    hourly = WindowSpec(start="0 * * * *", duration_minutes=60)
    state = schedule.window_state(hourly, at(1, 12, 30), horizon_s=3 * 3600)
    assert state.open
    assert state.closes_at is not None
    assert state.closes_at >= at(1, 15, 30)


def test_trial_gate_without_a_window_always_opens() -> None:
    assert schedule.trial_gate(spec(), TUESDAY).may_start


def test_trial_gate_waits_outside_the_window_and_says_until_when() -> None:
    nightly = spec(window={"start": "0 2 * * *", "durationMinutes": 120})
    gate = schedule.trial_gate(nightly, at(1, 12))
    assert not gate.may_start
    assert gate.until == at(2, 2)
    assert "outside the maintenance window" in gate.message
    assert "2026-12-02T02:00:00Z" in gate.message
    assert schedule.trial_gate(nightly, at(2, 2, 5)).may_start


def test_no_trial_starts_that_could_not_finish_before_the_close() -> None:
    nightly = spec(window={"start": "0 2 * * *", "durationMinutes": 120})
    # 15 min (the trial deadline) before the close is the last start
    assert schedule.trial_gate(nightly, at(1, 3, 45)).may_start
    late = schedule.trial_gate(nightly, at(1, 3, 46))
    assert not late.may_start
    assert late.until == at(2, 2)
    assert "before a trial could finish" in late.message


def test_window_time_zone() -> None:
    berlin = spec(window={"start": "0 2 * * *", "durationMinutes": 60, "timeZone": "Europe/Berlin"})
    assert schedule.trial_gate(berlin, at(2, 1, 10)).may_start
    assert not schedule.trial_gate(berlin, at(2, 2, 10)).may_start


# --- re-tuning ------------------------------------------------------------------------


def converged(**kw: Any) -> InferenceServiceStatus:
    return InferenceServiceStatus(phase="Converged", observed_generation=1, **kw)


def test_never_and_unfinished_studies_do_not_retune() -> None:
    assert schedule.retune_step(spec(), converged(), TUESDAY).action == "none"
    hourly = spec(retune="0 * * * *")
    tuning = InferenceServiceStatus(phase="Tuning", observed_generation=1)
    assert schedule.retune_step(hourly, tuning, TUESDAY).action == "none"
    failed = InferenceServiceStatus(phase="Failed", observed_generation=1)
    assert schedule.retune_step(hourly, failed, TUESDAY).action == "none"
    suspended = spec(retune="0 * * * *", suspend=True)
    assert schedule.retune_step(suspended, converged(), TUESDAY).action == "none"


def test_a_schedule_retunes_at_each_tick() -> None:
    hourly = spec(retune="0 * * * *")
    first = schedule.retune_step(hourly, converged(), at(1, 12, 10))
    assert (first.action, first.at) == ("schedule", at(1, 13))
    scheduled = converged(next_retune_at=first.at, retune_key=schedule.retune_key(hourly))
    assert schedule.retune_step(hourly, scheduled, at(1, 12, 59)).action == "none"
    due = schedule.retune_step(hourly, scheduled, at(1, 13))
    assert due.action == "retune"
    assert "scheduled re-tune" in due.why


def test_sla_breach_is_checked_at_most_once_per_window() -> None:
    watched = spec(load=PROMETHEUS_LOAD, retune="OnSLABreach", retuneWindow="10m")
    first = schedule.retune_step(watched, converged(), at(1, 12))
    assert (first.action, first.at) == ("schedule", at(1, 12, 10))
    scheduled = converged(next_retune_at=first.at, retune_key=schedule.retune_key(watched))
    for minute in (1, 5, 9):
        assert schedule.retune_step(watched, scheduled, at(1, 12, minute)).action == "none"
    check = schedule.retune_step(watched, scheduled, at(1, 12, 10))
    assert (check.action, check.at) == ("check", at(1, 12, 20))


def test_an_edited_retune_reschedules() -> None:
    hourly = spec(retune="0 * * * *")
    scheduled = converged(next_retune_at=at(1, 13), retune_key=schedule.retune_key(hourly))
    daily = spec(retune="0 3 * * *")
    step = schedule.retune_step(daily, scheduled, at(1, 12, 10))
    assert (step.action, step.at) == ("schedule", at(2, 3))


# --- the spec -------------------------------------------------------------------------


def refused(**kw: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        spec(**kw)
    return explain_validation_error(caught.value)


def test_spec_rules_name_what_is_wrong() -> None:
    assert "a cron expression has 5" in refused(window={"start": "0 2 * *", "durationMinutes": 60})
    assert "hour: 25 is outside 0-23" in refused(
        window={"start": "0 25 * * *", "durationMinutes": 60}
    )
    assert "is not an IANA time zone" in refused(
        window={"start": "0 2 * * *", "durationMinutes": 60, "timeZone": "Mars/Olympus"}
    )
    assert "must cover tuning.trialDeadlineSeconds" in refused(
        window={"start": "0 2 * * *", "durationMinutes": 10}
    )
    assert "Never, OnSLABreach, or a 5-field cron" in refused(retune="Sometimes")
    assert "needs load.source prometheus" in refused(retune="OnSLABreach")
    assert "s, m or h" in refused(retuneWindow="10d")
    assert "from 1m to 168h" in refused(retuneWindow="30s")


def test_duration_seconds() -> None:
    assert duration_seconds("10m") == 600
    assert duration_seconds("2h") == 7200
    assert duration_seconds("90s") == 90


def test_window_retune_and_suspend_edits_do_not_restart_a_study() -> None:
    old = spec()
    for new in (
        spec(window={"start": "0 2 * * *", "durationMinutes": 120}),
        spec(retune="0 * * * *"),
        spec(suspend=True),
    ):
        assert specdiff.restarting_changes(old, new) == []
        assert specdiff.study_fingerprint(old) == specdiff.study_fingerprint(new)


# --- kstatus --------------------------------------------------------------------------


def kstatus_of(status: InferenceServiceStatus) -> dict[str, tuple[str, str]]:
    found = kstatus.with_kstatus(status, TUESDAY).conditions
    return {
        c.type: (c.status, c.reason) for c in found if c.type in ("Ready", "Reconciling", "Stalled")
    }


def test_suspended_is_not_ready_and_not_stalled() -> None:
    status = InferenceServiceStatus(phase="Tuning", observed_generation=1, suspended=True)
    assert kstatus_of(status) == {
        "Ready": ("False", "Suspended"),
        "Reconciling": ("False", "Suspended"),
        "Stalled": ("False", "Suspended"),
    }


def test_outside_the_window_is_reconciling_with_the_reason() -> None:
    waiting = Condition(
        type="InWindow",
        status="False",
        reason="OutsideWindow",
        message="outside",
        last_transition_time=TUESDAY - timedelta(minutes=1),
    )
    status = InferenceServiceStatus(phase="Tuning", observed_generation=1, conditions=[waiting])
    assert kstatus_of(status)["Reconciling"] == ("True", "OutsideWindow")
    assert kstatus_of(status)["Stalled"] == ("False", "OutsideWindow")
