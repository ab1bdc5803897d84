"""Rate limits end to end: two worker processes, and a second claimer beside the leader, never exceed a kind's rate."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from scheduling import api, registry
from scheduling.due_at import claim
from scheduling.models import JobState, KindRate, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]


def test_two_workers_and_a_second_claimer_start_exactly_the_rate(cluster):
    """Rate 6 an hour, 20 due: two workers (one leading the claim) and this process claiming too run exactly 6."""
    api.set_rate("demo.record", registry.Rate(6, per_seconds=3600))
    ids = list(api.schedule_many("demo.record", [{"label": f"r{i}"} for i in range(20)], delay=0))
    others = list(api.schedule_many("demo.noop", [{}] * 10, delay=0))
    stop, claimed_here = threading.Event(), []

    def second_claimer() -> None:
        try:
            while not stop.is_set():
                claimed_here.append(claim.claim_and_dispatch().claimed)
        finally:
            connection.close()

    first, second = cluster.worker("w1"), cluster.worker("w2")
    wait_ready(first)
    wait_ready(second)
    thread = threading.Thread(target=second_claimer)
    thread.start()
    try:
        wait_for(lambda: Execution.objects.filter(kind="demo.record").count() >= 6, 60, message="six starts")
        wait_for(
            lambda: ScheduledJob.objects.filter(id__in=others, state=JobState.DONE).count() == 10,
            60,
            message="the other kind's jobs to run beside the limited one",
        )
    finally:
        stop.set()
        thread.join(30)
    assert Execution.objects.filter(kind="demo.record").count() == 6
    # each handler started on a start permit its worker process took (due_at/starts.py)
    assert len(KindRate.objects.get(kind="demo.record", partition="").handler_starts) == 6
    assert ScheduledJob.objects.filter(id__in=ids, state=JobState.PENDING).count() == 14
    assert api.status(include_broker=False)["rate_limited"] == 14
