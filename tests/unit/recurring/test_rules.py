"""Occurrence computation of recurrences (scheduling.recurring.rules) on the cron engine, across clock changes."""

from __future__ import annotations

import datetime as dt

import pytest

from scheduling.core import exceptions
from scheduling.recurring import rules

UTC = dt.UTC


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def chain(expression: str, zone: str, gap: str, start: dt.datetime, n: int) -> list[dt.datetime]:
    """n successive occurrences as the planner makes them: each after the previous, never missed."""
    schedule = rules.schedule_for(expression, None, zone, gap, start)
    out: list[dt.datetime] = []
    previous = start
    for _ in range(n):
        occurrence = rules.following(schedule, previous, now=previous, missed="skip", late_seconds=60)
        assert occurrence is not None
        out.append(occurrence.at)
        previous = occurrence.at
    return out


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        ("shift", [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]),
        ("skip", [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30), utc(2026, 3, 31, 0, 30)]),
    ],
)
def test_lisbon_spring_forward_at_0100_shifts_or_skips_0130(gap, expected):
    """Lisbon skips 01:00-02:00 on 29 Mar 2026: a 01:30 occurrence runs at 02:00 WEST (shift) or not that day (skip)."""
    assert chain("30 1 * * *", "Europe/Lisbon", gap, utc(2026, 3, 27, 12), 3) == expected


def test_lisbon_fall_back_runs_0130_once():
    """Lisbon repeats 01:00-02:00 on 25 Oct 2026: a 01:30 occurrence runs once, at the first 01:30 (WEST)."""
    assert chain("30 1 * * *", "Europe/Lisbon", "shift", utc(2026, 10, 24, 12), 3) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
        utc(2026, 10, 27, 1, 30),
    ]


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        ("shift", [utc(2026, 3, 7, 5, 30), utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 30)]),
        ("skip", [utc(2026, 3, 7, 5, 30), utc(2026, 3, 9, 4, 30), utc(2026, 3, 10, 4, 30)]),
    ],
)
def test_havana_spring_forward_at_midnight_shifts_or_skips_0030(gap, expected):
    """Havana skips 00:00-01:00 on 8 Mar 2026: a 00:30 occurrence runs at 01:00 CDT (shift) or not that day (skip)."""
    assert chain("30 0 * * *", "America/Havana", gap, utc(2026, 3, 6, 12), 3) == expected


def test_havana_fall_back_at_0100_runs_0030_once():
    """Havana repeats 00:00-01:00 on 1 Nov 2026: a 00:30 occurrence runs once (the CDT one)."""
    assert chain("30 0 * * *", "America/Havana", "shift", utc(2026, 10, 31, 12), 3) == [
        utc(2026, 11, 1, 4, 30),
        utc(2026, 11, 2, 5, 30),
        utc(2026, 11, 3, 5, 30),
    ]


def test_santiago_changes_at_midnight_both_directions():
    """Santiago: 23:30 runs once on the repeated hour (4 Apr 2026), 00:30 shifts to 01:00 on 6 Sep 2026."""
    assert chain("30 23 * * *", "America/Santiago", "shift", utc(2026, 4, 3, 12), 3) == [
        utc(2026, 4, 4, 2, 30),
        utc(2026, 4, 5, 2, 30),  # 23:30 -03 on the 4th; the repeat (23:30 -04) does not run again
        utc(2026, 4, 6, 3, 30),
    ]
    assert chain("30 0 * * *", "America/Santiago", "shift", utc(2026, 9, 4, 12), 3) == [
        utc(2026, 9, 5, 4, 30),
        utc(2026, 9, 6, 4, 0),
        utc(2026, 9, 7, 3, 30),
    ]


def test_each_zone_gets_its_own_0900():
    """The same 09:00 rule gives each zone its own instant (Tokyo, London, New York in January)."""
    after = utc(2026, 1, 10, 12)
    got = {
        z: rules.schedule_for("0 9 * * *", None, z, "shift", after).next_after(after)
        for z in ("Asia/Tokyo", "Europe/London", "America/New_York")
    }
    assert got == {
        "Asia/Tokyo": utc(2026, 1, 11, 0),
        "Europe/London": utc(2026, 1, 11, 9),
        "America/New_York": utc(2026, 1, 10, 14),
    }


def test_missed_skip_plans_the_first_after_now():
    """skip: occurrences older than the late window are not run; the next is the first after now."""
    schedule = rules.schedule_for("0 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    occ = rules.following(schedule, utc(2026, 1, 1, 9), now=utc(2026, 1, 5, 12), missed="skip", late_seconds=60)
    assert occ == rules.Occurrence(at=utc(2026, 1, 6, 9), due_at=utc(2026, 1, 6, 9))


def test_missed_run_once_runs_the_latest_missed_now():
    """run_once: the latest missed occurrence runs once, due now; the one after comes on schedule."""
    schedule = rules.schedule_for("0 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    now = utc(2026, 1, 5, 12)
    occ = rules.following(schedule, utc(2026, 1, 1, 9), now=now, missed="run_once", late_seconds=60)
    assert occ == rules.Occurrence(at=utc(2026, 1, 5, 9), due_at=now)
    after = rules.following(schedule, occ.at, now=now, missed="run_once", late_seconds=60)
    assert after == rules.Occurrence(at=utc(2026, 1, 6, 9), due_at=utc(2026, 1, 6, 9))


def test_missed_run_once_runs_the_latest_instant_before_an_end_that_passed_meanwhile():
    """Planner down from 01-02 to 01-10, ends_at 01-05 12:00: run_once runs 01-05 09:00, the last missed
    instant inside the window (it looked up to now, found 01-10 09:00 past the end and ran none)."""
    schedule = rules.schedule_for("0 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    now, ends_at = utc(2026, 1, 10, 12), utc(2026, 1, 5, 12)
    occ = rules.following(schedule, utc(2026, 1, 1, 9), now=now, missed="run_once", late_seconds=60, ends_at=ends_at)
    assert occ == rules.Occurrence(at=utc(2026, 1, 5, 9), due_at=now)
    assert rules.following(schedule, occ.at, now=now, missed="run_once", late_seconds=60, ends_at=ends_at) is None
    skip = rules.following(schedule, utc(2026, 1, 1, 9), now=now, missed="skip", late_seconds=60, ends_at=ends_at)
    assert skip is None, "skip still runs nothing missed"


@pytest.mark.parametrize("missed", ["skip", "run_once"])
def test_the_next_occurrence_is_never_before_a_start_moved_later(missed):
    """starts_at moved ten days ahead while an occurrence ran (or the recurrence was paused): the planner and
    resume planned the next one from the last run, ten days before the start."""
    schedule = rules.schedule_for("0 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    now = utc(2026, 1, 2, 12)
    occ = rules.following(
        schedule, utc(2026, 1, 2, 9), now=now, missed=missed, late_seconds=60, starts_at=utc(2026, 1, 12, 9)
    )
    assert occ == rules.Occurrence(at=utc(2026, 1, 12, 9), due_at=utc(2026, 1, 12, 9)), "the start itself counts"
    unchanged = rules.following(schedule, utc(2026, 1, 2, 9), now=now, missed=missed, late_seconds=60,
                                starts_at=utc(2026, 1, 1))  # fmt: skip
    assert unchanged == rules.Occurrence(at=utc(2026, 1, 3, 9), due_at=utc(2026, 1, 3, 9))


def test_late_within_the_window_still_runs_at_its_instant():
    """An occurrence planned a little late (within late_seconds) is not missed: it keeps its instant."""
    schedule = rules.schedule_for("*/5 * * * *", None, "UTC", "shift", utc(2026, 1, 1))
    occ = rules.following(schedule, utc(2026, 1, 1, 9), now=utc(2026, 1, 1, 9, 5, 30), missed="skip", late_seconds=60)
    assert occ is not None
    assert occ.at == utc(2026, 1, 1, 9, 5)


def test_end_stops_the_chain_and_start_opens_it():
    """No occurrence after ends_at; the first is at or after starts_at."""
    schedule = rules.schedule_for("0 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    assert (
        rules.following(
            schedule,
            utc(2026, 1, 1, 9),
            now=utc(2026, 1, 1, 9),
            missed="skip",
            late_seconds=60,
            ends_at=utc(2026, 1, 2),
        )
        is None
    )
    first = rules.first(schedule, now=utc(2026, 1, 1), starts_at=utc(2026, 2, 1, 9), ends_at=None)
    assert first is not None
    assert first.at == utc(2026, 2, 1, 9)


def test_every_grid_is_anchored_at_the_start():
    """every= places occurrences on anchor + k * every, the first at the start itself."""
    anchor = utc(2026, 1, 1, 0, 0, 7)
    schedule = rules.schedule_for("", 3600, "UTC", "shift", anchor)
    assert rules.upcoming(schedule, anchor, 3, ends_at=None) == [
        anchor,
        utc(2026, 1, 1, 1, 0, 7),
        utc(2026, 1, 1, 2, 0, 7),
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((None, None, None, None, "skip"), exceptions.InvalidRecurrence),
        (("0 9 * * *", 60, None, None, "skip"), exceptions.InvalidRecurrence),
        (("0 9 * * *", None, dt.datetime(2026, 1, 1), None, "skip"), exceptions.InvalidSchedule),
        (("0 9 * * *", None, utc(2026, 2, 1), utc(2026, 1, 1), "skip"), exceptions.InvalidRecurrence),
        (("0 9 * * *", None, None, None, "run_all"), exceptions.InvalidPolicy),
        ((None, 0.5, None, None, "skip"), exceptions.InvalidRecurrence),
        (("", None, None, None, "skip"), exceptions.InvalidCronExpression),
    ],
)
def test_bad_rules_are_refused_by_name(args, error):
    """No rule, both rules, naive datetimes, ends before starts, unknown policy, sub-second every: named errors."""
    with pytest.raises(error):
        rules.check_rule(*args)


def test_bad_expression_and_zone_are_refused_by_name():
    """A bad cron expression and an unknown zone raise the cron engine's named errors."""
    with pytest.raises(exceptions.InvalidCronExpression):
        rules.schedule_for("61 9 * * *", None, "UTC", "shift", utc(2026, 1, 1))
    with pytest.raises(exceptions.UnknownTimeZone):
        rules.schedule_for("0 9 * * *", None, "Mars/Olympus", "shift", utc(2026, 1, 1))
    with pytest.raises(exceptions.UnknownTimeZone):
        rules.schedule_for("", 60, "Mars/Olympus", "shift", utc(2026, 1, 1))
