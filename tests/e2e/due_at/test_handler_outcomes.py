"""Handler-chosen outcomes on a real worker: Snooze and Cancel, atomic and committing kinds."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from scheduling import api
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]

KINDS = ["demo.choose", "demo.choose_committing"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_snoozing_job_runs_again_uncharged_until_it_succeeds(cluster, kind):
    """A job snoozing for 2 s is claimed again, then done on attempt 1; only a committing job keeps its rows."""
    worker = cluster.worker()
    wait_ready(worker)
    until = (timezone.now() + dt.timedelta(seconds=2)).isoformat()
    job = api.schedule(kind, {"snooze_until": until}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.id).state == JobState.DONE, 60, message="the job to finish")
    done = ScheduledJob.objects.get(pk=job.id)
    outcomes = list(JobAttempt.objects.filter(job_id=job.id).order_by("id").values_list("outcome", flat=True))
    assert outcomes[-1] == "succeeded"
    assert set(outcomes[:-1]) == {"snoozed"}
    assert len(outcomes) >= 2, "it snoozed at least once"
    assert done.attempts == 1, "no snooze was charged"
    rows = Execution.objects.filter(idempotency_key=f"job:{job.id}").count()
    assert rows == (1 if kind == "demo.choose" else len(outcomes))


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_its_handler_cancels_is_cancelled_with_the_reason(cluster, kind):
    """Cancel("no longer wanted") with an attempt left: cancelled, not retried; an atomic job's row rolled back."""
    worker = cluster.worker()
    wait_ready(worker)
    job = api.schedule(kind, {"cancel": "no longer wanted"}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.id).state == JobState.CANCELLED, 60, message="the cancel")
    cancelled = ScheduledJob.objects.get(pk=job.id)
    assert cancelled.last_error == "Cancel: no longer wanted"
    assert list(JobAttempt.objects.filter(job_id=job.id).values_list("outcome", flat=True)) == ["cancelled"]
    assert Execution.objects.filter(idempotency_key=f"job:{job.id}").count() == (0 if kind == "demo.choose" else 1)
