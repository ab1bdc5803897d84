"""What an atomic job's transaction keeps from its siblings: constraint modes, and a rollback it asks for.

Each behaviour is shown for a job alone and for the same job in a batch beside siblings that fail,
time out, break their transaction (a database error caught and ignored) and fail a deferred
foreign key. The runner runs in this process; handler calls are counted, never timed.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, connection, transaction

from scheduling import api, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution, Notification
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: Counter[str] = Counter()  # handler calls per job key
CALLBACKS: list[str] = []  # on_commit callbacks that ran, by job key
DUPLICATES: list[str] = []  # jobs whose INSERT of a taken key failed inside their own atomic()
TABLE = "txn_unique_key"  # a unique key that is DEFERRABLE INITIALLY IMMEDIATE (made by the fixture)


class Planned(RuntimeError):
    """The failure the test kinds raise on purpose."""


def _job(job: registry.Job) -> None:
    """Write one row, then do what the payload says: take a unique key, roll back, fail, hang, break, bad FK."""
    CALLS[job.idempotency_key] += 1
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    transaction.on_commit(lambda: CALLBACKS.append(job.idempotency_key))
    p = job.payload
    if "key" in p:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("INSERT INTO txn_unique_key (k) VALUES (%s)", [p["key"]])
        except IntegrityError:
            DUPLICATES.append(job.idempotency_key)
    if p.get("rollback"):
        transaction.set_rollback(True)
    if p.get("fail"):
        raise Planned("failing after a write, on purpose")
    if p.get("hang"):
        time.sleep(float(p["hang"]))
    if p.get("break"):
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:  # swallowed on purpose
            cursor.execute("SELECT 1 / 0")
    if "notify" in p:  # a user deleted before the batch: the foreign key fails at the job's check
        Notification.objects.create(idempotency_key=job.idempotency_key, subject="hi", user_id=p["notify"])


def _rollback_only(job: registry.Job) -> None:
    """Send no statement: queue a callback and ask for the rollback."""
    CALLS[job.idempotency_key] += 1
    transaction.on_commit(lambda: CALLBACKS.append(job.idempotency_key))
    transaction.set_rollback(True)


registry.handler("txn.job", schema={"type": "object"}, timeout=1, max_attempts=3, batch_size=100)(_job)
registry.handler("txn.rollback_only", schema={"type": "object"}, timeout=1, max_attempts=3, batch_size=100)(
    _rollback_only
)


@pytest.fixture(autouse=True)
def _clean(run_sql) -> Iterator[None]:
    CALLS.clear()
    CALLBACKS.clear()
    DUPLICATES.clear()
    run_sql(f"CREATE TABLE {TABLE} (k text CONSTRAINT {TABLE}_k UNIQUE DEFERRABLE INITIALLY IMMEDIATE)")
    yield
    run_sql(f"DROP TABLE {TABLE}")
    lease.stop()  # its thread's connection is closed before the test database is dropped


def _run(kind: str, payloads: list[dict]) -> tuple[list[int], runner.BatchReport]:
    ids = api.schedule_many(kind, payloads, delay=60)
    support.make_due(state="pending")
    claims = store.claim_due_jobs(500)
    assert len(claims) == len(ids)
    return ids, runner.run_batch([(c.id, c.token) for c in claims])


def _key(job_id: int) -> str:
    return f"job:{job_id}"


def _states(ids: list[int]) -> list[str]:
    by_id = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state"))
    return [by_id[i] for i in ids]


def _siblings() -> list[dict]:
    """One of each sibling that must cost only itself: failing, timing out, breaking its transaction, bad FK."""
    gone = get_user_model().objects.create_user("txn-gone")
    gone_id = gone.pk
    gone.delete()
    return [{"fail": True}, {"hang": 1.5}, {"break": True}, {"notify": gone_id}]


def test_jobs_that_catch_a_duplicate_key_in_their_own_atomic_block_all_succeed():
    """Three jobs insert one DEFERRABLE INITIALLY IMMEDIATE unique key, each catching IntegrityError: all done."""
    ids, report = _run("txn.job", [{"key": "same"}] * 3)
    assert (report.succeeded, report.failed) == (3, 0), f"states {_states(ids)}"
    assert _states(ids) == [JobState.DONE] * 3
    assert [_key(ids[1]), _key(ids[2])] == DUPLICATES, "the key stayed immediate for the later jobs"
    assert Execution.objects.count() == 3
    assert sorted(CALLBACKS) == sorted(_key(i) for i in ids)


def test_jobs_that_catch_a_duplicate_key_succeed_beside_failing_slow_and_broken_siblings():
    """The same three jobs interleaved with failing, timed-out, broken and bad-FK siblings: all three done."""
    siblings = _siblings()
    payloads = [siblings[3], {"key": "same"}, siblings[0], {"key": "same"}, siblings[1], siblings[2]]
    payloads += [{"key": "same"}, siblings[3]]
    ids, report = _run("txn.job", payloads)
    unique = [i for i, p in zip(ids, payloads, strict=True) if "key" in p]
    assert (report.succeeded, report.failed) == (3, 5), f"states {_states(ids)}"
    assert _states(unique) == [JobState.DONE] * 3
    assert [_key(unique[1]), _key(unique[2])] == DUPLICATES
    assert set(CALLS.values()) == {1}, "every handler ran once"
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_key(i) for i in unique)
    assert sorted(CALLBACKS) == sorted(_key(i) for i in unique)


def test_a_job_that_asks_for_its_rollback_is_done_without_its_writes():
    """set_rollback(True) then return: the job is done, once, its row and callback discarded, the attempt says so."""
    ids, report = _run("txn.job", [{"rollback": True}])
    assert (report.succeeded, report.failed) == (1, 0)
    assert _states(ids) == [JobState.DONE]
    attempt = JobAttempt.objects.get(job_id=ids[0])
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.SUCCEEDED, runner.ROLLED_BACK_NOTE)
    assert not Execution.objects.exists()
    assert CALLBACKS == []
    assert Counter({_key(ids[0]): 1}) == CALLS


def test_a_job_that_asks_for_its_rollback_is_done_beside_failing_slow_and_broken_siblings():
    """The rolled-back job among good, failing, timed-out, broken and bad-FK siblings: done; only good rows commit."""
    siblings = _siblings()
    payloads = [{}, {"rollback": True}, *siblings[:2], {"rollback": True}, siblings[2], {}, siblings[3], {}]
    ids, report = _run("txn.job", payloads)
    good = [i for i, p in zip(ids, payloads, strict=True) if not p]
    rolled = [i for i, p in zip(ids, payloads, strict=True) if p.get("rollback")]
    assert (report.succeeded, report.failed) == (5, 4)
    assert _states(good + rolled) == [JobState.DONE] * 5
    errors = dict(JobAttempt.objects.filter(job_id__in=good + rolled).values_list("job_id", "error"))
    assert errors == {**dict.fromkeys(good, ""), **dict.fromkeys(rolled, runner.ROLLED_BACK_NOTE)}
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_key(i) for i in good)
    assert sorted(CALLBACKS) == sorted(_key(i) for i in good)
    assert set(CALLS.values()) == {1}


def test_a_job_that_asks_for_its_rollback_without_a_statement_is_done_and_drops_its_callback():
    """set_rollback(True) with no statement sent: done, its callback dropped, the next jobs unaffected."""
    ids, report = _run("txn.rollback_only", [{}, {}])
    assert (report.succeeded, report.failed) == (2, 0)
    assert _states(ids) == [JobState.DONE] * 2
    assert CALLBACKS == []
