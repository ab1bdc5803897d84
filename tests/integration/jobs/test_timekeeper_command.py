"""``manage.py timekeeper``: list, cancel, retry, reschedule and status, through scheduling.api."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from scheduling import api
from scheduling.models import JobState, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    """Call the command; return (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    call_command("timekeeper", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def jobs() -> dict[str, int]:
    """An overdue pending job, a future one with a key, a dead one and a done one."""
    overdue = api.schedule("demo.noop", {}, delay=0)
    future = api.schedule("demo.record", {}, delay=3600, key="order:7")
    dead = api.schedule("demo.noop", {"n": "dead"}, delay=3600)
    ScheduledJob.objects.filter(pk=dead.id).update(
        state=JobState.DEAD, finished_at=timezone.now(), attempts=5, last_error="boom"
    )
    done = api.schedule("demo.noop", {"n": "done"}, delay=3600)
    ScheduledJob.objects.filter(pk=done.id).update(state=JobState.DONE, finished_at=timezone.now())
    return {"overdue": overdue.id, "future": future.id, "dead": dead.id, "done": done.id}


def test_jobs_lists_with_each_filter(jobs):
    """--state, --kind, --key, --overdue and --limit narrow the JSON listing as named."""

    def ids(*args: str) -> list[int]:
        return [row["id"] for row in json.loads(run("jobs", "--json", *args)[0])]

    assert sorted(ids()) == sorted(jobs.values())
    assert ids("--state", "dead") == [jobs["dead"]]
    assert ids("--kind", "demo.record") == [jobs["future"]]
    assert ids("--key", "order:7") == [jobs["future"]]
    assert ids("--overdue") == [jobs["overdue"]]
    assert len(ids("--limit", "2")) == 2
    text = run("jobs", "--state", "dead")[0]
    assert "boom" in text
    assert "demo.noop" in text


def test_cancel_changes_pending_jobs_and_reports_the_others(jobs):
    """cancel touches only pending jobs; the done one and a missing id are reported, not changed."""
    out, err = run("cancel", str(jobs["overdue"]), str(jobs["done"]), "999999")
    assert f"Cancelled 1 job: {jobs['overdue']}." in out
    assert f"Not cancelled (done, not pending): {jobs['done']}." in err
    assert "No such job: 999999." in err
    assert ScheduledJob.objects.get(pk=jobs["overdue"]).state == JobState.CANCELLED
    assert ScheduledJob.objects.get(pk=jobs["done"]).state == JobState.DONE


def test_a_change_that_touches_nothing_is_an_error(jobs):
    """Retrying a job that is not dead changes nothing and fails with a message saying what can be retried."""
    with pytest.raises(CommandError, match="only dead jobs can be"):
        run("retry", str(jobs["future"]))


def test_retry_makes_a_dead_job_pending(jobs):
    """retry moves the dead job back to pending with fresh attempts."""
    out, _err = run("retry", str(jobs["dead"]))
    assert f"Retried 1 job: {jobs['dead']}." in out
    job = ScheduledJob.objects.get(pk=jobs["dead"])
    assert (job.state, job.attempts) == (JobState.PENDING, 0)


def test_reschedule_with_at_and_in(jobs):
    """--at sets the due time given; --in sets it that many seconds from now."""
    run("reschedule", str(jobs["future"]), "--at", "2031-01-31T09:00:00+00:00")
    assert ScheduledJob.objects.get(pk=jobs["future"]).due_at == dt.datetime(2031, 1, 31, 9, tzinfo=dt.UTC)
    before = timezone.now()
    run("reschedule", str(jobs["future"]), "--in", "600")
    due_at = ScheduledJob.objects.get(pk=jobs["future"]).due_at
    assert before + dt.timedelta(seconds=590) < due_at < before + dt.timedelta(seconds=3600)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cancel", "abc"], "is not a job id"),
        (["cancel", "0"], "ids are positive"),
        (["reschedule", "1", "--at", "tomorrow"], "is not an ISO 8601 time"),
        (["reschedule", "1", "--in", "-5"], "zero or more seconds"),
        (["reschedule", "1"], "one of the arguments --at --in is required"),
        (["jobs", "--state", "lost"], "invalid choice"),
        (["jobs", "--limit", "0"], "must be positive"),
    ],
)
def test_bad_input_is_a_command_error_naming_the_problem(args, says):
    """Each malformed argument is refused with a message a person can act on, before anything changes."""
    with pytest.raises(CommandError, match=says):
        run(*args)


def test_status_json_is_api_status(jobs):
    """status --json prints scheduling.api.status(); the text form shows the backlog line."""
    data = json.loads(run("status", "--json")[0])
    assert (data["backlog"], data["pending"]) == (1, 2)
    assert "backlog (pending and due)" in run("status")[0]
