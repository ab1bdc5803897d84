"""The orphan duty on real PostgreSQL: runs whose worker died are closed, live ones are left alone."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from scheduling import schedules
from scheduling.core import store
from scheduling.fixed import gate, orphans
from scheduling.models import RunState, SchedulePolicy, ScheduleRun

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_SECONDS = 5
LEASE_SECONDS = 5


@pytest.fixture
def make_schedule(settings: Any) -> Callable[..., SchedulePolicy]:
    """Sync a fixed-time schedule of ``demo.record`` (active deadline 5 s; lease 5 s) and return its policy."""
    settings.SCHEDULING_LEASE_SECONDS = LEASE_SECONDS

    def make(name: str, **fields: Any) -> SchedulePolicy:
        fields.setdefault("kind", "demo.record")
        fields.setdefault("every", 60)
        fields.setdefault("active_deadline_seconds", DEADLINE_SECONDS)
        schedules.sync(declarations=[schedules.make(name=name, **fields)])
        return SchedulePolicy.objects.get(periodic_task__name=name)

    return make


def running_row(policy: SchedulePolicy, started_seconds_ago: float, minutes_back: int = 0) -> ScheduleRun:
    """A run marked running, admitted ``started_seconds_ago`` (database clock), as a dead worker leaves it."""
    now = store.database_now()
    return ScheduleRun.objects.create(
        schedule=policy,
        tick=now.replace(microsecond=0) - dt.timedelta(minutes=minutes_back, seconds=started_seconds_ago),
        state=RunState.RUNNING,
        worker="gone-host:4242",
        started_at=now - dt.timedelta(seconds=started_seconds_ago),
    )


def state_of(run: ScheduleRun) -> ScheduleRun:
    return ScheduleRun.objects.get(pk=run.pk)


def test_an_allow_run_past_its_deadline_plus_the_lease_is_closed_failed_and_a_younger_one_is_left(make_schedule):
    """allow: a running row older than deadline + lease is closed failed, with the reason; a younger one is left."""
    policy = make_schedule("orphan-allow", concurrency_policy="allow")
    stale = running_row(policy, DEADLINE_SECONDS + LEASE_SECONDS + 5, minutes_back=2)
    young = running_row(policy, 1)

    report = orphans.close_orphans()

    assert report.closed == [stale.pk]
    closed = state_of(stale)
    assert closed.state == RunState.FAILED
    assert "worker running it was lost" in closed.error
    assert closed.finished_at is not None
    assert state_of(young).state == RunState.RUNNING


def test_a_forbid_run_whose_lock_is_free_is_closed_at_once_but_not_while_the_lock_is_held(make_schedule):
    """forbid: a running row is closed as soon as nobody holds the schedule's lock, never while someone does."""
    policy = make_schedule("orphan-forbid", concurrency_policy="forbid")
    run = running_row(policy, 1)
    holder = gate.lock_for(policy.pk)
    assert holder.try_acquire()
    try:
        assert orphans.close_orphans().closed == [], "a run holding the lock is alive"
        assert state_of(run).state == RunState.RUNNING
    finally:
        holder.release()

    assert orphans.close_orphans().closed == [run.pk]
    assert state_of(run).state == RunState.FAILED
    assert "overlap lock is free" in state_of(run).error


def test_closed_orphans_are_pruned_to_the_history_limits(make_schedule):
    """Closed orphans are final runs: the schedule's failed-history limit prunes them (running rows never were)."""
    policy = make_schedule("orphan-pruned", concurrency_policy="allow", failed_history_limit=1)
    runs = [running_row(policy, DEADLINE_SECONDS + LEASE_SECONDS + 5, minutes_back=m) for m in (3, 2, 1)]

    assert sorted(orphans.close_orphans().closed) == sorted(r.pk for r in runs)

    left = list(ScheduleRun.objects.filter(schedule=policy))
    assert [r.pk for r in left] == [runs[-1].pk], "only the latest failed run is kept"
    assert left[0].state == RunState.FAILED


def test_an_outcome_recorded_meanwhile_wins_over_the_close(make_schedule):
    """The close is conditional on running: a run that recorded its outcome keeps it."""
    policy = make_schedule("orphan-raced", concurrency_policy="allow")
    run = running_row(policy, DEADLINE_SECONDS + LEASE_SECONDS + 5)
    ScheduleRun.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, finished_at=store.database_now())

    assert orphans.close_orphans().closed == []
    assert state_of(run).state == RunState.SUCCEEDED
