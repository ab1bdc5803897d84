"""A handler's timeout inside a database statement: the watchdog cancels the statement, the call is timed out."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduling.core import executor, registry

pytestmark = pytest.mark.django_db(transaction=True)


def _pg_sleep(job: registry.Job) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [float(job.payload["sleep"])])


KIND = registry.Kind("exec.pg_sleep", _pg_sleep, None, 0.0, 1, registry.Backoff(), 30, 1, "")


def test_a_statement_past_the_timeout_is_cancelled_and_the_call_timed_out():
    """A 0.3 s timeout ends a pg_sleep(20) long before it returns: TIMED_OUT, and the connection answers after."""
    job = registry.Job(kind=KIND.name, payload={"sleep": 20}, attempt=1, max_attempts=1, due_at=None, id=1)
    began = time.monotonic()
    result = executor.invoke(KIND, job, 0.3)
    assert result.outcome == executor.TIMED_OUT
    assert time.monotonic() - began < 20, "cancelled: pg_sleep(20) did not run out"
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_in_a_batch_a_statement_on_a_connection_opened_by_the_job_is_cancelled():
    """Inside ``alarms()`` (a batch) the wrappers are read once at its start, the connection closed then:
    the job opens it, and its pg_sleep past the timeout is still cancelled."""
    job = registry.Job(kind=KIND.name, payload={"sleep": 20}, attempt=1, max_attempts=1, due_at=None, id=1)
    connection.close()
    began = time.monotonic()
    with executor.alarms():
        first = executor.invoke(KIND, job, 0.3)
        second = executor.invoke(KIND, job, 0.3)
    assert (first.outcome, second.outcome) == (executor.TIMED_OUT, executor.TIMED_OUT)
    assert time.monotonic() - began < 20, "both cancelled: neither pg_sleep(20) ran out"


def test_an_alias_this_process_cannot_set_up_leaves_a_batchs_deadlines_working(monkeypatch):
    """A configured database whose backend is missing here: the batch's wrappers leave it out, and the
    deadline still cancels a statement on the default connection."""
    from django.db import connections

    from scheduling.core import db

    monkeypatch.setitem(connections.settings, "unloadable", {**connections.settings["default"], "ENGINE": "no.such"})
    wrappers = db.thread_connections(every_alias=True)
    assert [w.alias for w in wrappers] == ["default"]
    job = registry.Job(kind=KIND.name, payload={"sleep": 20}, attempt=1, max_attempts=1, due_at=None, id=1)
    with executor.alarms():
        result = executor.invoke(KIND, job, 0.3)
    assert result.outcome == executor.TIMED_OUT
