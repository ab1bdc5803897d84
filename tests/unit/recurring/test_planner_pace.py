"""The planner's pace: its interval, longer while a pick that leaves its batch short is slow (no database)."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from scheduling.recurring import planner


def test_a_fast_pick_keeps_the_interval():
    """A quiet table's pick (well under a millisecond): the next pass after the interval, 1 s."""
    assert planner.pace_seconds(0.0004) == 1.0


def test_a_slow_pick_waits_until_it_costs_its_share():
    """A spike's pick of 50 ms waits 50 ms / PICK_SHARE (2.5 s); a pick of a second waits PACE_MAX_SECONDS."""
    assert planner.pace_seconds(0.05) == pytest.approx(0.05 / planner.PICK_SHARE)
    assert planner.pace_seconds(1.0) == planner.PACE_MAX_SECONDS


def test_the_wait_stays_within_a_quarter_of_the_late_window_and_never_below_the_interval():
    """An occurrence planned later than SCHEDULING_RECURRENCE_LATE_SECONDS counts as missed: a slow pick
    adds at most a quarter of it; a longer interval than the slow pick's wait is kept."""
    with override_settings(SCHEDULING_RECURRENCE_LATE_SECONDS=8.0):
        assert planner.pace_seconds(1.0) == 2.0
    with override_settings(SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS=3.0):
        assert planner.pace_seconds(0.01) == 3.0


@pytest.mark.parametrize(
    ("report", "wait"),
    [
        (planner.PlanReport(2000, 2000, 0, 1, False, 0.05), 2.5),  # short, slow pick: paced
        (planner.PlanReport(5000, 5000, 0, 1, True, 0.05), 0.0),  # full: the next pass at once
        (planner.PlanReport(0, 0, 0, 0, False, 0.0002), 1.0),  # nothing due: the interval
    ],
)
def test_the_duty_waits_what_its_last_pass_says(monkeypatch, report, wait):
    """The duty's next pass: at once after a full one, else after ``pace_seconds`` of the pass's pick."""
    monkeypatch.setattr(planner, "plan_once", lambda: report)
    duty = planner.Duty()
    before = time.monotonic()
    duty()
    assert duty.counters.passes == 1
    assert before + wait <= duty._next_at <= time.monotonic() + wait
