"""An occurrence claimed when its recurrence is paused or cancelled never returns to pending.

Pausing and cancelling let a claimed or running occurrence finish the attempt it has, with no retry
(its budget becomes its spent attempts). A give-back that returns an attempt (a worker stopping
before the handler began, a claim never sent, a rate limit, a handler's Snooze) gave that budget
back: the occurrence was pending again and ran after the user had cancelled (or while paused).
The lifecycle's deleted-owner decisions apply to it: given back, it is cancelled (found by review).
And an occurrence cancelled with its recurrence says why, and its history names who did it.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from scheduling import api, registry
from scheduling.due_at import lease, runner
from scheduling.due_at import store as jobs_store
from scheduling.models import JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[int] = []


def _snooze_once(job: registry.Job) -> None:
    CALLS.append(job.id)
    if len(CALLS) == 1:
        raise registry.Snooze(0)


registry.handler("giveback.snooze_once", schema={"type": "object"}, timeout=10)(_snooze_once)


@pytest.fixture(autouse=True)
def _clean():
    CALLS.clear()
    yield
    lease.stop()


def _claimed_occurrence(kind: str) -> tuple[int, list[tuple[int, str]], int]:
    recurrence = api.recur(kind, {}, key="k", every=3600)
    (job,) = ScheduledJob.objects.filter(recurrence_id=recurrence.id)
    support.make_due(job.id)
    claims = [(c.id, c.token) for c in jobs_store.claim_due_jobs(10)]
    assert [i for i, _ in claims] == [job.id]
    return recurrence.id, claims, job.id


@pytest.mark.parametrize("stop", ["cancel_recurrence", "pause_recurrence"])
def test_a_stopping_workers_give_back_cancels_the_occurrence_of_a_stopped_recurrence(stop):
    recurrence_id, claims, job_id = _claimed_occurrence("demo.noop")
    getattr(api, stop)(recurrence_id)
    runner._give_back(claims, running=None)  # a deploy's SIGTERM before the handler began
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED


def test_a_snooze_of_a_cancelled_recurrences_occurrence_cancels_it_and_it_never_runs_again():
    recurrence_id, claims, job_id = _claimed_occurrence("giveback.snooze_once")
    api.cancel_recurrence(recurrence_id)
    runner.run_batch(claims)
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED
    support.make_due()
    assert jobs_store.claim_due_jobs(10) == []
    assert job_id in CALLS
    assert len(CALLS) == 1


def test_an_active_recurrences_occurrence_given_back_is_pending_again_uncharged():
    """The path the rule leaves alone: the recurrence still active, the give-back returns the attempt."""
    _, claims, job_id = _claimed_occurrence("demo.noop")
    runner._give_back(claims, running=None)
    job = ScheduledJob.objects.get(pk=job_id)
    assert (job.state, job.attempts) == (JobState.PENDING, 0)


@pytest.mark.parametrize(("stop", "why"), [("pause_recurrence", "paused"), ("cancel_recurrence", "cancelled")])
def test_an_occurrence_cancelled_with_its_recurrence_says_why_and_its_history_names_who(admin_user, stop, why):
    """Its page showed a cancelled job with no reason, and its history (AuditRecord.for_job) no record."""
    from scheduling.core import audit
    from scheduling.models import AuditRecord

    recurrence = api.recur("demo.noop", {}, key="k", every=3600)
    (job,) = ScheduledJob.objects.filter(recurrence_id=recurrence.id)
    with audit.acting(audit.Actor(door="admin", user=admin_user)):
        getattr(api, stop)(recurrence.id)
    job.refresh_from_db()
    assert (job.state, job.last_error) == (JobState.CANCELLED, f"cancelled: its recurrence was {why}")
    (record,) = AuditRecord.objects.for_job(job.id)
    assert (record.action, record.user, record.details["recurrence_ids"]) == (
        f"recurrence_{stop.split('_')[0]}",
        admin_user,
        [recurrence.id],
    )


RACE: dict = {}
OPERATORS: list[threading.Thread] = []


def _waits_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row and row[0] == "Lock")


def _paused_meanwhile(job: registry.Job) -> None:
    """While the handler runs, an operator pauses its recurrence, in a transaction that commits only once the
    runner's outcome statement waits on it; the handler then snoozes or fails."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        runner_pid = cursor.fetchone()[0]
    paused = threading.Event()
    operator_pid: list[int] = []

    def operator() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                operator_pid.append(cursor.fetchone()[0])
            with transaction.atomic():
                api.pause_recurrence(RACE["recurrence_id"])
                paused.set()
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline and not _waits_on_a_lock(runner_pid):
                    time.sleep(0.02)
        finally:
            connection.close()

    OPERATORS.append(threading.Thread(target=operator))
    OPERATORS[-1].start()
    deadline = time.monotonic() + 5  # the pause ran (committing kind) or waits on this chunk's row (atomic)
    while (
        time.monotonic() < deadline and not paused.is_set() and not (operator_pid and _waits_on_a_lock(operator_pid[0]))
    ):
        time.sleep(0.02)
    if RACE["do"] == "snooze":
        raise registry.Snooze(0)
    raise RuntimeError("failing on purpose")


registry.handler("giveback.race.atomic", schema={"type": "object"}, timeout=10, max_attempts=3)(_paused_meanwhile)
registry.handler("giveback.race.committing", schema={"type": "object"}, timeout=10, max_attempts=3, atomic=False)(
    _paused_meanwhile
)


@pytest.mark.parametrize("do", ["snooze", "fail"])
@pytest.mark.parametrize("kind", ["giveback.race.atomic", "giveback.race.committing"])
def test_a_pause_racing_its_occurrences_outcome_leaves_it_finished_not_pending(kind, do):
    """Committing: the give-back waited on the pause's lock and read the recurrence as active in its older
    snapshot. Atomic: the pause waited on the chunk, whose give-back or retry then left the job pending
    where the pause's statements, with their snapshot from before, did not look. Found by review."""
    RACE.clear()
    OPERATORS.clear()
    recurrence = api.recur(kind, {}, key="k", every=3600)
    RACE.update(recurrence_id=recurrence.id, do=do)
    (job,) = ScheduledJob.objects.filter(recurrence_id=recurrence.id)
    support.make_due(job.id)
    claims = [(c.id, c.token) for c in jobs_store.claim_due_jobs(10)]
    try:
        runner.run_batch(claims)
    finally:
        for thread in OPERATORS:
            thread.join(20)
    job.refresh_from_db()
    assert job.state in (JobState.CANCELLED, JobState.DEAD), (job.state, job.attempts, job.max_attempts)


def test_resume_adopts_a_claimed_occurrence_and_it_is_no_longer_retired():
    """Paused while claimed, resumed before it ran: it is the recurrence's again, so given back it is pending."""
    recurrence_id, claims, job_id = _claimed_occurrence("demo.noop")
    api.pause_recurrence(recurrence_id)
    assert ScheduledJob.objects.get(pk=job_id).retired
    api.resume_recurrence(recurrence_id)
    assert not ScheduledJob.objects.get(pk=job_id).retired
    runner._give_back(claims, running=None)
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.PENDING


@pytest.mark.parametrize("stop", ["cancel_recurrence", "pause_recurrence"])
def test_a_dead_occurrence_of_a_stopped_recurrence_retried_runs_once_and_a_give_back_cancels_it(stop):
    """The operator's retry from dead runs it (their choice), but it stays retired while its recurrence is stopped:
    un-retired, a give-back made it pending again (found by review)."""
    from django.utils import timezone

    recurrence_id, _, job_id = _claimed_occurrence("demo.noop")
    getattr(api, stop)(recurrence_id)
    ScheduledJob.objects.filter(pk=job_id).update(
        state=JobState.DEAD, token=None, claimed_at=None, finished_at=timezone.now()
    )  # its last attempt failed under the stop
    assert api.retry_dead_many([job_id]).changed == (job_id,)
    assert ScheduledJob.objects.get(pk=job_id).retired
    support.make_due(job_id)
    runner._give_back([(c.id, c.token) for c in jobs_store.claim_due_jobs(10)], running=None)
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED
