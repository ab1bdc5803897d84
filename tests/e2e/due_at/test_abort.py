"""Aborting on real Celery workers: atomic and committing handlers and a fixed-time run interrupted mid-sleep.

A worker (prefork, heartbeat every second) runs a job that writes a row and then sleeps two
minutes; the test aborts it as an operator would (another process: this one) and checks the rows:
the job is cancelled with who asked, its attempt aborted, an atomic job's row rolled back. The time
from the abort to the interruption (the attempt's end minus the request, both on the database
clock) is printed, not asserted beyond "long before the sleep would have ended".
"""

from __future__ import annotations

import pytest

from scheduling import api, exceptions, schedules
from scheduling.fixed import gate
from scheduling.models import AttemptOutcome, JobAbort, JobAttempt, JobState, RunState, ScheduledJob, ScheduleRun
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready
from tests.faultkit.kinds import abort as abort_kinds  # registers the test kinds in this process

pytestmark = [pytest.mark.e2e]

ENV = {"DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings", "SCHEDULING_HEARTBEAT_SECONDS": "1"}


@pytest.mark.parametrize(("kind", "kept_rows"), [("faults.abort_atomic", 0), ("faults.abort_committing", 1)])
def test_an_abort_interrupts_the_handler_on_its_worker(cluster, kind, kept_rows):
    """The sleeping handler is interrupted: cancelled, attempt aborted by the operator, atomic writes gone."""
    worker = cluster.worker(env=ENV)
    cluster.beat(env=ENV)
    wait_ready(worker)
    job = api.schedule(kind, {}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.pk).state == JobState.RUNNING, 60, message="the job to start")
    if kind == "faults.abort_committing":  # its row commits at once: wait for it, so its survival means something
        wait_for(lambda: Execution.objects.filter(idempotency_key=f"job:{job.pk}").exists(), 30, message="its row")
    assert api.abort(job.pk, by="operator-7") == api.Aborted(job.pk, "requested")
    wait_for(
        lambda: ScheduledJob.objects.get(pk=job.pk).state == JobState.CANCELLED,
        abort_kinds.HOLD_SECONDS / 2,
        interval=0.1,
        message="the abort to interrupt the handler",
    )
    attempt = JobAttempt.objects.get(job_id=job.pk)
    assert attempt.outcome == AttemptOutcome.ABORTED
    assert attempt.error.startswith("aborted by operator-7 at ")
    assert ScheduledJob.objects.get(pk=job.pk).last_error == attempt.error
    assert Execution.objects.filter(idempotency_key=f"job:{job.pk}").count() == kept_rows
    requested_at = JobAbort.objects.get(job_id=job.pk).requested_at
    took = (attempt.finished_at - requested_at).total_seconds()
    print(f"{kind}: interrupted {took:.2f} s after the abort (heartbeat 1 s)")
    assert took < abort_kinds.HOLD_SECONDS, "interrupted, not run to its end"
    assert worker.alive(), "the pool process lives on"


def test_a_job_finished_before_the_abort_stays_done(cluster):
    """A job that finished on a real worker stays done; the abort says so and asks nothing."""
    worker = cluster.worker(env=ENV)
    cluster.beat(env=ENV)
    wait_ready(worker)
    job = api.schedule("faults.abort_atomic", {"hold": 0}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.pk).state == JobState.DONE, 60, message="the job to finish")
    with pytest.raises(exceptions.JobAlreadyFinished):
        api.abort(job.pk)
    assert not JobAbort.objects.exists()


def test_an_abort_interrupts_a_fixed_time_run_on_its_worker(cluster):
    """A manual run of a schedule that sleeps two minutes is interrupted and recorded aborted with who asked."""
    schedules.sync(
        declarations=[schedules.make(name="abort-nightly", kind="faults.abort_atomic", cron="0 3 * * *", payload={})]
    )
    worker = cluster.worker(env=ENV)
    wait_ready(worker)
    gate.run_now("abort-nightly")
    run = wait_for(
        lambda: ScheduleRun.objects.filter(schedule__periodic_task__name="abort-nightly", state="running").first(),
        60,
        message="the run to start",
    )
    api.abort_schedule_run(run.pk, by="operator-9")
    wait_for(
        lambda: ScheduleRun.objects.get(pk=run.pk).state == RunState.ABORTED,
        60,
        interval=0.1,
        message="the abort to interrupt the run",
    )
    run.refresh_from_db()
    assert run.abort_requested_by == "operator-9"
    assert run.error.startswith("aborted by operator-9 at ")
    assert run.finished_at is not None
    assert run.abort_requested_at is not None
    print(f"fixed-time run: interrupted {(run.finished_at - run.abort_requested_at).total_seconds():.2f} s after")
    assert (run.finished_at - run.started_at).total_seconds() < abort_kinds.HOLD_SECONDS, (
        "interrupted, not slept to its end"
    )
