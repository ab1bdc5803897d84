"""The control loop's claim in its own dedicated session: prepared once there, planned once (real PostgreSQL).

The leader claims on its leadership session (direct, never pooled), where the claim is a prepared
statement with a generic plan instead of being planned on every claim (``store.claim_due_jobs``,
``db.run_prepared``). These tests check that it is prepared once per session and planned generic,
that it claims what the Django-connection claim claims (caps and rate windows included), and that
a claim that fails leaves the session usable, outside any transaction, with its statement prepared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from django.db import connection

from scheduling import api, registry
from scheduling.core import db, locks
from scheduling.due_at import claim, control, store
from scheduling.models import ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_replan_within_a_test(monkeypatch):
    # the tests count plans: a statement prepared again after db.REPLAN_SECONDS or a slow run (a stall
    # of a loaded machine) would start its count again
    monkeypatch.setattr(db, "REPLAN_SECONDS", 3600.0)
    monkeypatch.setattr(db, "REPLAN_AFTER_SLOW_SECONDS", 3600.0)


@pytest.fixture
def session() -> Iterator[Any]:
    conn = locks.dedicated_connection("timekeeper-test-claim-session")
    yield conn
    conn.close()


def _plans(session: Any) -> dict[str, tuple[int, int]]:
    """The session's prepared statements: {name: (generic plans, custom plans)}."""
    with session.cursor() as cur:
        cur.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements")
        return {name: (generic, custom) for name, generic, custom in cur.fetchall()}


def _claim(session: Any, limit: int = 10) -> list[store.Claim]:
    return store.claim_due_jobs(
        limit, batch_sizes=claim.batch_sizes(), kind_queues=claim.kind_queues(), session=session
    )


def test_a_claim_in_a_session_is_prepared_once_and_planned_once_for_every_claim(session):
    api.schedule_many("demo.noop", [{}] * 3, delay=0)
    first = _claim(session)
    api.schedule_many("demo.noop", [{}] * 2, delay=0)
    second = _claim(session)
    assert (len(first), len(second)) == (3, 2)
    # committed by the session's own transaction: Django's connection sees the claims
    assert ScheduledJob.objects.filter(state="claimed").count() == 5
    assert _plans(session) == {"claim_due_jobs_without_held": (2, 0)}, "prepared once, a generic plan each time"
    assert session.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE


def test_a_claim_in_a_session_holds_a_cap_and_counts_a_rate_window(session, run_sql):
    api.set_max_running("demo.noop", 2)
    api.set_rate("demo.record", registry.Rate(3, per_seconds=3600))
    api.schedule_many("demo.noop", [{}] * 5, delay=0)
    api.schedule_many("demo.record", [{}] * 5, delay=0)
    claim.sync_rates(force=True)
    claims = _claim(session, limit=50)
    assert sorted(c.kind for c in claims) == ["demo.noop"] * 2 + ["demo.record"] * 3
    assert _plans(session) == {"claim_due_jobs": (1, 0)}, "the statement with the capped kinds' branches"
    assert _claim(session, limit=50) == [], "the cap is full and the window spent"
    [(window,)] = run_sql("SELECT coalesce(sum(n), 0) FROM scheduling_kindrate, unnest(starts) AS n")
    assert window == 3


def test_a_failed_claim_in_a_session_rolls_back_and_leaves_it_usable(session):
    api.schedule_many("demo.noop", [{}] * 3, delay=0)
    params = store.claim_params(10, batch_sizes=claim.batch_sizes(), kind_queues=claim.kind_queues())
    assert len(store._claim_in_session(session, params)) == 3
    api.schedule_many("demo.noop", [{}] * 2, delay=0)
    with pytest.raises(psycopg2.errors.InvalidRowCountInLimitClause):
        store._claim_in_session(session, {**params, "limit": -1})
    assert session.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert ScheduledJob.objects.filter(state="pending").count() == 2, "nothing of the failed claim stayed"
    assert len(store._claim_in_session(session, params)) == 2
    assert _plans(session) == {"claim_due_jobs_without_held": (1, 0)}, "after a failure: prepared again"


def test_a_lock_wait_past_the_sessions_limit_rolls_back_and_leaves_the_session_usable(run_sql):
    """A claim whose first statement fails (here: the control rows' lock, held by a migration-like
    ACCESS EXCLUSIVE lock, past the session's lock_timeout) rolls back: the session stays usable,
    as the lead's check of its session needs it to."""
    api.schedule_many("demo.noop", [{}] * 2, delay=0)
    bounded = locks.dedicated_connection("timekeeper-test-claim-session-bounded", lock_timeout_ms=200)
    holder = locks.dedicated_connection("timekeeper-test-lock-holder")
    try:
        with holder.cursor() as cur:
            cur.execute("BEGIN; LOCK TABLE scheduling_kindcontrol IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg2.errors.LockNotAvailable):
            _claim(bounded)
        assert bounded.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        with bounded.cursor() as cur:
            cur.execute("SELECT 1")
        with holder.cursor() as cur:
            cur.execute("ROLLBACK")
        assert len(_claim(bounded)) == 2
    finally:
        holder.close()
        bounded.close()


def test_a_statement_the_session_no_longer_holds_fails_one_claim_then_is_prepared_again(session):
    """The session and the list of what it holds may disagree (a statement deallocated, a pooler's other
    server session, a plan a migration made stale): one claim fails, the next prepares again and claims."""
    api.schedule_many("demo.noop", [{}] * 3, delay=0)
    assert len(_claim(session, limit=1)) == 1
    with session.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # behind the claim's back
    with pytest.raises(psycopg2.errors.InvalidSqlStatementName):
        _claim(session, limit=1)
    assert session.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert len(_claim(session, limit=1)) == 1
    assert len(_claim(session, limit=1)) == 1
    assert _plans(session) == {"claim_due_jobs_without_held": (2, 0)}, "prepared again once, then reused"


def test_a_new_session_prepares_the_claim_again(session):
    api.schedule_many("demo.noop", [{}] * 2, delay=0)
    assert len(_claim(session, limit=1)) == 1
    other = locks.dedicated_connection("timekeeper-test-claim-session-2")
    try:
        assert _plans(other) == {}
        assert len(_claim(other, limit=1)) == 1
        assert _plans(other) == {"claim_due_jobs_without_held": (1, 0)}
    finally:
        other.close()


def test_the_leader_claims_in_its_leadership_session():
    api.schedule_many("demo.noop", [{}] * 3, delay=0)
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        loop.turn()
        assert ScheduledJob.objects.filter(state="claimed").count() == 3
        # the claim, and the reads that say how long the loop sleeps, are prepared in the lead's session
        assert set(_plans(loop.leadership.connection)) == {
            "claim_due_jobs_without_held",
            "rate_limited_due",
            "next_due_times",
        }
        with loop.leadership.connection.cursor() as cur:
            cur.execute("SHOW lock_timeout")
            assert cur.fetchone()[0] == f"{control.LOCK_WAIT_SECONDS}s", "the lead's session bounds its lock waits"
    finally:
        loop.leadership.resign()
        connection.close()


def test_the_loops_reads_in_a_session_answer_as_on_djangos_connection_and_are_prepared_once(session):
    api.schedule_many("demo.record", [{}] * 2, delay=0)
    api.schedule("demo.noop", {}, delay=30)
    assert store.rate_limited_due(session=session) is None
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    assert store.rate_limited_due(session=session) == store.rate_limited_due() == pytest.approx(0.2)
    [upcoming] = store.next_due_times(60.0, 5, session=session)
    assert upcoming.at == store.next_due_times(60.0, 5)[0].at
    assert 0 < upcoming.in_seconds <= 30
    assert _plans(session) == {"rate_limited_due": (2, 0), "next_due_times": (1, 0)}


def test_positional_numbers_each_parameter_once_in_order_of_first_use():
    sql, names = db.positional("SELECT %(b)s, %(a)s, %(b)s::int, '100%%'")
    assert (sql, names) == ("SELECT $1, $2, $1::int, '100%'", ("b", "a"))


def _cached_plan(session: Any, statement: str) -> str:
    """The plan the session holds for its prepared ``statement`` (its generic plan, as EXECUTE runs it)."""
    with session.cursor() as cur:
        cur.execute(f"{db.GENERIC_PLAN}EXPLAIN (COSTS OFF) EXECUTE {statement}")
        return "\n".join(row[0] for row in cur.fetchall())


def test_a_plan_made_on_an_empty_table_is_made_again_after_replan_seconds(session, monkeypatch, run_sql, request):
    # PostgreSQL makes a prepared statement's generic plan again only when something invalidates it
    # (an analyze, a vacuum, DDL), never because its table grew. A leader that prepared its reads on
    # an empty table kept, with autovacuum off, a plan that read the kind's rows through (kind,
    # state) on each of rate_limited_due's ten probes: 13 ms a turn in bench flow. Prepared again,
    # the plan is made for the table as it is. (Since its probes were written so that only the kind's
    # index gives their order, kinds.sql, even the empty table's plan is one probe per priority.)
    # A table never analyzed, as on a new deploy: no rows, sizes unknown, no column statistics (those
    # earlier tests left would make the planner's pick on an empty table depend on the tests' order).
    run_sql("TRUNCATE scheduling_jobattempt, scheduling_scheduledjob CASCADE")
    run_sql("DELETE FROM pg_statistic WHERE starelid = 'scheduling_scheduledjob'::regclass")
    request.addfinalizer(lambda: run_sql("ANALYZE scheduling_scheduledjob"))  # statistics again, for later tests
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    assert store.rate_limited_due(session=session) is None  # prepared and planned on the empty table
    stale = _cached_plan(session, "rate_limited_due")
    api.schedule_many("demo.record", [{}] * 4000, delay=0)
    assert store.rate_limited_due(session=session) == pytest.approx(0.2)
    assert _cached_plan(session, "rate_limited_due") == stale, "within REPLAN_SECONDS the plan is kept"
    assert stale.count("scheduledjob_pending_kind_idx") == 10, "one probe per priority, planned on an empty table"
    prepared = _prepared_at(session)

    monkeypatch.setattr(db, "REPLAN_SECONDS", 0.0)
    assert store.rate_limited_due(session=session) == pytest.approx(0.2)
    fresh = _cached_plan(session, "rate_limited_due")
    assert "scheduledjob_kind_state_idx" not in fresh
    # priorities 9..1 hold no row: each is one probe of its (kind, priority) range, never a read of the
    # kind's 4,000 rows (priority 0, which all of them have, may be found by whichever scan stops first)
    assert fresh.count("scheduledjob_pending_kind_idx") >= 9
    assert _prepared_at(session) > prepared, "prepared again"


def test_a_slow_run_has_its_statement_prepared_again_at_its_next_run(session, monkeypatch, run_sql, request):
    """A stale plan is kept no longer than a slow run: the next run prepares the statement again (at most
    once every REPLAN_AFTER_SLOW_SECONDS), not only once REPLAN_SECONDS have passed."""
    run_sql("TRUNCATE scheduling_jobattempt, scheduling_scheduledjob CASCADE")
    run_sql("DELETE FROM pg_statistic WHERE starelid = 'scheduling_scheduledjob'::regclass")
    request.addfinalizer(lambda: run_sql("ANALYZE scheduling_scheduledjob"))
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    monkeypatch.setattr(db, "REPLAN_SECONDS", 3600.0)
    monkeypatch.setattr(db, "REPLAN_AFTER_SLOW_SECONDS", 0.0)
    monkeypatch.setattr(db, "SLOW_RUN_SECONDS", 3600.0)  # no run is slow
    assert store.rate_limited_due(session=session) is None  # prepared and planned on the empty table
    stale, prepared = _cached_plan(session, "rate_limited_due"), _prepared_at(session)
    api.schedule_many("demo.record", [{}] * 4000, delay=0)
    assert store.rate_limited_due(session=session) == pytest.approx(0.2)
    assert (_cached_plan(session, "rate_limited_due"), _prepared_at(session)) == (stale, prepared), "kept"

    monkeypatch.setattr(db, "SLOW_RUN_SECONDS", 0.0)  # every run is slow
    assert store.rate_limited_due(session=session) == pytest.approx(0.2)  # slow: marked
    assert _prepared_at(session) == prepared, "a slow run is answered, not run again"
    monkeypatch.setattr(db, "REPLAN_AFTER_SLOW_SECONDS", 3600.0)  # from now on a plan this young is kept, slow or not
    assert store.rate_limited_due(session=session) == pytest.approx(0.2)  # the next run prepares again
    again = _prepared_at(session)
    assert again > prepared
    fresh = _cached_plan(session, "rate_limited_due")
    assert "scheduledjob_kind_state_idx" not in fresh
    assert fresh.count("scheduledjob_pending_kind_idx") >= 9
    for _ in range(3):
        assert store.rate_limited_due(session=session) == pytest.approx(0.2)
    assert _prepared_at(session) == again, "slow runs of a young plan keep it"


def _prepared_at(session: Any) -> Any:
    with session.cursor() as cur:
        cur.execute("SELECT prepare_time FROM pg_prepared_statements WHERE name = 'rate_limited_due'")
        return cur.fetchone()[0]
