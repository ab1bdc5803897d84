"""Recurrences with real workers: a crash mid-occurrence reruns that occurrence and plans the next exactly once.

The next occurrence waits for the running one to finish (one live occurrence per recurrence, its
retries and reruns included).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time

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
    """kill -9 of the pool process running an occurrence: it runs again, then its successor is planned exactly once."""
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
    assert len(_occurrences(rec.id)) == 1, "no successor while the occurrence runs (it may come back)"
    os.kill(started.pid, signal.SIGKILL)

    wait_for(
        lambda: ScheduledJob.objects.get(pk=first.id).state == JobState.DONE, 45, message="the occurrence to rerun"
    )
    outcomes = list(JobAttempt.objects.filter(job_id=first.id).order_by("number").values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED], "killed, reclaimed, run again once"
    assert Execution.objects.filter(idempotency_key=f"job:{first.id}").count() == 2
    wait_for(lambda: len(_occurrences(rec.id)) == 2, 15, message="the planner to create the next occurrence")
    jobs = _occurrences(rec.id)
    assert len(jobs) == 2, "the next occurrence was created once"
    assert jobs[1].occurrence_at == starts + dt.timedelta(hours=1)
    assert jobs[1].state == JobState.PENDING
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()


def test_a_failed_occurrences_retry_is_the_one_live_occurrence_and_cancel_stops_it(cluster: Cluster):
    """every=2 s, occurrences failing once with a 20 s backoff: never two live occurrences; cancel stops the retry."""
    worker = cluster.worker("w1", concurrency=2, env=FAST)
    wait_ready(worker)
    rec = api.recur("faults.fail_first", {"hold": 2}, key="flaky", every=2)  # the planner sees it running
    live = ScheduledJob.objects.filter(recurrence_id=rec.id, state__in=[JobState.PENDING, *CLAIM_STATES])
    retry = wait_for(
        lambda: list(live.filter(state=JobState.PENDING, attempts=1)), 30, message="the first occurrence's retry"
    )[0]
    counts = []
    for _ in range(12):  # six planner intervals of the rule while the retry waits out its backoff
        counts.append(live.count())
        time.sleep(0.5)
    assert counts == [1] * len(counts), "the retry is the recurrence's one live occurrence: nothing planned beside it"
    api.cancel_recurrence(rec.id)
    retry.refresh_from_db()
    assert retry.state == JobState.CANCELLED
    assert not live.exists()
