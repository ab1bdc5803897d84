"""The leader's extra duties (the recurrence planner, the orphan pass) run on the control loop's duties
thread, beside its claims: a long pass never holds a claim (real PostgreSQL and Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import OperationalError, connection

from scheduling import api, registry
from scheduling.core import leadership
from scheduling.due_at import control
from scheduling.models import JobState, ScheduledJob
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

registry.handler("test.duties_noop", schema={"type": "object"}, timeout=10)(lambda job: None)


class Blocking:
    """A duty that records where it ran, then holds its pass until released (a planner pass of a spike)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(30)


def _with_duties(monkeypatch: pytest.MonkeyPatch, *duties: Callable[[], object]) -> None:
    monkeypatch.setattr(control, "EXTRA_DUTIES", list(duties))


def test_a_duty_that_takes_long_holds_no_claim(queue, monkeypatch):
    """While a duty's pass goes on, the leader claims a job that falls due: the pass runs on the duties
    thread, never in a turn (a turn that ran it waited for it, and claimed nothing meanwhile)."""
    duty = Blocking()
    _with_duties(monkeypatch, duty)
    loop = control.ControlLoop()
    loop.start()
    try:
        assert duty.entered.wait(20), "the leader offered the duty a pass"
        job = api.schedule("test.duties_noop", {}, delay=0)
        wait_for(lambda: loop.counters.claimed == 1, 20, message="the job to be claimed while the duty's pass goes on")
        assert not duty.release.is_set()
        assert duty.threads == ["timekeeper-duties"]
        assert ScheduledJob.objects.get(pk=job.id).state == JobState.CLAIMED
    finally:
        duty.release.set()
        assert loop.stop()
    assert not loop.thread.is_alive()
    assert not loop.duties_thread.is_alive()


def test_duties_run_only_while_this_process_leads(queue, monkeypatch):
    """A standby offers no duty a pass; once it leads (the other leader resigned), it does."""
    calls: list[str] = []
    _with_duties(monkeypatch, lambda: calls.append(threading.current_thread().name))
    other = leadership.Leadership(control.ROLE, silence_seconds=control.LEAD_SILENCE_SECONDS)
    assert other.lead()
    loop = control.ControlLoop()
    loop.start()
    try:
        # The standby has tried for the lead (its thread is alive and did not lead) and its duties thread
        # has waited: it offered nothing.
        wait_for(lambda: loop.thread.is_alive() and loop.duties_thread.is_alive(), 10, message="both threads")
        assert loop.stopping.wait(3 * control.STANDBY_RETRY_SECONDS) is False
        assert not loop.leadership.leading
        assert calls == []
        assert loop.counters.duty_rounds == 0
        other.resign()
        wait_for(lambda: len(calls) >= 2, 20, message="the new leader to offer its duty passes")
        assert set(calls) == {"timekeeper-duties"}
        assert loop.counters.duty_rounds >= 2
    finally:
        other.resign()
        assert loop.stop()


@pytest.mark.parametrize(
    "error",
    [OperationalError("the duty's session was lost"), KeyError("a bug in a duty")],
    ids=["database", "other"],
)
def test_a_duty_that_raises_is_offered_a_pass_again_on_a_new_session_and_the_claims_go_on(queue, monkeypatch, error):
    """A duty that raises (a lost session, or a bug outside the database): the duties thread closes its
    session, pauses and offers the pass again; it never ends (a leader whose duties thread died kept the
    lead and planned nothing), and the claims, on the loop's own thread, never stopped."""
    sessions: list[int] = []

    def flaky() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            sessions.append(cursor.fetchone()[0])
        if len(sessions) == 1:
            raise error

    _with_duties(monkeypatch, flaky)
    loop = control.ControlLoop()
    loop.start()
    try:
        wait_for(lambda: len(sessions) >= 2, 20, message="the duty to be offered a pass after its failure")
        assert sessions[1] != sessions[0], "the failed pass's session was closed"
        assert loop.duties_thread.is_alive()
        api.schedule("test.duties_noop", {}, delay=0)
        wait_for(lambda: loop.counters.claimed == 1, 20, message="the job to be claimed")
    finally:
        assert loop.stop()


def test_a_duty_that_keeps_failing_skips_no_other_and_its_rounds_go_on(queue, monkeypatch):
    """One duty fails on every pass: the next duty still gets its passes, and the rounds (what the liveness
    watcher looks at) go on, so a leader is not restarted for an error a restart would not mend."""
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise ValueError("a duty that fails every time")

    _with_duties(monkeypatch, broken, lambda: calls.append("other"))
    loop = control.ControlLoop()
    loop.start()
    try:
        wait_for(lambda: calls.count("other") >= 2, 20, message="the other duty's passes")
        assert calls.count("broken") >= 2
        assert loop.counters.duty_rounds >= 2
    finally:
        assert loop.stop()


def test_a_start_after_a_stop_that_timed_out_waits_for_the_old_threads_then_runs_new_ones(queue, monkeypatch):
    """stop() gave up while a duty's pass went on; start() again waits for the old threads to end (two loop
    threads would share one leadership session), then runs new ones, which lead and offer passes."""
    duty = Blocking()
    _with_duties(monkeypatch, duty)
    loop = control.ControlLoop()
    loop.start()
    try:
        assert duty.entered.wait(20)
        assert loop.stop(timeout=0.2) is False, "the pass goes on past the stop's wait"
        old = [loop.thread, loop.duties_thread]
        threading.Timer(0.5, duty.release.set).start()  # the pass ends while start() waits
        assert old[1].is_alive(), "the old duties thread is still in its pass when start() is called"
        assert loop.start() is True
        assert not any(thread.is_alive() for thread in old)
        assert loop.thread not in old
        assert loop.duties_thread not in old
        rounds = loop.counters.duty_rounds
        wait_for(lambda: loop.counters.duty_rounds > rounds, 20, message="the new duties thread's rounds")
        assert loop.duties_thread.is_alive()
    finally:
        duty.release.set()
        assert loop.stop()


def test_a_start_with_one_of_the_two_threads_gone_runs_both_anew(queue, monkeypatch):
    """The duties thread ended (the loop thread still runs): start() stops the survivor and runs both anew,
    not only the one that is missing (and not nothing, as when it saw a thread alive and returned)."""
    calls: list[str] = []
    _with_duties(monkeypatch, lambda: calls.append(threading.current_thread().name))
    loop = control.ControlLoop()
    loop.start()
    try:
        wait_for(lambda: calls, 20, message="a first duty pass")
        survivor = loop.thread
        gone = threading.Thread(target=lambda: None)
        gone.start()
        gone.join()
        loop.duties_thread = gone  # as if the duties thread had ended
        assert loop.start() is True
        assert not survivor.is_alive()
        assert loop.thread is not survivor
        assert loop.duties_thread is not gone
        assert loop.duties_thread.is_alive()
        before = len(calls)
        wait_for(lambda: len(calls) > before, 20, message="the new duties thread's passes")
    finally:
        assert loop.stop()


def _session_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] == 1


def test_a_leader_that_lost_the_lead_closes_its_duties_session(queue, monkeypatch):
    """The leader's lock session dies and another process takes the lead: the old leader's duties thread
    closes the session its duties used (a standby holds no duties session; every worker of a fleet held
    one before, twice the leader's share of connections)."""
    sessions: list[int] = []

    def duty() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            sessions.append(cursor.fetchone()[0])

    _with_duties(monkeypatch, duty)
    other = leadership.Leadership(control.ROLE, silence_seconds=control.LEAD_SILENCE_SECONDS)
    loop = control.ControlLoop()
    loop.start()
    try:
        wait_for(lambda: sessions, 20, message="a first duty pass")
        duty_session = sessions[-1]
        assert _session_alive(duty_session)
        # Once it sees its lead gone the loop tries again at once; held off (as after a step-down), it
        # leaves the lock to the other process, which takes it.
        monkeypatch.setattr(loop, "_hold_until", time.monotonic() + 60)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [loop.leadership.connection.get_backend_pid()])
        wait_for(other.lead, 20, message="the other process to take the lead")
        wait_for(lambda: not loop.leadership.leading, 20, message="the old leader to see its lead gone")
        wait_for(lambda: not _session_alive(duty_session), 20, message="the standby to close its duties session")
        passes = len(sessions)
        assert loop.stopping.wait(3 * control.STANDBY_RETRY_SECONDS) is False
        assert len(sessions) == passes, "a standby offers no pass"
        assert loop.duties_thread.is_alive()
    finally:
        other.resign()
        assert loop.stop()
