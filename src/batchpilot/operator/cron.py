"""Five-field cron expressions (minute hour day-of-month month day-of-week), parsed with
full validation and evaluated in a time zone.

The operator needs only "the next time this fires after t" for maintenance windows and
re-tune schedules, so a small parser is kept here rather than a dependency. Syntax:
`*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists `a,b-c`, month names
(jan..dec) and weekday names (sun..sat; 0 and 7 are both Sunday). As in Vixie cron, a
day matches when day-of-month OR day-of-week matches if both are restricted.

Daylight-saving transitions follow Vixie cron (the rule Debian's cron(8) documents). An
expression whose minute and hour fields are both fixed (neither starts with `*`) fires
once a day per time it names: a time the clock skips forward over fires at the moment
of the jump, and a time the clock repeats fires at its first occurrence only. Any
other expression (`*/15 * * * *`, `0 * * * *`) runs on the clock as it goes: a skipped
time does not occur, and a repeated one fires at both occurrences.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names whose index + offset is the value)
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...], int], ...] = (
    ("minute", 0, 59, (), 0),
    ("hour", 0, 23, (), 0),
    ("day of month", 1, 31, (), 0),
    ("month", 1, 12, _MONTHS, 1),
    ("day of week", 0, 7, _DAYS, 0),
)
# every pattern repeats within 28 years (the Gregorian weekday and leap cycle); a
# pattern that never matches (Feb 30) is refused at parse time, so this only bounds
# a search that cannot otherwise end
_SEARCH_DAYS = 366 * 28
# longer than any clock change the time zone database holds (two hours, Antarctica/Troll):
# how far ahead a repeated wall-clock time is looked for, and a skipped one's jump
_LONGEST_SHIFT = timedelta(hours=3)


class CronError(ValueError):
    """A cron expression that cannot be used; the message says what and what is allowed."""


def _value(text: str, field: str, low: int, high: int, names: tuple[str, ...], offset: int) -> int:
    lowered = text.lower()
    if lowered in names:
        return names.index(lowered) + offset
    if not text.isdigit():
        allowed = f"a number {low}-{high}" + (f" or a name ({', '.join(names)})" if names else "")
        raise CronError(f"{field}: {text!r} is not {allowed}")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{field}: {value} is outside {low}-{high}")
    return value


def _field(text: str, spec: tuple[str, int, int, tuple[str, ...], int]) -> frozenset[int]:
    field, low, high, names, offset = spec
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field}: empty list item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first = _value(a, field, low, high, names, offset)
            last = _value(b, field, low, high, names, offset)
            if first > last:
                raise CronError(f"{field}: range {base!r} runs backwards")
        else:
            first = _value(base, field, low, high, names, offset)
            # `5/15` means 5, 20, 35, 50 (from 5 to the end, every 15)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool
    # minute and hour both fixed: the DST rule for fixed times applies (module docstring)
    fixed_time: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                f"{text!r} has {len(parts)} fields; a cron expression has 5: "
                "minute hour day-of-month month day-of-week (e.g. '0 2 * * sat')"
            )
        sets = [_field(p, spec) for p, spec in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        cron = cls(
            text=text,
            minutes=tuple(sorted(sets[0])),
            hours=tuple(sorted(sets[1])),
            days=sets[2],
            months=sets[3],
            weekdays=weekdays,
            days_restricted=not parts[2].startswith("*"),
            weekdays_restricted=not parts[4].startswith("*"),
            fixed_time=not (parts[0].startswith("*") or parts[1].startswith("*")),
        )
        if not cron.weekdays_restricted and not any(
            day <= _longest(month) for day in cron.days for month in cron.months
        ):
            raise CronError(f"{text!r} never fires: no month it names has such a day")
        return cron

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def next_after(self, after: datetime, zone: tzinfo = UTC) -> datetime:
        """The first time strictly after `after` (an aware datetime) at which this fires,
        read on the wall clock of `zone`; returned in UTC."""
        local = after.astimezone(zone).replace(tzinfo=None)
        # A wall-clock time earlier than `after`'s can still come after it when the clock
        # is about to be set back: start from the earliest wall time the next few hours
        # show (without a change ahead, `after`'s own minute).
        ahead = (after + _LONGEST_SHIFT).astimezone(zone).replace(tzinfo=None)
        earliest = min(local, ahead - _LONGEST_SHIFT).replace(second=0, microsecond=0)
        best: datetime | None = None
        day = earliest.date()
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                for hour in self.hours:
                    if day == earliest.date() and hour < earliest.hour:
                        continue
                    for minute in self.minutes:
                        wall = datetime.combine(day, time(hour, minute))
                        if wall < earliest:
                            continue
                        fired = self._firings(wall, zone)
                        later = [t for t in fired if t > after]
                        if later and (best is None or min(later) < best):
                            best = min(later)
                        # Each wall time's first firing comes no earlier than the one
                        # before it (a skipped time fires at the jump, a repeated one
                        # first on its first pass), and a second firing comes after its
                        # own first: once a first firing is past `after`, no later wall
                        # time can fire sooner.
                        if fired and fired[0] > after:
                            assert best is not None
                            return best
            day += timedelta(days=1)
        raise CronError(f"{self.text!r} does not fire within {_SEARCH_DAYS // 366} years")

    def _firings(self, wall: datetime, zone: tzinfo) -> list[datetime]:
        """When the naive wall-clock time `wall` fires in `zone`, in UTC, earliest first:
        once; never or at the jump when the clock skips it; once or twice when the clock
        repeats it (the module docstring's rule)."""
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if first.astimezone(zone).replace(tzinfo=None) != wall:  # skipped
            return [_end_of_jump(wall, zone)] if self.fixed_time else []
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if second != first and not self.fixed_time:  # repeated
            return [first, second]
        return [first]


def _end_of_jump(skipped: datetime, zone: tzinfo) -> datetime:
    """The moment the clock jumped over the naive wall-clock time `skipped`, in UTC: the
    first minute after it that the clock shows (clocks change on whole minutes)."""
    wall = skipped
    while wall - skipped <= _LONGEST_SHIFT:
        wall += timedelta(minutes=1)
        instant = wall.replace(tzinfo=zone).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            return instant
    raise CronError(f"{zone}: no wall-clock time within {_LONGEST_SHIFT} after {skipped}")


def _longest(month: int) -> int:
    return (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
