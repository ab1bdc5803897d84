"""Aborting jobs (``api.abort``, ``abort_many``): a running handler interrupted, a claim cancelled, a finished job kept.

The runner runs in this process's main thread, as in a prefork worker's child; the abort is asked
from another thread (another connection), as an operator's door would, while the handler runs. The
heartbeat is made short so the tests wait little; nothing here is timed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import override_settings

from scheduling import api, registry
from scheduling.core import audit, exceptions
from scheduling.due_at import lease, runner, store
from scheduling.models import AttemptOutcome, AuditRecord, JobAbort, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

STARTED: dict[str, threading.Event] = {}  # job idempotency key -> set when its handler began
FINISHED: list[str] = []  # handlers that ran to their end
LONG_SECONDS = 30.0  # how long a handler would run if nothing stopped it


def _long(job: registry.Job) -> None:
    """Write a row, say so, then sleep in one blocking call (an abort must interrupt it)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    STARTED.setdefault(job.idempotency_key, threading.Event()).set()
    if job.payload.get("long"):
        time.sleep(LONG_SECONDS)
    FINISHED.append(job.idempotency_key)


def _polling(job: registry.Job) -> None:
    """A committing handler that polls abort_requested() between short steps and returns when asked."""
    STARTED.setdefault(job.idempotency_key, threading.Event()).set()
    deadline = time.monotonic() + LONG_SECONDS
    while time.monotonic() < deadline:
        if job.abort_requested():
            FINISHED.append("saw:" + job.idempotency_key)
            return
        time.sleep(0.01)
    FINISHED.append(job.idempotency_key)


registry.handler("abort.atomic", schema={"type": "object"}, timeout=60, batch_size=10)(_long)
registry.handler("abort.committing", schema={"type": "object"}, timeout=60, batch_size=10, atomic=False)(_long)
registry.handler("abort.polling", schema={"type": "object"}, timeout=60, atomic=False)(_polling)


@pytest.fixture(autouse=True)
def _short_heartbeat() -> Iterator[None]:
    STARTED.clear()
    FINISHED.clear()
    with override_settings(SCHEDULING_HEARTBEAT_SECONDS=0.05):
        yield
    lease.stop()  # its thread's connection is closed before the test database is dropped


def _claim(kind: str, payloads: list[dict]) -> list[tuple[int, str]]:
    ids = api.schedule_many(kind, payloads, delay=60)
    support.make_due(ids)
    claims = store.claim_due_jobs(500)
    assert sorted(c.id for c in claims) == sorted(ids)
    by_id = {c.id: c.token for c in claims}
    return [(i, by_id[i]) for i in ids]


def _abort_when_started(job_id: int, **kwargs: object) -> tuple[threading.Thread, list[object]]:
    """Abort ``job_id`` from another thread (its own connection) once its handler has started."""
    out: list[object] = []

    def ask() -> None:
        try:
            STARTED.setdefault(f"job:{job_id}", threading.Event()).wait(LONG_SECONDS)
            out.append(api.abort(job_id, **kwargs))  # type: ignore[arg-type]
        finally:
            connection.close()

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, out


def _attempt(job_id: int) -> JobAttempt:
    return JobAttempt.objects.get(job_id=job_id)


@pytest.mark.parametrize("kind", ["abort.atomic", "abort.committing"])
def test_a_running_handler_is_interrupted_and_its_job_cancelled_with_who_asked(kind):
    """The handler's blocking call is interrupted; the job is cancelled, its attempt aborted, naming the asker."""
    claims = _claim(kind, [{"long": True}])
    job_id = claims[0][0]
    thread, out = _abort_when_started(job_id, by="alice")
    report = runner.run_batch(claims)
    thread.join()
    assert out == [api.Aborted(job_id, "requested")]
    assert FINISHED == [], "the handler did not run to its end"
    job = ScheduledJob.objects.get(pk=job_id)
    assert job.state == JobState.CANCELLED
    attempt = _attempt(job_id)
    assert attempt.outcome == AttemptOutcome.ABORTED
    assert attempt.error.startswith("aborted by alice at ")
    assert job.last_error == attempt.error
    assert report.failed == 1
    # An atomic job's write is rolled back with it; a committing job's write had committed already.
    assert Execution.objects.filter(idempotency_key=f"job:{job_id}").count() == (0 if kind == "abort.atomic" else 1)


def test_an_aborted_atomic_job_costs_only_itself_in_its_batch():
    """Siblings before and after the aborted job in the same batch (and chunk) are done, their writes kept."""
    claims = _claim("abort.atomic", [{}, {"long": True}, {}])
    ids = [i for i, _ in claims]
    thread, _ = _abort_when_started(ids[1])
    runner.run_batch(claims)
    thread.join()
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert [states[i] for i in ids] == [JobState.DONE, JobState.CANCELLED, JobState.DONE]
    kept = set(Execution.objects.values_list("idempotency_key", flat=True))
    assert kept == {f"job:{ids[0]}", f"job:{ids[2]}"}


def test_a_job_aborted_while_waiting_in_its_batch_does_not_start():
    """The second job of a batch, aborted while the first runs, is cancelled without its handler being called."""
    claims = _claim("abort.committing", [{"long": True}, {}])
    first, second = (i for i, _ in claims)

    def ask() -> None:
        try:
            STARTED.setdefault(f"job:{first}", threading.Event()).wait(LONG_SECONDS)
            api.abort(second)
            support.wait_for(lambda: aborted_seen(second), 10, 0.01, "the heartbeat to read the abort")
            api.abort(first)
        finally:
            connection.close()

    def aborted_seen(job_id: int) -> bool:
        from scheduling.core import aborts

        return any(k[0] == job_id for k in aborts._requested)

    thread = threading.Thread(target=ask)
    thread.start()
    runner.run_batch(claims)
    thread.join()
    assert f"job:{second}" not in STARTED
    assert _attempt(second).outcome == AttemptOutcome.ABORTED
    assert ScheduledJob.objects.get(pk=second).state == JobState.CANCELLED


def test_an_abort_read_just_before_the_handler_is_marked_running_still_stops_it(monkeypatch):
    """The heartbeat reads the abort after the executor's "aborted while waiting?" check and before
    ``aborts.running()`` marks the handler as the one a poke interrupts: no poke is sent then, and
    later heartbeats see the request made. The executor asks again once the handler is marked."""
    from scheduling.core import aborts, executor

    claims = _claim("abort.atomic", [{"long": True}])
    job_id = claims[0][0]
    real_running = aborts.running

    def running_after_the_heartbeat_read_it(jid: int | None, tok: str | None) -> object:
        heartbeat = threading.Thread(target=aborts.request, args=(jid, tok, "aborted by bob at then"))
        heartbeat.start()  # as the heartbeat thread does: at this instant, no handler is marked
        heartbeat.join()
        return real_running(jid, tok)

    monkeypatch.setattr(executor.aborts, "running", running_after_the_heartbeat_read_it)
    runner.run_batch(claims)
    assert f"job:{job_id}" not in STARTED, "the handler never began"
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED
    assert (_attempt(job_id).outcome, _attempt(job_id).error) == (AttemptOutcome.ABORTED, "aborted by bob at then")


def test_a_committing_handler_can_poll_abort_requested():
    """job.abort_requested() turns true once the heartbeat read the abort; the handler may stop on its own."""
    claims = _claim("abort.polling", [{}])
    job_id = claims[0][0]
    thread, _ = _abort_when_started(job_id)
    runner.run_batch(claims)
    thread.join()
    assert FINISHED in ([f"saw:job:{job_id}"], []), "stopped by its own poll, or interrupted first"
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED


def test_a_claim_not_started_is_cancelled_at_once_and_never_runs():
    """abort() of a claimed job cancels it now (attempt given back); its batch then skips it."""
    claims = _claim("abort.atomic", [{}])
    job_id = claims[0][0]
    assert api.abort(job_id) == api.Aborted(job_id, "cancelled")
    job = ScheduledJob.objects.get(pk=job_id)
    assert (job.state, job.attempts) == (JobState.CANCELLED, 0)
    assert job.last_error.startswith("aborted by application at ")
    report = runner.run_batch(claims)
    assert (report.started, report.skipped) == (0, 1)
    assert STARTED == {}


def test_a_finished_job_stays_finished_and_the_caller_is_told():
    """abort() of a done job raises JobAlreadyFinished and changes nothing; of a pending job, JobNotAbortable."""
    claims = _claim("abort.atomic", [{}])
    job_id = claims[0][0]
    runner.run_batch(claims)
    with pytest.raises(exceptions.JobAlreadyFinished) as raised:
        api.abort(job_id)
    assert raised.value.state == JobState.DONE
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.DONE
    assert not JobAbort.objects.exists()
    pending = api.schedule("abort.atomic", {}, delay=60)
    with pytest.raises(exceptions.JobNotAbortable) as refused:
        api.abort(pending.pk)
    assert not isinstance(refused.value, exceptions.JobAlreadyFinished)
    with pytest.raises(exceptions.JobNotFound):
        api.abort(10**12)


def test_an_abort_by_key_finds_the_running_job_not_its_waiting_successor():
    """By key, the owner's running job is asked, though a pending job of the same key waits beside it."""
    claims = _claim("abort.atomic", [{}])
    job_id = claims[0][0]
    ScheduledJob.objects.filter(pk=job_id).update(key="export-7")
    store.start_jobs(claims, "test-worker")
    api.schedule("abort.atomic", {}, key="export-7", delay=60)
    assert api.abort(key="export-7") == api.Aborted(job_id, "requested")
    assert JobAbort.objects.get(job_id=job_id).token == ScheduledJob.objects.get(pk=job_id).token


def test_an_abort_asked_for_an_earlier_attempt_never_stops_a_later_one():
    """The request names its claim: the heartbeat of a later claim of the same job reads no abort."""
    claims = _claim("abort.atomic", [{}])
    store.start_jobs(claims, "test-worker")
    job_id = claims[0][0]
    api.abort(job_id)
    assert [r.abort_by for r in store.heartbeat_jobs(claims)] == ["application"]
    JobAbort.objects.filter(job_id=job_id).update(token="00000000-0000-0000-0000-000000000001")
    assert [r.abort_by for r in store.heartbeat_jobs(claims)] == [None]


def test_abort_many_reports_each_job_and_records_the_operator_once(admin_user):
    """The bulk call cancels claims, asks running jobs, reports the rest; one audit record names the admin."""
    claims = _claim("abort.atomic", [{}, {}])
    (claimed, _), (running, _) = claims
    store.start_jobs(claims[1:], "test-worker")
    pending = api.schedule("abort.atomic", {}, delay=60).pk
    with audit.acting(audit.Actor(door="admin", user=admin_user)):
        result = api.abort_many([claimed, running, pending, 10**12])
    assert result.changed == (claimed, running)
    assert result.untouched == {pending: JobState.PENDING}
    assert result.missing == (10**12,)
    record = AuditRecord.objects.get()
    assert (record.action, record.changed, record.actor) == ("abort", 2, admin_user.get_username())
    assert JobAbort.objects.get(job_id=running).requested_by == admin_user.get_username()
