"""A worker that stops mid-batch gives the batch back: only the job it was running is charged.

``scheduling/due_at/runner.py``: a shutdown (Celery's soft then cold shutdown, as a deploy sends
it) or Celery's hard time limit (billiard's SIGTERM to the pool process) stops a batch while one
job runs and others wait behind it. The waiting ones never ran: they go back pending with their
attempts as they were and run on another worker; the running one is charged the attempt (dead
here: the kind allows one). Kind ``faults.batch_effect``: batches of 4, one attempt.
"""

from __future__ import annotations

import signal

import pytest
from django.db import transaction

from scheduling import api
from scheduling.core import broker, tasknames
from scheduling.due_at import runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import Cluster, Proc, wait_for, wait_ready
from tests.faultkit.kinds import handlers  # noqa: F401 - registers the test kinds in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAST = {
    "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings",
    "SCHEDULING_HEARTBEAT_SECONDS": "1",
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1",
    "CELERY_BROKER_RESTORE_INTERVAL_SECONDS": "1",
}
# SIGTERM as a deploy sends it, with REMAP_SIGTERM=SIGQUIT (docs/operations.md): a soft shutdown of
# 2 s, then the running task is cancelled (SIGTERM to its pool process).
SOFT_SHUTDOWN = {"REMAP_SIGTERM": "SIGQUIT", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS": "2"}
KIND = "faults.batch_effect"


def _schedule_batch() -> tuple[int, list[int]]:
    """One batch: a first job holding 10 s (the most urgent, so it runs first), then three quick ones."""
    with transaction.atomic():  # committed together: the claim takes the four in one batch
        first = api.schedule(KIND, {"hold": 10}, delay=0, priority=1)
        rest = [api.schedule(KIND, {"hold": 0}, delay=0) for _ in range(3)]
    return first.id, [job.id for job in rest]


def _executions(job_id: int) -> list[Execution]:
    return list(Execution.objects.filter(idempotency_key=f"job:{job_id}").order_by("id"))


def _outcomes(job_id: int) -> list[str]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("number").values_list("outcome", flat=True))


def _assert_given_back_uncharged(rest: list[int]) -> None:
    """Back pending with no attempt recorded (or already claimed again, by the leaving worker's last claim)."""
    for job in ScheduledJob.objects.filter(id__in=rest):
        again = job.state == JobState.CLAIMED and job.attempts == 1
        assert (job.state == JobState.PENDING and job.attempts == 0) or again, (
            f"job {job.id} never ran: back pending, its attempt not counted ({job.state}, {job.last_error!r})"
        )
        assert _outcomes(job.id) == [], "nothing recorded: it ran nothing"


def _assert_ran_once_on(rest: list[int], worker: Proc) -> None:
    final = (JobState.DONE, JobState.DEAD, JobState.CANCELLED)
    for job_id in rest:
        wait_for(lambda job_id=job_id: ScheduledJob.objects.get(pk=job_id).state in final, 30, message="the job to end")
        job = ScheduledJob.objects.get(pk=job_id)
        assert job.state == JobState.DONE, f"job {job_id} never ran, yet it is {job.state}: {job.last_error!r}"
        assert _outcomes(job_id) == [AttemptOutcome.SUCCEEDED]
        assert job.attempts == 1
        assert [run.pid in worker.children() for run in _executions(job_id)] == [True]


def test_a_deploy_gives_back_what_never_started_uncharged(cluster: Cluster):
    """SIGTERM mid-batch (soft, then cold shutdown): 3 unstarted jobs come back uncharged; the running one pays."""
    leaving = cluster.worker("w1", concurrency=1, env={**FAST, **SOFT_SHUTDOWN})
    wait_ready(leaving)
    first, rest = _schedule_batch()
    wait_for(lambda: _executions(first), 30, message="the first job to start")
    taken = ScheduledJob.objects.filter(id__in=[first, *rest]).exclude(state=JobState.PENDING).count()
    assert taken == 4, "the four jobs were claimed as one batch"
    leaving.signal(signal.SIGTERM)
    assert leaving.popen.wait(30) is not None

    _assert_given_back_uncharged(rest)
    charged = ScheduledJob.objects.get(pk=first)
    assert charged.state == JobState.DEAD, "the job that was running is charged (its one attempt)"
    assert list(JobAttempt.objects.filter(job_id=first).values_list("outcome", "error")) == [
        (AttemptOutcome.RECLAIMED, runner.RELEASE_REASON)
    ]
    staying = cluster.worker("w2", concurrency=1, env=FAST)
    wait_ready(staying)
    _assert_ran_once_on(rest, staying)


def test_the_hard_time_limit_gives_back_what_never_started_uncharged(cluster: Cluster):
    """A batch past Celery's hard time limit: its 3 unstarted jobs run later, uncharged, once each."""
    worker = cluster.worker("w1", concurrency=1, env=FAST)
    wait_ready(worker)
    with transaction.atomic():  # claimed before any worker's claim can see them
        first, rest = _schedule_batch()
        claims = store.claim_due_jobs(10)
    assert [c.id for c in claims] == [first, *rest]
    # Sent as the claim sends a batch, with a hard limit the first job outlives (the claim's own is the
    # sum of the jobs' timeouts plus 30 s: the same path, longer).
    broker.send(tasknames.RUN_BATCH, args=[[[c.id, c.token] for c in claims]], time_limit=3)
    wait_for(lambda: "Hard time limit (3s) exceeded" in worker.log(), 30, message="the hard time limit")
    # The pool process gives the batch back in the 0.1 s billiard leaves between its SIGTERM and its
    # SIGKILL (one statement). Killed before that, the sweeper refunds the batch that died together
    # (each job's attempt recorded, not counted): the unstarted jobs still run once, never dead.
    ended = (JobState.DEAD, JobState.DONE)
    wait_for(lambda: ScheduledJob.objects.get(pk=first).state in ended, 45, message="the running job to end")
    gave_back = JobAttempt.objects.filter(job_id=first, error=runner.RELEASE_REASON).exists()
    if gave_back:
        _assert_ran_once_on(rest, worker)
        assert ScheduledJob.objects.get(pk=first).state == JobState.DEAD, "the running job was charged"
    else:  # pragma: no cover - a loaded machine: reported, and the weaker guarantee checked
        print("\nthe pool process was killed before its give-back: the sweeper refunded the batch")
        for job_id in rest:
            wait_for(lambda job_id=job_id: ScheduledJob.objects.get(pk=job_id).state == JobState.DONE, 30)
            assert len(_executions(job_id)) == 1
