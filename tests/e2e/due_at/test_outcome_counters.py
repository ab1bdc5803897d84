"""The ``*_total`` counters across a worker restart: a new worker process carries on from the stored counts."""

from __future__ import annotations

import signal

import pytest
from django.test import Client

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from tests.e2e.harness import wait_for, wait_ready
from tests.integration.web.test_metrics import scrape

pytestmark = [pytest.mark.e2e]

DONE = (("kind", "demo.record"), ("outcome", "done"))


def finished(client: Client) -> float:
    return scrape(client).get("timekeeper_jobs_finished_total", {}).get(DONE, 0.0)


def run_jobs(n: int, label: str) -> None:
    ids = api.schedule_many("demo.record", [{"label": f"{label}-{i}"} for i in range(n)], delay=0)
    wait_for(lambda: ScheduledJob.objects.filter(pk__in=ids, state=JobState.DONE).count() == n, 90, 0.5,
             message=f"{label}: every job to run")  # fmt: skip


def test_counters_carry_on_across_a_killed_and_restarted_worker(cluster):
    """20 jobs, the worker kill -9ed, a new worker runs 30 more: jobs_finished_total reads 20 then 50."""
    client = Client()
    worker = cluster.worker("w1")
    wait_ready(worker)
    run_jobs(20, "before")
    assert finished(client) == 20
    worker.signal(signal.SIGKILL)
    worker.popen.wait(30)
    assert finished(client) == 20, "the count is in the database, not in the dead process"
    restarted = cluster.worker("w2")
    wait_ready(restarted)
    run_jobs(30, "after")
    assert finished(client) == 50
