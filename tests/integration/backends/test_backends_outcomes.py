"""Django Tasks: handler-chosen outcomes in results (Snooze READY, Discard/Cancel FAILED), uniqueness windows."""

from __future__ import annotations

import pytest

from scheduling import testing
from scheduling.backends import TaskResultStatus
from tests import support
from tests.taskkit import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_snoozed_task_is_ready_again_with_no_error():
    """Snooze: the result is READY (it runs again later), with no TaskError."""
    result = tasks.chooses.enqueue("snooze")
    testing.run_due(max_rounds=1)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors == []


@pytest.mark.parametrize(
    ("outcome", "path", "reason"),
    [
        ("discard", "scheduling.core.registry.Discard", "the invoice was already paid"),
        ("cancel", "scheduling.core.registry.Cancel", "the customer left"),
    ],
)
def test_a_discarded_or_cancelled_task_is_failed_with_its_reason(outcome, path, reason):
    """Discard / Cancel: FAILED at once (attempts were left), one TaskError naming the class, the reason in it."""
    result = tasks.chooses.enqueue(outcome)
    testing.run_due(max_rounds=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [path]
    assert reason in result.errors[0].traceback


def test_a_tasks_unique_for_option_keeps_one_job_per_window():
    """.options(unique_for=3600): enqueueing the same call twice gives the same result id, one row."""
    import datetime as dt

    from scheduling.models import ScheduledJob

    support.clear_of_a_slot_edge(3600)  # both enqueues meet in one hour's slot
    windowed = tasks.add.using().options(unique_for=dt.timedelta(hours=1), on_conflict="keep")
    first = windowed.enqueue(1, 2)
    second = windowed.enqueue(1, 2)
    assert first.id == second.id
    assert ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").count() == 1
