"""scheduling.api against real PostgreSQL: validation, keys, cancel and reschedule."""

from __future__ import annotations

import datetime as dt
import select
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from scheduling import api, exceptions
from scheduling.core import store as core_store
from scheduling.core import validation
from scheduling.due_at import claim
from scheduling.due_at import store as jobs_store
from scheduling.models import JobState, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"user_id": 1, "trial_id": 2}


def test_schedule_with_delay_uses_database_clock(run_sql):
    """A delay is added to the database's now(), and the job is stored pending."""
    job = api.schedule("reminders.trial_ending", PAYLOAD, delay=60)
    (db_now,) = run_sql("SELECT now()")[0]
    stored = ScheduledJob.objects.get(pk=job.id)
    assert stored.state == JobState.PENDING
    assert dt.timedelta(seconds=55) < stored.due_at - db_now <= dt.timedelta(seconds=60)
    assert stored.max_attempts == 5
    assert stored.attempts == 0


def test_rolled_back_enqueue_leaves_nothing():
    """schedule() joins the caller's transaction: a rollback leaves no row."""

    class Boom(Exception):
        pass

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            api.schedule("demo.noop", {}, delay=1)
            raise Boom

    with pytest.raises(Boom):
        enqueue_then_fail()
    assert ScheduledJob.objects.count() == 0


@pytest.mark.parametrize(
    ("kind", "payload", "kwargs", "error"),
    [
        ("no.such.kind", {}, {"delay": 1}, exceptions.UnknownJobKind),
        ("reminders.trial_ending", {"user_id": "x", "trial_id": 2}, {"delay": 1}, exceptions.InvalidPayload),
        ("reminders.trial_ending", {"user_id": 1}, {"delay": 1}, exceptions.InvalidPayload),
        ("reminders.trial_ending", [1, 2], {"delay": 1}, exceptions.InvalidPayload),
        ("demo.noop", {"x": {1, 2}}, {"delay": 1}, exceptions.InvalidPayload),
        ("demo.noop", {"x": float("nan")}, {"delay": 1}, exceptions.InvalidPayload),
        ("demo.noop", {"blob": "x" * 70_000}, {"delay": 1}, exceptions.PayloadTooLarge),
        ("demo.noop", {}, {"due_at": dt.datetime(2030, 1, 1)}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": 1, "due_at": timezone.now()}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": -1}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": float("inf")}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": True}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": "10"}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": 1, "on_conflict": "merge", "key": "k"}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": 1, "max_attempts": 0}, exceptions.InvalidSchedule),
        ("demo.noop", {}, {"delay": 1, "key": ""}, exceptions.InvalidSchedule),
    ],
)
def test_bad_input_raises_named_error_and_stores_nothing(kind, payload, kwargs, error):
    """Bad kinds, payloads and times get a named error at schedule time and store nothing."""
    with pytest.raises(error):
        api.schedule(kind, payload, **kwargs)
    assert ScheduledJob.objects.count() == 0


def test_deeply_nested_payload_is_refused():
    """A 10,000-deep payload is an InvalidPayload, not a crash."""
    deep: dict = {}
    node = deep
    for _ in range(10_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(exceptions.InvalidPayload):
        api.schedule("demo.noop", deep, delay=1)
    assert ScheduledJob.objects.count() == 0


def test_key_replace_moves_the_pending_job():
    """on_conflict=replace moves the existing pending job instead of adding one."""
    first = api.schedule("demo.noop", {"v": 1}, delay=100, key="k1")
    second = api.schedule("demo.noop", {"v": 2}, delay=500, key="k1", on_conflict="replace")
    assert first.id == second.id
    stored = ScheduledJob.objects.get(pk=first.id)
    assert stored.payload == {"v": 2}
    assert ScheduledJob.objects.filter(key="k1").count() == 1
    assert stored.due_at > first.due_at + dt.timedelta(seconds=300)


def test_key_keep_returns_the_first_job_unchanged():
    """on_conflict=keep leaves the first job and returns it."""
    first = api.schedule("demo.noop", {"v": 1}, delay=100, key="k2")
    kept = api.schedule("demo.noop", {"v": 2}, delay=500, key="k2", on_conflict="keep")
    assert kept.id == first.id
    assert ScheduledJob.objects.get(pk=first.id).payload == {"v": 1}


def test_key_error_raises_key_conflict_and_changes_nothing():
    """on_conflict=error raises KeyConflict naming the live job."""
    first = api.schedule("demo.noop", {"v": 1}, delay=100, key="k3")
    with pytest.raises(exceptions.KeyConflict) as info:
        api.schedule("demo.noop", {"v": 2}, delay=5, key="k3", on_conflict="error")
    assert info.value.job_id == first.id
    assert ScheduledJob.objects.get(pk=first.id).payload == {"v": 1}


def test_key_is_free_again_once_the_job_is_finished():
    """The key constraint covers only pending and claimed jobs."""
    first = api.schedule("demo.noop", {}, delay=100, key="k4")
    api.cancel(first.id)
    second = api.schedule("demo.noop", {}, delay=100, key="k4", on_conflict="error")
    assert second.id != first.id


def test_cancel_and_reschedule_by_key_and_id():
    """cancel/reschedule find a job by id or by key; only a pending job changes."""
    job = api.schedule("demo.noop", {}, delay=100, key="k5")
    new_due = timezone.now() + dt.timedelta(days=3)
    assert api.reschedule(key="k5", due_at=new_due) == new_due
    api.cancel(key="k5")
    with pytest.raises(exceptions.JobNotCancellable) as info:
        api.cancel(job.id)
    assert info.value.state == "cancelled"
    with pytest.raises(exceptions.JobNotReschedulable):
        api.reschedule(job.id, due_at=new_due)
    assert ScheduledJob.objects.get(pk=job.id).due_at == new_due


def test_cancel_unknown_job_is_not_found():
    """Cancelling a job that does not exist raises JobNotFound."""
    with pytest.raises(exceptions.JobNotFound):
        api.cancel(123456789)
    with pytest.raises(exceptions.JobNotFound):
        api.cancel(key="nobody")


def test_reschedule_refuses_naive_datetime():
    """reschedule() refuses a naive due_at and leaves the job as it was."""
    job = api.schedule("demo.noop", {}, delay=100)
    with pytest.raises(exceptions.InvalidSchedule):
        api.reschedule(job.id, due_at=dt.datetime(2031, 1, 1))
    assert ScheduledJob.objects.get(pk=job.id).due_at == job.due_at


def test_payload_depth_limit():
    """A payload nested just past SCHEDULING_MAX_PAYLOAD_DEPTH is refused; one at the limit is stored."""
    from scheduling.core import conf

    def nested(levels: int) -> dict:
        node: dict = {}
        root = node
        for _ in range(levels - 1):
            node["a"] = {}
            node = node["a"]
        return root

    limit = conf.get().max_payload_depth
    assert validation.payload_depth(nested(limit)) == limit
    api.schedule("demo.noop", nested(limit), delay=60)
    with pytest.raises(exceptions.InvalidPayload, match="deeper"):
        api.schedule("demo.noop", nested(limit + 1), delay=60)
    assert ScheduledJob.objects.count() == 1


def _claimed_and_dead() -> tuple[int, int]:
    """One claimed job and one dead job (each the only row of its state)."""
    claimed = api.schedule("demo.noop", {}, delay=0)
    assert [c.id for c in jobs_store.claim_due_jobs(10)] == [claimed.id]
    dead = api.schedule("demo.noop", {}, delay=3600)
    ScheduledJob.objects.filter(pk=dead.id).update(state=JobState.DEAD, finished_at=timezone.now(), attempts=5)
    return claimed.id, dead.id


def test_cancel_many_cancels_the_pending_jobs_and_reports_the_others_with_their_states():
    """cancel_many changes only pending jobs; the rest come back with the state that kept them out, or as missing."""
    pending = [api.schedule("demo.noop", {}, delay=3600).id for _ in range(2)]
    claimed, dead = _claimed_and_dead()
    result = api.cancel_many([*reversed(pending), claimed, dead, 987654321, pending[0]])
    assert result.changed == tuple(sorted(pending))
    assert dict(result.untouched) == {claimed: JobState.CLAIMED, dead: JobState.DEAD}
    assert result.missing == (987654321,)
    assert result.selected == 5
    states = dict(ScheduledJob.objects.values_list("id", "state"))
    assert states == {pending[0]: "cancelled", pending[1]: "cancelled", claimed: "claimed", dead: "dead"}


def test_reschedule_many_moves_only_pending_jobs_and_refuses_a_naive_time():
    """reschedule_many moves the pending jobs to the time; a naive time is refused before anything changes."""
    job = api.schedule("demo.noop", {}, delay=3600)
    claimed, _dead = _claimed_and_dead()
    with pytest.raises(exceptions.InvalidSchedule):
        api.reschedule_many([job.id], due_at=dt.datetime(2031, 1, 1))
    assert ScheduledJob.objects.get(pk=job.id).due_at == job.due_at
    when = dt.datetime(2031, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    result = api.reschedule_many([job.id, claimed], due_at=when)
    assert (result.changed, dict(result.untouched)) == ((job.id,), {claimed: JobState.CLAIMED})
    assert ScheduledJob.objects.get(pk=job.id).due_at == when


def test_retry_dead_many_revives_dead_jobs_with_a_fresh_budget():
    """retry_dead_many makes dead jobs pending and due now; pending ones are reported untouched."""
    pending = api.schedule("demo.noop", {}, delay=3600)
    _claimed, dead = _claimed_and_dead()
    result = api.retry_dead_many([dead, pending.id])
    assert (result.changed, dict(result.untouched)) == ((dead,), {pending.id: JobState.PENDING})
    revived = ScheduledJob.objects.get(pk=dead)
    assert (revived.state, revived.attempts, revived.finished_at) == (JobState.PENDING, 0, None)
    assert revived.due_at <= core_store.database_now()


def _notifications(conn: Any, at_least: int) -> int:
    """Notifications received on ``conn`` once at least ``at_least`` arrived (or 10 s passed)."""
    for _ in range(100):
        conn.poll()
        if len(conn.notifies) >= at_least:
            break
        select.select([conn], [], [], 0.1)
    conn.poll()
    return len(conn.notifies)


@pytest.mark.parametrize("change", ["run_now_many", "retry_dead_many", "reschedule_many"])
def test_a_bulk_change_making_jobs_due_now_wakes_the_claim_loop_when_it_commits(raw_connect, change):
    """run now, retry dead and a reschedule to now NOTIFY the claim loop on commit, and not on rollback."""
    job = api.schedule("demo.noop", {}, delay=3600)
    if change == "retry_dead_many":
        ScheduledJob.objects.filter(pk=job.id).update(state=JobState.DEAD, finished_at=timezone.now())
    arguments = {"due_at": core_store.database_now()} if change == "reschedule_many" else {}
    listener = raw_connect(autocommit=True)
    listener.cursor().execute(f"LISTEN {claim.NOTIFY_CHANNEL}")

    def change_then_fail() -> None:
        with transaction.atomic():
            assert getattr(api, change)([job.id], **arguments).changed == (job.id,)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        change_then_fail()
    with transaction.atomic():
        assert getattr(api, change)([job.id], **arguments).changed == (job.id,)
    assert _notifications(listener, at_least=1) == 1
    assert [n.channel for n in listener.notifies] == [claim.NOTIFY_CHANNEL]
