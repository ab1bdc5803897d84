"""One job of an atomic batch touches no other: failures, timeouts, broken transactions, on_commit, stalls.

Handler calls are counted in this process (``CALLS``, the runner runs here), never timed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction
from django.test import override_settings

from scheduling import api, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution, Notification
from tests import support
from tests.e2e.harness import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise, for the admin page
]

CALLS: Counter[str] = Counter()  # handler calls per job key
CALLBACKS: list[str] = []  # on_commit callbacks that ran, by job key
RUNAWAY_CALLS = 500  # past this many calls in one test the old re-run loop is spinning: stop it


class Planned(RuntimeError):
    """The failure the test kinds raise on purpose."""


class Runaway(BaseException):
    """Raised past RUNAWAY_CALLS so a test fails instead of spinning through 2^k re-runs."""


def _count(job: registry.Job) -> None:
    CALLS[job.idempotency_key] += 1
    if sum(CALLS.values()) > RUNAWAY_CALLS:
        raise Runaway(f"{sum(CALLS.values())} handler calls")


def _write(job: registry.Job) -> None:
    """Count the call, write one row in the job's transaction, send one mail directly, maybe fail or hang."""
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    mail.send_mail("direct", job.idempotency_key, "from@example.com", ["to@example.com"])
    transaction.on_commit(lambda: _callback(job))
    if job.payload.get("fail"):
        raise Planned("failing after a write, on purpose")
    if job.payload.get("hang"):
        time.sleep(float(job.payload["hang"]))


def _callback(job: registry.Job) -> None:
    if job.payload.get("callback_fails"):
        raise Planned("the on_commit callback fails, on purpose")
    CALLBACKS.append(job.idempotency_key)


def _swallow(job: registry.Job) -> None:
    """Write, then hit a database error and swallow it (right under autocommit, not in a transaction)."""
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    if job.payload.get("orm"):
        Notification.objects.create(idempotency_key="taken", subject="first")
        with contextlib.suppress(IntegrityError):  # swallowed on purpose: right under autocommit
            Notification.objects.create(idempotency_key="taken", subject="second")
    elif job.payload.get("raw"):
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:  # swallowed on purpose
            cursor.execute("SELECT 1 / 0")


HOLD = threading.Event()  # test.atomic_hold waits on it (released by the test)


def _hold(job: registry.Job) -> None:
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    assert HOLD.wait(float(job.payload.get("wait", 20)))


def _taken_back(job: registry.Job) -> None:
    """A committing job whose claim is taken back while it runs (a new token, as after a sweep)."""
    _count(job)
    if job.payload.get("take_back"):
        ScheduledJob.objects.filter(pk=job.id).update(token=uuid.uuid4())
    time.sleep(float(job.payload.get("sleep", 0)))


registry.handler("iso.write", schema={"type": "object"}, timeout=1, max_attempts=3, batch_size=100)(_write)
registry.handler("iso.swallow", schema={"type": "object"}, timeout=10, max_attempts=3, batch_size=10)(_swallow)
registry.handler("iso.hold", schema={"type": "object"}, timeout=30, lease_seconds=1, batch_size=10)(_hold)
registry.handler("iso.slow", schema={"type": "object"}, timeout=10, batch_size=100, atomic=False)(_taken_back)
registry.handler("iso.slow_atomic", schema={"type": "object"}, timeout=10, batch_size=100)(_taken_back)


def _slow_fail(job: registry.Job) -> None:
    time.sleep(1.2)  # longer than the whole backoff (0.5-1 s after attempt 1)
    raise Planned("failing after running longer than its backoff, on purpose")


registry.handler(
    "iso.slow_fail",
    schema={"type": "object"},
    timeout=10,
    max_attempts=3,
    backoff=registry.Backoff(1, 1),
    batch_size=10,
)(_slow_fail)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    CALLS.clear()
    CALLBACKS.clear()
    HOLD.clear()
    yield
    HOLD.set()
    lease.stop()  # its thread's connection is closed before the test database is dropped


def _run(run_sql, kind: str, payloads: list[dict]) -> tuple[list[int], runner.BatchReport]:
    ids = api.schedule_many(kind, payloads, delay=60)
    support.make_due(state="pending")
    claims = store.claim_due_jobs(500)
    assert len(claims) == len(ids)
    return ids, runner.run_batch([(c.id, c.token) for c in claims])


def _in_thread(run: Callable[[], object]) -> None:
    """Run ``run`` and close this thread's database connection (the test database is dropped after)."""
    try:
        run()
    finally:
        connection.close()


def _keys(ids: list[int]) -> list[str]:
    return [f"job:{i}" for i in ids]


def test_fifty_failing_jobs_of_one_batch_make_fifty_handler_calls(run_sql):
    """A batch of 50 atomic jobs that all fail (a downstream outage) calls each handler once: 50 calls."""
    ids, report = _run(run_sql, "iso.write", [{"fail": True}] * 50)
    assert Counter(dict.fromkeys(_keys(ids), 1)) == CALLS
    assert (report.succeeded, report.failed) == (0, 50)
    assert not Execution.objects.exists(), "every failed job's write rolled back"
    assert set(ScheduledJob.objects.values_list("state", flat=True)) == {JobState.PENDING}
    assert CALLBACKS == []


def test_forty_good_and_five_failing_jobs_make_forty_five_calls_and_one_effect_each(run_sql):
    """40 good + 5 failing in one batch: 45 handler calls, 45 direct mails, one committed row per good job."""
    payloads = [{"fail": True} if i % 9 == 4 else {} for i in range(45)]
    ids, report = _run(run_sql, "iso.write", payloads)
    good = [i for i, p in zip(ids, payloads, strict=True) if not p]
    assert len(good) == 40
    assert sum(CALLS.values()) == 45
    assert set(CALLS.values()) == {1}
    assert len(mail.outbox) == 45, "no sibling's failure repeated a direct effect"
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_keys(good))
    assert (report.succeeded, report.failed) == (40, 5)
    assert sorted(CALLBACKS) == sorted(_keys(good)), "on_commit once per committed job, none for the failed"
    assert ScheduledJob.objects.filter(state=JobState.DONE).count() == 40


def test_three_timeouts_in_a_batch_make_three_calls(run_sql):
    """Three jobs past their 1 s timeout beside good ones: each handler is called once, only those three fail."""
    payloads = [{}, {"hang": 3}, {}, {"hang": 3}, {"hang": 3}, {}]
    ids, report = _run(run_sql, "iso.write", payloads)
    assert sum(CALLS.values()) == 6
    assert set(CALLS.values()) == {1}
    assert (report.succeeded, report.failed) == (3, 3)
    timed_out = JobAttempt.objects.filter(outcome=AttemptOutcome.TIMED_OUT).values_list("job_id", flat=True)
    assert sorted(timed_out) == [ids[1], ids[3], ids[4]]
    assert Execution.objects.count() == 3


@pytest.mark.parametrize("how", ["orm", "raw"])
def test_a_handler_that_swallows_a_database_error_costs_only_its_own_job(run_sql, how):
    """A job that catches a database error and goes on fails alone (its writes undone); its siblings commit once."""
    payloads = [{}, {}, {how: True}, {}, {}]
    ids, report = _run(run_sql, "iso.swallow", payloads)
    assert sum(CALLS.values()) == 5
    assert set(CALLS.values()) == {1}
    assert (report.succeeded, report.failed) == (4, 1)
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_keys(ids[:2] + ids[3:]))
    broken = ScheduledJob.objects.get(pk=ids[2])
    assert broken.state == JobState.PENDING, "failed, retried later"
    assert broken.last_error == runner.BROKEN_TRANSACTION_ERROR
    assert not Notification.objects.exists()


def test_one_raising_on_commit_callback_stops_no_other_and_shows_on_the_job_page(run_sql, caplog, admin_client):
    """50 jobs each with an on_commit callback, the 6th raising: 49 run, all done, the failure logged and shown."""
    payloads = [{"callback_fails": True} if i == 5 else {} for i in range(50)]
    with caplog.at_level(logging.ERROR, logger="scheduling.due_at.runner"):
        ids, report = _run(run_sql, "iso.write", payloads)
    assert report.succeeded == 50
    assert len(CALLBACKS) == 49
    assert f"job:{ids[5]}" not in CALLBACKS
    (failure,) = [r for r in caplog.records if getattr(r, "action", "") == "on_commit_failed"]
    assert failure.job_id == ids[5]
    attempt = JobAttempt.objects.get(job_id=ids[5])
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.error == "on_commit failed: Planned: the on_commit callback fails, on purpose"
    assert JobAttempt.objects.exclude(job_id=ids[5]).filter(error="").count() == 49
    page = admin_client.get(f"/admin/scheduling/scheduledjob/{ids[5]}/change/").content.decode()
    assert "on_commit failed: Planned: the on_commit callback fails, on purpose" in page


def test_a_healthy_atomic_job_longer_than_its_lease_is_not_stuck(run_sql):
    """A job of a running chunk past its 1 s lease is locked, not stuck; unlocked and stale it is stuck."""
    ids = api.schedule_many("iso.hold", [{}], delay=60)
    support.make_due(state="pending")
    claims = store.claim_due_jobs(10)
    batch = threading.Thread(target=_in_thread, args=(lambda: runner.run_batch([(c.id, c.token) for c in claims]),))
    batch.start()
    try:
        wait_for(lambda: CALLS[f"job:{ids[0]}"] == 1, 10, message="the job to run")
        wait_for(
            lambda: run_sql(
                "SELECT heartbeat_at < now() - interval '1.5 seconds' FROM scheduling_scheduledjob WHERE id = %s",
                [ids[0]],
            )[0][0],
            10,
            message="the lease to pass while the job runs",
        )
        assert api.status()["stuck"] == 0, "its chunk holds it: running, not stuck"
    finally:
        HOLD.set()
        batch.join(20)
    assert ScheduledJob.objects.get(pk=ids[0]).state == JobState.DONE


def test_an_atomic_chunk_idle_past_its_timeout_loses_its_locks_and_gives_its_claims_back(run_sql, monkeypatch):
    """A chunk idle in its transaction past timeout + margin is ended by PostgreSQL: nothing commits, claims go back."""
    monkeypatch.setattr(runner, "STALL_MARGIN_SECONDS", 0.5)
    ids = api.schedule_many("iso.stall", [{}, {}], delay=60)
    support.make_due(state="pending")
    claims = [(c.id, c.token) for c in store.claim_due_jobs(10)]
    result: list[runner.BatchReport] = []
    # Off the main thread no SIGALRM stops the handler (as in a thread pool): only the database's limit does.
    batch = threading.Thread(target=_in_thread, args=(lambda: result.append(runner.run_batch(claims)),))
    batch.start()
    batch.join(30)
    assert result, "the batch ended"
    assert Counter(dict.fromkeys(_keys(ids), 1)) == CALLS, "each handler called once"
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == [f"job:{ids[1]}"], (
        "nothing of the ended chunk committed"
    )
    first = ScheduledJob.objects.get(pk=ids[0])
    assert first.state == JobState.PENDING
    attempt = JobAttempt.objects.get(job_id=ids[0])
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.RECLAIMED, runner.LOST_REASON)
    assert ScheduledJob.objects.get(pk=ids[1]).state == JobState.DONE, "the next chunk ran on a new connection"


def _stall(job: registry.Job) -> None:
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    if CALLS[job.idempotency_key] == 1 and sum(CALLS.values()) == 1:
        time.sleep(3)  # idle in the chunk's transaction past its limit (0.5 s timeout + 0.5 s margin)


registry.handler("iso.stall", schema={"type": "object"}, timeout=0.5, max_attempts=3, batch_size=10)(_stall)


@pytest.mark.parametrize("kind", ["iso.slow", "iso.slow_atomic"])
def test_a_batch_of_finished_jobs_logs_no_claim_lost(run_sql, caplog, monkeypatch, kind):
    """Heartbeats during a batch whose early jobs have finished say nothing about them: no false "claim lost"."""
    with override_settings(SCHEDULING_HEARTBEAT_SECONDS=0.02):
        monkeypatch.setattr(lease, "_beater", None)  # a heartbeat thread with the short interval
        with caplog.at_level(logging.WARNING, logger="scheduling.due_at.lease"):
            _, report = _run(run_sql, kind, [{"sleep": 0.05}] * 40)
    assert report.succeeded == 40
    assert [r for r in caplog.records if "claim lost" in r.getMessage()] == []


def test_a_claim_really_taken_back_still_logs_claim_lost(run_sql, caplog, monkeypatch):
    """A running job whose claim is taken back is reported by the heartbeat, once, with its id."""
    with override_settings(SCHEDULING_HEARTBEAT_SECONDS=0.02):
        monkeypatch.setattr(lease, "_beater", None)
        with caplog.at_level(logging.WARNING, logger="scheduling.due_at.lease"):
            ids, report = _run(run_sql, "iso.slow", [{"sleep": 0.05}, {"take_back": True, "sleep": 0.5}, {}])
    lost = [r for r in caplog.records if "claim lost while running" in r.getMessage()]
    assert [r.job_id for r in lost] == [ids[1]]
    assert (report.succeeded, report.stale) == (2, 1)


def test_a_chunks_limits_never_raise_a_stricter_one_in_force(run_sql):
    """bound_transaction lowers statement_timeout and the idle limit to its bound, never raises a stricter one."""
    with transaction.atomic():
        run_sql("SET LOCAL statement_timeout = '2s'")
        store.bound_transaction(10)
        assert run_sql("SHOW statement_timeout") == [("2s",)]
        assert run_sql("SHOW idle_in_transaction_session_timeout") == [("10s",)]
    with transaction.atomic():
        run_sql("SET LOCAL statement_timeout = '30s'")
        store.bound_transaction(4.5)
        assert run_sql("SHOW statement_timeout") == [("4500ms",)]
    assert run_sql("SHOW idle_in_transaction_session_timeout") == [("0",)], "the limits end with the transaction"


def test_a_kind_without_a_timeout_leaves_its_chunk_unbounded():
    """A chunk with a kind whose timeout is 0 (no limit of its own) gets no idle limit: its handler may run long."""
    job = store.StartedJob(1, "t", "iso.untimed", {}, 1, 1, None, None)  # type: ignore[arg-type]
    untimed = registry.Kind("iso.untimed", _count, None, 0.0, 1, registry.Backoff(), 30, 1, "")
    timed = registry.get("iso.write")
    assert runner._stall_limit_seconds([job], {"iso.untimed": untimed}) is None
    assert runner._stall_limit_seconds([job], {"iso.untimed": timed}) == 1 + runner.STALL_MARGIN_SECONDS


SEEN_HEARTBEATS: list[float] = []  # iso.long_chunk: its committed heartbeat age when each job ran
WATCHER: list = []  # an autocommit psycopg2 connection that reads what is committed


def _long_chunk(job: registry.Job) -> None:
    _count(job)
    with WATCHER[0].cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at) FROM scheduling_scheduledjob WHERE id = %s",
            [job.id],
        )
        SEEN_HEARTBEATS.append(float(cursor.fetchone()[0]))
    time.sleep(0.7)  # longer than a chunk: one job per chunk


registry.handler("iso.long_chunk", schema={"type": "object"}, timeout=10, lease_seconds=2, batch_size=10)(_long_chunk)


def test_a_batch_of_long_chunks_keeps_the_lease_of_its_jobs_still_to_run(run_sql, raw_connect):
    """Jobs waiting behind long chunks (rows the heartbeat cannot renew) get their lease renewed at each commit."""
    WATCHER[:] = [raw_connect(autocommit=True)]
    SEEN_HEARTBEATS.clear()
    _, report = _run(run_sql, "iso.long_chunk", [{}] * 5)
    assert (report.succeeded, report.chunks) == (5, 5)
    assert max(SEEN_HEARTBEATS) < 1.5, f"a job waited with a stale lease (2 s): {SEEN_HEARTBEATS}"


KILLER: list = []  # an autocommit psycopg2 connection that ends the chunk's session (iso.lose)


def _fk(job: registry.Job) -> None:
    """Delete a user, or notify one (a foreign key Django checks only at COMMIT), or just write."""
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    transaction.on_commit(lambda: _callback(job))
    if "delete_user" in job.payload:
        get_user_model().objects.filter(pk=job.payload["delete_user"]).delete()
    if "notify" in job.payload:
        Notification.objects.create(idempotency_key=job.idempotency_key, subject="hi", user_id=job.payload["notify"])


def _lose(job: registry.Job) -> None:
    """Write; the job marked ``lose`` has its chunk's session ended by the server (as by an idle limit)."""
    _count(job)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    if job.payload.get("lose"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with KILLER[0].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


registry.handler("iso.fk", schema={"type": "object"}, timeout=10, max_attempts=3, batch_size=10)(_fk)
registry.handler("iso.lose", schema={"type": "object"}, timeout=10, max_attempts=2, batch_size=10)(_lose)


def _take_next(job: registry.Job) -> None:
    """Take the claim of the batch's next job (a new token, as a sweep and another worker's claim would)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_scheduledjob SET token = gen_random_uuid()"
            " WHERE id = (SELECT min(id) FROM scheduling_scheduledjob WHERE id > %s AND kind = %s)",
            [job.id, job.kind],
        )


def _take_or_lose(job: registry.Job) -> None:
    if job.payload.get("take_next"):
        _take_next(job)
    else:
        _lose(job)


registry.handler("iso.take_or_lose", schema={"type": "object"}, timeout=10, max_attempts=2, batch_size=10)(
    _take_or_lose
)


def test_a_deferred_foreign_key_failure_fails_its_job_not_its_chunk(run_sql):
    """A job whose foreign key fails at COMMIT (a sibling deleted the user) fails alone; its siblings commit."""
    user = get_user_model().objects.create_user("fk-victim")
    ids, report = _run(run_sql, "iso.fk", [{"delete_user": user.pk}, {"notify": user.pk}, {}])
    assert Counter(dict.fromkeys(_keys(ids), 1)) == CALLS, "each handler called once"
    assert (report.succeeded, report.failed, report.chunks) == (2, 1, 1)
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {ids[0]: JobState.DONE, ids[1]: JobState.PENDING, ids[2]: JobState.DONE}
    assert "IntegrityError" in ScheduledJob.objects.get(pk=ids[1]).last_error
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_keys([ids[0], ids[2]]))
    assert not Notification.objects.exists()
    assert sorted(CALLBACKS) == sorted(_keys([ids[0], ids[2]])), "the failed job's callback was dropped"
    assert run_sql("SELECT count(*) FROM auth_user WHERE id = %s", [user.pk]) == [(0,)]


def test_a_lost_chunk_of_several_jobs_is_refunded_and_runs_alone_after_backoff(run_sql, raw_connect):
    """A chunk whose session the server ends costs its jobs no attempt: refunded, run_alone, due after backoff."""
    KILLER[:] = [raw_connect(autocommit=True)]
    ids, report = _run(run_sql, "iso.lose", [{}, {}, {"lose": True}])
    assert Counter(dict.fromkeys(_keys(ids), 1)) == CALLS, "each handler called once"
    assert (report.succeeded, report.chunks) == (0, 0)
    assert not Execution.objects.exists(), "nothing of the lost chunk committed"
    rows = run_sql(
        "SELECT id, state, attempts, max_attempts, run_alone, due_at > clock_timestamp() + interval '1 s'"
        " FROM scheduling_scheduledjob WHERE id = ANY(%s) ORDER BY id",
        [ids],
    )
    assert rows == [(i, "pending", 1, 3, True, True) for i in ids], "refunded, alone next, after backoff"
    attempts = JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", "error")
    assert list(attempts) == [(AttemptOutcome.RECLAIMED, runner.LOST_REASON)] * 3


def test_a_lost_chunk_of_one_job_is_charged_with_backoff(run_sql, raw_connect):
    """A job lost alone in its chunk is charged the attempt (dead when spent), and is due again only after backoff."""
    KILLER[:] = [raw_connect(autocommit=True)]
    ids, _ = _run(run_sql, "iso.lose", [{"lose": True}])
    assert run_sql(
        "SELECT state, attempts, max_attempts, due_at > clock_timestamp() + interval '1 s'"
        " FROM scheduling_scheduledjob WHERE id = %s",
        [ids[0]],
    ) == [("pending", 1, 2, True)]
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 ms' WHERE id = %s", [ids[0]])
    claims = store.claim_due_jobs(10)
    runner.run_batch([(c.id, c.token) for c in claims])
    assert ScheduledJob.objects.get(pk=ids[0]).state == JobState.DEAD, "a poison job alone reaches dead"


def test_a_lost_chunk_after_a_claim_lost_before_it_ran_leaves_the_rest_of_the_batch_as_it_was(
    run_sql, raw_connect, monkeypatch, caplog
):
    """A claim lost before its job ran, then the next chunk lost: each counted once, nothing of the chunk again.

    Chunks of one job: the first takes the second job's claim, the third job's chunk is lost. The
    lost chunk's job was handed to the next chunk once more when the batch's rest was cut by count.
    """
    KILLER[:] = [raw_connect(autocommit=True)]
    monkeypatch.setattr(runner, "ATOMIC_CHUNK_JOBS", 1)
    with caplog.at_level(logging.WARNING, logger="scheduling.due_at.runner"):
        ids, report = _run(run_sql, "iso.take_or_lose", [{"take_next": True}, {}, {"lose": True}])
    assert (report.succeeded, report.stale, report.chunks) == (1, 1, 1)
    lost_before = [r.job_id for r in caplog.records if r.getMessage() == "claim lost before the job ran"]
    assert lost_before == [ids[1]], "only the claim really taken"
    assert dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state")) == {
        ids[0]: JobState.DONE,
        ids[1]: JobState.RUNNING,  # under the token that took it
        ids[2]: JobState.PENDING,  # lost alone: charged, due again after backoff
    }


def test_an_ambiguous_commit_runs_the_callbacks_of_the_jobs_that_committed(run_sql, monkeypatch, caplog):
    """A COMMIT that succeeds on the server while the client sees the drop: committed jobs' callbacks run once."""
    real_commit = connection._commit
    failed: list[bool] = []

    def commit_then_drop() -> None:
        chunk = bool(connection.run_on_commit)  # the chunk's commit: its jobs' callbacks are queued
        real_commit()
        if chunk and not failed:
            failed.append(True)
            raise OperationalError("server closed the connection unexpectedly (after COMMIT, injected)")

    monkeypatch.setattr(connection, "_commit", commit_then_drop)
    with caplog.at_level(logging.INFO, logger="scheduling.due_at.runner"):
        ids, report = _run(run_sql, "iso.write", [{}, {"fail": True}, {}])
    assert failed, "the injected fault fired"
    assert Counter(dict.fromkeys(_keys(ids), 1)) == CALLS, "each handler called once"
    assert sorted(CALLBACKS) == sorted(_keys([ids[0], ids[2]])), "each committed good job's callback ran once"
    assert (report.succeeded, report.failed, report.stale) == (2, 1, 0)
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {ids[0]: JobState.DONE, ids[1]: JobState.PENDING, ids[2]: JobState.DONE}
    assert not [r for r in caplog.records if getattr(r, "action", "") == "stale_completion"], "no false 'taken back'"


def test_a_retry_waits_its_backoff_from_the_failure_not_from_the_chunks_start(run_sql):
    """An atomic job that ran longer than its backoff is not due again at once: the wait counts from its failure."""
    (job_id,), report = _run(run_sql, "iso.slow_fail", [{}])
    assert report.failed == 1
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.get(job_id=job_id)
    assert job.state == JobState.PENDING
    assert job.due_at >= attempt.finished_at + dt.timedelta(seconds=0.5), (job.due_at, attempt.finished_at)
