"""Operating the due_at engine: priorities, pausing a kind and capping how many of it run (real PostgreSQL)."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection

from scheduling import api, exceptions
from scheduling.core import store
from scheduling.jobs import runner
from scheduling.models import JobState, KindControl, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)


def _due_now(run_sql) -> None:
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 ms' WHERE state = 'pending'")


def _locked_scans(node: object) -> list[str]:
    """The index (or "Seq Scan") under every LockRows node of an EXPLAIN (FORMAT JSON) plan."""
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("Node Type") == "LockRows":
            (scan,) = node["Plans"]
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
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 hour'")
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
    """With a backlog, EXPLAIN of the claim reads the partial (priority, due_at) index per priority, never the table."""
    api.schedule_many("demo.record", [{}] * 3000, delay=60)
    api.schedule_many("demo.record", [{}] * 20, delay=60, priority=5)
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 hour'")
    api.schedule_many("demo.record", [{}] * 3000, delay=3600)  # and rows not due yet
    run_sql("ANALYZE scheduling_scheduledjob")
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + store.queries()["claim_due_jobs"], {"limit": 500})
        plan = json.dumps(cursor.fetchone()[0])
    indexes = set(re.findall(r'"Index Name": "([a-z_]+)"', plan))
    assert "scheduledjob_pending_prio_idx" in indexes, indexes
    locked = _locked_scans(json.loads(plan))
    assert len(locked) == 10, "one locking range scan per priority"
    assert set(locked) <= {"scheduledjob_pending_prio_idx", "scheduledjob_pending_due_idx"}, locked


def test_a_paused_kind_stays_pending_counts_as_paused_and_runs_on_resume(run_sql):
    """Paused: due jobs of the kind are not claimed and count as paused, not backlog; resumed, they are claimed."""
    paused_jobs = api.schedule_many("demo.record", [{}, {}], delay=60)
    other = api.schedule("demo.noop", {}, delay=60)
    _due_now(run_sql)
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
    _due_now(run_sql)
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
