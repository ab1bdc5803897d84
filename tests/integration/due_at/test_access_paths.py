"""Which index each hot statement reads, when the statistics say almost nothing is claimed or finished.

A busy jobs table outruns its statistics: after a quiet analyze, a spike of claims and outcomes
leaves the planner believing that no row is claimed and none finished. A statement that can then
choose a partial index over the whole claimed or finished set (and every dead version in it since
the last vacuum) instead of its rows' primary keys gets slower with every job of the spike. These
tests take that state on purpose (an analyze before any claim) and check the path each statement
takes: by id through the primary key, and the whole claimed set only where it is wanted.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduling import api
from scheduling.core import db
from scheduling.due_at import store
from scheduling.recurring import store as recurring_store
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "scheduling_scheduledjob"
PKEY = "scheduling_scheduledjob_pkey"
PREPARED = "EXECUTE tk_"  # a batch's statements, prepared on the connection (store.START_TYPES and the like)


def _scans(node: Any) -> Iterator[str]:
    """Each way into the jobs table in an EXPLAIN (FORMAT JSON) plan: an index's name, or "Seq Scan".

    An index scan of the primary key must look rows up by id (its condition names ``id``), not walk it.
    A bitmap scan is named by its index scans (the nodes under it; they carry no relation name).
    """
    if isinstance(node, dict):
        kind = node.get("Node Type", "")
        index = node.get("Index Name", "")
        if node.get("Relation Name") == JOBS and kind in ("Seq Scan", "Index Scan", "Index Only Scan"):
            if index == PKEY and "id" not in node.get("Index Cond", ""):
                yield f"{PKEY} (walked)"
            else:
                yield index or kind
        elif kind == "Bitmap Index Scan" and (index.startswith("scheduledjob_") or index == PKEY):
            yield index
        for value in node.values():
            yield from _scans(value)
    elif isinstance(node, list):
        for value in node:
            yield from _scans(value)


def _plan(sql: str) -> Any:
    """The statement's plan; a prepared one's (``EXECUTE``) generic plan, the one a worker runs after five runs."""
    with connection.cursor() as cursor:
        cursor.execute((db.GENERIC_PLAN if sql.startswith("EXECUTE ") else "") + "EXPLAIN (FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    return json.loads(plan) if isinstance(plan, str) else plan


def _statement(captured: str) -> str:
    """The statement of a captured query, without the ``SET LOCAL`` a claim-path statement starts with;
    of a batch's prepared statement (``db.run_prepared_here``), its ``EXECUTE``."""
    if PREPARED in captured:
        return captured[captured.index(PREPARED) :]
    return captured.removeprefix(store.ASYNC_COMMIT)


def _on_jobs(captured: str) -> bool:
    """Whether a captured query reads the jobs table: its text says so, or it runs a batch's prepared statement
    (whose preparing, the first time on a connection, reads nothing)."""
    if captured.startswith(("PREPARE ", "DEALLOCATE ")):
        return False
    return JOBS in captured or PREPARED in captured


@pytest.fixture
def stale_statistics(run_sql) -> list[store.Claim]:
    """100,000 due jobs analyzed while none is claimed or finished, then a batch of 50 claimed."""
    run_sql(
        "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, lease_seconds, attempts, max_attempts,"
        " last_error, claimed_by, created_at, updated_at, priority, run_alone, atomic, former_owner)"
        " SELECT 'demo.record', '{}', now() - interval '1 minute', 'pending', 60, 0, 3, '', '', now(), now(), 0,"
        " false, true, '' FROM generate_series(1, 100000)"
    )
    run_sql("VACUUM ANALYZE scheduling_scheduledjob")
    claims = store.claim_due_jobs(50)
    assert len(claims) == 50
    return claims


def test_statements_addressing_claims_by_id_read_them_by_primary_key(stale_statistics):
    """Start, heartbeat, lock, complete, fail, release, give back: each reads the jobs table by its key only."""
    pairs = [(c.id, c.token) for c in stale_statistics]
    now = dt.datetime.now(dt.UTC)
    outcomes = [store.Outcome(i, t, now, now, "succeeded") for i, t in pairs]
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        store.start_jobs(pairs, "worker-1")
        store.heartbeat_jobs(pairs)
        store.lock_claims(pairs)
        store.complete_jobs(outcomes)
        store.fail_jobs([store.Outcome(i, t, now, now, "failed", "boom", 1.0) for i, t in pairs])
        store.release_jobs(pairs, "shutting down")
        store.release_lost_chunk([(i, t, 1.0) for i, t in pairs], "chunk lost")
        store.unclaim_jobs(pairs)
        transaction.set_rollback(True)
    statements = [_statement(q["sql"]) for q in captured.captured_queries if _on_jobs(q["sql"])]
    assert len(statements) == 8
    assert sum(sql.startswith(PREPARED) for sql in statements) == 7, "all but the heartbeat are prepared"
    for sql in statements:
        scans = set(_scans(_plan(sql)))
        assert scans == {PKEY}, (scans, sql.splitlines()[0])


def test_the_sweeper_and_the_counts_read_the_claimed_set_index(stale_statistics, run_sql):
    """The statements that want every claim say claimed_at IS NOT NULL and get the claimed set's index."""
    with CaptureQueriesContext(connection) as captured:
        store.sweep_expired_claims(heartbeats=True, sweep_after_seconds=60, limit=100, queued_ids=[])
        store.unseen_unstarted_claims([], limit=100)
        store.backlog_status(stuck_after_seconds=600)
    statements = [_statement(q["sql"]) for q in captured.captured_queries if "claimed_at IS NOT NULL" in q["sql"]]
    assert len(statements) == 3
    for sql in statements:
        assert "scheduledjob_claimed_set_idx" in set(_scans(_plan(sql))), sql.splitlines()[0]


def _index_scans(run_sql) -> dict[str, int]:
    """Scans of the jobs table so far, per index and "Seq Scan" (this session's counters flushed first)."""
    run_sql("SELECT pg_stat_force_next_flush()")
    scans = dict(run_sql("SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = %s", [JOBS]))
    scans["Seq Scan"] = run_sql("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = %s", [JOBS])[0][0]
    return scans


def test_counting_a_batch_of_outcomes_reads_each_job_by_its_key(stale_statistics, run_sql):
    """The attempts trigger joins a batch's new attempts to their jobs by key: no partial index is read.

    Before it counted through four joins each filtered on the job's state, which let the planner read
    the whole finished (or pending) index when the statistics said it was nearly empty.
    """
    if connection.pg_version < 150000:
        pytest.skip("pg_stat_force_next_flush() is PostgreSQL 15's")
    pairs = [(c.id, c.token) for c in stale_statistics]
    store.start_jobs(pairs, "worker-1")
    now = dt.datetime.now(dt.UTC)
    before = _index_scans(run_sql)
    assert len(store.complete_jobs([store.Outcome(i, t, now, now, "succeeded") for i, t in pairs])) == 50
    after = _index_scans(run_sql)
    used = {name for name, scans in after.items() if scans > before.get(name, 0)}
    assert used == {PKEY}, used


def _compiles(sql: str, params: Any, *, prefix: str) -> bool:
    """Whether EXPLAIN ANALYZE of ``sql`` shows JIT compiling it, after ``prefix``, with every plan past the bar."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit_above_cost = 0")  # the claim's estimate in a spike, for any table size
        if prefix:
            cursor.execute(prefix)
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return "JIT" in plan[0]


def test_the_claim_and_the_planner_pick_run_without_jit(run_sql):
    """Both start their own transaction with SET LOCAL jit = off, and that keeps JIT off. The claim's
    transaction opens with its lock of the control rows (store._claim), then runs the claim statement.

    Measured before: 66,000 claims after an analyze, the claim's estimate passed jit_above_cost and
    each claim compiled for 150 ms to run in 3 (bench/README.md, "recurring").
    """
    api.schedule_many("demo.record", [{}] * 20, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 minute'")
    with CaptureQueriesContext(connection) as captured:
        assert len(store.claim_due_jobs(5)) == 5
    lock, claim = [q["sql"] for q in captured.captured_queries if "FOR UPDATE SKIP LOCKED" in q["sql"]]
    assert lock.startswith(db.NO_JIT)
    assert "INSERT INTO scheduling_kindrate" not in claim, "no control row held: the claim without the windows' write"
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        recurring_store.pick_recurrences_to_plan(10, ["demo.record"])
    (pick,) = [q["sql"] for q in captured.captured_queries if "scheduling_recurrence" in q["sql"]]
    assert pick.startswith(db.NO_JIT)
    if not run_sql("SELECT pg_jit_available()")[0][0]:
        pytest.skip("this PostgreSQL has no JIT: nothing to turn off")
    params = store.claim_params(5)
    assert _compiles(store.SQL["claim_due_jobs"], params, prefix="")  # the bar reached: JIT would compile it
    assert not _compiles(store.SQL["claim_due_jobs"], params, prefix=db.NO_JIT)


def test_a_claim_in_the_callers_transaction_is_planned_as_every_claim_and_gives_the_settings_back(run_sql):
    """In a caller's transaction (``testing.run_due`` in a test's), the claim runs with the settings every
    claim runs with (JIT off, store.INDEX_COSTS), and the caller's statements after it with the caller's
    own, also those the caller set in its transaction."""
    api.schedule_many("demo.record", [{}] * 5, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 minute'")
    shown = (
        "SELECT current_setting('jit'), current_setting('random_page_cost'), current_setting('enable_sort'),"
        " current_setting('enable_incremental_sort')"
    )
    (before,) = run_sql(shown)
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        run_sql("SET LOCAL random_page_cost = 2.5")
        assert len(store.claim_due_jobs(5)) == 5
        assert run_sql(shown) == [(before[0], "2.5", *before[2:])]
        transaction.set_rollback(True)
    sent = [q["sql"] for q in captured.captured_queries]
    [lock] = [n for n, sql in enumerate(sent) if "timekeeper.held_kinds" in sql]
    assert sent[lock - 1] == db.NO_JIT + store.INDEX_COSTS, "the claim's settings, then its lock and its statement"
    assert before[2:] == ("on", "on"), "the server's defaults: a restore to them is seen"


def test_the_loops_look_for_a_waiting_rate_limited_job_probes_its_kinds_index_whatever_the_statistics(run_sql):
    """``rate_limited_due`` (on most of the control loop's turns while a rate-limited kind waits) probes
    each priority in the kind's range of the (kind, priority, due_at) index, on a quiet table's
    statistics too (analyzed with no pending row). Seen before: each empty priority's probe read every
    due row through the due_at index, 20-32 ms a call with 18,000 due."""
    api.schedule_many("demo.record", [{}] * 3000, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now()")
    run_sql("VACUUM ANALYZE scheduling_scheduledjob")
    run_sql("DELETE FROM scheduling_scheduledjob")
    api.schedule_many("demo.record", [{}] * 3000, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 minute'")
    api.set_rate("demo.record", "5/s")
    with CaptureQueriesContext(connection) as captured:
        assert store.rate_limited_due() == pytest.approx(0.2)
    [probe] = [q["sql"] for q in captured.captured_queries if "refill_seconds" in q["sql"]]
    assert probe.startswith(db.NO_JIT + store.INDEX_COSTS)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(db.GENERIC_PLAN + store.INDEX_COSTS + "PREPARE probe AS " + store.SQL["rate_limited_due"])
        try:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe")
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE probe")
    scans = [n for n in support.plan_nodes(plan) if n.get("Relation Name") == JOBS and n["Actual Loops"]]
    assert {n.get("Index Name") for n in scans} == {"scheduledjob_pending_kind_idx"}
    assert max(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in scans) < 10


def test_the_claims_settings_are_given_back_after_an_error_outside_the_database(run_sql, monkeypatch):
    """A claim whose statement ran but whose rows failed to be read back (here an error raised after it)
    leaves the caller's transaction usable: its settings are set back before the error goes on. The
    loop's rate_limited_due in a caller's transaction gives them back too."""
    api.schedule_many("demo.record", [{}] * 3, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 minute'")
    shown = "SELECT current_setting('jit'), current_setting('enable_sort'), current_setting('random_page_cost')"
    (before,) = run_sql(shown)
    fetch_all = store.SQL.fetch_all

    def read_then_fail(*args: Any, **kwargs: Any) -> Any:
        fetch_all(*args, **kwargs)
        raise RuntimeError("the rows could not be read back")

    with transaction.atomic():
        monkeypatch.setattr(store.SQL, "fetch_all", read_then_fail)
        with pytest.raises(RuntimeError):
            store.claim_due_jobs(3)
        monkeypatch.undo()
        assert run_sql(shown) == [before]
        api.set_rate("demo.record", "5/s")
        assert store.rate_limited_due() is None  # the three rows are claimed
        assert run_sql(shown) == [before]
        transaction.set_rollback(True)
