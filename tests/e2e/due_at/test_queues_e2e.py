"""Named queues end to end: a worker per queue, and a queue without workers whose due jobs wait and are reported."""

from __future__ import annotations

import pytest

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]


def _done(ids: list[int]) -> int:
    return ScheduledJob.objects.filter(id__in=ids, state=JobState.DONE).count()


def test_a_worker_per_queue_and_a_queue_without_workers(cluster):
    """Default jobs run beside an unserved exports queue (waiting, reported); a -Q exports worker then runs them."""
    default_worker = cluster.worker("w1")
    wait_ready(default_worker)
    exports = list(api.schedule_many("demo.export", [{"label": f"e{i}"} for i in range(5)], delay=0))
    records = list(api.schedule_many("demo.record", [{"label": f"r{i}"} for i in range(5)], delay=0))
    wait_for(lambda: _done(records) == 5, 60, message="the default queue's jobs to run")
    wait_for(lambda: api.status()["queues_without_workers"] == ["exports"], 30, message="exports reported unserved")
    assert ScheduledJob.objects.filter(id__in=exports, state=JobState.PENDING).count() == 5, "nothing runs them"
    more = list(api.schedule_many("demo.record", [{"label": f"s{i}"} for i in range(5)], delay=0))
    wait_for(lambda: _done(more) == 5, 60, message="the default queue unaffected by the unserved one")
    exports_worker = cluster.worker("x1", args=["-Q", "exports"])
    wait_ready(exports_worker)
    wait_for(lambda: _done(exports) == 5, 60, message="the exports worker to run the waiting exports")
    assert "demo.export" in exports_worker.log()
    assert "demo.export" not in default_worker.log()
    assert api.status()["queues_without_workers"] == []
