"""The statements every batch runs are prepared on the worker's own connection, unless it goes through a
transaction pooler (``db.run_prepared_here``): prepared once per connection, then only executed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduling import api, registry
from scheduling.core import db
from scheduling.due_at import lease, runner, store
from scheduling.models import JobState, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)

PREPARED = {"tk_start_jobs", "tk_lock_claims", "tk_set_job_states"}


def _noop(job: registry.Job) -> None:
    """Nothing."""


registry.handler("prepared.noop", schema={"type": "object"}, timeout=10, batch_size=10)(_noop)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(db, "REPLAN_SECONDS", 3600.0)
    monkeypatch.setattr(db, "REPLAN_AFTER_SLOW_SECONDS", 3600.0)
    monkeypatch.setattr(db, "_orm_refused", False)
    yield
    lease.stop()  # its thread's connection is closed before the test database is dropped


def _claims(count: int = 2) -> list[tuple[int, str]]:
    ScheduledJob.objects.filter(kind="prepared.noop").delete()
    api.schedule_many("prepared.noop", [{}] * count, delay=0)
    return [(c.id, c.token) for c in store.claim_due_jobs(10)]


def _run_batch() -> list[str]:
    """The statements of one batch of two no-op jobs."""
    claims = _claims()
    with CaptureQueriesContext(connection) as captured:
        report = runner.run_batch(claims)
    assert report.succeeded == 2
    return [q["sql"] for q in captured.captured_queries]


def _prepared_here() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall()}


def test_a_batchs_statements_are_prepared_once_then_only_executed():
    connection.close()  # a new session: nothing prepared on it yet
    first = _run_batch()
    assert _prepared_here() >= PREPARED
    assert sum("PREPARE tk_" in sql for sql in first) == 3, first
    second = _run_batch()
    assert not any("PREPARE" in sql for sql in second), second
    executed = {sql.split("EXECUTE ", 1)[1].split(" ", 1)[0] for sql in second if "EXECUTE tk_" in sql}
    assert executed == PREPARED, second
    assert ScheduledJob.objects.filter(kind="prepared.noop", state=JobState.DONE).count() == 2


def test_behind_a_transaction_pooler_nothing_is_prepared(monkeypatch):
    """DISABLE_SERVER_SIDE_CURSORS, Django's setting for a pooler in transaction mode: every statement as text."""
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    sent = _run_batch()
    assert not any("PREPARE" in sql or "EXECUTE" in sql for sql in sent), sent
    assert not _prepared_here() & PREPARED
    assert any("WITH started AS" in sql for sql in sent), "start_jobs went as text"


def test_a_session_without_a_statement_this_process_prepared_stops_the_preparing(caplog):
    """As a pooler without that setting would do: the next transaction on a server session that never saw
    the PREPARE. In autocommit the statement, which ran nothing, is sent again as text at once; the
    process sends text from then on."""
    connection.close()
    _run_batch()
    claims = _claims()
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE tk_start_jobs")  # the session as another server's would be
    with CaptureQueriesContext(connection) as captured:
        started = store.start_jobs(claims, "worker-1")
    assert [j.id for j in started] == [i for i, _ in claims], "started once, by the text"
    assert sum("WITH started AS" in q["sql"] for q in captured.captured_queries) == 1
    assert db._orm_refused
    assert not db.orm_prepares()
    assert any(r.__dict__.get("action") == "prepare_refused" for r in caplog.records)
    sent = _run_batch()
    assert not any("EXECUTE" in sql for sql in sent), sent


def test_inside_a_transaction_a_lost_statement_fails_the_transaction_and_stops_the_preparing():
    """A statement cannot be sent again inside the caller's transaction (it is aborted): the failure is the
    caller's, as any statement's; the rows are untouched and the next statements go as text."""
    connection.close()
    _run_batch()
    claims = _claims()
    store.start_jobs(claims, "worker-1")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE tk_lock_claims")
    with pytest.raises(DatabaseError), transaction.atomic():
        store.lock_claims(claims)
    assert not db.orm_prepares()
    with transaction.atomic():
        assert sorted(store.lock_claims(claims)) == sorted(i for i, _ in claims)
    assert ScheduledJob.objects.filter(id__in=[i for i, _ in claims], state=JobState.RUNNING).count() == 2


def test_only_with_psycopg2(monkeypatch):
    """psycopg 3 binds on the server itself (and its mogrify returns text): nothing is prepared there."""
    monkeypatch.setattr(connection, "Database", object())
    assert not db.orm_prepares()
