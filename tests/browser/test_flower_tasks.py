"""Flower's task list in a real browser after a failing job: the kind's name, FAILURE and RETRY, as in the admin.

A real worker and a real Flower (started as ``dev.py run`` starts it), Chromium logged in to Flower
with basic auth. Screenshots: ``tests/artifacts/browser/<test>/`` (git-ignored).
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from tests.browser.conftest import TIMEOUT_MS, Shots
from tests.e2e import harness
from tests.e2e.project import test_flower as flower

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


def test_flower_lists_a_failing_job_as_failure_under_its_kind(page, chromium, workers, request):
    """After demo.fail dies, Flower's Tasks page lists its attempts as demo.fail FAILURE and RETRY, by job id."""
    _, base = flower.start_flower(workers)
    worker = workers.worker(concurrency=1)
    harness.wait_for(lambda: "ready" in worker.log(), timeout=90, message="the worker did not start")
    job = api.schedule("demo.fail", {}, delay=0)
    api.schedule("demo.record", {"label": "fine"}, delay=0)

    def dead() -> list[dict[str, Any]]:
        return [t for t in flower.flower_tasks(base).values() if t.get("state") == "FAILURE"]

    harness.wait_for(dead, timeout=90, message="Flower never showed the failure")
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD  # the admin agrees

    context = chromium.new_context(
        http_credentials={"username": flower.USER, "password": flower.PASSWORD},
        viewport={"width": 1280, "height": 900},
    )
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    shot = Shots(tab, harness.ARTIFACTS / "browser" / request.node.name)
    try:
        tab.goto(f"{base}/tasks")
        tab.wait_for_selector("#tasks-table tbody tr td")
        harness.wait_for(lambda: "FAILURE" in tab.inner_text("#tasks-table"), 30, message="the FAILURE row")
        table = tab.inner_text("#tasks-table")
        assert "demo.fail" in table
        assert "RETRY" in table
        assert "SUCCESS" in table
        assert f"job-{job.id}-3-" in table  # the attempt's task id: search Flower for job-<id>
        shot("flower-tasks")
        tab.goto(f"{base}/task/job-{job.id}-3-" + _batch_suffix(base, job.id))
        tab.wait_for_selector("text=FAILURE")
        assert "DemoFailure" in tab.inner_text("body")
        shot("flower-failed-attempt")
    finally:
        context.close()


def _batch_suffix(base: str, job_id: int) -> str:
    (task_id,) = [t for t in flower.flower_tasks(base) if t.startswith(f"job-{job_id}-3-")]
    return task_id.rsplit("-", 1)[1]
