"""Cron expressions across daylight-saving transitions, as Vixie cron (and Debian's cron)
runs them: a fixed time (minute and hour both fixed) fires once a day, at the jump when
the clock skips it and on its first pass when the clock repeats it; any other expression
runs on the clock as it goes, so a skipped time does not occur and a repeated one fires
at both occurrences.

The zones cover the kinds of transition the time zone database holds: an hour at 02:00
(New York) and at 01:00 UTC (Berlin), half an hour (Lord Howe), at midnight (Santiago),
two hours (Troll), and at a quarter to the hour (Chatham)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from batchpilot.operator.cron import Cron


def utc(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


# (zone, instant of the change, offset before, offset after) for 2026
SPRING = {
    "America/New_York": (utc(3, 8, 7), -5.0, -4.0),
    "Europe/Berlin": (utc(3, 29, 1), 1.0, 2.0),
    "Australia/Lord_Howe": (utc(10, 3, 15, 30), 10.5, 11.0),
    "America/Santiago": (utc(9, 6, 4), -4.0, -3.0),
    "Antarctica/Troll": (utc(3, 29, 1), 0.0, 2.0),
    "Pacific/Chatham": (utc(9, 26, 14), 12.75, 13.75),
}
AUTUMN = {
    "America/New_York": (utc(11, 1, 6), -4.0, -5.0),
    "Europe/Berlin": (utc(10, 25, 1), 2.0, 1.0),
    "Australia/Lord_Howe": (utc(4, 4, 15), 11.0, 10.5),
    "America/Santiago": (utc(4, 5, 3), -3.0, -4.0),
    "Antarctica/Troll": (utc(10, 25, 1), 2.0, 0.0),
    "Pacific/Chatham": (utc(4, 4, 14), 13.75, 12.75),
}


def checked_change(zone: str, changes: dict[str, tuple[datetime, float, float]]) -> datetime:
    """The instant the zone's clock changes, after checking that the installed time zone
    database agrees (a rule change there fails here, not in the assertions below)."""
    at, before, after = changes[zone]
    tz = ZoneInfo(zone)
    seen = (
        (at - timedelta(minutes=1)).astimezone(tz).utcoffset(),
        at.astimezone(tz).utcoffset(),
    )
    assert seen == (timedelta(hours=before), timedelta(hours=after)), (
        f"the time zone database moves {zone}'s clock differently in 2026: {seen}"
    )
    return at


def firings(text: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    cron, tz, found = Cron.parse(text), ZoneInfo(zone), []
    at = cron.next_after(start, tz)
    while at <= end:
        found.append(at)
        at = cron.next_after(at, tz)
    return found


def wall(t: datetime, zone: str) -> str:
    return t.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M")


# --- spring: the clock skips forward --------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "text"),
    [
        ("America/New_York", "30 2 * * *"),  # 02:00-02:59 never shows
        ("Europe/Berlin", "30 2 * * *"),
        ("Australia/Lord_Howe", "15 2 * * *"),  # 02:00-02:29
        ("America/Santiago", "30 0 * * *"),  # midnight to 01:00
        ("Antarctica/Troll", "30 1 * * *"),  # 01:00-02:59
        ("Antarctica/Troll", "30 2 * * *"),
        ("Pacific/Chatham", "0 3 * * *"),  # 02:45-03:44
    ],
)
def test_a_fixed_time_the_clock_skips_fires_at_the_jump(zone: str, text: str) -> None:
    jump = checked_change(zone, SPRING)
    tz = ZoneInfo(zone)
    fired = firings(text, zone, jump - timedelta(days=2), jump + timedelta(days=2))
    day = jump.astimezone(tz).date()
    assert [t for t in fired if t.astimezone(tz).date() == day] == [jump]
    # the days around it at the time itself
    assert {wall(t, zone)[6:] for t in fired if t != jump} == {
        text.split()[1].zfill(2) + ":" + text.split()[0].zfill(2)
    }


@pytest.mark.parametrize("zone", sorted(SPRING))
def test_a_skipped_time_of_a_wildcard_expression_does_not_occur(zone: str) -> None:
    jump = checked_change(zone, SPRING)
    fired = firings("*/15 * * * *", zone, jump - timedelta(hours=3), jump + timedelta(hours=3))
    # every 15 minutes of real time: the clock's skipped quarters simply never come
    assert all(b - a == timedelta(minutes=15) for a, b in pairwise(fired))
    assert len(fired) == 6 * 4
    assert jump in fired


def test_new_york_spring_forward_in_wall_clock_terms() -> None:
    zone = "America/New_York"
    checked_change(zone, SPRING)
    start, end = utc(3, 8, 5), utc(3, 8, 9)
    assert [wall(t, zone) for t in firings("30 2 * * *", zone, start, end)] == ["03-08 03:00"]
    assert [wall(t, zone) for t in firings("*/30 * * * *", zone, start, end)] == [
        "03-08 00:30", "03-08 01:00", "03-08 01:30",  # then 02:00-02:59 is skipped
        "03-08 03:00", "03-08 03:30", "03-08 04:00", "03-08 04:30", "03-08 05:00",
    ]  # fmt: skip
    # a minute-wildcard expression within the skipped hour does not fire that day
    assert firings("*/15 2 * * *", zone, start, end) == []


# --- autumn: the clock repeats ----------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "text"),
    [
        ("America/New_York", "30 1 * * *"),  # 01:00-01:59 twice
        ("Europe/Berlin", "30 2 * * *"),  # 02:00-02:59 twice
        ("Australia/Lord_Howe", "45 1 * * *"),  # 01:30-01:59 twice
        ("America/Santiago", "30 23 * * *"),  # 23:00-23:59 twice
        ("Antarctica/Troll", "30 1 * * *"),  # 01:00-02:59 twice
        ("Antarctica/Troll", "59 2 * * *"),
        ("Pacific/Chatham", "0 3 * * *"),  # 02:45-03:44 twice
    ],
)
def test_a_fixed_time_the_clock_repeats_fires_on_its_first_pass_only(zone: str, text: str) -> None:
    change = checked_change(zone, AUTUMN)
    fired = firings(text, zone, change - timedelta(hours=6), change + timedelta(hours=6))
    assert len(fired) == 1
    [first] = fired
    assert first < change  # before the clock went back
    tz = ZoneInfo(zone)
    repeat = first.astimezone(tz).replace(fold=1).astimezone(UTC)
    assert repeat > change
    assert repeat not in fired


@pytest.mark.parametrize("zone", sorted(AUTUMN))
def test_a_repeated_time_of_a_wildcard_expression_fires_at_both_passes(zone: str) -> None:
    change = checked_change(zone, AUTUMN)
    fired = firings("*/15 * * * *", zone, change - timedelta(hours=3), change + timedelta(hours=3))
    # every 15 minutes of real time: no silence while the clock goes over the same times
    assert all(b - a == timedelta(minutes=15) for a, b in pairwise(fired))
    assert len(fired) == 6 * 4
    walls = [wall(t, zone) for t in fired]
    assert len(set(walls)) < len(walls)  # some wall-clock times fired twice


def test_new_york_fall_back_in_wall_clock_terms() -> None:
    zone = "America/New_York"
    checked_change(zone, AUTUMN)
    start, end = utc(11, 1, 4), utc(11, 1, 8)
    assert [wall(t, zone) for t in firings("0 * * * *", zone, start, end)] == [
        "11-01 01:00", "11-01 01:00", "11-01 02:00", "11-01 03:00",
    ]  # fmt: skip
    assert firings("30 1 * * *", zone, start, end) == [utc(11, 1, 5, 30)]  # 01:30 EDT


def test_from_inside_the_second_pass_the_next_repeated_time_comes_next() -> None:
    # 01:10 EST, the second 01:10 of the night: 01:15 EST is next, not 02:00
    zone = ZoneInfo("America/New_York")
    assert Cron.parse("*/15 * * * *").next_after(utc(11, 1, 6, 10), zone) == utc(11, 1, 6, 15)
    # from the first pass, the first pass's next quarter, then the second pass's
    assert Cron.parse("0 * * * *").next_after(utc(11, 1, 5, 10), zone) == utc(11, 1, 6)
    assert Cron.parse("*/15 * * * *").next_after(utc(11, 1, 5, 50), zone) == utc(11, 1, 6)


def test_troll_two_hour_fall_back_keeps_an_hourly_expression_hourly() -> None:
    zone = "Antarctica/Troll"
    change = checked_change(zone, AUTUMN)
    fired = firings("0 * * * *", zone, change - timedelta(hours=4), change + timedelta(hours=4))
    assert fired == [change + timedelta(hours=h) for h in range(-3, 5)]


# --- any day of the year ----------------------------------------------------------------


@pytest.mark.parametrize("zone", sorted(SPRING))
@pytest.mark.parametrize("text", ["0 0 * * *", "30 1 * * *", "30 2 * * *", "59 23 * * *"])
def test_a_fixed_daily_time_fires_once_on_every_local_day_of_the_year(zone: str, text: str) -> None:
    tz = ZoneInfo(zone)
    start = datetime(2026, 1, 1, tzinfo=tz).astimezone(UTC)
    end = datetime(2027, 1, 1, tzinfo=tz).astimezone(UTC)
    fired = firings(text, zone, start - timedelta(seconds=1), end - timedelta(seconds=1))
    days = [t.astimezone(tz).date() for t in fired]
    assert len(days) == 365
    assert len(set(days)) == 365
