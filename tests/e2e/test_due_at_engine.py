"""The due_at engine end to end: a real worker and a real beat."""

from __future__ import annotations

import pytest
from django.db.models import Max

from scheduling import api
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]


def test_due_job_runs_once_cancelled_never_failing_retries_to_dead(cluster):
    """A job due in 2 s runs once, a cancelled one never runs, a failing one retries to dead."""
    worker = cluster.worker()
    cluster.beat()
    wait_ready(worker)
    runs = api.schedule("demo.record", {"label": "due-in-2s"}, delay=2)
    cancelled = api.schedule("demo.record", {"label": "cancelled"}, delay=2)
    failing = api.schedule("demo.fail", {}, delay=1)
    api.cancel(cancelled.id)

    wait_for(lambda: ScheduledJob.objects.get(pk=runs.id).state == JobState.DONE, 30, message="the due job to run")
    wait_for(
        lambda: ScheduledJob.objects.get(pk=failing.id).state == JobState.DEAD, 60, message="the failing job to die"
    )

    assert Execution.objects.filter(idempotency_key=f"job:{runs.id}").count() == 1
    assert not Execution.objects.filter(idempotency_key=f"job:{cancelled.id}").exists()
    assert ScheduledJob.objects.get(pk=cancelled.id).state == JobState.CANCELLED
    dead = ScheduledJob.objects.get(pk=failing.id)
    assert dead.attempts == dead.max_attempts == 3
    assert Execution.objects.filter(idempotency_key=f"job:{failing.id}").count() == 3
    outcomes = list(JobAttempt.objects.filter(job_id=failing.id).order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["failed", "failed", "failed"]
    attempt = JobAttempt.objects.get(job_id=runs.id)
    assert attempt.outcome == "succeeded"
    assert attempt.started_at >= runs.due_at, "nothing runs before its due time"
    assert JobAttempt.objects.aggregate(m=Max("number"))["m"] == 3


def test_timeout_stops_a_handler(cluster):
    """A handler running past its kind's timeout is stopped and recorded as timed_out."""
    worker = cluster.worker()
    cluster.beat()
    wait_ready(worker)
    job = api.schedule("demo.sleep", {"seconds": 30}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD, 60, message="the sleeper to die")
    outcomes = list(JobAttempt.objects.filter(job_id=job.id).values_list("outcome", flat=True))
    assert outcomes == ["timed_out", "timed_out"]
    for attempt in JobAttempt.objects.filter(job_id=job.id):
        assert (attempt.finished_at - attempt.started_at).total_seconds() < 10
