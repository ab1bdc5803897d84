"""What a job's isolation costs in round trips: statements counted with Django's CaptureQueriesContext.

Each test runs the same kind once with one job and once with fifty in one batch (one chunk): the
difference, divided by 49, is what one more job costs, whatever the batch itself costs. Counted,
never timed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduling import api, registry
from scheduling.core import db
from scheduling.due_at import lease, runner, store
from scheduling.models import JobState, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 50


def _noop(job: registry.Job) -> None:
    """Run no SQL at all."""


def _insert(job: registry.Job) -> None:
    """One ORM INSERT, as demo.record does."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)


def _read(job: registry.Job) -> None:
    """One SELECT, no write."""
    Execution.objects.filter(idempotency_key=job.idempotency_key).exists()


def _mixed(job: registry.Job) -> None:
    """No SQL, unless the payload says: write one row then fail, sleep past the timeout, or break the transaction."""
    if job.payload.get("write"):
        Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    if job.payload.get("fail"):
        raise RuntimeError("failing after a write, on purpose")
    if job.payload.get("hang"):
        time.sleep(float(job.payload["hang"]))
    if job.payload.get("break"):
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:  # swallowed on purpose
            cursor.execute("SELECT 1 / 0")


def _nested(job: registry.Job) -> None:
    """One ORM INSERT in a nested atomic() block: a savepoint of the handler's own, released."""
    with transaction.atomic():
        Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)


registry.handler("trips.mixed", schema={"type": "object"}, timeout=0.1, batch_size=100)(_mixed)
registry.handler("trips.nested", schema={"type": "object"}, timeout=10, batch_size=100)(_nested)
registry.handler("trips.many", schema={"type": "object"}, timeout=10, batch_size=250)(_noop)
registry.handler("trips.noop", schema={"type": "object"}, timeout=10, batch_size=100)(_noop)
registry.handler("trips.insert", schema={"type": "object"}, timeout=10, batch_size=100)(_insert)
registry.handler("trips.read", schema={"type": "object"}, timeout=10, batch_size=100)(_read)


@pytest.fixture(autouse=True)
def _stop_heartbeat() -> Iterator[None]:
    yield
    lease.stop()  # its thread's connection is closed before the test database is dropped


@pytest.fixture(autouse=True)
def _prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's own statements are prepared on the connection before counting, as on a worker after
    its first batch (db.run_prepared_here), and not prepared again during the test."""
    monkeypatch.setattr(db, "REPLAN_SECONDS", 3600.0)
    monkeypatch.setattr(db, "REPLAN_AFTER_SLOW_SECONDS", 3600.0)  # a slow run on a loaded machine, too
    _statements("trips.noop", 1)


def _statements(kind: str, count: int, payloads: list[dict] | None = None) -> list[str]:
    """The statements sent while ``count`` jobs of ``kind`` (or one per payload) run as one batch (one chunk)."""
    payloads = payloads or [{}] * count
    report, sent = _run_one_batch(kind, payloads)
    assert (report.succeeded + report.failed, report.chunks) == (len(payloads), 1)
    failing = ("fail", "hang", "break")
    assert report.succeeded == sum(1 for p in payloads if not any(p.get(f) for f in failing))
    return [_first_line(sql) for sql in sent]


def _run_one_batch(kind: str, payloads: list[dict]) -> tuple[runner.BatchReport, list[str]]:
    """Schedule one job of ``kind`` per payload, claim them and run them as one batch: its report and statements."""
    ScheduledJob.objects.filter(state=JobState.PENDING).delete()  # an earlier run's failures, retried later
    api.schedule_many(kind, payloads, delay=60)
    support.make_due(state="pending")
    claims = store.claim_due_jobs(500)
    assert len(claims) == len(payloads)
    with CaptureQueriesContext(connection) as captured:
        report = runner.run_batch([(c.id, c.token) for c in claims])
    return report, [q["sql"] for q in captured.captured_queries]


def _first_line(sql: str) -> str:
    """A statement's first line that is not a comment, cut short: enough to say what it was."""
    lines = [line for line in sql.splitlines() if line.strip() and not line.startswith("--")]
    return (lines[0] if lines else sql)[:60]


def _per_job(kind: str) -> tuple[float, list[str], list[str]]:
    """Round trips one more job of ``kind`` costs in a batch, and the statements of the two runs."""
    one = _statements(kind, 1)
    many = _statements(kind, BATCH)
    return (len(many) - len(one)) / (BATCH - 1), one, many


def test_a_job_that_runs_no_sql_sends_no_statement_for_its_isolation():
    """Fifty no-op jobs in one chunk send exactly the statements one does: no savepoint, no check per job."""
    per_job, one, many = _per_job("trips.noop")
    assert per_job == 0, f"{len(many)} statements for {BATCH} no-op jobs, {len(one)} for one: {many}"


def test_jobs_that_run_no_sql_send_nothing_beside_failing_slow_and_broken_siblings():
    """Thirty no-op jobs among failing, timed-out and broken siblings add not one statement to the five siblings'."""
    siblings = [{"write": True, "fail": True}, {"hang": 0.3}, {"break": True}, {"write": True, "fail": True}, {}]
    alone = _statements("trips.mixed", 0, siblings)
    mixed = [siblings[0], *[{}] * 10, siblings[1], *[{}] * 10, siblings[2], siblings[3], *[{}] * 10, siblings[4]]
    among = _statements("trips.mixed", 0, mixed)
    assert len(among) == len(alone), f"{len(among) - len(alone)} statements for 30 no-op jobs: {among}"


def test_a_one_insert_job_costs_at_most_one_round_trip_beyond_its_insert():
    """Fifty one-INSERT jobs in one chunk: each costs its INSERT and at most one more round trip."""
    per_job, _, many = _per_job("trips.insert")
    assert per_job <= 2, f"{per_job:.2f} round trips per one-INSERT job: {many[:8]}"
    assert Execution.objects.count() == 1 + BATCH


def test_a_one_insert_job_costs_its_insert_alone_its_check_rides_with_the_next_statement():
    """Fifty one-INSERT jobs in one chunk cost one round trip each: the check goes in front of the next INSERT."""
    per_job, _, many = _per_job("trips.insert")
    assert per_job == 1, f"{per_job:.2f} round trips per one-INSERT job: {many[:8]}"
    checks = [sql for sql in many if sql.startswith("SAVEPOINT tk_check; SET CONSTRAINTS ALL IMMEDIATE")]
    assert len(checks) == BATCH, "every job checked once: 49 in front of the next INSERT, the last alone"


def test_a_read_only_job_costs_at_most_one_round_trip_beyond_its_select():
    """Fifty one-SELECT jobs in one chunk: each costs its SELECT and at most one more round trip."""
    per_job, _, many = _per_job("trips.read")
    assert per_job <= 2, f"{per_job:.2f} round trips per one-SELECT job: {many[:8]}"


def test_the_round_trip_tests_count_every_statement_the_runner_sends():
    """The counter sees the runner's own statements: a batch of one costs a handful, each ending as asked."""
    one = _statements("trips.insert", 1)
    assert any(sql.startswith('INSERT INTO "tasks_execution"') for sql in one), one
    assert 2 <= len(one) <= 12, one
    assert min(runner.ATOMIC_CHUNK_SAVEPOINTS, runner.ATOMIC_CHUNK_JOBS) >= BATCH, "the fifty jobs fit one chunk"


def test_a_batch_start_and_a_heartbeat_are_one_round_trip_each_and_commit_without_the_flush():
    """No BEGIN or COMMIT around them: the SET LOCAL and the statement go as one implicit transaction."""
    ScheduledJob.objects.filter(state=JobState.PENDING).delete()
    api.schedule_many("trips.noop", [{}] * 3, delay=0)
    claims = [(c.id, c.token) for c in store.claim_due_jobs(10)]
    with CaptureQueriesContext(connection) as captured:
        started = store.start_jobs(claims, "worker-1")
        renewed = store.heartbeat_jobs(claims)
    assert (len(started), len(renewed)) == (3, 3)
    sent = [q["sql"] for q in captured.captured_queries]
    assert len(sent) == 2, [_first_line(sql) for sql in sent]
    assert all(sql.startswith(store.ASYNC_COMMIT) for sql in sent)
    # inside a caller's transaction the statement joins it, unprefixed: its commit is the caller's
    with CaptureQueriesContext(connection) as inside, transaction.atomic():
        assert len(store.heartbeat_jobs(claims)) == 3
    statements = [q["sql"] for q in inside.captured_queries if "heartbeat" in q["sql"]]
    assert len(statements) == 1
    assert not statements[0].startswith(store.ASYNC_COMMIT)
    # what the prefix relies on: PostgreSQL keeps a SET LOCAL for the rest of its query string's implicit
    # transaction (and warns and ignores it outside a transaction, which would commit with the flush)
    with connection.cursor() as cursor:
        cursor.execute(store.ASYNC_COMMIT + "SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone() == ("off",)
        cursor.execute("SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone() == ("on",)


def _chunks(kind: str, payloads: list[dict]) -> tuple[runner.BatchReport, list[list[str]]]:
    """Run one batch of ``kind``: its report, and the statements sent, cut at each chunk's lock of its claims.

    The chunks' time bound is lifted: on a loaded machine 100 jobs may take longer than 0.5 s, and
    these tests are about the other bounds.
    """
    report, sent = _run_one_batch(kind, payloads)
    chunks: list[list[str]] = []
    for sql in sent:
        if "EXECUTE tk_lock_claims" in sql:  # the lock of its claims opens a chunk (prepared: _prepared)
            chunks.append([])
        if chunks:
            chunks[-1].append(sql)
    assert len(chunks) == report.chunks
    return report, chunks


def _open_savepoints(sent: list[str]) -> int:
    """The runner's job savepoints a chunk's statements left open: opened, less those rolled back to (still open)."""
    return sum(sql.count("SAVEPOINT tk_job") for sql in sent) - sum(
        sql.count("ROLLBACK TO SAVEPOINT tk_job") for sql in sent
    )


@pytest.fixture
def _no_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "ATOMIC_CHUNK_SECONDS", 600.0)


@pytest.mark.usefixtures("_no_time_bound")
def test_a_hundred_jobs_that_run_no_sql_share_one_chunk_they_open_no_savepoint():
    """A chunk's bound counts savepoints, and a job that sends nothing opens none: 100 no-op jobs, one chunk.

    One lock, one outcome statement and one commit for the batch, not two of each with a heartbeat
    of the second half between them, as when the bound counted jobs.
    """
    report, chunks = _chunks("trips.noop", [{}] * 100)
    assert (report.succeeded, report.chunks) == (100, 1), f"{report.chunks} chunks for 100 jobs that sent no statement"
    assert not [sql for sql in chunks[0] if "heartbeat" in sql]


@pytest.mark.usefixtures("_no_time_bound")
def test_a_chunk_ends_when_its_succeeded_writers_hold_fifty_savepoints_whatever_runs_between_them():
    """60 good writers among no-op, failing and broken jobs: the first chunk closes on its 50th good writer.

    A failed writer is rolled back to its savepoint (which stays, clean): it leaves none open and does
    not count. When the bound counted jobs, the first chunk closed after 50 jobs, 30 of them good writers.
    """
    twenty = [{"write": True}] * 12 + [{"write": True, "fail": True}] * 3 + [{"break": True}] * 2 + [{}] * 3
    payloads = [twenty[(i * 7) % 20] for i in range(20)] * 5  # 60 good writers, 15 failing, 10 broken, 15 no-op
    report, chunks = _chunks("trips.mixed", payloads)
    assert (report.succeeded, report.failed, report.chunks) == (75, 25, 2)
    assert _open_savepoints(chunks[0]) == runner.ATOMIC_CHUNK_SAVEPOINTS + 1, "tk_job, and one after each of 50"
    assert _open_savepoints(chunks[1]) <= runner.ATOMIC_CHUNK_SAVEPOINTS + 1
    assert Execution.objects.count() == 60


@pytest.mark.usefixtures("_no_time_bound")
def test_the_savepoints_a_handler_opens_itself_count_toward_its_chunks_bound():
    """A nested atomic() is a subtransaction too (kept to the commit, released or not): 25 such jobs fill a chunk.

    Each leaves two savepoints open, the runner's and its own: 60 jobs run in chunks of 25, 25 and 10.
    """
    report, chunks = _chunks("trips.nested", [{}] * 60)
    assert (report.succeeded, report.chunks) == (60, 3)
    assert [_open_savepoints(sent) for sent in chunks] == [26, 26, 11]
    assert Execution.objects.count() == 60


@pytest.mark.usefixtures("_no_time_bound")
def test_a_chunk_holds_at_most_two_hundred_jobs_even_when_they_send_nothing():
    """A lost chunk refunds every job it held: however few savepoints they leave, a chunk stops at 200 jobs."""
    report, _ = _chunks("trips.many", [{}] * 250)
    assert (report.succeeded, report.chunks) == (250, 2)
