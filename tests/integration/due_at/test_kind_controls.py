"""Operating the due_at engine: priorities, pausing a kind and capping how many of it run (real PostgreSQL)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from scheduling import api, exceptions
from scheduling.due_at import runner, store
from scheduling.models import JobState, KindControl, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


def _locked_scans(node: object) -> list[str]:
    """The index (or "Seq Scan") under every LockRows node of an EXPLAIN (FORMAT JSON) plan."""
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("Node Type") == "LockRows":
            (scan,) = [child for child in node["Plans"] if child.get("Parent Relationship") == "Outer"]
            while scan["Node Type"] == "Result":  # a one-time filter (claim.sql's choice of walk) above the scan
                (scan,) = [child for child in scan["Plans"] if child.get("Parent Relationship") == "Outer"]
            found.append(scan.get("Index Name", scan["Node Type"]))
        for value in node.values():
            found.extend(_locked_scans(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_locked_scans(value))
    return found


def test_a_higher_priority_is_claimed_first_among_due_jobs(run_sql):
    """Three low-priority jobs due earlier, two high ones due later: a claim of two takes the high ones."""
    low = api.schedule_many("demo.record", [{}, {}, {}], delay=60)
    support.make_due(ago="1 hour")
    high = api.schedule_many("demo.record", [{}, {}], delay=60, priority=7)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 minute' WHERE priority = 7")
    claimed = store.claim_due_jobs(2)
    assert sorted(c.id for c in claimed) == sorted(high)
    rest = store.claim_due_jobs(10)
    assert sorted(c.id for c in rest) == sorted(low)


def test_a_kind_default_priority_and_its_bounds(run_sql):
    """schedule() takes the kind's default priority; outside 0-9 is InvalidSchedule and nothing is stored."""
    job = api.schedule("demo.record", {}, delay=60)
    assert ScheduledJob.objects.get(pk=job.id).priority == 0
    for bad in (-1, 10, 1.5, True, "3"):
        with pytest.raises(exceptions.InvalidSchedule):
            api.schedule("demo.record", {}, delay=60, priority=bad)
    assert ScheduledJob.objects.count() == 1


def test_the_claim_is_one_indexed_statement_walking_priorities(run_sql):
    """With a backlog, EXPLAIN of the claim reads a partial index per priority (and capped kinds'), not the table."""
    api.schedule_many("demo.record", [{}] * 3000, delay=60)
    api.schedule_many("demo.record", [{}] * 20, delay=60, priority=5)
    api.schedule_many("demo.noop", [{}] * 1000, delay=60)  # a capped kind with a backlog of its own
    support.make_due(ago="1 hour")
    api.schedule_many("demo.record", [{}] * 3000, delay=3600)  # and rows not due yet
    api.set_max_running("demo.noop", 5)
    run_sql("ANALYZE scheduling_scheduledjob")
    with transaction.atomic(), connection.cursor() as cursor:  # planned as every claim is (store.INDEX_COSTS)
        cursor.execute(
            store.INDEX_COSTS + "EXPLAIN (FORMAT JSON) " + store.SQL["claim_due_jobs"], store.claim_params(500)
        )
        plan = json.dumps(cursor.fetchone()[0])
    indexes = set(re.findall(r'"Index Name": "([a-z_]+)"', plan))
    assert "scheduledjob_pending_prio_idx" in indexes, indexes
    locked = _locked_scans(json.loads(plan))
    # one locking range scan per priority for the walk by due time and for the capped kinds, and the
    # walk kind by kind's lock of the rows it read, by primary key (which walk runs is decided when
    # the claim runs: claim.sql, "head")
    assert len(locked) == 21, "one locking range scan per priority, for the walk and for the capped kinds"
    partial = {"scheduledjob_pending_prio_idx", "scheduledjob_pending_due_idx", "scheduledjob_pending_kind_idx"}
    assert set(locked) <= partial | {"scheduling_scheduledjob_pkey"}, locked
    assert locked.count("scheduling_scheduledjob_pkey") == 1, locked
    assert "scheduledjob_pending_kind_idx" in locked, "the capped kind's common priority: its own index range"
    # each priority through its own index whatever the statistics (store.INDEX_COSTS, claim.sql)
    assert locked.count("scheduledjob_pending_prio_idx") == 10, locked
    assert locked.count("scheduledjob_pending_kind_idx") == 10, locked


def test_a_paused_kind_stays_pending_counts_as_paused_and_runs_on_resume(run_sql):
    """Paused: due jobs of the kind are not claimed and count as paused, not backlog; resumed, they are claimed."""
    paused_jobs = api.schedule_many("demo.record", [{}, {}], delay=60)
    other = api.schedule("demo.noop", {}, delay=60)
    support.make_due(state="pending")
    api.pause("demo.record")
    claimed = store.claim_due_jobs(10)
    assert [c.id for c in claimed] == [other.id]
    status = api.status(include_broker=False)
    assert (status["backlog"], status["paused"]) == (0, 2)
    api.resume("demo.record")
    assert sorted(c.id for c in store.claim_due_jobs(10)) == sorted(paused_jobs)
    assert KindControl.objects.get(kind="demo.record").paused is False


def test_a_capped_kind_has_at_most_its_cap_claimed_or_running(run_sql):
    """max_running=2 with five due: two claimed; when one finishes, one more; the rest stay pending."""
    ids = api.schedule_many("demo.record", [{}] * 5, delay=60)
    support.make_due(state="pending")
    api.set_max_running("demo.record", 2)
    first = store.claim_due_jobs(10)
    assert len(first) == 2
    assert store.claim_due_jobs(10) == [], "the cap is reached: nothing more is claimed"
    runner.run_batch([(first[0].id, first[0].token)])
    second = store.claim_due_jobs(10)
    assert len(second) == 1
    assert ScheduledJob.objects.filter(pk__in=ids, state=JobState.PENDING).count() == 2
    api.set_max_running("demo.record", None)
    assert len(store.claim_due_jobs(10)) == 2


def test_controls_refuse_unknown_kinds_and_bad_caps():
    """Pausing an unknown kind is UnknownJobKind; a cap of 0 or a fraction is InvalidSchedule; nothing stored."""
    with pytest.raises(exceptions.UnknownJobKind):
        api.pause("no.such.kind")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(exceptions.InvalidSchedule):
            api.set_max_running("demo.record", bad)
    assert not KindControl.objects.exists()


def _stagger_due(run_sql, ids: list[int]) -> None:
    """Make ``ids`` due in their order, one millisecond apart, all in the past (FIFO is then id order)."""
    run_sql(
        "UPDATE scheduling_scheduledjob AS j SET due_at = now() - interval '1 hour' + t.n * interval '1 ms'"
        " FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(id, n) WHERE j.id = t.id",
        [ids],
    )


def test_a_capped_kind_with_a_backlog_leaves_the_claim_to_other_kinds(run_sql):
    """Cap 3 on a kind with 1,000 due rows, then 20 of another kind: one claim takes 3 of the first and all 20."""
    capped = api.schedule_many("demo.record", [{}] * 1000, delay=60)
    other = api.schedule_many("demo.noop", [{}] * 20, delay=60)
    _stagger_due(run_sql, capped + other)  # the capped kind's rows are all due first
    api.set_max_running("demo.record", 3)
    claimed = store.claim_due_jobs(50)
    by_kind = {kind: sorted(c.id for c in claimed if c.kind == kind) for kind in ("demo.record", "demo.noop")}
    assert by_kind["demo.record"] == capped[:3], "the cap's room, the most urgent rows of the kind"
    assert by_kind["demo.noop"] == other, "the claim filled the rest with the other kind instead of coming back short"
    assert store.claim_due_jobs(50) == [], "the capped kind is full and nothing else is due"
    assert ScheduledJob.objects.filter(kind="demo.record", state=JobState.CLAIMED).count() == 3


def test_a_capped_kind_of_higher_priority_still_goes_first(run_sql):
    """A capped kind's rows of priority 9 come before other kinds' older priority-0 rows in the claim's order."""
    low = api.schedule_many("demo.noop", [{}] * 5, delay=60)
    high = api.schedule_many("demo.record", [{}] * 5, delay=60, priority=9)
    _stagger_due(run_sql, low + high)
    api.set_max_running("demo.record", 2)
    claimed = store.claim_due_jobs(3)
    assert [c.id for c in claimed] == [*high[:2], low[0]], "urgency order: the capped kind's room, then the rest"


def test_two_overlapping_claims_never_exceed_a_cap(run_sql, raw_connect):
    """Cap 3: a claim beside an open one skips the capped kind (no wait); one after its commit counts its claims."""
    api.schedule_many("demo.record", [{}] * 20, delay=60)
    support.make_due(state="pending")
    api.set_max_running("demo.record", 3)
    sql = store.claim_statement()
    params = store.claim_params(10)
    first, second = raw_connect(), raw_connect()
    barrier = threading.Barrier(2)
    got: dict[str, int] = {}

    def claim(name: str, conn: Any) -> None:
        barrier.wait()
        if name == "second":
            first_claimed.wait(10)
        with conn.cursor() as cur:
            cur.execute(sql, params)
            got[name] = len(cur.fetchall())
        if name == "first":
            first_claimed.set()
            commit_first.wait(10)
        conn.commit()
        if name == "second":
            second_done.set()

    first_claimed, commit_first, second_done = threading.Event(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=claim, args=args) for args in (("first", first), ("second", second))]
    for thread in threads:
        thread.start()
    assert first_claimed.wait(10)
    # The second claim runs while the first is open: it skips the capped kind instead of waiting.
    finished_while_open = second_done.wait(10)
    commit_first.set()
    for thread in threads:
        thread.join(10)
    assert finished_while_open, "the second claim waited for the first to commit"
    assert got["first"] == 3
    assert got["second"] == 0, "the second claim took room while the first held the kind's control row"
    with second.cursor() as cur:
        cur.execute(sql, params)
        assert cur.fetchall() == [], "a claim after the first's commit counted its claims"
    second.commit()
    assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 3


def test_strict_priorities_let_lower_priorities_wait_while_higher_ones_fill_the_claim(run_sql):
    """The starvation rule documented: older priority-0 rows wait while priority-5 rows fill each claim, then go."""
    old = api.schedule_many("demo.noop", [{}] * 3, delay=60)
    urgent = api.schedule_many("demo.noop", [{}] * 8, delay=60, priority=5)
    _stagger_due(run_sql, old + urgent)  # the priority-0 rows have waited longest
    first, second, third = (store.claim_due_jobs(4) for _ in range(3))
    assert [c.id for c in first] == urgent[:4]
    assert [c.id for c in second] == urgent[4:], "no aging: an hour of waiting does not lift priority 0"
    assert [c.id for c in third] == old, "once no higher priority is due, the oldest go first"
    # A cap bounds a kind's share: capped, the urgent kind leaves room for the others.
    api.schedule_many("demo.record", [{}] * 8, delay=60, priority=5)
    later_old = api.schedule_many("demo.noop", [{}] * 3, delay=60)
    support.make_due(state="pending")
    api.set_max_running("demo.record", 2)
    claimed = store.claim_due_jobs(4)
    assert sorted(c.kind for c in claimed) == ["demo.noop", "demo.noop", "demo.record", "demo.record"]
    assert {c.id for c in claimed if c.kind == "demo.noop"} <= set(later_old)
