"""Recurrences with real workers: a crash mid-occurrence reruns that occurrence and plans the next exactly once."""

from __future__ import annotations

import datetime as dt
import os
import signal

import pytest

from scheduling import api
from scheduling.core import store
from scheduling.models import CLAIM_STATES, AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import Cluster, wait_for, wait_ready
from tests.faultkit.kinds import handlers as fault_kinds  # registers the test kinds in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAST = {
    "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings",
    "SCHEDULING_HEARTBEAT_SECONDS": "1",
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1",
    "SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS": "0.5",
}


def _occurrences(recurrence_id: int) -> list[ScheduledJob]:
    return list(ScheduledJob.objects.filter(recurrence_id=recurrence_id).order_by("occurrence_at", "id"))


def test_kill_9_mid_occurrence_reruns_it_and_plans_the_next_once(cluster: Cluster):
    """kill -9 of the pool process running an occurrence: it runs again, and its successor exists exactly once."""
    assert fault_kinds.EFFECT_LEASE_SECONDS < 10
    worker = cluster.worker("w1", concurrency=2, env=FAST)
    cluster.beat(env=FAST)
    wait_ready(worker)
    starts = store.database_now() + dt.timedelta(seconds=2)
    rec = api.recur("faults.effect", {"hold": 30}, key="crash", every=3600, starts_at=starts)
    (first,) = _occurrences(rec.id)
    assert first.occurrence_at == starts

    started = wait_for(
        lambda: list(Execution.objects.filter(idempotency_key=f"job:{first.id}")), 30, message="the occurrence to start"
    )[0]
    assert started.pid in worker.children(), "the occurrence runs in one of this worker's pool processes"
    wait_for(lambda: len(_occurrences(rec.id)) == 2, 15, message="the planner to create the next occurrence")
    os.kill(started.pid, signal.SIGKILL)

    wait_for(
        lambda: ScheduledJob.objects.get(pk=first.id).state == JobState.DONE, 45, message="the occurrence to rerun"
    )
    outcomes = list(JobAttempt.objects.filter(job_id=first.id).order_by("number").values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED], "killed, reclaimed, run again once"
    assert Execution.objects.filter(idempotency_key=f"job:{first.id}").count() == 2
    jobs = _occurrences(rec.id)
    assert len(jobs) == 2, "the next occurrence was created once, not again after the rerun"
    assert jobs[1].occurrence_at == starts + dt.timedelta(hours=1)
    assert jobs[1].state == JobState.PENDING
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()
