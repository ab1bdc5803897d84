"""A handler (or its on_commit callback) raising a BaseException other than the process's shutdown.

GeneratorExit, asyncio.CancelledError (a BaseException since Python 3.8) or a library's own went
past the executor's ``except Exception`` and out of the batch: every job of it stayed running until
its lease ran out, a committing sibling that had finished ran again after the sweep, the culprit's
error was never recorded, and the other jobs' on_commit callbacks never ran. They are the job's
failure, like an Exception; a shutdown's SystemExit still stops the batch (test_runner_shutdown).
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import transaction

from scheduling import api, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


class LibrarysOwn(BaseException):
    """A BaseException of a library's own (as gevent's GreenletExit or trio's Cancelled are)."""


RAISED = {"generator_exit": GeneratorExit, "cancelled": asyncio.CancelledError, "own": LibrarysOwn}
CALLBACKS: list[int] = []


def _write_then(job: registry.Job) -> None:
    Execution.objects.create(idempotency_key=f"{job.idempotency_key}:{job.attempt}", kind=job.kind, pid=0)
    raised = RAISED.get(job.payload.get("do", ""))
    if raised is not None:
        raise raised("from the handler")


def _callback_then(job: registry.Job) -> None:
    if job.payload.get("do") == "callback":

        def boom() -> None:
            raise LibrarysOwn("from an on_commit callback")

        transaction.on_commit(boom)
    else:
        transaction.on_commit(lambda: CALLBACKS.append(job.id))


registry.handler("baseexc.atomic", schema={"type": "object"}, timeout=5, max_attempts=3)(_write_then)
registry.handler("baseexc.committing", schema={"type": "object"}, timeout=5, max_attempts=3, atomic=False)(_write_then)
registry.handler("baseexc.callback", schema={"type": "object"}, timeout=5)(_callback_then)


@pytest.fixture(autouse=True)
def _stop_the_lease():
    CALLBACKS.clear()
    yield
    lease.stop()


def _run(ids: list[int]) -> runner.BatchReport:
    support.make_due(ids)
    claims = sorted(store.claim_due_jobs(10), key=lambda c: c.id)
    assert [c.id for c in claims] == ids
    return runner.run_batch([(c.id, c.token) for c in claims])


@pytest.mark.parametrize("kind", ["baseexc.atomic", "baseexc.committing"])
@pytest.mark.parametrize("do", sorted(RAISED))
def test_a_base_exception_is_its_jobs_failure_and_its_batch_mates_finish(kind, do):
    ids = api.schedule_many(kind, [{}, {"do": do}, {}], delay=60)
    report = _run(ids)
    assert (report.succeeded, report.failed) == (2, 1)
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[i] for i in ids] == [JobState.DONE, JobState.PENDING, JobState.DONE]
    culprit = ScheduledJob.objects.get(pk=ids[1])
    assert culprit.last_error.startswith(f"{RAISED[do].__name__}: from the handler")
    assert list(JobAttempt.objects.filter(job_id=ids[1]).values_list("outcome", flat=True)) == [AttemptOutcome.FAILED]
    written = set(Execution.objects.values_list("idempotency_key", flat=True))
    assert {f"job:{ids[0]}:1", f"job:{ids[2]}:1"} <= written, "the batch-mates' work committed once"
    assert (f"job:{ids[1]}:1" in written) == (kind == "baseexc.committing"), "an atomic job's writes roll back"


def test_an_on_commit_callback_raising_a_base_exception_stops_no_other_callback():
    ids = api.schedule_many("baseexc.callback", [{"do": "callback"}, {}, {}], delay=60)
    report = _run(ids)
    assert report.succeeded == 3
    assert ids[1:] == CALLBACKS
    failed = JobAttempt.objects.get(job_id=ids[0])
    assert (failed.outcome, failed.error) == (
        AttemptOutcome.SUCCEEDED,
        "on_commit failed: LibrarysOwn: from an on_commit callback",
    )
