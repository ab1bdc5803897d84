"""System checks of the recurrences' settings: scheduling.E010 and scheduling.W009."""

from __future__ import annotations

from django.test import override_settings

from scheduling.recurring import checks


def ids() -> list[str]:
    return [message.id for message in checks.check_recurrence_settings()]


def test_defaults_pass():
    """The default planner settings raise nothing."""
    assert ids() == []


def test_a_planner_that_cannot_plan_is_an_error():
    """A batch of 0 or a non-positive interval is scheduling.E010."""
    with override_settings(SCHEDULING_RECURRENCE_PLAN_BATCH_SIZE=0):
        assert ids() == ["scheduling.E010"]
    with override_settings(SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS=0):
        assert "scheduling.E010" in ids()


def test_a_late_window_shorter_than_the_pace_is_a_warning():
    """A late window under the planner's and claim's intervals would miss occurrences: scheduling.W009."""
    with override_settings(SCHEDULING_RECURRENCE_LATE_SECONDS=1.0):
        assert ids() == ["scheduling.W009"]
