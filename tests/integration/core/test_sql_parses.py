"""Every named statement of every store's .sql files parses and plans in PostgreSQL."""

from __future__ import annotations

import re

import pytest
from django.db import DatabaseError, connection, transaction

from scheduling.core import store as core_store
from scheduling.deferrals import store as deferrals_store
from scheduling.due_at import store
from scheduling.fixed import store as fixed_store
from scheduling.recurring import store as recurring_store
from scheduling.web import store as web_store

pytestmark = pytest.mark.django_db

# savepoints: run, not planned
UTILITY = {"open_job_savepoint", "check_job", "refuse_statements"}


STORES = [core_store, store, fixed_store, deferrals_store, recurring_store, web_store]
STATEMENTS = [(s, name) for s in STORES for name in sorted(s.SQL.queries)]


@pytest.mark.parametrize(("owner", "name"), STATEMENTS, ids=[f"{s.__name__.split('.')[1]}:{n}" for s, n in STATEMENTS])
def test_statement_plans(owner, name):
    """EXPLAIN accepts the statement with every parameter NULL (types come from the casts in the SQL)."""
    sql = owner.SQL[name]
    params = {p: None for p in re.findall(r"%\((\w+)\)s", sql)}
    with transaction.atomic(), connection.cursor() as cursor:
        if name in UTILITY:  # a utility statement has no plan: PostgreSQL must accept it as it is
            cursor.execute(store.SQL["open_job_savepoint"])
            if name == "refuse_statements":
                with pytest.raises(DatabaseError, match="an earlier statement of this job failed"):
                    cursor.execute(sql)
            else:
                cursor.execute(sql)
            transaction.set_rollback(True)
            return
        cursor.execute("EXPLAIN " + sql, params)
        assert cursor.fetchall()
        transaction.set_rollback(True)


def test_claim_uses_the_partial_index(run_sql):
    """The claim's plan reads the pending-only partial indexes (not the whole table)."""
    run_sql("SET enable_seqscan = off")
    plan = "\n".join(row[0] for row in run_sql("EXPLAIN " + store.SQL["claim_due_jobs"], store.claim_params(10)))
    assert "scheduledjob_pending_prio_idx" in plan or "scheduledjob_pending_due_idx" in plan
    assert "Seq Scan on scheduling_scheduledjob" not in plan
