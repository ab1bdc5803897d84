"""Aborting a task through the Tasks door (``scheduling.backends.abort``): tasks' result ids only, who asked recorded.

A running task is made with the store's own claim and start (no worker here); the worker's side of
an abort (the handler interrupted, its writes rolled back) is ``tests/e2e/backends/test_backends_worker.py``.
"""

from __future__ import annotations

import uuid

import pytest

from scheduling import api, backends, exceptions, testing
from scheduling.backends import TaskResultDoesNotExist, TaskResultStatus
from scheduling.core import audit
from scheduling.due_at import store
from scheduling.models import AuditRecord, JobAbort, JobState, ScheduledJob
from tests.taskkit import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ABORTED_PATH = "scheduling.core.executor.JobAborted"


def _claimed(result) -> tuple[int, str]:
    """Claim the task's job as a worker's leader would: (job id, claim token)."""
    (claim,) = store.claim_due_jobs(10)
    assert claim.id == backends.task_job(result).pk
    return claim.id, claim.token


def test_abort_refuses_any_id_that_is_not_a_tasks_result_id_and_asks_nothing():
    """A job's number, a plain job's result id, an unknown UUID, junk: TaskResultDoesNotExist; nothing changes."""
    plain = api.schedule("demo.record", {"label": "system"}, delay=0)
    ScheduledJob.objects.filter(pk=plain.pk).update(task_result_id=uuid.uuid4())
    (claim,) = store.claim_due_jobs(10)
    store.start_jobs([(claim.id, claim.token)], "test-worker")  # running: api.abort would ask it to stop
    plain_result_id = str(ScheduledJob.objects.get(pk=plain.pk).task_result_id)
    for other in (str(plain.pk), plain_result_id, str(uuid.uuid4()), "not-a-uuid", ""):
        with pytest.raises(TaskResultDoesNotExist):
            backends.abort(other)
    assert ScheduledJob.objects.get(pk=plain.pk).state == JobState.RUNNING
    assert not JobAbort.objects.exists()
    assert not AuditRecord.objects.filter(action="abort").exists()


def test_abort_of_a_finished_task_tells_the_caller_and_of_a_waiting_one_is_refused():
    """A task that ran: JobAlreadyFinished, still SUCCESSFUL; a task not claimed yet: JobNotAbortable (cancel it)."""
    ran = tasks.add.enqueue(2, 3)
    testing.run_due()
    with pytest.raises(exceptions.JobAlreadyFinished):
        backends.abort(ran)
    after = tasks.add.get_result(ran.id)
    assert (after.status, after.return_value, after.errors) == (TaskResultStatus.SUCCESSFUL, 5, [])
    waiting = tasks.add.enqueue(1, 1)
    with pytest.raises(exceptions.JobNotAbortable) as refused:
        backends.abort(waiting.id)
    assert not isinstance(refused.value, exceptions.JobAlreadyFinished)
    assert tasks.add.get_result(waiting.id).status == TaskResultStatus.READY
    assert not JobAbort.objects.exists()


def test_abort_of_a_running_task_records_the_request_with_who_asked(admin_user):
    """A RUNNING task: a request for its claim naming ``by`` (else the door's operator, audited); it runs on."""
    result = tasks.add.enqueue(4, 4)
    job_id, token = _claimed(result)
    store.start_jobs([(job_id, token)], "test-worker")
    assert backends.abort(result, by="operator-3") == api.Aborted(job_id, "requested")
    request = JobAbort.objects.get(job_id=job_id)
    assert (str(request.token), request.requested_by) == (token, "operator-3")
    assert tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING  # its worker has yet to stop it
    JobAbort.objects.all().delete()
    with audit.acting(audit.Actor(door="admin", user=admin_user)):
        assert backends.abort(result.id).requested  # its id as a string; the operator acting is who asked
    assert JobAbort.objects.get(job_id=job_id).requested_by == admin_user.get_username()
    record = AuditRecord.objects.get(action="abort")
    assert (record.actor, record.job_ids, record.details) == (
        admin_user.get_username(),
        [job_id],
        {"outcome": "requested"},
    )


def test_abort_of_a_claimed_task_cancels_it_and_its_result_names_the_abort():
    """Claimed, not started: cancelled at once, never runs; FAILED with one JobAborted error saying who asked."""
    result = tasks.record.enqueue("never")
    job_id, _ = _claimed(result)
    assert backends.abort(result, by="operator-5") == api.Aborted(job_id, "cancelled")
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 0)
    assert [e.exception_class_path for e in result.errors] == [ABORTED_PATH]
    assert result.errors[0].traceback.startswith("aborted by operator-5 at ")
    with pytest.raises(exceptions.JobAlreadyFinished):
        backends.abort(result)
    assert testing.run_due(include_future=True).started == 0


def test_a_cancelled_task_names_no_abort():
    """A task cancelled before it was claimed is FAILED with no error: only an abort names JobAborted."""
    result = tasks.add.enqueue(1, 2)
    backends.cancel(result)
    result.refresh()
    assert (result.status, result.errors) == (TaskResultStatus.FAILED, [])
