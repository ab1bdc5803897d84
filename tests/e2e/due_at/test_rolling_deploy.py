"""A rolling deploy: workers of the old release (the leader among them) meet a kind only the new release has.

The old release is the project's settings; the new one adds the test kinds of ``tests.faultkit.kinds``
(``faults.new_release``, one attempt). What must hold (docs/operations.md, "Rolling deploys"): no job
of the new kind is charged an attempt by an old worker (it is given back, uncharged, and runs on a new
one), the old leader never pauses a recurrence of it (it leaves it to a leader that knows the kind),
and it sends its batches without a time limit it cannot know.
"""

from __future__ import annotations

import json
import time

import pytest
from django.conf import settings

from scheduling import api
from scheduling.core import broker as core_broker
from scheduling.core import holdings as core_holdings
from scheduling.models import AttemptOutcome, JobAttempt, JobState, Recurrence, RecurrenceState, ScheduledJob
from tests.e2e.harness import wait_for, wait_ready
from tests.faultkit.kinds import handlers as fault_kinds  # noqa: F401 - registers the new kind in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OLD = {"SCHEDULING_HEARTBEAT_SECONDS": "1", "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1"}
NEW = {**OLD, "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings"}
KIND = "faults.new_release"


def _done(job_ids: list[int]) -> bool:
    return ScheduledJob.objects.filter(pk__in=job_ids, state=JobState.DONE).count() == len(job_ids)


def test_an_old_release_charges_no_attempt_and_pauses_nothing(cluster):
    """Old leader and worker: a new kind's job is given back uncharged, its recurrence stays active; both run later."""
    leader = cluster.worker("old-leader", args=["-Q", "elsewhere"], env=OLD)  # leads, runs no batch
    wait_ready(leader)
    old = cluster.worker("old", env=OLD)
    wait_ready(old)
    job = api.schedule(KIND, {}, delay=0)
    recurrence = api.recur(KIND, {}, key="rolling", every=2)
    first = ScheduledJob.objects.get(recurrence_id=recurrence.id)
    wait_for(
        lambda: ScheduledJob.objects.get(pk=job.id).last_error != "",
        30,
        message=f"the old worker to be handed the new kind ({old.log_path})",
    )
    given_back = ScheduledJob.objects.get(pk=job.id)
    assert (given_back.state, given_back.attempts) == (JobState.PENDING, 0), given_back.last_error
    assert not JobAttempt.objects.filter(job_id=job.id).exists()

    old.stop()  # the deploy replaces the old worker by a new one; the old leader leads still
    new = cluster.worker("new", env=NEW)
    wait_ready(new)
    wait_for(lambda: _done([job.id, first.id]), 60, message=f"the new worker to run the new kind ({new.log_path})")
    time.sleep(3)  # a negative: the old leader's planner passes (1 s apart) see the recurrence and leave it be
    assert Recurrence.objects.get(pk=recurrence.id).state == RecurrenceState.ACTIVE

    leader.stop()  # the deploy ends: the new worker leads and plans the next occurrence
    wait_for(
        lambda: ScheduledJob.objects.filter(recurrence_id=recurrence.id, state=JobState.DONE).count() >= 2,
        60,
        message=f"the new leader to plan and run the next occurrence ({new.log_path})",
    )
    assert Recurrence.objects.get(pk=recurrence.id).state == RecurrenceState.ACTIVE
    (attempt,) = JobAttempt.objects.filter(job_id=job.id)
    assert (attempt.number, attempt.outcome) == (1, AttemptOutcome.SUCCEEDED)


def _queued_batches(client) -> list[dict]:
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{core_broker.default_queue()}"
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def test_an_old_leader_sends_a_new_kind_without_a_time_limit(cluster, broker):
    """A leader that does not know a kind sends its batch with no hard time limit (a guessed one killed 120 s jobs)."""
    old = cluster.worker("old", args=["-Q", "elsewhere"], env=OLD)  # it leads, and leaves the batch queued
    wait_ready(old)
    # The default queue needs a live worker, or the claim gives it no room (per-queue back-pressure).
    # A real one would take the batch (even stopped: Redis hands a blocked BRPOP the message), so a
    # presence that says a worker serves it, written as a worker writes its own, stands in for one.
    presence = core_holdings._key(core_holdings.PRESENCE_KEY.format(id="standby"))
    holders = core_holdings._key(core_holdings.HOLDERS_KEY)
    broker.sadd(holders, "standby")
    broker.set(presence, json.dumps({"pid": 0, "at": time.time(), "queues": [core_broker.default_queue()]}), ex=120)
    try:
        job = api.schedule(KIND, {}, delay=0)
        (message,) = wait_for(lambda: _queued_batches(broker), 30, message=f"the old leader's batch ({old.log_path})")
        assert message["headers"]["task"] == "scheduling.run_batch"
        assert message["headers"]["timelimit"] == [None, None]
        assert ScheduledJob.objects.get(pk=job.id).state == JobState.CLAIMED
    finally:
        broker.delete(presence)
        broker.srem(holders, "standby")
