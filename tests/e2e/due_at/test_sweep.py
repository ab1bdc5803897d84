"""The sweeper against real workers: a run message a worker holds, or that waits in its routed queue, is not lost.

A claim never started is taken back only when its message is lost with the broker
(``scheduling/due_at/sweep.py``, ``core/holdings.claim_ids_in_flight``). Here the messages are
not lost: a worker with Celery's default ``--prefetch-multiplier 4`` holds several while it runs
one, or ``scheduling.run_batch`` is routed to a queue of its own. Jobs allow one attempt, so a
claim taken for lost would end its job dead without running.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from django.conf import settings

from scheduling import api
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import Cluster, wait_ready
from tests.faultkit import routed_settings
from tests.faultkit.kinds import handlers  # noqa: F401 - registers the test kinds in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAST = {
    "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings",
    "SCHEDULING_HEARTBEAT_SECONDS": "1",
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1",
    "CELERY_BROKER_RESTORE_INTERVAL_SECONDS": "1",
}
ROUTED = {**FAST, "DJANGO_SETTINGS_MODULE": "tests.faultkit.routed_settings"}
FINAL = (JobState.DONE, JobState.DEAD, JobState.CANCELLED)


def _schedule(count: int, hold: float) -> list[int]:
    """``count`` jobs of ``faults.effect`` holding ``hold`` s, each allowed one attempt (a false loss kills it)."""
    return [api.schedule("faults.effect", {"hold": hold}, delay=0, max_attempts=1).id for _ in range(count)]


def _wait_finished(ids: list[int], timeout: float, sample: Callable[[], int]) -> list[int]:
    """Wait until every job is final, calling ``sample()`` about every 0.2 s; the samples."""
    samples: list[int] = []
    deadline = time.monotonic() + timeout
    while ScheduledJob.objects.filter(id__in=ids).exclude(state__in=FINAL).exists():
        assert time.monotonic() < deadline, "the jobs did not finish in time"
        samples.append(sample())
        time.sleep(0.2)
    return samples


def _assert_each_ran_once(ids: list[int]) -> None:
    jobs = {job.id: job for job in ScheduledJob.objects.filter(id__in=ids)}
    dead = {i: jobs[i].last_error for i in ids if jobs[i].state != JobState.DONE}
    assert not dead, f"jobs taken for lost: {dead}"
    for job_id in ids:
        outcomes = list(JobAttempt.objects.filter(job_id=job_id).values_list("outcome", flat=True))
        assert outcomes == [AttemptOutcome.SUCCEEDED], f"job {job_id}: one attempt, not taken back"
        assert Execution.objects.filter(idempotency_key=f"job:{job_id}").count() == 1


def _held_messages(broker_client: redis.Redis) -> int:
    """Messages workers hold unacknowledged (kombu's ``unacked`` hash): running or prefetched."""
    return int(broker_client.hlen(f"{settings.CELERY_BROKER_KEYPREFIX}unacked"))


@pytest.mark.parametrize("concurrency", [1, 2])
def test_messages_a_worker_prefetched_are_not_taken_for_lost(cluster: Cluster, broker, concurrency):
    """--prefetch-multiplier 4, 6 jobs of 7 s, concurrency 1 or 2: each runs once; none dies unrun while held."""
    worker = cluster.worker("w1", concurrency=concurrency, args=["--prefetch-multiplier", "4"], env=FAST)
    wait_ready(worker)
    ids = _schedule(6, 7)
    held = _wait_finished(ids, 120, lambda: _held_messages(broker))
    _assert_each_ran_once(ids)
    print(f"\nmessages held by the worker at once: at most {max(held)} (concurrency {concurrency})")
    assert max(held) > concurrency, "the worker held prefetched run messages beyond those it ran (the case under test)"


def test_messages_routed_to_their_own_queue_are_not_taken_for_lost(cluster: Cluster, broker):
    """run_batch routed by CELERY_TASK_ROUTES to its own queue: every job runs once; none is taken for lost."""
    worker = cluster.worker("w1", concurrency=2, env=ROUTED)
    wait_ready(worker)
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{routed_settings.BATCH_QUEUE}"
    ids = _schedule(12, 2)
    queued = _wait_finished(ids, 120, lambda: broker.llen(key))
    _assert_each_ran_once(ids)
    # The claim's bound (SCHEDULING_MAX_QUEUED_BATCHES) reads the default queue: reported, not asserted here.
    print(f"\nrouted queue: at most {max(queued)} messages waiting (the claim's bound: 4)")
    assert max(queued) > 0, "run messages went through the routed queue (the case under test)"
    assert broker.llen(f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}") == 0
