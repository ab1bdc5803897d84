"""An operator aborts a running job in a real browser: the job page's button, the confirmation, a real worker stops it.

Headless Chromium against the live server and a real Celery worker (heartbeat 1 s) running a
handler that would sleep two minutes. Screenshots: ``tests/artifacts/browser/<test>/``.
"""

from __future__ import annotations

import time

import pytest

from scheduling import api
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tests.browser.test_audit_trail import JOBS, log_in
from tests.e2e import harness
from tests.faultkit.kinds import abort as abort_kinds  # registers the test kinds in this process

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

ENV = {"DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings", "SCHEDULING_HEARTBEAT_SECONDS": "1"}


def test_abort_job_on_a_running_jobs_page_stops_it_on_its_worker(page, django_user_model, workers):
    """Abort job asks first; confirmed, the worker interrupts the handler; the page shows who aborted it."""
    worker = workers.worker(concurrency=2, env=ENV)
    workers.beat(env=ENV)
    harness.wait_ready(worker, timeout=120)
    job = api.schedule("faults.abort_atomic", {}, delay=0)
    harness.wait_for(lambda: ScheduledJob.objects.get(pk=job.pk).state == JobState.RUNNING, 60, message="it to run")
    log_in(page, django_user_model)
    page.goto(f"{JOBS}{job.pk}/change/")
    page.click('button[value="abort"]')
    page.wait_for_selector("#confirm-form")
    page.shot("confirm-abort")
    page.click("#confirm-form input[type=submit]")
    page.wait_for_selector("ul.messagelist li")
    assert "Aborted 1 job" in page.inner_text("ul.messagelist")
    deadline = time.monotonic() + abort_kinds.HOLD_SECONDS / 2
    while ScheduledJob.objects.get(pk=job.pk).state != JobState.CANCELLED:
        assert time.monotonic() < deadline, "the worker never stopped the handler"
        time.sleep(0.2)
    page.reload()
    body = page.inner_text("body")
    assert "aborted by ops-anna at " in body
    assert JobAttempt.objects.get(job_id=job.pk).outcome == AttemptOutcome.ABORTED
    page.shot("job-aborted")
