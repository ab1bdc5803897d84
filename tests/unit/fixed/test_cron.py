"""Unit tests for scheduling.fixed.cron and cron_fields: parsing, DST-correct cron ticks, interval ticks."""
from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, crontab_parser
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import exceptions
from scheduling.fixed import cron, cron_fields
from scheduling.fixed.cron import CronSchedule

LISBON = "Europe/Lisbon"
# Europe/Lisbon 2026: clocks go forward at 01:00 UTC on Sunday 29 March (01:00 WET -> 02:00 WEST)
# and back at 01:00 UTC on Sunday 25 October (02:00 WEST -> 01:00 WET).
SPRING_FORWARD = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
FALL_BACK = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)

# Zones with unusual changes: 30-minute DST (Lord Howe), :45 offsets (Chatham), changes at
# midnight (Santiago, Havana), southern hemisphere, and no DST at all (Kolkata).
ODD_ZONES = (
    LISBON,
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
    "America/Havana",
    "Asia/Kolkata",
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def wall(tick: datetime, zone: str = LISBON) -> datetime:
    """The local wall-clock reading of an instant, as a naive datetime."""
    return tick.astimezone(ZoneInfo(zone)).replace(tzinfo=None)


def local_day_ticks(schedule: CronSchedule, day: date) -> list[datetime]:
    """The ticks whose local date in the schedule's zone is ``day``."""
    zone = ZoneInfo(schedule.timezone)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC) - timedelta(days=1)
    ticks = schedule.ticks_between(start, start + timedelta(days=3))
    return [t for t in ticks if t.astimezone(zone).date() == day]


@functools.cache
def transitions(zone_name: str, year: int) -> list[datetime]:
    """The instants (to the minute) at which ``zone_name`` changes its UTC offset during ``year``."""
    zone = ZoneInfo(zone_name)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    while t.year == year:
        if t.astimezone(zone).utcoffset() != (t + HOUR).astimezone(zone).utcoffset():
            low, high = t, t + HOUR
            while high - low > MINUTE:
                middle = low + (high - low) / 2
                middle = middle.replace(second=0, microsecond=0)
                if middle == low:
                    middle += MINUTE
                if middle.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high)
        t += HOUR
    return found


def matcher(minutes: set[int], hours: set[int] | None = None, days_of_month: set[int] | None = None,
            months: set[int] | None = None, days_of_week: set[int] | None = None) -> Callable[[datetime], bool]:
    """An independent wall-time matcher (None = '*'), with the either-day rule when both days are restricted."""

    def matches(at: datetime) -> bool:
        if at.minute not in minutes or (hours is not None and at.hour not in hours):
            return False
        if months is not None and at.month not in months:
            return False
        dom = days_of_month is None or at.day in days_of_month
        dow = days_of_week is None or at.isoweekday() % 7 in days_of_week
        if days_of_month is not None and days_of_week is not None:
            return dom or dow
        return dom and dow

    return matches


def oracle(zone_name: str, matches: Callable[[datetime], bool], start: datetime, end: datetime,
           dst_gap: str, wildcard: bool = False) -> list[datetime]:
    """Ticks in (start, end] found by walking every UTC minute.

    Fixed-time schedules: first occurrences and gap ends (shift). Wildcard ones (Debian's
    MIN_STAR/HR_STAR): every minute at which the clock reads a matching wall time, nothing else.
    """
    zone = ZoneInfo(zone_name)
    ticks = []
    t = start.replace(second=0, microsecond=0)
    previous = (t - MINUTE).astimezone(zone).replace(tzinfo=None)
    while t <= end:
        local = t.astimezone(zone)
        now = local.replace(tzinfo=None, fold=0)
        fire = (wildcard or local.fold == 0) and matches(now)  # fold=1: second pass of a repeated wall time
        if not wildcard and dst_gap == "shift" and now - previous > MINUTE:  # the clock jumped over wall times
            skipped = previous + MINUTE
            while skipped < now and not fire:
                fire = matches(skipped)
                skipped += MINUTE
        if fire and t > start:
            ticks.append(t)
        previous = now
        t += MINUTE
    return ticks


def is_gap_end_for(schedule: CronSchedule, matches: Callable[[datetime], bool], tick: datetime) -> bool:
    """Whether ``tick`` is the end of a DST gap that swallowed a matching wall time."""
    before, after = wall(tick - MINUTE, schedule.timezone), wall(tick, schedule.timezone)
    skipped = before + MINUTE
    while skipped < after:
        if matches(skipped):
            return True
        skipped += MINUTE
    return False


# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nickname", "explicit"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_nickname_expands_to_explicit_form_with_same_ticks(nickname: str, explicit: str) -> None:
    """A nickname expands to its five-field form and yields exactly the same ticks."""
    assert cron.expand(nickname) == explicit
    reference = utc(2026, 3, 1)
    by_nickname = CronSchedule.parse(nickname, LISBON).next_n(reference, 40)
    by_expression = CronSchedule.parse(explicit, LISBON).next_n(reference, 40)
    assert by_nickname == by_expression
    assert len(by_nickname) == 40


def test_expand_normalises_case_and_whitespace() -> None:
    """expand() accepts nicknames in any case and collapses whitespace between fields."""
    assert cron.expand("  @DAILY ") == "0 0 * * *"
    assert cron.expand("0   3\t* *  *") == "0 3 * * *"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("@reboot", "no fixed time"),
        ("@fortnightly", "Unknown cron nickname"),
        ("* * * *", "has 4 field"),
        ("0 * * * * *", "has 6 field"),
        ("60 * * * *", "minute field '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour field '24': 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field '0': 0 is out of range 1-31"),
        ("* * 32 * *", "day-of-month field '32'"),
        ("* * * 0 *", "month field '0'"),
        ("* * * 13 *", "month field '13'"),
        ("* * * * 8", "day-of-week field '8': 8 is out of range 0-7"),
        ("1-60 * * * *", "60 is out of range"),
        ("abc * * * *", "'abc' is not a number"),
        ("mon * * * *", "minute field 'mon'"),
        ("* * * mon *", "month field 'mon'"),
        ("* * * * jan", "day-of-week field 'jan'"),
        ("* * * * monday", "day-of-week field 'monday'"),
        ("*/0 * * * *", "step must be at least 1"),
        ("5/10 * * * *", "a step needs '*' or a range"),
        ("1-5/2/3 * * * *", "cannot be parsed"),
        ("5-10-15 * * * *", "cannot be parsed"),
        ("*junk * * * *", "cannot be parsed"),
        ("1,,2 * * * *", "empty list item"),
        ("-1 * * * *", "cannot be parsed"),
        ("? * * * *", "cannot be parsed"),
        ("\u0663 * * * *", "cannot be parsed"),  # an Arabic-Indic digit is not a cron number
        ("0 0 31 2 *", "never fires"),
        ("0 0 30,31 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid_expression_raises_with_reason(expression: str, message: str) -> None:
    """Malformed, out-of-range or never-firing expressions raise InvalidCronExpression saying why."""
    with pytest.raises(exceptions.InvalidCronExpression, match=re.escape(message)):
        cron.expand(expression)
    with pytest.raises(exceptions.InvalidCronExpression):
        CronSchedule.parse(expression, "UTC")


def test_direct_construction_validates_too() -> None:
    """Building CronSchedule directly (not via parse) still rejects an invalid expression."""
    with pytest.raises(exceptions.InvalidCronExpression):
        CronSchedule("61 * * * *", "UTC")
    with pytest.raises(exceptions.InvalidCronExpression):
        cron.expand(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "Europe", "../etc/passwd", "/etc/localtime", "utc"])
def test_unknown_time_zone_raises(zone: str) -> None:
    """A zone the tz database does not know (or a malformed key) raises UnknownTimeZone."""
    with pytest.raises(exceptions.UnknownTimeZone):
        CronSchedule.parse("0 3 * * *", zone)


def test_unknown_dst_gap_policy_raises() -> None:
    """dst_gap must be 'shift' or 'skip'."""
    with pytest.raises(exceptions.InvalidPolicy, match="dst_gap"):
        CronSchedule.parse("0 3 * * *", LISBON, dst_gap="later")


def test_names_and_seven_mean_the_same_days() -> None:
    """Day 7 and 'sun' mean Sunday like 0, and month/day names are accepted in any case."""
    reference = utc(2026, 1, 1)
    sundays = CronSchedule.parse("0 0 * * 0", "UTC").next_n(reference, 10)
    for same in ("0 0 * * 7", "0 0 * * sun", "0 0 * * SUN"):
        assert CronSchedule.parse(same, "UTC").next_n(reference, 10) == sundays
    by_name = CronSchedule.parse("0 0 1 jan,Jul *", "UTC").next_n(reference, 4)
    assert by_name == CronSchedule.parse("0 0 1 1,7 *", "UTC").next_n(reference, 4)


def test_descending_range_wraps_around() -> None:
    """A descending range wraps like Celery's: fri-sun is Friday, Saturday, Sunday."""
    reference = utc(2026, 1, 1)
    wrapped = CronSchedule.parse("0 0 * * fri-sun", "UTC").next_n(reference, 9)
    assert wrapped == CronSchedule.parse("0 0 * * 5,6,0", "UTC").next_n(reference, 9)
    assert {t.isoweekday() % 7 for t in wrapped} == {5, 6, 0}


@pytest.mark.parametrize(
    ("day_of_week", "written", "days"),
    [
        ("7", "0", {0}),
        ("0-7", "0-6", set(range(7))),
        ("1-7", "0-6", set(range(7))),
        ("fri-7", "0,5-6", {5, 6, 0}),
        ("5-7,mon", "0-1,5-6", {5, 6, 0, 1}),
        ("1-7/3", "0-1,4", {1, 4, 0}),
        ("sun", "sun", {0}),
        ("*/2", "*/2", {0, 2, 4, 6}),
    ],
)
def test_day_of_week_seven_is_written_the_way_celery_reads_it(day_of_week: str, written: str, days: set[int]) -> None:
    """Day 7 (alone or in a range) expands to a field Celery's crontab reads as the same days; Sunday fires."""
    expression = f"0 3 * * {day_of_week}"
    expanded = cron.expand(expression)
    assert expanded == f"0 3 * * {written}"
    assert crontab(minute="0", hour="3", day_of_week=expanded.split()[4]).day_of_week == days
    reference = utc(2026, 1, 1)
    ticks = CronSchedule.parse(expression, LISBON).next_n(reference, 14)
    assert ticks == CronSchedule.parse(expanded, LISBON).next_n(reference, 14)
    assert {t.isoweekday() % 7 for t in ticks} == days


@pytest.mark.parametrize(
    ("day_of_week", "days"),
    [
        ("fri-mon/2", {5, 0}),
        ("sat-tue/2", {6, 1}),
        ("fri-sun", {5, 6, 0}),
        ("sat-mon/1", {6, 0, 1}),
        ("7-2", {0, 1, 2}),
    ],
)
def test_wrapped_day_of_week_range_counts_sunday_once(day_of_week: str, days: set[int]) -> None:
    """A descending day-of-week range wraps over a 7-day week like Celery's: fri-mon/2 is Friday and Sunday."""
    ticks = CronSchedule.parse(f"0 0 * * {day_of_week}", "UTC").next_n(utc(2026, 1, 1), 21)
    assert {t.isoweekday() % 7 for t in ticks} == days
    if "7" not in day_of_week:
        assert crontab_parser(7).parse(day_of_week) == days


@pytest.mark.parametrize(
    "expression",
    [
        "9" * 5000 + " * * * *",
        "*/" + "9" * 5000 + " * * * *",
        "0 " + "1" * 90 + " * * *",
        "0 0 1-" + "9" * 60 + " * *",
        "*/" + "7" * 200 + " * * * *",
        "0 0 * * 1," + "0" * 30 + "8",
    ],
)
def test_huge_numbers_raise_invalid_cron_expression_with_a_short_message(expression: str) -> None:
    """A number of thousands of digits (value or step) is an InvalidCronExpression, and the message stays short."""
    with pytest.raises(exceptions.InvalidCronExpression) as caught:
        cron.expand(expression)
    assert len(str(caught.value)) < 300


def test_leading_zeros_and_large_steps_are_still_numbers() -> None:
    """0005 is minute 5 and a step larger than the field leaves only its start, as in Vixie cron and Celery."""
    reference = utc(2026, 1, 1)
    assert CronSchedule.parse("0005 * * * *", "UTC").next_n(reference, 3) == CronSchedule.parse(
        "5 * * * *", "UTC"
    ).next_n(reference, 3)
    assert CronSchedule.parse("*/100 0 * * *", "UTC").next_n(reference, 3) == CronSchedule.parse(
        "0 0 * * *", "UTC"
    ).next_n(reference, 3)


_FIELD_BOUNDS = ((0, 59, ()), (0, 23, ()), (1, 31, ()), (1, 12, cron_fields.MONTH_NAMES), (0, 7, cron_fields.DAY_NAMES))


@st.composite
def field_texts(draw: st.DrawFn, index: int) -> str:
    """A valid text for field ``index``: lists of *, */n, values, names, ranges (wrapped too) and steps."""
    low, high, names = _FIELD_BOUNDS[index]

    def atom() -> str:
        value = draw(st.integers(low, high))
        if names and draw(st.booleans()) and value - (1 if index == 3 else 0) < len(names):
            return names[value - (1 if index == 3 else 0)]
        return str(value)

    items = []
    for _ in range(draw(st.integers(1, 3))):
        form = draw(st.sampled_from(["*", "*/n", "a", "a-b", "a-b/n"]))
        step = str(draw(st.integers(1, high + 2)))
        item = {"*": "*", "*/n": f"*/{step}", "a": atom(), "a-b": f"{atom()}-{atom()}"}.get(form)
        items.append(item if item is not None else f"{atom()}-{atom()}/{step}")
    return ",".join(items)


@settings(max_examples=400, deadline=None)
@given(fields=st.tuples(*(field_texts(i) for i in range(5))))
def test_every_expanded_field_is_read_by_celery_as_the_same_values(fields: tuple[str, ...]) -> None:
    """Celery's crontab parser reads each field of expand() as exactly the values Timekeeper fires on."""
    expression = " ".join(fields)
    try:
        expanded, parsed = cron_fields.parse(expression)  # the value sets behind the public API
    except exceptions.InvalidCronExpression as exc:  # only a day no listed month has may be refused
        message = str(exc)
    else:
        message = ""
    if message:
        assert "never fires" in message
        return
    sizes = ((60, 0), (24, 0), (31, 1), (12, 1), (7, 0))
    values = (parsed.minutes, parsed.hours, parsed.days_of_month, parsed.months, parsed.days_of_week)
    for text, (size, low), wanted in zip(expanded.split(), sizes, values, strict=True):
        assert crontab_parser(size, low).parse(text) == wanted, text


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    """With both day fields restricted, a day matches if either does (Vixie rule)."""
    schedule = CronSchedule.parse("0 12 13 * 5", "UTC")
    days = [t.date() for t in schedule.ticks_between(utc(2026, 1, 1), utc(2026, 4, 1))]
    expected = [
        date(2026, 1, 1) + timedelta(days=i)
        for i in range(90)
        if (date(2026, 1, 1) + timedelta(days=i)).day == 13 or (date(2026, 1, 1) + timedelta(days=i)).weekday() == 4
    ]
    assert days == expected
    assert date(2026, 1, 13) in days  # a Tuesday the 13th
    assert date(2026, 2, 13) in days  # a Friday the 13th, once


@pytest.mark.parametrize(
    ("expression", "runs_on"),
    [
        # A day field that does not start with '*' is restricted, whatever it covers: either day matches.
        ("0 0 1-31 * 1", lambda d: True),
        ("0 0 13 * 0-6", lambda d: True),
        ("0 0 1-31 * mon-fri", lambda d: True),
        ("0 0 1,15 * 1", lambda d: d.day in (1, 15) or d.weekday() == 0),
        # A field that starts with '*' is unrestricted, even with a step: both must match.
        ("0 0 */2 * 1", lambda d: d.day % 2 == 1 and d.weekday() == 0),
        ("0 0 */1 * 5", lambda d: d.weekday() == 4),
        ("0 0 13 * */1", lambda d: d.day == 13),
        ("0 0 1-31 * *", lambda d: True),
        ("0 0 * * 0-6", lambda d: True),
    ],
)
def test_day_fields_follow_the_vixie_rule(expression: str, runs_on: Callable[[date], bool]) -> None:
    """Vixie cron's rule: a day field starting with '*' is unrestricted; with both restricted, either day matches."""
    ticks = CronSchedule.parse(expression, "UTC").ticks_between(utc(2025, 12, 31, 23), utc(2026, 6, 30, 23))
    days = [t.date() for t in ticks]
    expected = [date(2026, 1, 1) + timedelta(days=i) for i in range(181)]
    assert days == [day for day in expected if runs_on(day)]


def test_leap_day_is_found_without_scanning() -> None:
    """0 0 29 2 * finds the next Feb 29, even across the 8-year gap around 2100."""
    schedule = CronSchedule.parse("0 0 29 2 *", LISBON)
    assert schedule.next_after(utc(2026, 3, 1)) == utc(2028, 2, 29)
    assert schedule.next_after(utc(2096, 3, 1)) == utc(2104, 2, 29)
    assert schedule.latest_at_or_before(utc(2103, 12, 31)) == utc(2096, 2, 29)
    assert schedule.next_n(utc(2026, 1, 1), 3) == [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]


def test_day_of_month_and_star_day_of_week_ticks_decades_apart_are_found() -> None:
    """13 June on a Sunday (11 years apart) and 29 February on a Sunday (40 years across 2100) are found."""
    june = CronSchedule.parse("44 11 13 6 */7", "UTC")
    assert june.next_after(utc(2038, 6, 14)) == utc(2049, 6, 13, 11, 44)
    assert june.latest_at_or_before(utc(2049, 6, 12)) == utc(2038, 6, 13, 11, 44)
    leap_sunday = CronSchedule.parse("0 0 29 2 */7", LISBON)  # */7 is Sunday and starts with "*": both must match
    assert leap_sunday.next_after(utc(2088, 3, 1)) == utc(2128, 2, 29)
    assert leap_sunday.min_interval_seconds() == (date(2060, 2, 29) - date(2032, 2, 29)).days * 86400.0


# --- Europe/Lisbon 2026 DST days ---------------------------------------------------------------------


def test_daily_in_repeated_hour_fires_once_at_first_occurrence() -> None:
    """30 1 * * * fires once on 25 Oct 2026, at 01:30 WEST (00:30 UTC), not again at 01:30 WET."""
    schedule = CronSchedule.parse("30 1 * * *", LISBON)
    assert local_day_ticks(schedule, date(2026, 10, 25)) == [utc(2026, 10, 25, 0, 30)]
    assert list(schedule.ticks_between(utc(2026, 10, 24, 12), utc(2026, 10, 25, 12))) == [utc(2026, 10, 25, 0, 30)]


def test_daily_in_skipped_hour_shifts_to_gap_end() -> None:
    """With shift, 30 1 * * * fires on 29 Mar 2026 at 02:00 WEST (01:00 UTC), when the gap ends."""
    schedule = CronSchedule.parse("30 1 * * *", LISBON, dst_gap="shift")
    assert local_day_ticks(schedule, date(2026, 3, 29)) == [SPRING_FORWARD]
    assert wall(SPRING_FORWARD) == datetime(2026, 3, 29, 2, 0)
    assert schedule.next_after(utc(2026, 3, 28, 12)) == SPRING_FORWARD


def test_daily_in_skipped_hour_does_not_run_with_skip() -> None:
    """With skip, 30 1 * * * does not fire on 29 Mar 2026 but does on the days around it."""
    schedule = CronSchedule.parse("30 1 * * *", LISBON, dst_gap="skip")
    assert local_day_ticks(schedule, date(2026, 3, 29)) == []
    assert schedule.next_after(utc(2026, 3, 28, 12)) == utc(2026, 3, 30, 0, 30)
    assert schedule.latest_at_or_before(utc(2026, 3, 30)) == utc(2026, 3, 28, 1, 30)


def test_three_am_is_three_am_local_all_season() -> None:
    """0 3 * * * is 03:00 local every day 20 Mar-5 Nov 2026; 23h and 25h apart only on change days."""
    schedule = CronSchedule.parse("0 3 * * *", LISBON)
    ticks = list(schedule.ticks_between(utc(2026, 3, 20), utc(2026, 11, 5, 23)))
    days = [wall(t).date() for t in ticks]
    first, last = date(2026, 3, 20), date(2026, 11, 5)
    assert days == [first + timedelta(days=i) for i in range((last - first).days + 1)]
    assert all((wall(t).hour, wall(t).minute) == (3, 0) for t in ticks)
    for previous, tick in itertools.pairwise(ticks):
        expected = {date(2026, 3, 29): 23 * HOUR, date(2026, 10, 25): 25 * HOUR}.get(wall(tick).date(), 24 * HOUR)
        assert tick - previous == expected, tick


def test_quarter_hours_keep_their_cadence_through_the_repeated_hour() -> None:
    """*/15 on the fall-back night fires every 15 real minutes: 01:00-01:45 WEST, then 01:00-01:45 WET again."""
    schedule = CronSchedule.parse("*/15 * * * *", LISBON)
    ticks = list(schedule.ticks_between(utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 30)))
    quarter = timedelta(minutes=15)
    assert ticks == [utc(2026, 10, 24, 23, 45) + i * quarter for i in range(12)]
    local = [t.astimezone(ZoneInfo(LISBON)).strftime("%H:%M %Z") for t in ticks]
    assert local[1:9] == [f"01:{m:02d} {z}" for z in ("WEST", "WET") for m in (0, 15, 30, 45)]


@pytest.mark.parametrize(
    ("expression", "local"),
    [
        ("30 * * * *", ["00:30 WEST", "01:30 WEST", "01:30 WET", "02:30 WET"]),  # wildcard hour: both passes
        ("0-59/30 1 * * *", ["01:00 WEST", "01:30 WEST"]),  # fixed time (no leading '*'): first pass only
        ("30 1 * * *", ["01:30 WEST"]),
        ("@hourly", ["01:00 WEST", "01:00 WET", "02:00 WET"]),
        ("* 1 * * *", [f"01:{m:02d} {z}" for z in ("WEST", "WET") for m in range(60)]),
    ],
)
def test_fall_back_fixed_time_runs_once_and_wildcard_runs_in_both_passes(expression: str, local: list[str]) -> None:
    """Debian's rule at fall-back: fixed minute and hour fire at the first 01:30; a '*' field fires in both hours."""
    schedule = CronSchedule.parse(expression, LISBON)
    ticks = schedule.ticks_between(utc(2026, 10, 24, 23, 15), utc(2026, 10, 25, 2, 45))
    assert [t.astimezone(ZoneInfo(LISBON)).strftime("%H:%M %Z") for t in ticks] == local


@pytest.mark.parametrize("dst_gap", ["shift", "skip"])
def test_spring_forward_wildcard_skips_the_gap_and_fixed_time_shifts(dst_gap: str) -> None:
    """At spring-forward 30 * * * * keeps hourly real time (no 01:30 at all); 30 1 * * * shifts to 02:00 or skips."""
    hourly = CronSchedule.parse("30 * * * *", LISBON, dst_gap)
    assert list(hourly.ticks_between(utc(2026, 3, 28, 23, 45), utc(2026, 3, 29, 2, 45))) == [
        utc(2026, 3, 29, 0, 30),  # 00:30 WET
        utc(2026, 3, 29, 1, 30),  # 02:30 WEST: one real hour later, 01:30 never shown by the clock
        utc(2026, 3, 29, 2, 30),
    ]
    daily = CronSchedule.parse("30 1 * * *", LISBON, dst_gap)
    expected = [SPRING_FORWARD] if dst_gap == "shift" else []
    assert list(daily.ticks_between(utc(2026, 3, 28, 23, 45), utc(2026, 3, 29, 2, 45))) == expected


def test_quarter_hours_in_skipped_hour_keep_their_cadence() -> None:
    """*/15 at spring-forward: 01:00-01:45 WET do not exist; 00:45 WET is followed 15 min later by 02:00 WEST."""
    schedule = CronSchedule.parse("*/15 * * * *", LISBON)
    ticks = list(schedule.ticks_between(utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)))
    assert ticks == [utc(2026, 3, 29, 0, 45), SPRING_FORWARD, utc(2026, 3, 29, 1, 15), utc(2026, 3, 29, 1, 30)]
    skipping = CronSchedule.parse("*/15 * * * *", LISBON, dst_gap="skip")
    # dst_gap applies to fixed-time schedules only: a wildcard one has no wall times to shift.
    assert list(skipping.ticks_between(utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30))) == ticks


def test_several_gap_wall_times_yield_the_gap_end_once() -> None:
    """Wall times 01:00, 01:20, 01:40 (all in the gap) and 02:00 WEST shift to one tick, not four."""
    only_gap = CronSchedule.parse("0,20,40 1 * * *", LISBON)
    assert local_day_ticks(only_gap, date(2026, 3, 29)) == [SPRING_FORWARD]
    assert local_day_ticks(CronSchedule.parse("0,20,40 1 * * *", LISBON, "skip"), date(2026, 3, 29)) == []
    with_after = CronSchedule.parse("0,20,40 1,2 * * *", LISBON)
    assert local_day_ticks(with_after, date(2026, 3, 29)) == [
        SPRING_FORWARD,
        utc(2026, 3, 29, 1, 20),
        utc(2026, 3, 29, 1, 40),
    ]


def test_latest_at_or_before_during_second_pass_of_repeated_hour() -> None:
    """At 01:10 WET (second pass) the latest 45 1 * * * tick is 01:45 WEST, a later wall time that ran earlier."""
    schedule = CronSchedule.parse("45 1 * * *", LISBON)
    assert schedule.latest_at_or_before(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 25, 0, 45)
    assert schedule.next_after(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 45)
    quarters = CronSchedule.parse("*/15 * * * *", LISBON)
    assert quarters.latest_at_or_before(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 25, 1, 0)  # 01:00 WET
    assert quarters.next_after(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 25, 1, 15)  # 01:15 WET


def test_latest_at_or_before_on_gap_day() -> None:
    """latest_at_or_before sees the shifted tick with shift and the previous day's with skip."""
    noon = utc(2026, 3, 29, 12)
    assert CronSchedule.parse("30 1 * * *", LISBON).latest_at_or_before(noon) == SPRING_FORWARD
    assert CronSchedule.parse("30 1 * * *", LISBON, "skip").latest_at_or_before(noon) == utc(2026, 3, 28, 1, 30)


@pytest.mark.parametrize("zone_name", ODD_ZONES)
@pytest.mark.parametrize("dst_gap", ["shift", "skip"])
@pytest.mark.parametrize(
    ("expression", "minutes", "hours"),
    [
        ("*/15 * * * *", set(range(0, 60, 15)), None),
        ("30 * * * *", {30}, None),
        ("* 1 * * *", set(range(60)), {1}),
        ("0 */2 * * *", {0}, set(range(0, 24, 2))),
        ("0-59/20 1-3 * * *", {0, 20, 40}, {1, 2, 3}),
        ("30 1 * * *", {30}, {1}),
        ("0 0 * * *", {0}, {0}),
        ("59 23 * * *", {59}, {23}),
        ("1,59 0-3 * * *", {1, 59}, {0, 1, 2, 3}),
        ("45 2 * * *", {45}, {2}),
    ],
)
def test_ticks_match_minute_by_minute_oracle_around_changes(
    zone_name: str, dst_gap: str, expression: str, minutes: set[int], hours: set[int] | None
) -> None:
    """Around every 2026 offset change of odd zones, ticks equal a brute-force minute-by-minute walk (both kinds)."""
    schedule = CronSchedule.parse(expression, zone_name, dst_gap)
    matches = matcher(minutes, hours)
    wildcard = expression.split()[0].startswith("*") or expression.split()[1].startswith("*")
    for change in transitions(zone_name, 2026) or [utc(2026, 6, 1)]:
        start, end = change - timedelta(hours=26), change + timedelta(hours=26)
        expected = oracle(zone_name, matches, start, end, dst_gap, wildcard)
        assert list(schedule.ticks_between(start, end)) == expected, change


def test_repeated_interval_spanning_midnight() -> None:
    """Goose Bay 2010 fell back at 00:01 to 23:01: a tick of the next day can precede the second pass."""
    goose_bay = "America/Goose_Bay"
    assert datetime(2010, 11, 7, 3, 1, tzinfo=UTC) in transitions(goose_bay, 2010)
    schedule = CronSchedule.parse("0 0 * * *", goose_bay)
    second_pass = utc(2010, 11, 7, 3, 30)  # 23:30 AST on 6 Nov, after 00:00 ADT on 7 Nov already ran
    assert wall(second_pass, goose_bay) == datetime(2010, 11, 6, 23, 30)
    assert schedule.latest_at_or_before(second_pass) == utc(2010, 11, 7, 3, 0)
    assert schedule.next_after(second_pass) == utc(2010, 11, 8, 4, 0)
    start, end = utc(2010, 11, 5), utc(2010, 11, 9)
    every_quarter = CronSchedule.parse("*/15 * * * *", goose_bay)
    fixed_quarters = CronSchedule.parse("0,15,30,45 0-23 * * *", goose_bay)
    for schedule, wildcard in ((every_quarter, True), (fixed_quarters, False)):
        expected = oracle(goose_bay, matcher({0, 15, 30, 45}), start, end, "shift", wildcard)
        assert list(schedule.ticks_between(start, end)) == expected
        for instant in (second_pass, utc(2010, 11, 7, 3, 10), utc(2010, 11, 7, 3, 59), utc(2010, 11, 7, 4, 1)):
            assert schedule.latest_at_or_before(instant) == max(t for t in expected if t <= instant), instant


def test_transitions_helper_finds_lisbon_changes() -> None:
    """The test helper finds Lisbon's two 2026 changes at the documented instants."""
    assert transitions(LISBON, 2026) == [SPRING_FORWARD, FALL_BACK]


# --- general behaviour -------------------------------------------------------------------------------


def test_next_after_is_strict_and_ticks_between_is_half_open() -> None:
    """next_after(tick) is the following tick; ticks_between excludes start and includes end."""
    schedule = CronSchedule.parse("0 * * * *", "UTC")
    assert schedule.next_after(utc(2026, 5, 1, 10)) == utc(2026, 5, 1, 11)
    assert schedule.next_after(utc(2026, 5, 1, 10, 59, 59, 999999)) == utc(2026, 5, 1, 11)
    assert list(schedule.ticks_between(utc(2026, 5, 1, 10), utc(2026, 5, 1, 12))) == [
        utc(2026, 5, 1, 11),
        utc(2026, 5, 1, 12),
    ]
    assert list(schedule.ticks_between(utc(2026, 5, 1, 12), utc(2026, 5, 1, 10))) == []
    assert schedule.next_n(utc(2026, 5, 1, 10), 0) == []


def test_accepts_any_zone_and_returns_utc() -> None:
    """Instants in any zone are accepted; ticks come back as aware UTC datetimes."""
    schedule = CronSchedule.parse("0 3 * * *", LISBON)
    new_york = datetime(2026, 6, 1, 12, tzinfo=ZoneInfo("America/New_York"))
    tick = schedule.next_after(new_york)
    assert tick.tzinfo is UTC
    assert tick == schedule.next_after(new_york.astimezone(UTC)) == utc(2026, 6, 2, 2)


def test_naive_instant_is_refused() -> None:
    """A naive datetime raises InvalidSchedule instead of being guessed at."""
    schedule = CronSchedule.parse("0 3 * * *", LISBON)
    with pytest.raises(exceptions.InvalidSchedule, match="timezone-aware"):
        schedule.next_after(datetime(2026, 6, 1))
    with pytest.raises(exceptions.InvalidSchedule):
        schedule.ticks_between(datetime(2026, 6, 1), utc(2026, 6, 2))


def test_schedules_are_frozen_values() -> None:
    """CronSchedule is hashable and equal by expression, zone and DST policy."""
    a = CronSchedule.parse(" 0  3 * * * ", LISBON)
    assert a == CronSchedule("0 3 * * *", LISBON)
    assert a != CronSchedule("0 3 * * *", LISBON, "skip")
    assert len({a, CronSchedule("0 3 * * *", LISBON)}) == 1
    with pytest.raises(AttributeError):
        a.timezone = "UTC"  # type: ignore[misc]


# --- min_interval_seconds and describe ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "zone", "seconds"),
    [
        ("* * * * *", LISBON, 60.0),
        ("*/15 * * * *", LISBON, 900.0),
        ("0 3 * * *", LISBON, 23 * 3600.0),
        ("0 3 * * *", "UTC", 24 * 3600.0),
        ("@weekly", LISBON, (7 * 24 - 1) * 3600.0),
        ("0 0 29 2 *", LISBON, 1461 * 86400.0),
        # 01:01 and 01:59 shift to 02:00 WEST on 29 Mar, one minute before 02:01: closer than the usual 2 min.
        ("1,59 1,2 * * *", LISBON, 60.0),
    ],
)
def test_min_interval_seconds(expression: str, zone: str, seconds: float) -> None:
    """min_interval_seconds is the shortest real gap between ticks over a year, DST days included."""
    assert CronSchedule.parse(expression, zone).min_interval_seconds() == seconds


def test_min_interval_seconds_with_skip_ignores_skipped_ticks() -> None:
    """With skip, wall times lost in the gap do not create short intervals."""
    schedule = CronSchedule.parse("1,59 1,2 * * *", LISBON, "skip")
    assert schedule.min_interval_seconds() == 120.0


def test_describe_is_readable_and_names_the_zone() -> None:
    """describe() gives the zone, the nickname, the either-day rule and the DST rule of wildcard schedules."""
    assert CronSchedule.parse("0 3 * * *", LISBON).describe() == "At 03:00 AM (Europe/Lisbon)"
    assert CronSchedule.parse("@daily", "UTC").describe() == "@daily: At 12:00 AM (UTC)"
    assert "either" in CronSchedule.parse("0 0 13 * fri", "UTC").describe()
    assert "do not run" in CronSchedule.parse("30 1 * * *", LISBON, "skip").describe()
    cadence = "at clock changes it keeps its real-time cadence: a repeated hour runs twice"
    assert cadence in CronSchedule.parse("*/15 * * * *", LISBON).describe()
    assert cadence in CronSchedule.parse("@hourly", LISBON, "skip").describe()
    assert "do not run" not in CronSchedule.parse("@hourly", LISBON, "skip").describe(), "dst_gap is for fixed times"
    assert "cadence" not in CronSchedule.parse("*/15 * * * *", "UTC").describe()


# --- properties ---------------------------------------------------------------------------------------


def _field(draw: st.DrawFn, low: int, high: int, star_chance: bool = True) -> set[int] | None:
    if star_chance and draw(st.booleans()):
        return None
    return draw(st.sets(st.integers(low, high), min_size=1, max_size=4))


@st.composite
def schedules(draw: st.DrawFn) -> tuple[CronSchedule, Callable[[datetime], bool]]:
    """A random satisfiable expression, zone and DST policy, with an independent matcher."""
    minutes = _field(draw, 0, 59, star_chance=False)
    assert minutes is not None
    hours = _field(draw, 0, 23)
    days_of_month = _field(draw, 1, 28)
    months = _field(draw, 1, 12)
    days_of_week = _field(draw, 0, 6)

    def text(values: set[int] | None) -> str:
        return "*" if values is None else ",".join(str(v) for v in sorted(values))

    expression = " ".join(text(f) for f in (minutes, hours, days_of_month, months, days_of_week))
    zone, dst_gap = draw(st.sampled_from(ODD_ZONES)), draw(st.sampled_from(["shift", "skip"]))
    schedule = CronSchedule.parse(expression, zone, dst_gap)
    return schedule, matcher(minutes, hours, days_of_month, months, days_of_week)


_CHANGES = [change for zone in ODD_ZONES for change in transitions(zone, 2026)]
instants = st.one_of(
    st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)),
    st.builds(
        lambda change, offset: change + timedelta(seconds=offset),
        st.sampled_from(_CHANGES),
        st.integers(-3 * 3600, 3 * 3600),
    ),
)


@settings(max_examples=300, deadline=None)
@given(case=schedules(), instant=instants)
def test_next_after_increases_and_matches_the_expression(
    case: tuple[CronSchedule, Callable[[datetime], bool]], instant: datetime
) -> None:
    """Ticks increase; each reads a matching wall time (a first occurrence if fixed-time) or is a shifted gap end."""
    schedule, matches = case
    zone = ZoneInfo(schedule.timezone)
    minute, hour = schedule.expanded.split()[:2]
    wildcard = minute.startswith("*") or hour.startswith("*")
    previous = instant
    for tick in schedule.next_n(instant, 5):
        assert tick > previous
        assert tick.tzinfo is UTC
        local = tick.astimezone(zone)
        if not ((wildcard or local.fold == 0) and matches(local.replace(tzinfo=None, fold=0))):
            assert not wildcard, "a wildcard schedule fires only when the clock reads a matching time"
            assert schedule.dst_gap == "shift"
            assert is_gap_end_for(schedule, matches, tick), tick
        previous = tick


@settings(max_examples=300, deadline=None)
@given(case=schedules(), instant=instants)
def test_latest_at_or_before_agrees_with_next_after(
    case: tuple[CronSchedule, Callable[[datetime], bool]], instant: datetime
) -> None:
    """latest_at_or_before(x) <= x < next_after(x) with no tick between them, and ticks map to themselves."""
    schedule, _ = case
    following = schedule.next_after(instant)
    latest = schedule.latest_at_or_before(instant)
    assert latest is not None
    assert latest <= instant
    assert schedule.next_after(latest) == following
    assert schedule.latest_at_or_before(following) == following
    assert schedule.latest_at_or_before(following - timedelta(microseconds=1)) == latest


# --- intervals -----------------------------------------------------------------------------------------


def test_interval_tick_is_the_same_on_every_replica() -> None:
    """Two replicas given the same moment (in different zones) compute the same interval tick."""
    now = datetime(2026, 10, 25, 1, 17, 42, 123456, tzinfo=UTC)
    replica_a = cron.interval_tick(now, 300)
    replica_b = cron.interval_tick(now.astimezone(ZoneInfo(LISBON)), 300.0)
    assert replica_a == replica_b == utc(2026, 10, 25, 1, 15)
    assert cron.interval_next_after(now, 300) == utc(2026, 10, 25, 1, 20)


def test_interval_tick_follows_the_anchor() -> None:
    """Ticks sit on anchor + k * every, before the anchor too."""
    anchor = utc(2026, 1, 1, 0, 0, 7)
    assert cron.interval_tick(utc(2026, 1, 1, 0, 5), 60, anchor) == utc(2026, 1, 1, 0, 4, 7)
    assert cron.interval_tick(utc(2025, 12, 31, 23, 59), 60, anchor) == utc(2025, 12, 31, 23, 58, 7)
    assert cron.interval_tick(anchor, 60, anchor) == anchor
    assert cron.interval_next_after(anchor, 60, anchor) == anchor + MINUTE


@settings(max_examples=300, deadline=None)
@given(
    now=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)),
    every=st.one_of(st.integers(1, 7 * 86400), st.sampled_from([0.5, 0.25, 1.5, 2.000001])),
    zone=st.sampled_from(ODD_ZONES),
)
def test_interval_tick_properties(now: datetime, every: float, zone: str) -> None:
    """interval_tick <= now < interval_next_after, on the epoch grid, whatever zone now is expressed in."""
    tick = cron.interval_tick(now, every)
    step = timedelta(microseconds=round(every * 1_000_000))
    assert tick <= now < tick + step
    assert (tick - cron.EPOCH) % step == timedelta(0)
    assert cron.interval_tick(now.astimezone(ZoneInfo(zone)), every) == tick
    assert cron.interval_next_after(now, every) == tick + step


@pytest.mark.parametrize("every", [0, -5, math.nan, math.inf, 1e-9, True, "60"])
def test_invalid_interval_is_refused(every: object) -> None:
    """A non-positive, non-finite, sub-microsecond or non-numeric interval raises InvalidSchedule."""
    with pytest.raises(exceptions.InvalidSchedule):
        cron.interval_tick(utc(2026, 1, 1), every)  # type: ignore[arg-type]
