"""Recurrences against real PostgreSQL: each API verb, the planner, and at-most-once occurrences under races."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, transaction

from scheduling import api, exceptions
from scheduling.core import options
from scheduling.due_at import store as jobs_store
from scheduling.models import JobState, Recurrence, RecurrenceState, ScheduledJob
from scheduling.recurring import api as recurring_api
from scheduling.recurring import planner
from scheduling.recurring import store as recurring_store
from tasks.models import Payment
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC


def db_now(run_sql: Any) -> dt.datetime:
    return run_sql("SELECT now()")[0][0]


def occurrences(recurrence_id: int) -> list[ScheduledJob]:
    return list(ScheduledJob.objects.filter(recurrence_id=recurrence_id).order_by("occurrence_at", "id"))


def pending(recurrence_id: int) -> list[ScheduledJob]:
    return [job for job in occurrences(recurrence_id) if job.state == JobState.PENDING]


def finish_current(run_sql: Any, ids: list[int], *, back: str = "1 day", state: str = "done") -> None:
    """Move each recurrence's latest occurrence into the past and end it, as a worker would have."""
    run_sql(
        "UPDATE scheduling_scheduledjob AS j SET state = %s, finished_at = now(),"
        " occurrence_at = occurrence_at - %s::interval, due_at = due_at - %s::interval"
        " FROM scheduling_recurrence AS r WHERE r.id = ANY(%s) AND j.id = r.current_job_id",
        [state, back, back, ids],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - %s::interval WHERE id = ANY(%s)", [back, ids])


def test_recur_creates_the_row_and_its_first_occurrence(run_sql):
    """recur() stores the recurrence and exactly one pending occurrence at the zone's next 09:00."""
    rec = api.recur("demo.noop", {"user": 1}, key="digest:1", cron="0 9 * * *", timezone="Asia/Tokyo")
    jobs = occurrences(rec.id)
    assert len(jobs) == 1
    assert jobs[0].state == JobState.PENDING
    job = jobs[0]
    assert job.kind == "demo.noop"
    assert job.payload == {"user": 1}
    assert job.occurrence_at == job.due_at == rec.current_at
    local = job.occurrence_at.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert (local.hour, local.minute) == (9, 0)
    assert job.occurrence_at > db_now(run_sql)
    assert rec.current_job_id == job.id
    assert rec.state == RecurrenceState.ACTIVE


def test_recur_rolls_back_with_the_caller():
    """recur() joins the caller's transaction: a rollback leaves neither recurrence nor occurrence."""

    def recur_then_fail() -> None:
        with transaction.atomic():
            api.recur("demo.noop", {}, key="k", every=60)
            raise RuntimeError

    with pytest.raises(RuntimeError):
        recur_then_fail()
    assert Recurrence.objects.count() == 0
    assert ScheduledJob.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"cron": "0 25 * * *"}, exceptions.InvalidCronExpression),
        ({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, exceptions.UnknownTimeZone),
        ({"cron": "0 9 * * *", "starts_at": dt.datetime(2030, 1, 1)}, exceptions.InvalidSchedule),
        (
            {
                "cron": "0 9 * * *",
                "starts_at": dt.datetime(2030, 2, 1, tzinfo=UTC),
                "ends_at": dt.datetime(2030, 1, 1, tzinfo=UTC),
            },
            exceptions.InvalidRecurrence,
        ),
        ({}, exceptions.InvalidRecurrence),
        ({"cron": "0 9 * * *", "every": 60}, exceptions.InvalidRecurrence),
        ({"cron": "0 9 * * *", "dst_gap": "later"}, exceptions.InvalidPolicy),
        ({"cron": "0 9 * * *", "missed": "run_all"}, exceptions.InvalidPolicy),
        ({"cron": "0 9 * * *", "on_conflict": "merge"}, exceptions.InvalidPolicy),
        ({"every": 1e12}, exceptions.InvalidRecurrence),  # past ten years: the planner's arithmetic overflows
        ({"every": float("inf")}, exceptions.InvalidRecurrence),
        ({"cron": "0 9 * * *", "ends_at": dt.datetime(9999, 12, 31, tzinfo=UTC)}, exceptions.InvalidSchedule),
        ({"cron": "0 9 * * *", "starts_at": dt.datetime(1, 1, 2, tzinfo=UTC)}, exceptions.InvalidSchedule),
    ],
)
def test_bad_input_raises_by_name_and_stores_nothing(kwargs, error):
    """Bad cron, unknown zone, naive datetime, ends before starts, bad policies: a named error, no row."""
    with pytest.raises(error):
        api.recur("demo.noop", {}, key="bad", **kwargs)
    assert Recurrence.objects.count() == 0
    assert ScheduledJob.objects.count() == 0


def test_a_stored_ends_at_past_the_window_does_not_block_a_payload_only_change(run_sql):
    """A stored ends_at 20 years ahead allows a payload-only change; passing such an ends_at is still refused."""
    rec = api.recur("demo.noop", {"v": 1}, key="long", cron="0 9 * * *")
    run_sql("UPDATE scheduling_recurrence SET ends_at = now() + interval '20 years' WHERE id = %s", [rec.id])
    stored_ends = Recurrence.objects.get(pk=rec.id).ends_at
    assert stored_ends is not None

    changed = api.change_recurrence(rec.id, payload={"v": 2})

    assert (changed.payload, changed.ends_at) == ({"v": 2}, stored_ends)
    with pytest.raises(exceptions.InvalidSchedule, match="ends_at"):
        api.change_recurrence(rec.id, ends_at=db_now(run_sql) + dt.timedelta(days=365 * 20))
    assert Recurrence.objects.get(pk=rec.id).ends_at == stored_ends, "the refused change stored nothing"


def test_unknown_kind_and_bad_payload_are_refused():
    """The kind and its payload schema are checked at recur() time."""
    with pytest.raises(exceptions.UnknownJobKind):
        api.recur("no.such.kind", {}, key="k", every=60)
    with pytest.raises(exceptions.InvalidPayload):
        api.recur("reminders.trial_ending", {"user_id": "x"}, key="k", every=60)
    assert Recurrence.objects.count() == 0


def test_key_is_per_owner_and_on_conflict_applies(django_user_model):
    """A key names one recurrence per owner: keep returns it, error raises, replace changes it."""
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    first = api.recur("demo.noop", {"v": 1}, key="digest", cron="0 9 * * *", owner=alice)
    other = api.recur("demo.noop", {"v": 1}, key="digest", cron="0 9 * * *", owner=bob)
    assert first.id != other.id
    assert (
        api.recur("demo.noop", {"v": 2}, key="digest", cron="0 10 * * *", owner=alice, on_conflict="keep").id
        == first.id
    )
    with pytest.raises(exceptions.RecurrenceKeyConflict):
        api.recur("demo.noop", {"v": 2}, key="digest", cron="0 10 * * *", owner=alice, on_conflict="error")
    replaced = api.recur("demo.noop", {"v": 3}, key="digest", cron="0 10 * * *", owner=alice)
    assert replaced.id == first.id
    assert replaced.expression == "0 10 * * *"
    (job,) = pending(first.id)
    assert job.payload == {"v": 3}
    assert job.occurrence_at.hour == 10
    assert Recurrence.objects.count() == 2


def test_change_moves_the_pending_occurrence(run_sql):
    """Changing the zone and payload moves the one pending occurrence (same job) and creates no other."""
    rec = api.recur("demo.noop", {"v": 1}, key="k", cron="0 9 * * *", timezone="UTC")
    (before,) = pending(rec.id)
    changed = api.change_recurrence(rec.id, timezone="America/New_York", payload={"v": 2})
    jobs = occurrences(rec.id)
    assert [j.id for j in jobs] == [before.id]
    assert jobs[0].payload == {"v": 2}
    assert jobs[0].occurrence_at.astimezone(dt.timezone(dt.timedelta(hours=-5))).hour in (9, 10)  # EST/EDT 09:00
    assert jobs[0].occurrence_at.hour in (13, 14)
    assert changed.current_at == jobs[0].occurrence_at


def test_change_to_every_and_by_key(django_user_model):
    """change_recurrence by the owner's key replaces a cron rule with every= seconds."""
    alice = django_user_model.objects.create_user("alice")
    rec = api.recur("demo.noop", {}, key="k", cron="0 9 * * *", owner=alice)
    changed = api.change_recurrence(key="k", owner=alice, every=120)
    assert changed.expression == ""
    assert changed.every_seconds == 120
    (job,) = pending(rec.id)
    assert job.occurrence_at == changed.current_at
    with pytest.raises(exceptions.RecurrenceNotFound):
        api.change_recurrence(key="k", every=60)  # the system's namespace has no such key


def test_cancel_cancels_the_pending_occurrence_and_plans_no_more(run_sql):
    """cancel: the pending occurrence is cancelled and the planner never plans another."""
    rec = api.recur("demo.noop", {}, key="k", every=60)
    api.cancel_recurrence(rec.id)
    assert [j.state for j in occurrences(rec.id)] == [JobState.CANCELLED]
    run_sql("UPDATE scheduling_recurrence SET current_at = now() - interval '1 hour' WHERE id = %s", [rec.id])
    assert planner.plan_once().created == 0
    assert len(occurrences(rec.id)) == 1
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.CANCELLED
    api.cancel_recurrence(rec.id)  # again: idempotent
    with pytest.raises(exceptions.RecurrenceStateConflict):
        api.resume_recurrence(rec.id)


def test_pause_and_resume(run_sql):
    """pause cancels the pending occurrence; resume plans the same next instant again (once)."""
    rec = api.recur("demo.noop", {}, key="k", cron="0 9 * * *")
    (job,) = pending(rec.id)
    api.pause_recurrence(rec.id)
    assert pending(rec.id) == []
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.PAUSED
    assert api.next_occurrences(rec.id) == []
    api.resume_recurrence(rec.id)
    (again,) = pending(rec.id)
    assert again.id != job.id
    assert again.occurrence_at == job.occurrence_at
    api.resume_recurrence(rec.id)  # already active: nothing more
    assert len(pending(rec.id)) == 1


def test_an_id_that_is_not_a_whole_number_is_refused_and_changes_nothing():
    """True and 2.9 would have named recurrences 1 and 2 (int() takes both); past bigint there is no such one."""
    first = api.recur("demo.noop", {}, key="a", cron="0 9 * * *")
    second = api.recur("demo.noop", {}, key="b", cron="0 9 * * *")
    assert (first.id, second.id) != (0, 0)
    for call in (
        lambda rid: api.pause_recurrence(rid),
        lambda rid: api.cancel_recurrence(rid),
        lambda rid: api.change_recurrence(rid, payload={"x": 1}),
    ):
        for not_an_id in (True, float(first.id), float(second.id) + 0.9, f"{first.id}.0", "one"):
            with pytest.raises(exceptions.InvalidSchedule, match="recurrence_id must be a whole number"):
                call(not_an_id)
        with pytest.raises(exceptions.RecurrenceNotFound):
            call(2**70)
        with pytest.raises(exceptions.RecurrenceNotFound, match="a 16610-bit number"):
            call(10**5000)  # past 4,300 digits str() refuses it: the message does not write it out
    for bulk in (api.pause_recurrences, api.cancel_recurrences, api.resume_recurrences):
        with pytest.raises(exceptions.InvalidSchedule, match="recurrence_id must be a whole number"):
            bulk([first.id, 2.9])
        assert bulk([2**70]).changed == ()  # no row can have it: left out, not a database error
    rows = Recurrence.objects.filter(pk__in=[first.id, second.id])
    assert set(rows.values_list("state", flat=True)) == {RecurrenceState.ACTIVE}
    assert [r.payload for r in rows] == [{}, {}]
    api.pause_recurrence(str(first.id))  # its digits, as a URL carries them, still name it
    assert Recurrence.objects.get(pk=first.id).state == RecurrenceState.PAUSED


@pytest.mark.parametrize(("missed", "runs_now"), [("skip", False), ("run_once", True)])
def test_resume_after_missed_occurrences_follows_the_missed_policy(run_sql, missed, runs_now):
    """After days paused: skip plans the next after now, run_once plans the latest missed one due now."""
    rec = api.recur("demo.noop", {}, key="k", cron="0 9 * * *", missed=missed)
    finish_current(run_sql, [rec.id], back="5 days")
    api.pause_recurrence(rec.id)
    api.resume_recurrence(rec.id)
    (job,) = pending(rec.id)
    now = db_now(run_sql)
    if runs_now:
        assert job.occurrence_at < now
        assert job.due_at <= now + dt.timedelta(seconds=1)
        assert (job.occurrence_at.hour, job.occurrence_at.minute) == (9, 0)
    else:
        assert job.occurrence_at > now
        assert job.due_at == job.occurrence_at


def test_next_occurrences_lists_from_the_pending_one():
    """next_occurrences(n) starts at the pending occurrence and follows the rule."""
    rec = api.recur("demo.noop", {}, key="k", cron="0 9 * * *", timezone="Europe/Lisbon")
    (job,) = pending(rec.id)
    nxt = api.next_occurrences(rec.id, n=3)
    assert nxt[0] == job.occurrence_at
    assert len(nxt) == 3
    assert all(
        b - a in (dt.timedelta(days=1), dt.timedelta(hours=23), dt.timedelta(hours=25))
        for a, b in itertools.pairwise(nxt)
    )
    with pytest.raises(exceptions.InvalidSchedule):
        api.next_occurrences(rec.id, n=0)


def test_ends_at_ends_the_recurrence(run_sql):
    """Past ends_at no occurrence is planned and the recurrence is ended."""
    rec = api.recur("demo.noop", {}, key="k", every=3600)
    run_sql("UPDATE scheduling_recurrence SET ends_at = now() - interval '30 minutes' WHERE id = %s", [rec.id])
    finish_current(run_sql, [rec.id], back="2 hours")
    report = planner.plan_once()
    assert (report.created, report.ended) == (0, 1)
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.ENDED


def test_bulk_pause_resume_and_cancel_report_each_id():
    """pause/resume/cancel_recurrences change what they may and report the others' states and missing ids."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=600).id for i in range(3)]
    result = api.pause_recurrences([ids[0], ids[1], 999_999])
    assert result.changed == (ids[0], ids[1])
    assert result.missing == (999_999,)
    again = api.pause_recurrences(ids)
    assert again.changed == (ids[2],)
    assert again.untouched == {ids[0]: "paused", ids[1]: "paused"}
    assert api.resume_recurrences([ids[0]]).changed == (ids[0],)
    cancelled = api.cancel_recurrences(ids)
    assert cancelled.changed == tuple(ids)
    assert ScheduledJob.objects.filter(recurrence_id__in=ids, state=JobState.PENDING).count() == 0


def test_recur_many_creates_one_occurrence_each_with_one_computation_per_zone():
    """recur_many stores every entry and one pending occurrence each; keys taken are kept."""
    zones = ["Asia/Tokyo", "Europe/Lisbon", "America/Santiago"]
    entries = [api.NewEntry(key=f"d:{i}", payload={"u": i}, timezone=zones[i % 3]) for i in range(30)]
    ids = api.recur_many("demo.noop", entries, cron="0 9 * * *")
    assert len(ids) == 30
    assert ScheduledJob.objects.filter(recurrence_id__in=ids, state=JobState.PENDING).count() == 30
    assert ScheduledJob.objects.filter(recurrence_id__in=ids).values("occurrence_at").distinct().count() == 3
    assert api.recur_many("demo.noop", entries[:5], cron="0 9 * * *") == []


def test_planner_creates_the_next_once_the_previous_left_pending(run_sql):
    """The planner plans only for occurrences that left pending, one next each, with one computation for a spike."""
    support.clear_of_a_slot_edge(86_400)  # 09:00 Tokyo is 00:00 UTC: all 50 first occurrences on one day
    zone_ids = [api.recur("demo.noop", {}, key=f"k{i}", cron="0 9 * * *", timezone="Asia/Tokyo").id for i in range(50)]
    assert planner.plan_once().created == 0  # all still pending
    finish_current(run_sql, zone_ids[:40], back="1 day")
    report = planner.plan_once()
    assert (report.picked, report.created, report.computed) == (40, 40, 1)
    for rid in zone_ids:
        assert len(pending(rid)) == 1
    assert planner.plan_once().created == 0  # nothing left to plan


def test_a_claimed_occurrence_holds_back_its_successor_until_it_finishes(run_sql):
    """A claimed occurrence may yet come back as a retry: its successor is planned only once it is done."""
    rec = api.recur("demo.noop", {}, key="k", every=60)
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(),"
        " occurrence_at = occurrence_at - interval '2 minutes', due_at = due_at - interval '2 minutes'"
        " WHERE recurrence_id = %s",
        [rec.id],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - interval '2 minutes' WHERE id = %s", [rec.id])
    assert planner.plan_once().created == 0
    run_sql("UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now() WHERE recurrence_id = %s", [rec.id])
    assert planner.plan_once().created == 1
    assert [j.state for j in occurrences(rec.id)] == [JobState.DONE, JobState.PENDING]


def test_two_racing_planners_create_each_next_occurrence_once(run_sql):
    """Two planners on two connections, released together by a barrier: every next occurrence exists once."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=3600).id for i in range(300)]
    finish_current(run_sql, ids, back="1 hour")
    barrier = threading.Barrier(2)
    reports: list[planner.PlanReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            reports.append(planner.plan_once(limit=200))
            reports.append(planner.plan_once(limit=200))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(r.created for r in reports) == 300
    for rid in ids:
        assert len(pending(rid)) == 1
    assert run_sql(
        "SELECT count(*) FROM (SELECT recurrence_id, occurrence_at FROM scheduling_scheduledjob"
        " WHERE recurrence_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1) AS d"
    ) == [(0,)]


def test_the_same_plan_written_twice_at_once_creates_one_occurrence(run_sql, raw_connect):
    """Two connections run the same planned insert at once (a stale planner): the unique record keeps one."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=3600).id for i in range(20)]
    finish_current(run_sql, ids, back="1 hour")
    rows = {r.id: r for r in recurring_store.pick_recurrences_to_plan(100, ["demo.noop"])}
    plan = [
        recurring_store.PlannedOccurrence(
            rid,
            rows[rid].current_at,
            rows[rid].current_at + dt.timedelta(hours=1),
            rows[rid].current_at + dt.timedelta(hours=1),
            30,
            5,
            0,
        )
        for rid in ids
    ]
    sql = recurring_store.SQL["plan_occurrences"]
    params = {
        "ids": [p.recurrence_id for p in plan],
        "prevs": [p.prev for p in plan],
        "ats": [p.occurrence_at for p in plan],
        "dues": [p.due_at for p in plan],
        "leases": [30] * 20,
        "attempts": [5] * 20,
        "priorities": [0] * 20,
    }
    barrier = threading.Barrier(2)
    counts: list[int] = []

    def run() -> None:
        conn = raw_connect()
        with conn.cursor() as cursor:
            barrier.wait()
            cursor.execute(sql, params)
            counts.append(len(cursor.fetchall()))
        conn.commit()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, 20]
    for rid in ids:
        assert len(pending(rid)) == 1
    assert planner.plan_once().created == 0


def test_occurrence_is_an_ordinary_job_of_its_kind(run_sql):
    """An occurrence gets its kind's attempts budget and the recurrence's priority, like any job."""
    rec = api.recur("demo.noop", {}, key="k", every=60, priority=7, max_attempts=2)
    (job,) = pending(rec.id)
    assert (job.priority, job.max_attempts, job.attempts) == (7, 2, 0)
    api.cancel(job.id)  # the job API works on it too; the planner then plans the next
    run_sql("UPDATE scheduling_recurrence SET current_at = now() - interval '1 second' WHERE id = %s", [rec.id])
    assert planner.plan_once().created == 1


def test_pruning_a_recurrences_latest_occurrence_is_allowed(run_sql):
    """History pruning deletes old finished occurrences, the latest one included; the planner then plans anew."""
    rec = api.recur("demo.noop", {}, key="k", every=3600)
    finish_current(run_sql, [rec.id], back="30 days")
    run_sql(
        "UPDATE scheduling_scheduledjob SET finished_at = now() - interval '30 days' WHERE recurrence_id = %s", [rec.id]
    )
    assert jobs_store.prune_finished_jobs(days=14, limit=100) == 1
    assert occurrences(rec.id) == []
    assert planner.plan_once().created == 1
    assert len(pending(rec.id)) == 1


def test_change_while_the_occurrence_runs_leaves_it_and_plans_the_next_by_the_new_rule(run_sql):
    """A change while the occurrence is claimed leaves that job as it is; its successor (once done) has the new rule."""
    rec = api.recur("demo.noop", {"v": 1}, key="k", every=3600)
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(),"
        " occurrence_at = now() - interval '1 minute', due_at = now() - interval '1 minute' WHERE recurrence_id = %s",
        [rec.id],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = now() - interval '1 minute' WHERE id = %s", [rec.id])
    api.change_recurrence(rec.id, cron="0 9 * * *", timezone="Asia/Tokyo", payload={"v": 2})
    (running,) = occurrences(rec.id)
    assert running.state == JobState.CLAIMED
    assert running.payload == {"v": 1}
    assert planner.plan_once().created == 0  # it runs: its successor waits for it
    run_sql("UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now() WHERE id = %s", [running.id])
    assert planner.plan_once().created == 1
    (nxt,) = pending(rec.id)
    assert nxt.payload == {"v": 2}
    assert (nxt.occurrence_at.hour, nxt.occurrence_at.minute) == (0, 0)  # 09:00 JST


def test_deleting_the_owner_deletes_their_recurrences_and_cancels_the_pending_occurrence(django_user_model):
    """A deleted user's recurrences go with them; their pending occurrence is cancelled, not left to run."""
    carol = django_user_model.objects.create_user("carol")
    rec = api.recur("demo.noop", {}, key="k", every=600, owner=carol)
    (job,) = pending(rec.id)
    carol.delete()
    assert not Recurrence.objects.filter(pk=rec.id).exists()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.recurrence_id is None


def test_a_recurrence_of_a_kind_this_process_does_not_know_is_left_active_not_picked(run_sql):
    """A recurrence of a kind not registered here (an old-release leader) is never picked nor paused: left as it is."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=3600).id for i in range(2)]
    finish_current(run_sql, ids, back="2 hours")
    run_sql("UPDATE scheduling_recurrence SET kind = 'gone.kind' WHERE id = %s", [ids[0]])
    report = planner.plan_once()
    assert (report.picked, report.created) == (1, 1)
    assert Recurrence.objects.get(pk=ids[0]).state == RecurrenceState.ACTIVE
    assert pending(ids[0]) == []
    assert planner.plan_once().picked == 0
    run_sql("UPDATE scheduling_recurrence SET kind = 'demo.noop' WHERE id = %s", [ids[0]])  # a leader that knows it
    assert (planner.plan_once().created, len(pending(ids[0]))) == (1, 1)


def test_the_planner_pauses_a_callers_recurrence_whose_owner_lost_the_kinds_permission(run_sql, django_user_model):
    """Made through the API, it is paused with a reason once its owner loses the permission; code's goes on."""
    alice = django_user_model.objects.create_user("alice")
    alice.user_permissions.add(Permission.objects.get(codename="schedule_payment"))
    Payment.objects.create(reference="p1", amount_cents=100, owner=alice)
    by_api = api.recur("payments.retry", {"reference": "p1"}, key="api", every=3600, owner=alice, caller=alice)
    by_code = api.recur("payments.retry", {"reference": "p1"}, key="code", every=3600, owner=alice)
    assert (Recurrence.objects.get(pk=by_api.id).recheck_access, by_code.recheck_access) == (True, False)
    finish_current(run_sql, [by_api.id, by_code.id], back="2 hours")
    alice.user_permissions.clear()
    report = planner.plan_once()
    assert (report.picked, report.created) == (2, 1)
    paused = Recurrence.objects.get(pk=by_api.id)
    assert paused.state == RecurrenceState.PAUSED
    assert paused.paused_reason == "its owner may no longer schedule payments.retry"
    assert pending(by_api.id) == []
    assert len(pending(by_code.id)) == 1
    with pytest.raises(exceptions.RecurrenceStateConflict, match=r"no longer schedule payments\.retry"):
        api.resume_recurrence(by_api.id)
    assert api.resume_recurrences([by_api.id]).refused == {by_api.id: paused.paused_reason}  # kept paused
    alice.user_permissions.add(Permission.objects.get(codename="schedule_payment"))
    api.resume_recurrence(by_api.id)
    resumed = Recurrence.objects.get(pk=by_api.id)
    assert (resumed.state, resumed.paused_reason) == (RecurrenceState.ACTIVE, "")
    assert len(pending(by_api.id)) == 1


def test_the_planner_pauses_every_recurrence_of_a_deactivated_owner(run_sql, django_user_model):
    """A deactivated owner's recurrences create no occurrence owned by them: paused, visibly, at the next pass."""
    erin = django_user_model.objects.create_user("erin")
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=3600, owner=erin).id for i in range(3)]
    system = api.recur("demo.noop", {}, key="system", every=3600).id
    finish_current(run_sql, [*ids, system], back="2 hours")
    erin.is_active = False
    erin.save()
    assert planner.plan_once().created == 1  # the system's alone
    assert set(Recurrence.objects.filter(pk__in=ids).values_list("state", "paused_reason")) == {
        (RecurrenceState.PAUSED, "its owner is deactivated")
    }
    assert not ScheduledJob.objects.filter(owner=erin, state=JobState.PENDING).exists()


def test_retrying_dead_occurrences_keeps_one_live_occurrence(run_sql):
    """retry_dead_many leaves a dead occurrence dead beside a live one, and retries one of two dead ones, not both."""
    rec = api.recur("demo.noop", {}, key="k", every=3600)
    finish_current(run_sql, [rec.id], back="3 hours", state="dead")
    planner.plan_once()
    finish_current(run_sql, [rec.id], back="1 hour", state="dead")
    planner.plan_once()
    dead = [j.id for j in occurrences(rec.id) if j.state == JobState.DEAD]
    assert len(dead) == 2
    assert len(pending(rec.id)) == 1
    assert api.retry_dead_many(dead).changed == ()  # the recurrence's pending occurrence holds them back
    api.pause_recurrence(rec.id)
    assert pending(rec.id) == []
    assert api.retry_dead_many(dead).changed == (max(dead),)
    assert [j.id for j in pending(rec.id)] == [max(dead)]


def test_the_job_options_go_whole_to_the_recurrence_and_its_occurrence():
    """recur_with_options stores the options whole on the recurrence and its job; UNSET keeps one, a value moves it."""
    rule = recurring_api.Rule(every=3600)
    rec = recurring_api.recur_with_options(
        "demo.noop", {}, rule, options.JobOptions(key="whole:1", max_attempts=4, priority=8)
    )
    (job,) = occurrences(rec.id)
    assert (rec.max_attempts, rec.priority, job.max_attempts, job.priority) == (4, 8, 4, 8)
    same = recurring_api.Rule(
        **{
            name: recurring_api.UNSET
            for name in ("cron", "every", "timezone", "starts_at", "ends_at", "dst_gap", "missed")
        }
    )
    changed = recurring_api.change_with_options(
        rec.id,
        recurring_api.UNSET,
        {"v": 2},
        same,
        options.JobOptions(max_attempts=recurring_api.UNSET, priority=2),
    )
    (job,) = occurrences(rec.id)
    assert (changed.max_attempts, changed.priority, job.max_attempts, job.priority) == (4, 2, 4, 2)
    assert job.payload == {"v": 2}


def _ran_a_minute_ago(run_sql: Any, recurrence_id: int, state: str) -> None:
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = %s, token = CASE WHEN %s = 'claimed' THEN gen_random_uuid() END,"
        " claimed_at = now(), attempts = 1, finished_at = CASE WHEN %s = 'done' THEN now() END,"
        " occurrence_at = now() - interval '1 minute', due_at = now() - interval '1 minute' WHERE recurrence_id = %s",
        [state, state, state, recurrence_id],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = now() - interval '1 minute' WHERE id = %s", [recurrence_id])


def test_a_start_moved_later_while_an_occurrence_runs_holds_for_the_planners_next_one(run_sql):
    """change_recurrence(starts_at=+10 days) while the occurrence is claimed: once it is done the planner plans
    the next at or after the start (it planned the next hour's, from the last run)."""
    rec = api.recur("demo.noop", {}, key="k", every=3600)
    _ran_a_minute_ago(run_sql, rec.id, "claimed")
    starts = _database_now() + dt.timedelta(days=10)
    api.change_recurrence(rec.id, starts_at=starts)
    run_sql("UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now() WHERE recurrence_id = %s", [rec.id])
    assert planner.plan_once().created == 1
    (nxt,) = pending(rec.id)
    assert starts <= nxt.occurrence_at < starts + dt.timedelta(hours=1)


def test_a_start_moved_later_while_paused_holds_for_resume(run_sql):
    rec = api.recur("demo.noop", {}, key="k", every=3600)
    _ran_a_minute_ago(run_sql, rec.id, "done")
    api.pause_recurrence(rec.id)
    starts = _database_now() + dt.timedelta(days=10)
    api.change_recurrence(rec.id, starts_at=starts)
    api.resume_recurrence(rec.id)
    (nxt,) = pending(rec.id)
    assert starts <= nxt.occurrence_at < starts + dt.timedelta(hours=1)


def _database_now() -> dt.datetime:
    from scheduling.core import store as core_store

    return core_store.database_now()


def _today_waits_as_a_retry(run_sql: Any, recurrence_id: int) -> dt.datetime:
    """Today's occurrence (a daily rule) ran once, failed and waits for its retry; its instant."""
    run_sql(
        "UPDATE scheduling_scheduledjob SET attempts = 1, last_error = 'boom',"
        " occurrence_at = occurrence_at - interval '1 day', due_at = now() + interval '5 minutes'"
        " WHERE recurrence_id = %s",
        [recurrence_id],
    )
    run_sql(
        "UPDATE scheduling_recurrence SET current_at = current_at - interval '1 day' WHERE id = %s", [recurrence_id]
    )
    return ScheduledJob.objects.get(recurrence_id=recurrence_id).occurrence_at


def test_changes_while_a_retry_waits_supersede_it_and_skip_no_occurrence(run_sql):
    """Two payload-only changes while today's occurrence waits as a retry: the row moves to tomorrow, as a first
    attempt, and stays there (it kept its spent attempt, read as having run tomorrow: the second change moved
    it to the day after, tomorrow's occurrence was skipped). Found by review."""
    rec = api.recur("demo.noop", {"v": 1}, key="k", every=86400)
    today = _today_waits_as_a_retry(run_sql, rec.id)
    tomorrow = today + dt.timedelta(days=1)
    api.change_recurrence(rec.id, payload={"v": 2})
    api.change_recurrence(rec.id, payload={"v": 3})
    (job,) = occurrences(rec.id)
    assert (job.occurrence_at, job.attempts, job.payload, job.last_error) == (tomorrow, 0, {"v": 3}, "")


def test_a_change_while_a_retry_waits_then_pause_and_resume_plans_tomorrow(run_sql):
    rec = api.recur("demo.noop", {"v": 1}, key="k", every=86400)
    today = _today_waits_as_a_retry(run_sql, rec.id)
    api.change_recurrence(rec.id, payload={"v": 2})
    api.pause_recurrence(rec.id)
    api.resume_recurrence(rec.id)
    (nxt,) = pending(rec.id)
    assert nxt.occurrence_at == today + dt.timedelta(days=1)


def test_run_once_resume_of_a_recurrence_paused_before_its_first_occurrence_runs_the_latest_missed(run_sql):
    """Hourly, run_once, paused before its first occurrence ran, resumed three hours later: the latest instant
    missed while paused runs now, as for a recurrence that had run before its pause (it planned the next
    future instant). skip still plans the next one. Found by review."""
    run_once = api.recur("demo.noop", {}, key="once", every=3600, missed="run_once")
    skip = api.recur("demo.noop", {}, key="skip", every=3600)
    for rec in (run_once, skip):
        api.pause_recurrence(rec.id)
        run_sql(
            "UPDATE scheduling_recurrence SET anchor_at = anchor_at - interval '3 hours',"
            " current_at = current_at - interval '3 hours' WHERE id = %s",
            [rec.id],
        )
        run_sql(
            "UPDATE scheduling_scheduledjob SET occurrence_at = occurrence_at - interval '3 hours',"
            " due_at = due_at - interval '3 hours' WHERE recurrence_id = %s",
            [rec.id],
        )
    now = _database_now()
    for rec in (run_once, skip):
        api.resume_recurrence(rec.id)
    (missed,) = pending(run_once.id)
    (upcoming,) = pending(skip.id)
    assert now - dt.timedelta(hours=1) < missed.occurrence_at < now
    assert missed.due_at <= _database_now()
    assert now < upcoming.occurrence_at <= now + dt.timedelta(hours=1)
