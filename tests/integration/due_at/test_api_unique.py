"""Uniqueness windows (``schedule(unique_for=...)``): decided by the database, exact under concurrent inserts."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction

from scheduling import api, exceptions, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import JobState, ScheduledJob
from tests import support
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clear_of_the_hours_edge(transactional_db: None) -> None:
    """Every call of a test here must meet in one hour's slot (see support.clear_of_a_slot_edge)."""
    support.clear_of_a_slot_edge(3600)


HOUR = dt.timedelta(hours=1)


def _noop(job: registry.Job) -> None:
    """Nothing."""


registry.handler("uniq.plain", schema={"type": "object"})(_noop)
registry.handler("uniq.hourly", schema={"type": "object"}, unique_for=HOUR)(_noop)


def _fail(job: registry.Job) -> None:
    raise RuntimeError("failing on purpose")


registry.handler("uniq.fail", schema={"type": "object"}, max_attempts=1)(_fail)


def _run_due() -> None:
    support.make_due(state="pending")
    claims = store.claim_due_jobs(100)
    runner.run_batch([(c.id, c.token) for c in claims])
    lease.stop()


def test_the_same_payload_twice_in_a_window_meets_on_conflict():
    """Without a key the payload counts: error raises DuplicateJob, keep returns the first, replace moves it."""
    first = api.schedule("uniq.plain", {"user": 1}, delay=60, unique_for=HOUR)
    with pytest.raises(exceptions.DuplicateJob) as raised:
        api.schedule("uniq.plain", {"user": 1}, delay=60, unique_for=HOUR, on_conflict="error")
    assert (raised.value.job_id, raised.value.state) == (first.id, "pending")
    kept = api.schedule("uniq.plain", {"user": 1}, delay=60, unique_for=HOUR, on_conflict="keep", priority=5)
    assert (kept.id, kept.priority) == (first.id, 0)
    replaced, outcome = api.schedule_with_outcome("uniq.plain", {"user": 1}, delay=600, unique_for=HOUR, priority=5)
    assert (replaced.id, outcome) == (first.id, "replaced")
    assert ScheduledJob.objects.get(pk=first.id).priority == 5
    other = api.schedule("uniq.plain", {"user": 2}, delay=60, unique_for=HOUR)
    assert other.id != first.id, "another payload is another job"
    assert ScheduledJob.objects.count() == 2


def test_with_a_key_the_key_counts_not_the_payload():
    """Keyed: a second job of the key with another payload in the window is the same job (keep returns it)."""
    first = api.schedule("uniq.plain", {"v": 1}, key="report-7", delay=60, unique_for=HOUR)
    _run_due()  # done: still holds the window
    kept = api.schedule("uniq.plain", {"v": 2}, key="report-7", delay=60, unique_for=HOUR, on_conflict="keep")
    assert kept.id == first.id
    assert kept.state == JobState.DONE


def test_a_finished_job_holds_its_window_by_default_and_unique_states_choose():
    """Done holds by default (replace leaves it, returns it); cancelled does not; each row's unique_states decide."""
    done = api.schedule("uniq.plain", {"n": 1}, delay=60, unique_for=HOUR)
    _run_due()
    again, outcome = api.schedule_with_outcome("uniq.plain", {"n": 1}, delay=60, unique_for=HOUR)
    assert (again.id, outcome) == (done.id, "kept"), "a done job is not moved"
    cancelled = api.schedule("uniq.plain", {"n": 2}, delay=60, unique_for=HOUR)
    api.cancel(cancelled.id)
    assert api.schedule("uniq.plain", {"n": 2}, delay=60, unique_for=HOUR).id != cancelled.id
    states = ["pending", "claimed", "running", "cancelled"]
    held = api.schedule("uniq.plain", {"n": 3}, delay=60, unique_for=HOUR, unique_states=states)
    api.cancel(held.id)
    with pytest.raises(exceptions.DuplicateJob):
        api.schedule("uniq.plain", {"n": 3}, delay=60, unique_for=HOUR, unique_states=states, on_conflict="error")
    running_only = ["pending", "claimed", "running"]
    first = api.schedule("uniq.plain", {"n": 4}, delay=60, unique_for=HOUR, unique_states=running_only)
    _run_due()
    free = api.schedule("uniq.plain", {"n": 4}, delay=60, unique_for=HOUR, unique_states=running_only)
    assert free.id != first.id, "a done job whose unique_states leave out done does not hold the window"


def test_unique_states_must_hold_the_waiting_and_running_states():
    """unique_states without pending, claimed and running, or with a state that is not one, is refused."""
    for states in (["done"], ["pending", "claimed", "done"], ["pending", "claimed", "running", "paused"], "pending"):
        with pytest.raises(exceptions.InvalidSchedule):
            api.schedule("uniq.plain", {}, delay=60, unique_for=HOUR, unique_states=states)
    with pytest.raises(exceptions.InvalidSchedule):
        api.schedule("uniq.plain", {}, delay=60, unique_for=-1)


def test_owners_do_not_share_windows():
    """The same payload for two owners is two jobs: a window never reaches another owner's job."""
    users = get_user_model()
    a, b = users.objects.create(username="a"), users.objects.create(username="b")
    first = api.schedule("uniq.plain", {"x": 1}, delay=60, unique_for=HOUR, owner=a)
    second = api.schedule("uniq.plain", {"x": 1}, delay=60, unique_for=HOUR, owner=b, on_conflict="error")
    assert first.id != second.id


def test_a_kinds_default_window_applies_and_zero_turns_it_off():
    """registry.handler(unique_for=1 h): a second schedule is the same job; unique_for=0 asks for none."""
    first = api.schedule("uniq.hourly", {"x": 1}, delay=60)
    assert api.schedule("uniq.hourly", {"x": 1}, delay=60, on_conflict="keep").id == first.id
    assert api.schedule("uniq.hourly", {"x": 1}, delay=60, unique_for=0).id != first.id


def test_schedule_many_meets_the_window_per_payload():
    """schedule_many with a window: a payload twice in the call, or already scheduled, gives the same id."""
    first = api.schedule("uniq.plain", {"n": 1}, delay=60, unique_for=HOUR)
    ids = api.schedule_many("uniq.plain", [{"n": 1}, {"n": 2}, {"n": 2}], delay=60, unique_for=HOUR, on_conflict="keep")
    assert ids[0] == first.id
    assert ids[1] == ids[2] != first.id
    assert ScheduledJob.objects.count() == 2


def test_a_dead_job_retried_leaves_its_window_when_dead_does_not_hold_it():
    """A dead job's window is free (dead not in unique_states); retried, it runs again without taking the slot back."""
    job = api.schedule("uniq.fail", {"d": 1}, delay=60, unique_for=HOUR)
    _run_due()
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD
    successor = api.schedule("uniq.fail", {"d": 1}, delay=60, unique_for=HOUR)
    assert successor.id != job.id
    assert api.retry_dead_many([job.id]).changed == (job.id,)
    retried = ScheduledJob.objects.get(pk=job.id)
    assert (retried.state, retried.unique_key) == (JobState.PENDING, None)


def test_two_connections_inserting_at_once_make_exactly_one_row():
    """Two transactions insert the same unique job: the second waits on the first's row, then keeps it: one row."""
    results: dict[str, int] = {}
    inserted = threading.Event()
    release = threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = api.schedule("uniq.plain", {"race": 1}, delay=60, unique_for=HOUR).id
                inserted.set()
                assert release.wait(20)
        finally:
            connection.close()

    def second() -> None:
        try:
            assert inserted.wait(20)
            with transaction.atomic():
                results["second"] = api.schedule(
                    "uniq.plain", {"race": 1}, delay=60, unique_for=HOUR, on_conflict="keep"
                ).id
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        # The second insert waits on the first's uncommitted row in the unique index (no check-then-insert).
        wait_for(lambda: _waiting_on_a_lock() >= 1, 20, message="the second insert to wait for the first transaction")
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert results["first"] == results["second"]
    assert ScheduledJob.objects.filter(kind="uniq.plain").count() == 1


def test_many_racing_inserts_on_a_barrier_leave_one_row_per_window():
    """Eight threads on a barrier, each schedule the same payload 10 times: one row; every call names it."""
    barrier = threading.Barrier(8)
    seen: list[int] = []
    lock = threading.Lock()

    def insert() -> None:
        try:
            barrier.wait(20)
            for _ in range(10):
                job = api.schedule("uniq.plain", {"race": 2}, delay=60, unique_for=HOUR, on_conflict="keep")
                with lock:
                    seen.append(job.id)
        finally:
            connection.close()

    threads = [threading.Thread(target=insert) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(seen) == 80
    assert len(set(seen)) == 1
    assert ScheduledJob.objects.filter(kind="uniq.plain").count() == 1


def _waiting_on_a_lock() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])
