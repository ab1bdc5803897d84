"""A writing job's deferred-constraint check rides in front of the next statement: who pays when it fails.

A job that sent statements and succeeded owes a check of its deferred constraints and the next job's
savepoint (``sql/isolation.sql``). The runner sends both in front of the next statement, in its
execute (``runner._Statements``). These tests take each way that statement can go: a plain
statement, a handler's own ``atomic()`` block, ``executemany`` (the check goes alone first), a job
with no SQL in between, the chunk's end (the check alone), and a next statement that fails for its
own reasons. Handler calls are counted; the statements are read with ``CaptureQueriesContext``.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from psycopg2 import sql as psycopg_sql

from scheduling import api, registry
from scheduling.due_at import runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution, Notification
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: Counter[str] = Counter()
CALLBACKS: list[str] = []
INSERT = 'INSERT INTO "tasks_execution"'


def _carry(job: registry.Job) -> None:
    """Write one Execution row by the payload's ``first`` way, then delete or notify a user, or fail."""
    CALLS[job.idempotency_key] += 1
    first = job.payload.get("first", "plain")
    row = {"idempotency_key": job.idempotency_key, "kind": job.kind, "pid": 0}
    if first == "none":
        return
    if first == "divide":
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    if first == "divide_swallowed":
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        except DatabaseError:
            pass  # swallowed on purpose: the transaction stays broken
    if first == "unparsable":
        with connection.cursor() as cursor:
            cursor.execute("SELEC 1")
    if first == "bypass_then_orm":
        raw = connection.connection.cursor()  # the driver's own cursor: no execute wrapper sees it
        with contextlib.suppress(Exception):  # psycopg2's own error class, not Django's; swallowed on purpose
            raw.execute("SELECT 1 / 0")
    if first == "trigger":
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO carry_deferred VALUES (1)")  # its deferred trigger raises at the check
    if first == "composed":
        with connection.cursor() as cursor:
            cursor.execute(psycopg_sql.SQL("SELECT {}").format(psycopg_sql.Literal(1)))
    if first == "iterator":
        list(Execution.objects.all().iterator(chunk_size=10))  # a named (server-side) cursor in a transaction
    if first in ("plain", "bypass_then_orm", "composed", "iterator"):
        Execution.objects.create(**row)
    if first == "atomic":
        with transaction.atomic():
            Execution.objects.create(**row)
    elif first == "many":
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO tasks_execution (idempotency_key, kind, pid, started_at) VALUES (%s, %s, %s, now())",
                [(job.idempotency_key, job.kind, 0)],
            )
    transaction.on_commit(lambda: CALLBACKS.append(job.idempotency_key))
    if "delete_user" in job.payload:
        get_user_model().objects.filter(pk=job.payload["delete_user"]).delete()
    if "notify" in job.payload:
        Notification.objects.create(idempotency_key=job.idempotency_key, subject="hi", user_id=job.payload["notify"])


registry.handler("carry.job", schema={"type": "object"}, timeout=10, max_attempts=3, batch_size=20)(_carry)


@pytest.fixture(autouse=True)
def _clean() -> None:
    CALLS.clear()
    CALLBACKS.clear()


def _run(payloads: list[dict]) -> tuple[list[int], runner.BatchReport, list[str]]:
    """Run one batch (one chunk) of ``payloads``; the ids, the report and every statement sent."""
    ids = api.schedule_many("carry.job", payloads, delay=60)
    support.make_due(state="pending")
    claims = store.claim_due_jobs(500)
    assert len(claims) == len(ids)
    with CaptureQueriesContext(connection) as captured:
        report = runner.run_batch([(c.id, c.token) for c in claims])
    assert report.chunks == 1
    assert sum(CALLS.values()) == len(ids), "each handler called once"
    return ids, report, [q["sql"] for q in captured.captured_queries]


def _states(ids: list[int]) -> list[str]:
    by_id = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state"))
    return [by_id[i] for i in ids]


def _keys(ids: list[int]) -> list[str]:
    return [f"job:{i}" for i in ids]


CHECK = store.check_job_sql("tk_job_N").partition(" SAVEPOINT tk_job_N")[0]  # the check's commands


def _carried(sql: str, statement: str = "") -> bool:
    """Whether ``sql`` is the check and a new job savepoint in front of a statement starting with ``statement``."""
    return re.match(re.escape(CHECK) + r" SAVEPOINT tk_job_\d+;\n" + re.escape(statement), sql) is not None


def _alone(sql: str) -> bool:
    """Whether ``sql`` is the check and a new job savepoint sent alone (``store.check_job``)."""
    return re.fullmatch(re.escape(CHECK) + r" SAVEPOINT tk_job_\d+;\n", sql) is not None


@pytest.mark.parametrize("following", ["plain", "atomic", "many", "after_a_job_without_sql", "none: the chunk ends"])
def test_a_failed_check_fails_the_owing_job_alone_whatever_statement_carried_it(following):
    """A job whose foreign key fails at its check is failed and rolled back; the job after it never sees it."""
    user = get_user_model().objects.create_user("victim")
    payloads: list[dict] = [{"delete_user": user.pk}, {"notify": user.pk}]
    if following == "after_a_job_without_sql":
        payloads += [{"first": "none"}, {"first": "plain"}]
    elif following != "none: the chunk ends":
        payloads.append({"first": following})
    ids, report, sent = _run(payloads)
    owing = ids[1]
    assert _states(ids) == [JobState.PENDING if i == owing else JobState.DONE for i in ids]
    assert "IntegrityError" in ScheduledJob.objects.get(pk=owing).last_error
    assert (report.succeeded, report.failed) == (len(ids) - 1, 1)
    writers = [i for i, p in zip(ids, payloads, strict=True) if p.get("first") != "none"]
    written = sorted(Execution.objects.values_list("idempotency_key", flat=True))
    assert written == sorted(_keys([i for i in writers if i != owing])), "the owing job's writes rolled back"
    assert not Notification.objects.exists()
    assert sorted(CALLBACKS) == sorted(_keys([i for i in writers if i != owing])), "its callback was dropped"
    # Which path ran. The debug log keeps one statement per execute, the last sent on its cursor: a
    # carried check that failed shows as the statement sent again alone. The checks sent alone are
    # the chunk's last writing job's, and one before an executemany.
    alone = sum(1 for sql in sent if _alone(sql))
    assert alone == {"many": 2}.get(following, 1), "the failed check was carried, not sent alone"
    carried = [sql for sql in sent if _carried(sql) and not _alone(sql)]
    assert len(carried) == 1
    assert _carried(carried[0], INSERT), "the notify job's INSERT carried the first check"


@pytest.mark.parametrize("first", ["divide", "divide_swallowed"])
def test_the_next_statements_own_error_fails_its_job_and_the_owing_job_commits(first):
    """A passed check in front of a failing statement: that job fails alone, behind its own savepoint."""
    ids, report, sent = _run([{"first": "plain"}, {"first": first}, {"first": "plain"}])
    assert _states(ids) == [JobState.DONE, JobState.PENDING, JobState.DONE]
    error = ScheduledJob.objects.get(pk=ids[1]).last_error
    assert ("division by zero" in error) if first == "divide" else (error == runner.BROKEN_TRANSACTION_ERROR)
    assert (report.succeeded, report.failed) == (2, 1)
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_keys([ids[0], ids[2]]))
    assert sorted(CALLBACKS) == sorted(_keys([ids[0], ids[2]]))
    assert any(_carried(sql, "SELECT 1 / 0") for sql in sent), "the first job's check rode on the failing statement"


def test_a_chunk_of_writing_jobs_sends_its_checks_in_front_of_the_next_statements_and_one_alone():
    """Twenty one-INSERT jobs: nineteen INSERTs carry the previous job's check, and the last job's goes alone."""
    _, report, sent = _run([{"first": "plain"}] * 20)
    assert report.succeeded == 20
    assert sum(1 for sql in sent if _carried(sql, INSERT)) == 19
    assert sum(1 for sql in sent if sql.startswith(INSERT)) == 1
    assert sum(1 for sql in sent if "SET CONSTRAINTS ALL IMMEDIATE" in sql) == 20, "every job checked once"
    assert Execution.objects.count() == 20


@pytest.fixture
def deferred_trigger(run_sql):
    """A table whose DEFERRABLE INITIALLY DEFERRED constraint trigger raises a plain error (not an integrity one)."""
    run_sql("CREATE TABLE carry_deferred (id int)")
    run_sql(
        "CREATE FUNCTION carry_refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'refused at the check, on purpose'; END$$"
    )
    run_sql(
        "CREATE CONSTRAINT TRIGGER carry_refuse AFTER INSERT ON carry_deferred DEFERRABLE INITIALLY DEFERRED"
        " FOR EACH ROW EXECUTE FUNCTION carry_refuse()"
    )
    yield
    run_sql("DROP TABLE carry_deferred")
    run_sql("DROP FUNCTION carry_refuse()")


def _given_back(job_id: int) -> bool:
    """Refunded as a job of a chunk that died together: pending, to run alone, the note on its attempt."""
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.filter(job_id=job_id).get()
    return (
        job.state == JobState.PENDING
        and job.run_alone
        and job.last_error.startswith("refunded:")
        and attempt.outcome == AttemptOutcome.RECLAIMED
    )


def test_a_check_that_fails_without_an_integrity_error_gives_its_job_back_uncharged(deferred_trigger):
    """A deferred trigger raising at the check: that job is rolled back and runs again uncharged; the next commits."""
    ids, report, _ = _run([{"first": "trigger"}, {"first": "plain"}, {"first": "plain"}])
    assert _given_back(ids[0])
    assert _states(ids[1:]) == [JobState.DONE, JobState.DONE]
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(_keys(ids[1:]))
    assert sorted(CALLBACKS) == sorted(_keys(ids[1:]))
    assert (report.succeeded, report.failed, report.given_back) == (2, 0, 1)


def test_a_statement_postgresql_cannot_parse_costs_the_owing_job_its_writes_but_not_an_attempt():
    """The whole string fails before the check runs: the owing job runs again uncharged; the bad job fails alone."""
    ids, report, sent = _run([{"first": "plain"}, {"first": "unparsable"}, {"first": "plain"}])
    assert _given_back(ids[0]), ScheduledJob.objects.get(pk=ids[0]).last_error
    bad = ScheduledJob.objects.get(pk=ids[1])
    assert (bad.state, bad.attempts) == (JobState.PENDING, 1)
    assert "syntax error" in bad.last_error
    assert _states([ids[2]]) == [JobState.DONE]
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == _keys([ids[2]])
    assert _keys([ids[2]]) == CALLBACKS
    assert (report.succeeded, report.failed, report.given_back) == (1, 1, 1)
    assert any(_carried(sql, "SELEC 1") for sql in sent), "the check rode on the statement that did not parse"


def test_a_statement_past_djangos_cursor_that_breaks_the_transaction_costs_the_owing_job_no_attempt():
    """A driver cursor's error inside the owing job's savepoint: that job runs again uncharged; the breaker fails."""
    ids, report, _ = _run([{"first": "plain"}, {"first": "bypass_then_orm"}, {"first": "plain"}])
    assert _given_back(ids[0]), ScheduledJob.objects.get(pk=ids[0]).last_error
    assert "current transaction is aborted" in ScheduledJob.objects.get(pk=ids[1]).last_error, "its ORM call raised"
    assert _states([ids[2]]) == [JobState.DONE]
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == _keys([ids[2]])
    assert (report.succeeded, report.failed, report.given_back) == (1, 1, 1)


@pytest.mark.parametrize("first", ["composed", "iterator"])
def test_a_statement_the_check_cannot_go_in_front_of_gets_it_alone_first(first):
    """A composed statement or a server-side cursor's: the owed check goes alone before it, and both jobs commit."""
    ids, report, sent = _run([{"first": "plain"}, {"first": first}])
    assert _states(ids) == [JobState.DONE, JobState.DONE]
    assert report.succeeded == 2
    assert sum(1 for sql in sent if _alone(sql)) == 2, "the first job's check before the statement, the last's"
    assert not any(_carried(sql) and not _alone(sql) for sql in sent)
