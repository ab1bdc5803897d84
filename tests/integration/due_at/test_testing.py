"""scheduling.testing, used as a project's tests use it: inside the test's transaction, on real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import TestCase
from django.utils import timezone

from scheduling import api, registry, testing
from scheduling.core import exceptions
from scheduling.models import JobState, ScheduledJob
from tasks.models import Execution
from tests.taskkit import tasks

pytestmark = pytest.mark.django_db  # a transaction per test, rolled back: as pytest-django's `db` and TestCase


def test_run_due_runs_the_due_jobs_in_this_process_and_leaves_the_future_ones():
    """Due jobs run here (their effect is in this transaction); a job due in an hour waits unless asked."""
    due = api.schedule("demo.record", {"label": "now"}, delay=0)
    later = api.schedule("demo.record", {"label": "later"}, delay=3600)
    report = testing.run_due()
    assert (report.rounds, report.started, report.succeeded, report.job_ids) == (1, 1, 1, [due.id])
    assert ScheduledJob.objects.get(pk=due.id).state == JobState.DONE
    assert ScheduledJob.objects.get(pk=later.id).state == JobState.PENDING
    assert testing.run_due(include_future=True).job_ids == [later.id]
    assert Execution.objects.filter(kind="demo.record").count() == 2


def test_run_due_follows_retries_to_the_end_with_include_future():
    """A failing job is retried round after round (backoff skipped) until dead: every attempt counted."""
    job = api.schedule("demo.fail", {}, delay=0)
    report = testing.run_due(include_future=True)
    assert (report.rounds, report.started, report.failed, report.succeeded) == (3, 3, 3, 0)
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD
    assert testing.run_due(include_future=True).rounds == 0


def test_run_due_stops_after_max_rounds():
    """max_rounds bounds the loop: one round runs one attempt of a job that keeps failing."""
    api.schedule("demo.fail", {}, delay=0)
    assert testing.run_due(include_future=True, max_rounds=1).started == 1


def test_run_due_runs_django_tasks_too():
    """A Django task enqueued in the test runs inline and its result is SUCCESSFUL with the value."""
    result = tasks.add.enqueue(20, 22)
    testing.run_due()
    assert tasks.add.get_result(result.id).return_value == 42


def test_assert_scheduled_matches_kind_payload_key_and_due_time():
    """The job scheduled with that payload, key and due time is found and returned; count=0 says none is."""
    at = timezone.now() + dt.timedelta(days=3)
    job = api.schedule("demo.record", {"label": "x"}, due_at=at, key="trial:1")
    found = testing.assert_scheduled("demo.record", payload={"label": "x"}, key="trial:1", due_at=at)
    assert found is not None
    assert found.id == job.id
    testing.assert_scheduled("demo.record", payload={"label": "y"}, count=0)
    testing.assert_scheduled("demo.noop", count=0)


def test_assert_scheduled_fails_with_what_there_is():
    """A mismatch raises AssertionError listing the jobs of the kind (payload, key, due, state)."""
    api.schedule("demo.record", {"label": "real"}, delay=60, key="k:1")
    with pytest.raises(AssertionError, match=r"expected 1 job\(s\) of 'demo.record'.*found 0") as caught:
        testing.assert_scheduled("demo.record", payload={"label": "other"})
    assert "key='k:1'" in str(caught.value)
    assert "'label': 'real'" in str(caught.value)
    with pytest.raises(AssertionError, match="found 0"):
        testing.assert_scheduled("demo.record", due_at=timezone.now() + dt.timedelta(days=1))


def test_isolated_registry_starts_empty_keeps_tasks_and_forgets_its_kinds():
    """Inside: no app kinds, the declared tasks kept, new kinds usable; after: the old registry, without them."""
    with testing.isolated_registry():
        with pytest.raises(exceptions.UnknownJobKind):
            registry.get("demo.record")
        assert registry.get("tests.taskkit.tasks.add").name == "tests.taskkit.tasks.add"

        @registry.handler("isolated.only", schema={"type": "object"})
        def only(job: registry.Job) -> None:
            """A kind that lives in the block only."""

        api.schedule("isolated.only", {}, delay=0)
        assert testing.run_due().succeeded == 1
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("isolated.only")
    assert registry.get("demo.record").name == "demo.record"
    with testing.isolated_registry(keep_tasks=False), pytest.raises(exceptions.UnknownJobKind):
        registry.get("tests.taskkit.tasks.add")


def test_inline_deferrals_make_defer_a_row_that_run_due_runs():
    """Under inline_deferrals, a 5 s defer() is a due_at row (mechanism table) and runs inline; outside, a countdown."""
    with testing.inline_deferrals():
        handle = api.defer("demo.record", {"label": "deferred"}, 5)
        assert handle.mechanism == "due_at"
        testing.run_due(include_future=True)
    assert Execution.objects.filter(kind="demo.record").count() == 1
    assert ScheduledJob.objects.get(pk=handle.id).state == JobState.DONE
    assert api.defer("demo.record", {"label": "deferred"}, 5).mechanism == "deferrals"


class RunDueInsideTestCase(TestCase):
    """Django's TestCase: one transaction per test, whose now() PostgreSQL freezes at its start."""

    def test_a_task_enqueued_for_now_during_the_test_runs(self) -> None:
        """run_due() runs a task enqueued with run_after=timezone.now() inside the TestCase (wall clock, not now())."""
        result = tasks.add.using(run_after=timezone.now()).enqueue(20, 22)
        with self.captureOnCommitCallbacks(execute=True):
            report = testing.run_due()
        assert report.succeeded == 1
        assert tasks.add.get_result(result.id).return_value == 42

    def test_a_task_for_later_still_waits(self) -> None:
        """A task due in an hour is not run by run_due() (only what the wall clock says is due)."""
        tasks.add.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1, 1)
        assert testing.run_due().started == 0
