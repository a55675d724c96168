"""Five-field cron expressions (minute hour day-of-month month day-of-week), parsed with
full validation and evaluated in a time zone.

The operator needs only "the next time this fires after t" for maintenance windows and
re-tune schedules, so a small parser is kept here rather than a dependency. Syntax:
`*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists `a,b-c`, month names
(jan..dec) and weekday names (sun..sat; 0 and 7 are both Sunday). As in Vixie cron, a
day matches when day-of-month OR day-of-week matches if both are restricted.
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
        local = after.astimezone(zone)
        start = (local + timedelta(minutes=1)).replace(second=0, microsecond=0)
        day = start.date()
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                first_day = day == start.date()
                for hour in self.hours:
                    if first_day and hour < start.hour:
                        continue
                    for minute in self.minutes:
                        wall = datetime.combine(day, time(hour, minute), tzinfo=zone)
                        fired = wall.astimezone(UTC)
                        if fired > after:
                            return fired
            day += timedelta(days=1)
        raise CronError(f"{self.text!r} does not fire within {_SEARCH_DAYS // 366} years")


def _longest(month: int) -> int:
    return (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
