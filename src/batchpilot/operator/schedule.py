"""When a study may send load (tuning.window) and when a converged study starts over
(tuning.retune), as pure functions of the spec, the status and `now`.

A window opens at each time its cron start fires and stays open durationMinutes;
windows that touch or overlap count as one. A trial starts only when the open window
still covers trialDeadlineSeconds, the longest it may take, so a trial running at the
close has finished (or been cut at its deadline) by then.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from batchpilot.operator.cron import Cron
from batchpilot.operator.spec import InferenceServiceSpec, WindowSpec, duration_seconds
from batchpilot.operator.status import InferenceServiceStatus

# merging touching windows stops once the close is this far past what was asked for:
# an every-minute start with a long duration is one endless window, not a loop
_MERGE_LIMIT = 10_000


@dataclass(frozen=True)
class WindowState:
    open: bool
    # open: when the (merged) window closes, at least as far as was asked for
    closes_at: datetime | None = None
    # closed: when the next window opens
    opens_at: datetime | None = None


def window_state(window: WindowSpec, now: datetime, *, horizon_s: float) -> WindowState:
    """Whether `now` lies in a window; `horizon_s` bounds how far ahead the close of an
    open window is followed through windows that touch it."""
    cron = Cron.parse(window.start)
    zone = ZoneInfo(window.time_zone)
    length = timedelta(minutes=window.duration_minutes)
    # the earliest start whose window still covers now
    first = cron.next_after(now - length, zone)
    if first > now:
        return WindowState(open=False, opens_at=first)
    closes = first + length
    fired = first
    enough = now + timedelta(seconds=horizon_s)
    for _ in range(_MERGE_LIMIT):
        if closes >= enough:
            break
        fired = cron.next_after(fired, zone)
        if fired > closes:
            break
        closes = max(closes, fired + length)
    return WindowState(open=True, closes_at=closes)


@dataclass(frozen=True)
class WindowGate:
    """Whether a trial may start now, and if not, what the study says and until when."""

    may_start: bool
    message: str
    until: datetime | None = None


def _shown(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def trial_gate(spec: InferenceServiceSpec, now: datetime) -> WindowGate:
    window = spec.tuning.window
    if window is None:
        return WindowGate(True, "no maintenance window: trials may run at any time")
    deadline = spec.tuning.trial_deadline_seconds
    state = window_state(window, now, horizon_s=deadline)
    if state.open:
        assert state.closes_at is not None  # an open state carries its close
        if state.closes_at - now >= timedelta(seconds=deadline):
            return WindowGate(
                True, f"inside the maintenance window until {_shown(state.closes_at)}"
            )
        # too late in this window for a whole trial: the next one that starts after it
        cron, zone = Cron.parse(window.start), ZoneInfo(window.time_zone)
        opens = cron.next_after(state.closes_at - timedelta(microseconds=1), zone)
        message = (
            f"the maintenance window closes at {_shown(state.closes_at)}, before a trial "
            f"could finish (tuning.trialDeadlineSeconds {deadline}); waiting until the next "
            f"window opens at {_shown(opens)}"
        )
        return WindowGate(False, message, until=opens)
    assert state.opens_at is not None  # a closed state carries the next opening
    message = (
        f"outside the maintenance window ({window.start!r} {window.time_zone}, "
        f"{window.duration_minutes} min): no load until it opens at {_shown(state.opens_at)}"
    )
    return WindowGate(False, message, until=state.opens_at)


RetuneAction = Literal["none", "schedule", "check", "retune"]


@dataclass(frozen=True)
class RetuneStep:
    """What a converged study does about re-tuning now: nothing, (re)schedule the next
    tick or check at `at`, check the SLA now, or start a new study."""

    action: RetuneAction
    at: datetime | None = None
    why: str = ""


def retune_key(spec: InferenceServiceSpec) -> str:
    """What the status's next re-tune time was computed from: an edit that changes it
    reschedules."""
    tuning = spec.tuning
    if tuning.retune == "OnSLABreach":
        return f"OnSLABreach/{tuning.retune_window}"
    return tuning.retune


def next_retune(spec: InferenceServiceSpec, now: datetime) -> datetime | None:
    tuning = spec.tuning
    if tuning.retune == "Never":
        return None
    if tuning.retune == "OnSLABreach":
        return now + timedelta(seconds=duration_seconds(tuning.retune_window))
    return Cron.parse(tuning.retune).next_after(now)


def retune_step(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime
) -> RetuneStep:
    """The re-tune decision for a study that is over. Only a Converged study re-tunes:
    a Failed or RolledBack one waits for the user. The SLA is checked at most once per
    retuneWindow, a schedule fires once per tick."""
    if status.phase != "Converged" or spec.tuning.retune == "Never" or spec.suspend:
        return RetuneStep("none")
    due = status.next_retune_at
    if due is None or status.retune_key != retune_key(spec):
        return RetuneStep("schedule", at=next_retune(spec, now))
    if now < due:
        return RetuneStep("none")
    if spec.tuning.retune == "OnSLABreach":
        return RetuneStep("check", at=next_retune(spec, now))
    return RetuneStep("retune", why=f"scheduled re-tune ({spec.tuning.retune!r}) at {_shown(due)}")
