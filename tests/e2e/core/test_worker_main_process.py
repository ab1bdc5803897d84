"""The worker's main process, the one that claims and dispatches, keeps its heap small.

Two causes of its long garbage collections, each a pause of the claim and the dispatch, found by
``python -m bench soak`` (bench/README.md): Django's and Celery's startup objects walked by every
full collection (``scheduling.tasks.freeze_what_startup_built``), and the time limits of finished
tasks kept in the event loop's timer until their due time (``scheduling.core.worker_timers``).
"""

from __future__ import annotations

import re

import pytest

from scheduling import api
from scheduling.core import worker_timers
from scheduling.models import JobState, ScheduledJob
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]

JOBS = 300  # demo.sleep: batches of one, each message with a hard limit of 32 s (2 s timeout + 30)


def test_a_ready_worker_has_frozen_its_startup_objects(cluster):
    """The worker logs how many objects it froze once ready: the whole of its startup, not a handful."""
    worker = cluster.worker()
    wait_ready(worker)
    wait_for(lambda: "startup objects frozen" in worker.log(), 30, message="the freeze to be logged")
    counts = [int(n) for n in re.findall(r"startup objects frozen: (\d+)", worker.log())]
    assert len(counts) == 1, "once, in the main process (not in each pool process)"
    assert counts[0] > 50_000, counts


def _dropped(log: str) -> int:
    return sum(int(n) for n in re.findall(r"timer compacted: (\d+) cancelled entries dropped", log))


def test_the_time_limits_of_finished_batches_leave_the_timer_before_their_due_time(cluster):
    """300 batches, each with a 32 s hard limit, finish in seconds: their cancelled limits are dropped
    from the event loop's timer within the compaction interval, long before they would fall due (all
    but fewer than ``MIN_CANCELLED``: a compaction may run midway, and it waits for that many)."""
    worker = cluster.worker()
    wait_ready(worker)
    ids = [api.schedule("demo.sleep", {"seconds": 0}, delay=0).id for _ in range(JOBS)]
    wait_for(
        lambda: ScheduledJob.objects.filter(id__in=ids, state=JobState.DONE).count() == JOBS,
        60,
        message="the jobs to run",
    )
    enough = JOBS - worker_timers.MIN_CANCELLED + 1
    wait_for(lambda: _dropped(worker.log()) >= enough, 25, message="the finished batches' limits to be dropped")
