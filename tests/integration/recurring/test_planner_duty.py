"""The planner duty beside the claim: the leader's turn wakes the planner's thread and never waits for its pass.

A pass is held up here by a table lock another session holds (the pick's ``FOR UPDATE`` waits on
it, seen in ``pg_stat_activity``): the call the control loop makes still returns, the pass runs
on, and ends once the lock goes. A pass that fails (its lock wait bounded, as the loop's are) is
counted, and a later call plans. A pass stuck past its bound is left to end on its own while a new
thread plans beside it, and the two create the occurrence once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from scheduling.recurring import planner
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def duty(monkeypatch) -> Iterator[planner.Duty]:
    """A duty of the test's own; its thread is ended (and its connection closed) when the test ends."""
    monkeypatch.setattr(planner, "LOCK_WAIT_SECONDS", 60)  # a loaded machine never ends a pass by its lock wait
    one = planner.Duty()
    yield one
    one.stop(timeout=10)


def _plannable(run_sql: Any, key: str = "duty:1") -> int:
    """A recurrence whose latest occurrence finished a day ago: the next pass plans its next one."""
    rec = api.recur("demo.noop", {}, key=key, cron="0 9 * * *", timezone="UTC")
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now(),"
        " occurrence_at = occurrence_at - interval '1 day', due_at = due_at - interval '1 day'"
        " WHERE recurrence_id = %s",
        [rec.id],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - interval '1 day' WHERE id = %s", [rec.id])
    return rec.id


def _pending(recurrence_id: int) -> int:
    return ScheduledJob.objects.filter(recurrence_id=recurrence_id, state=JobState.PENDING).count()


def _locked_recurrences(raw_connect: Any) -> Any:
    """A session holding the recurrences table so that the planner's pick waits (until its rollback)."""
    holder = raw_connect()
    with holder.cursor() as cursor:
        cursor.execute("LOCK TABLE scheduling_recurrence IN EXCLUSIVE MODE")
    return holder


def _picks_waiting(run_sql: Any) -> int:
    """Planner picks waiting for a lock, by pg_stat_activity (whose text is the statement's first 1 KB)."""
    return run_sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND query LIKE %s",
        ["%The planner's pick%"],
    )[0][0]


def _planner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "timekeeper-planner"]


def _call_returns(duty: planner.Duty) -> bool:
    """Call the duty as the control loop's turn does, on a thread; whether the call came back within 5 s."""
    caller = threading.Thread(target=duty, daemon=True)
    caller.start()
    caller.join(5)
    return not caller.is_alive()


def test_the_turn_does_not_wait_for_a_pass_which_plans_once_the_pick_can_go_on(run_sql, raw_connect, duty):
    """The call returns while the pass waits on the lock; no occurrence until the lock goes, then exactly one."""
    recurrence_id = _plannable(run_sql)
    holder = _locked_recurrences(raw_connect)
    try:
        assert _call_returns(duty), "the turn waited for the planner's pass"
        support.wait_for(lambda: _picks_waiting(run_sql) == 1, timeout=10, message="the pick never waited")
        assert duty.running()
        assert (_pending(recurrence_id), duty.counters.passes) == (0, 0)
    finally:
        holder.rollback()
    support.wait_for(lambda: duty.counters.passes == 1, timeout=20, message="the pass never ended")
    assert (duty.counters.created, duty.counters.failed) == (1, 0)
    assert _pending(recurrence_id) == 1
    support.wait_for(lambda: not duty.running(), timeout=10)


def test_a_failed_pass_is_counted_and_a_later_call_plans(run_sql, raw_connect, duty, monkeypatch):
    """The pick's lock wait ends the pass with an error: counted, nothing planned; a later pass plans."""
    monkeypatch.setattr(planner, "LOCK_WAIT_SECONDS", 0.2)
    monkeypatch.setattr(planner, "ERROR_PAUSE_SECONDS", 0.0)
    recurrence_id = _plannable(run_sql)
    holder = _locked_recurrences(raw_connect)
    try:
        assert _call_returns(duty)
        support.wait_for(lambda: duty.counters.failed == 1, timeout=20, message="the pass did not fail")
        assert (_pending(recurrence_id), duty.counters.passes) == (0, 0)
    finally:
        holder.rollback()

    def planned() -> bool:
        duty()  # the control loop's next turns
        return duty.counters.passes == 1

    support.wait_for(planned, timeout=20, interval=0.05, message="no pass after the failed one")
    assert (duty.counters.created, duty.counters.failed) == (1, 1)
    assert _pending(recurrence_id) == 1


def test_a_stuck_pass_is_left_and_a_new_thread_plans_beside_it_once(run_sql, raw_connect, duty, monkeypatch):
    """Past STUCK_PASS_SECONDS the next call starts a second pass; when the lock goes, one occurrence is created."""
    monkeypatch.setattr(planner, "STUCK_PASS_SECONDS", 0.5)
    recurrence_id = _plannable(run_sql)
    holder = _locked_recurrences(raw_connect)
    try:
        assert _call_returns(duty)
        support.wait_for(lambda: _picks_waiting(run_sql) == 1, timeout=10, message="the first pick never waited")

        def abandoned() -> bool:
            duty()  # the turns go on; past the bound one of them starts a new thread
            return duty.counters.abandoned == 1

        support.wait_for(abandoned, timeout=20, interval=0.1, message="the stuck pass was never left")
        support.wait_for(lambda: _picks_waiting(run_sql) == 2, timeout=10, message="no second pass")
        assert duty.counters.abandoned == 1
        assert _pending(recurrence_id) == 0
    finally:
        holder.rollback()
    support.wait_for(lambda: duty.counters.passes == 2, timeout=20, message="the two passes never ended")
    assert (duty.counters.created, duty.counters.failed) == (1, 0)
    assert _pending(recurrence_id) == 1


def test_after_stop_the_turns_wake_no_pass_until_start(run_sql, duty, settings):
    """A stopping worker's last turns start no planner thread; start() lets them plan again."""
    settings.SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS = 0.05  # the turns below come after a pass is due
    first = _plannable(run_sql)
    duty()
    support.wait_for(lambda: duty.counters.passes == 1, timeout=20, message="the first pass never ended")
    duty.stop(timeout=10)
    support.wait_for(lambda: not _planner_threads(), timeout=10, message="the planner's thread did not end")
    second = _plannable(run_sql, key="duty:2")
    turns_until = time.monotonic() + 0.5  # ten plan intervals of turns
    while time.monotonic() < turns_until:
        duty()
        assert not _planner_threads(), "a turn after stop() started a planner thread"
        time.sleep(0.01)
    assert (duty.counters.passes, _pending(first), _pending(second)) == (1, 1, 0)
    duty.start()

    def planned() -> bool:
        duty()
        return duty.counters.passes == 2

    support.wait_for(planned, timeout=20, interval=0.05, message="no pass after start()")
    assert _pending(second) == 1
