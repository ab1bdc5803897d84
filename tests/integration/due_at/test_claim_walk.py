"""The claim's two walks of the other kinds' due rows (real PostgreSQL).

By due time (priority by priority, the (priority, due_at) index) unless most of the first due rows
are of kinds the walk leaves out
(paused, capped, rate-limited, of a closed queue): then kind by kind (the (kind, priority, due_at)
index), which never reads those rows. Which walk ran is read off EXPLAIN ANALYZE; both must claim
the same rows in the same order.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from scheduling import api
from scheduling.core import db
from scheduling.due_at import claim, store
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 300  # due rows of a paused kind, older than every other due row
_nodes = support.plan_nodes


def _params(limit: int, **overrides: Any) -> dict[str, Any]:
    params = store.claim_params(limit, batch_sizes=claim.batch_sizes(), kind_queues=claim.kind_queues())
    return {**params, **overrides}


def _claim(params: dict[str, Any], *, explain: bool = False) -> Any:
    """The claim's ids in order (or its EXPLAIN ANALYZE plan), in a transaction rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(db.NO_JIT + store.INDEX_COSTS + store.SQL["lock_capped_kinds"], params)
        name = "claim_due_jobs" if cursor.fetchone()[0] else "claim_due_jobs_without_held"
        cursor.execute(("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " if explain else "") + store.SQL[name], params)
        result = cursor.fetchone()[0] if explain else [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return result


def _cte(plan: Any, name: str) -> dict[str, Any]:
    [node] = [n for n in _nodes(plan) if n.get("Subplan Name") == f"CTE {name}"]
    return node


def _walk_rows(plan: Any) -> dict[str, int]:
    """Rows each walk returned: the two branches of the walk CTE's Append, by due time first (claim.sql)."""
    by_due, by_kind = _cte(plan, "walk")["Plans"]
    return {"by_due": by_due["Actual Rows"], "by_kind": by_kind["Actual Rows"]}


def _passed_over(plan: Any) -> int:
    """Rows of the jobs table the walks read through an index and dropped by a filter."""
    return sum(
        n.get("Rows Removed by Filter", 0) * max(1, n.get("Actual Loops", 1))
        for name in ("walk", "kind_candidates")
        for n in _nodes(_cte(plan, name))
        if n.get("Relation Name") == "scheduling_scheduledjob" and n["Node Type"] == "Index Scan"
    )


def _mixed_due(run_sql) -> list[int]:
    """A paused kind's backlog at the head of the due_at index, then five rows of other kinds: a
    priority-5 one, two of a kind this process never registered, two of a registered one."""
    api.schedule_many("demo.record", [{}] * BACKLOG, delay=60)
    support.make_due(ago="1 hour")
    api.pause("demo.record")
    others = api.schedule_many("demo.noop", [{}] * 5, delay=60)
    run_sql("UPDATE scheduling_scheduledjob SET kind = 'test.gone' WHERE id = ANY(%s)", [others[1:3]])
    run_sql("UPDATE scheduling_scheduledjob SET priority = 5 WHERE id = %s", [others[4]])
    for n, job_id in enumerate(others):
        support.make_due(job_id, ago=f"{10 - n} minutes")
    return others


def test_when_left_out_kinds_fill_the_head_the_walk_goes_kind_by_kind_and_reads_none_of_them(run_sql):
    others = _mixed_due(run_sql)
    plan = _claim(_params(50), explain=True)
    assert _walk_rows(plan) == {"by_due": 0, "by_kind": 5}
    assert _passed_over(plan) < BACKLOG, "the paused kind's rows are not read past"
    assert _claim(_params(50)) == [others[4], *others[:4]], "priority first, then due time; the unknown kind too"


def test_both_walks_claim_the_same_rows_in_the_same_order(run_sql):
    _mixed_due(run_sql)
    more = api.schedule_many("demo.noop", [{}] * 4, delay=60, priority=2)
    for n, job_id in enumerate(more):  # distinct due times: a tie may be cut either way by either walk
        support.make_due(job_id, ago=f"{30 - n} seconds")
    for limit in (3, 6, 50):
        by_kind, by_due = _params(limit), _params(limit, walk_head=0)  # no head read: by due time
        assert _walk_rows(_claim(by_due, explain=True))["by_kind"] == 0
        assert _walk_rows(_claim(by_kind, explain=True))["by_due"] == 0
        assert _claim(by_kind) == _claim(by_due)


def test_a_few_left_out_rows_at_the_head_keep_the_walk_by_due_time(run_sql):
    api.schedule_many("demo.record", [{}] * 10, delay=60)
    support.make_due(ago="1 hour")
    api.pause("demo.record")
    api.schedule_many("demo.noop", [{}] * 100, delay=60)
    support.make_due(state="pending", ago="1 minute")
    support.make_due(
        [j for (j,) in run_sql("SELECT id FROM scheduling_scheduledjob WHERE kind = 'demo.record'")], ago="1 hour"
    )
    plan = _claim(_params(20), explain=True)
    assert _walk_rows(plan) == {"by_due": 20, "by_kind": 0}


def test_with_no_kind_left_out_the_head_is_not_read(run_sql):
    api.schedule_many("demo.noop", [{}] * 5, delay=0)
    plan = _claim(_params(50), explain=True)
    assert _walk_rows(plan) == {"by_due": 5, "by_kind": 0}
    head_scans = [n for n in _nodes(_cte(plan, "head")) if n.get("Relation Name") == "scheduling_scheduledjob"]
    assert head_scans
    assert all(n["Actual Loops"] == 0 for n in head_scans), "the head's rows are never read"
    api.pause("demo.record")
    head_scans = _nodes(_cte(_claim(_params(50), explain=True), "head"))
    assert any(n.get("Relation Name") == "scheduling_scheduledjob" and n["Actual Loops"] == 1 for n in head_scans)


def test_the_walk_kind_by_kind_reads_no_row_not_yet_due_and_locks_only_what_it_claims(run_sql):
    """Each kind is read one priority at a time, bounded by now() in its (kind, priority, due_at) range: a
    kind's rows not yet due (here 4,000, at two priorities) are never visited; the rows read are locked
    after the cut, by primary key, so no more are locked than the claim takes."""
    others = _mixed_due(run_sql)
    api.schedule_many("demo.noop", [{}] * 2000, delay=3600, priority=5)
    api.schedule_many("demo.noop", [{}] * 2000, delay=3600)
    plan = _claim(_params(3), explain=True)
    assert _walk_rows(plan) == {"by_due": 0, "by_kind": 3}
    reads = [n for n in _nodes(_cte(plan, "kind_candidates")) if n.get("Relation Name") == "scheduling_scheduledjob"]
    assert reads
    for scan in reads:
        assert scan.get("Index Name") == "scheduledjob_pending_kind_idx", scan.get("Index Name")
        assert "priority =" in scan["Index Cond"]
        assert "due_at <= now()" in scan["Index Cond"]
    [lock] = [n for n in _nodes(_cte(plan, "walk")) if n["Node Type"] == "LockRows" and n["Actual Loops"] == 1]
    assert lock["Actual Rows"] == 3
    assert _claim(_params(3)) == [others[4], others[0], others[1]]


DUE_ROWS = 6000  # due rows of the common priority in the test of the statistics


def _insert_jobs(run_sql, n: int, *, state: str, due: str, priority: int = 0) -> None:
    """``n`` rows due at ``due`` from now, 1 ms apart."""
    run_sql(
        "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, finished_at, lease_seconds, attempts,"
        " max_attempts, last_error, claimed_by, created_at, updated_at, priority, run_alone, atomic, former_owner)"
        " SELECT 'demo.record', '{}', now() + %s::interval + g * interval '1 ms', %s, CASE WHEN %s = 'done' THEN now()"
        " END, 60, 0, 3, '', '', now(), now(), %s, false, true, '' FROM generate_series(1, %s) AS g",
        [due, state, state, priority, n],
    )


def _generic_claim_plan(params: dict[str, Any]) -> Any:
    """EXPLAIN ANALYZE of the claim's generic plan (the one the leader's prepared claim runs), rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(db.NO_JIT + store.INDEX_COSTS + db.GENERIC_PLAN + store.SQL["lock_capped_kinds"], params)
        name = "claim_due_jobs" if cursor.fetchone()[0] else "claim_due_jobs_without_held"
        text, names = db.positional(store.SQL[name])
        declared = ", ".join(store.CLAIM_PARAM_TYPES[n] for n in names)
        cursor.execute(f"PREPARE walk_test ({declared}) AS {text}")
        try:
            cursor.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE walk_test ({', '.join(['%s'] * len(names))})",
                [params[n] for n in names],
            )
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE walk_test")
        transaction.set_rollback(True)
    return plan


@pytest.mark.parametrize("statistics", ["a quiet table's", "a spike's"])
@pytest.mark.parametrize("plan_kind", ["generic", "custom"])
@pytest.mark.parametrize("branch", ["walk", "capped"])
def test_each_priority_is_one_descent_of_its_index_whatever_the_statistics_say(run_sql, statistics, plan_kind, branch):
    """The walk (and a capped kind's branch) reads only the rows it takes, through the (priority, due_at)
    index (the capped kind's: its range of the (kind, priority, due_at) one), on the statistics a spike
    meets: a quiet table's (analyzed with no pending row: the planner sees every plan as free), or the
    spike's own (one kind, one priority). Seen before the branches were written for it: on the first,
    each empty priority read every due row through the due_at index; on the second, the common
    priority's branch read and sorted them all. Rows not yet due (here 20,000 of a priority with three
    due rows) are never read: each branch's scan stops at now() (seen when the branches said
    ``priority >= p AND (priority, due_at) <= (p, now())``: the scan went on to the priority's end, 100
    index pages here, and EXPLAIN counts none of those rows as removed)."""
    if statistics == "a quiet table's":
        _insert_jobs(run_sql, DUE_ROWS, state="done", due="-1 hour")
        run_sql("VACUUM ANALYZE scheduling_scheduledjob")
        run_sql("DELETE FROM scheduling_scheduledjob")
    _insert_jobs(run_sql, DUE_ROWS, state="pending", due="-1 minute")
    _insert_jobs(run_sql, 3, state="pending", due="-2 minutes", priority=3)
    _insert_jobs(run_sql, 20000, state="pending", due="1 hour", priority=3)
    if statistics == "a spike's":
        run_sql("VACUUM ANALYZE scheduling_scheduledjob")
    if branch == "capped":
        api.set_max_running("demo.record", 1000)
    index = {"walk": "scheduledjob_pending_prio_idx", "capped": "scheduledjob_pending_kind_idx"}[branch]
    params = _params(100, walk_head=0)
    # once first (rolled back): the pages the plan counts are then the index's, not the catalog's a
    # backend reads the first time it runs such a statement (seen: 215 "pages" in the first branch)
    _claim(params)
    plan = _generic_claim_plan(params) if plan_kind == "generic" else _claim(params, explain=True)
    scans = [n for n in _nodes(_cte(plan, branch)) if n.get("Relation Name") == "scheduling_scheduledjob"]
    assert {n.get("Index Name") for n in scans if n["Actual Loops"]} == {index}
    assert all(n["Node Type"] == "Index Scan" and "now()" in n["Index Cond"] for n in scans if n["Actual Loops"])
    assert sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans) == 100, "only the rows taken"
    assert not [n for n in _nodes(_cte(plan, branch)) if n["Node Type"] == "Sort"]
    pages = [n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in scans if n["Actual Loops"]]
    assert max(pages) < 20, f"pages read by each priority's scan: {pages}"
    claimed = _claim(params)
    assert len(claimed) == 100
    assert run_sql(
        "SELECT count(*) FILTER (WHERE priority = 3) FROM scheduling_scheduledjob WHERE id = ANY(%s)", [claimed]
    ) == [(3,)]
