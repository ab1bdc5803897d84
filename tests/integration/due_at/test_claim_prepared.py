"""The claim runs as a statement prepared once per server session (store.claim_due_jobs)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from scheduling.due_at import store

pytestmark = pytest.mark.django_db(transaction=True)


def _insert_due(run_sql, n: int) -> None:
    run_sql(
        "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, lease_seconds, attempts, max_attempts,"
        " last_error, claimed_by, created_at, updated_at)"
        " SELECT 'demo.noop', '{}'::jsonb, now() - make_interval(secs => g), 'pending', 60, 0, 3, '', '', now(), now()"
        " FROM generate_series(1, %s) AS g",
        [n],
    )


def _executions(run_sql) -> dict[str, int]:
    """{prepared statement name: times executed} of this session (PostgreSQL counts each run's plan)."""
    return {
        name: generic + custom
        for name, generic, custom in run_sql("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements")
    }


def test_each_claim_runs_the_statement_prepared_once_in_the_session(run_sql):
    """Eight claims prepare the statement once and execute it by name eight times; each takes its row."""
    _insert_due(run_sql, 20)
    run_sql("DEALLOCATE ALL")
    taken = [store.claim_due_jobs(1) for _ in range(8)]
    assert [len(rows) for rows in taken] == [1] * 8
    assert len({rows[0].id for rows in taken}) == 8
    assert _executions(run_sql) == {store._claim_prepared().name: 8}


def test_a_session_without_the_statement_prepares_it_and_claims(run_sql):
    """A session that lost it (a new server session behind a pooler) claims at once and holds it again."""
    _insert_due(run_sql, 5)
    assert len(store.claim_due_jobs(2)) == 2
    run_sql("DEALLOCATE ALL")
    assert len(store.claim_due_jobs(2)) == 2
    assert _executions(run_sql) == {store._claim_prepared().name: 1}
    claimed = run_sql("SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'claimed'")
    assert claimed == [(4,)]


def test_a_session_holding_another_release_of_the_statement_runs_its_own(run_sql):
    """A statement left by another release (another text, so another name) is not run in place of this one."""
    _insert_due(run_sql, 3)
    run_sql("DEALLOCATE ALL")
    run_sql("PREPARE timekeeper_0000000000000000(integer) AS SELECT $1")
    assert len(store.claim_due_jobs(3)) == 3
    assert _executions(run_sql) == {"timekeeper_0000000000000000": 0, store._claim_prepared().name: 1}


def test_a_claim_inside_a_callers_transaction_prepares_nothing(run_sql):
    """Inside a caller's transaction the claim runs unprepared: a missing statement would abort that transaction."""
    _insert_due(run_sql, 3)
    run_sql("DEALLOCATE ALL")
    with transaction.atomic():
        assert len(store.claim_due_jobs(3)) == 3
        assert not connection.get_autocommit()
    assert _executions(run_sql) == {}
