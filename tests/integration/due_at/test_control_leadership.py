"""The control loop's lead across hosts: its session's bounds, a lock wait that must not cost the lead,
and the step-down of a leader whose broker cannot be reached (real PostgreSQL; a closed Redis port)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg2
import pytest
from celery import Celery
from django.db import connection

from scheduling import api, registry
from scheduling.core import broker, leadership, locks
from scheduling.due_at import control
from scheduling.models import JobState, ScheduledJob
from tests.e2e import private_services
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

registry.handler("test.capped_noop", schema={"type": "object"}, timeout=10)(lambda job: None)


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


def test_the_leaders_own_session_is_bounded_and_waits_for_a_lock_briefly(queue):
    """A turn gives the loop's Django session the vanished-client bounds and a lock wait shorter than the
    lead survives in silence (a leader that vanished mid-claim leaves no row lock for long)."""
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        loop.turn()
        assert _show("lock_timeout") == f"{control.LOCK_WAIT_SECONDS}s"
        assert _show("idle_in_transaction_session_timeout") == f"{locks.IDLE_IN_TRANSACTION_SECONDS}s"
        assert control.LOCK_WAIT_SECONDS + control.ERROR_PAUSE_SECONDS < control.LEAD_SILENCE_SECONDS
    finally:
        loop.leadership.resign()
        connection.close()


def test_a_leader_whose_claim_waits_on_a_lock_keeps_the_lead(queue, caplog):
    """A claim that waits on a capped kind's row lock (a vanished leader's open claim) longer than the
    lead's silence limit: the leader keeps its lock session, and claims the job once the lock is gone."""
    api.set_max_running("test.capped_noop", 5)
    job = api.schedule("test.capped_noop", {}, delay=0)
    holder = psycopg2.connect(**locks.default_database_parameters())  # unbounded, like an old client's
    with holder.cursor() as cur:  # what a leader cut off in the middle of its claim leaves behind
        cur.execute("SELECT kind FROM scheduling_kindcontrol WHERE max_running IS NOT NULL FOR UPDATE")
    loop = control.ControlLoop()
    caplog.set_level(logging.INFO, logger="scheduling")
    loop.start()
    try:
        wait_for(lambda: loop.leadership.leading, 10, message="the loop to lead")
        pid = loop.leadership.connection.get_backend_pid()
        time.sleep(control.LEAD_SILENCE_SECONDS + 4)  # longer than an idle lock session survives
        holder.rollback()
        wait_for(lambda: loop.counters.claimed == 1, 20, message="the job to be claimed once the lock is gone")
        assert ScheduledJob.objects.get(pk=job.id).state != JobState.PENDING
        assert loop.leadership.leading
        assert loop.leadership.connection.get_backend_pid() == pid, "the same lock session throughout"
        lost = [r for r in caplog.records if getattr(r, "action", "") in {"leader_lost", "stopped"}]
        assert not lost, "the lead was never lost"
    finally:
        holder.close()
        assert loop.stop()


def test_a_leader_that_cannot_reach_the_broker_steps_down_and_another_leads(caplog, monkeypatch):
    """With Redis unreachable from the leader (a closed port) and PostgreSQL fine, its sends fail; after
    BROKER_FAILURES_TO_STEP_DOWN turns it gives the lead up (logged, counted), gives its claims back,
    lets another process take the lead, and leads again after STEP_DOWN_HOLD_SECONDS when none did."""
    closed = f"redis://127.0.0.1:{private_services.free_port()}/0"
    monkeypatch.setenv("CELERY_BROKER_URL", closed)  # Celery's own variable wins over the settings
    unreachable = Celery("unreachable", set_as_current=False)
    unreachable.config_from_object("django.conf:settings", namespace="CELERY")
    unreachable.conf.broker_connection_timeout = 1
    job = api.schedule("test.capped_noop", {}, delay=0)
    loop = control.ControlLoop()
    caplog.set_level(logging.INFO, logger="scheduling")
    previous = broker.app()
    unreachable.set_current()
    other = leadership.Leadership(control.ROLE)
    try:
        assert loop.leadership.lead()
        for _ in range(control.BROKER_FAILURES_TO_STEP_DOWN):
            assert loop.leadership.leading
            loop.turn()
        assert not loop.leadership.leading, "stepped down"
        assert loop.counters.step_downs == 1
        assert [r for r in caplog.records if getattr(r, "action", "") == "stepped_down"]
        assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING, "its claims were given back"
        assert other.lead(), "another process takes the lead at once"
        other.resign()
        thread = threading.Thread(target=loop.run)
        thread.start()
        time.sleep(control.STANDBY_RETRY_SECONDS)
        assert not loop.leadership.leading, "the stepped-down loop holds off"
        wait_for(lambda: loop.leadership.leading, control.STEP_DOWN_HOLD_SECONDS + 5, message="the lead again")
        loop.stopping.set()
        thread.join(5)
    finally:
        previous.set_current()
        loop.leadership.resign()
        other.resign()
        connection.close()
