"""Event dedupe: a Warning that repeats on every retry is posted once, not once per
retry with a new text each time.

Rule: per InferenceService and reason, a Warning is posted at most once per `window_s`
(default 10 minutes), whatever its text; the next one after the window says how many
were held back. Normal events pass unchanged (they mark progress and each says
something new), except the reasons in REPEATING_NORMAL, which say again on every trial
what was already said (with a figure that changes each time) and follow the Warnings'
rule; the reasons in PER_OCCURRENCE, which report one trial, one confirmation round or
one refused spec generation each, always pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_WINDOW_S = 600.0
# one trial, one round, one failed study, one refused spec generation (posted once each)
PER_OCCURRENCE = frozenset({"Trial", "Confirmation", "StudyFailed", "InvalidSpec"})
# Normal events a study would post before every measurement: production's live traffic
# taken off InPlace steps (its rate differs a little every time)
REPEATING_NORMAL = frozenset({"LiveTraffic"})


@dataclass
class _Seen:
    posted_at: float
    held: int = 0


@dataclass
class EventLimiter:
    window_s: float = DEFAULT_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, _Seen] = field(default_factory=dict)

    def admit(self, type: str, reason: str, message: str) -> str | None:
        """The text to post for this event, or None to hold it back."""
        if reason in PER_OCCURRENCE or (type != "Warning" and reason not in REPEATING_NORMAL):
            return message
        now = self.clock()
        seen = self._seen.get(reason)
        if seen is not None and now - seen.posted_at < self.window_s:
            seen.held += 1
            return None
        held = seen.held if seen is not None else 0
        self._seen[reason] = _Seen(posted_at=now)
        if held:
            minutes = self.window_s / 60.0
            return f"{message} ({held} more like it in the last {minutes:g} min)"
        return message
