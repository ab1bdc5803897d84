"""Real browser flows for operating Timekeeper: pause a kind, retry a dead job, a live dashboard, phone width.

Screenshots: ``tests/artifacts/browser/<test>/``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduling import api
from scheduling.models import JobState, KindControl, ScheduledJob

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


def log_in(page: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("operator", "op@example.invalid", "op-password")
    page.goto("/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "op-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#timekeeper-dashboard")


def test_operator_pauses_and_resumes_a_kind(page, django_user_model):
    """The Kinds page pauses demo.noop (its due job counts as paused), caps it, then resumes it."""
    log_in(page, django_user_model)
    api.schedule("demo.noop", {}, delay=0)
    page.goto("/admin/scheduling/kindcontrol/")
    row = page.locator('tr[data-kind="demo.noop"]')
    row.locator("form.tk-pause button").click()
    page.wait_for_selector('tr[data-kind="demo.noop"][data-paused="true"]')
    assert "Paused demo.noop" in page.locator("ul.messagelist").inner_text()
    assert KindControl.objects.get(kind="demo.noop").paused
    page.shot("paused")
    page.locator('tr[data-kind="demo.noop"] input[name=max_running]').fill("2")
    page.locator('tr[data-kind="demo.noop"] form.tk-cap button').click()
    page.wait_for_selector("text=demo.noop: at most 2 running at once.")
    page.goto("/admin/")
    assert page.locator('[data-metric="paused"] .tk-value').inner_text().strip() == "1"
    page.shot("dashboard-paused")
    page.goto("/admin/scheduling/kindcontrol/")
    page.locator('tr[data-kind="demo.noop"] form.tk-pause button').click()
    page.wait_for_selector('tr[data-kind="demo.noop"][data-paused="false"]')
    assert KindControl.objects.get(kind="demo.noop").paused is False
    page.shot("resumed")


def test_operator_sets_and_lifts_a_kinds_rate(page, django_user_model):
    """The Kinds page's Set rate limits demo.noop to "5/2s per partner", shows it in the row, then lifts it."""
    log_in(page, django_user_model)
    page.goto("/admin/scheduling/kindcontrol/")
    field = page.locator('tr[data-kind="demo.noop"] form.tk-rate input[name=rate]')
    expect(field).to_have_value("")
    field.fill("5/2s per partner")
    page.locator('tr[data-kind="demo.noop"] form.tk-rate button').click()
    page.wait_for_selector("text=demo.noop: at most 5/2s per partner.")
    expect(page.locator('tr[data-kind="demo.noop"] form.tk-rate input[name=rate]')).to_have_value("5/2s per partner")
    row = KindControl.objects.get(kind="demo.noop")
    assert (row.rate_limit, row.rate_period_seconds, row.rate_partition_by) == (5, 2.0, "partner")
    # every control of every kind is on screen at 1,280 px: nothing scrolls sideways
    assert page.evaluate("document.scrollingElement.scrollWidth") <= page.evaluate("window.innerWidth")
    page.shot("rate-set")
    page.locator('tr[data-kind="demo.noop"] form.tk-rate input[name=rate]').fill("")
    page.locator('tr[data-kind="demo.noop"] form.tk-rate button').click()
    page.wait_for_selector("text=demo.noop: no rate limit.")
    expect(page.locator('tr[data-kind="demo.noop"] form.tk-rate input[name=rate]')).to_have_value("")
    assert KindControl.objects.get(kind="demo.noop").rate_limit is None
    page.shot("rate-lifted")


def test_operator_retries_a_dead_job_from_its_page(page, django_user_model):
    """A dead job's page has Retry and no Save; Retry makes it pending and says so."""
    log_in(page, django_user_model)
    job = api.schedule("demo.noop", {}, delay=3600)
    ScheduledJob.objects.filter(pk=job.id).update(state=JobState.DEAD, finished_at=timezone.now(), attempts=3)
    page.goto(f"/admin/scheduling/scheduledjob/{job.id}/change/")
    assert page.locator("input[name=_save]").count() == 0
    page.shot("dead-job")
    page.click('#job-actions button[value="retry"]')
    page.wait_for_selector("ul.messagelist li")
    assert "pending again" in page.locator("ul.messagelist").inner_text()
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING
    page.shot("retried")


def test_dashboard_shows_a_job_scheduled_after_the_page_loaded(page, django_user_model):
    """The dashboard's body refreshes itself: a job scheduled after load shows up without a reload."""
    log_in(page, django_user_model)
    assert page.locator('[data-metric="pending"] .tk-value').inner_text().strip() == "0"
    page.evaluate("window.__notReloaded = true")
    api.schedule("demo.record", {"label": "after load"}, delay=600)
    # A locator wait, not wait_for_function: a string predicate is eval'd in the page, which the CSP forbids.
    expect(page.locator('[data-metric="pending"] .tk-value')).to_have_text("1", timeout=30_000)
    assert page.evaluate("window.__notReloaded") is True
    page.shot("refreshed")


def test_dashboard_fits_a_phone(page, django_user_model):
    """At 420 px wide the admin index with the dashboard has no horizontal overflow."""
    page.set_viewport_size({"width": 420, "height": 900})
    log_in(page, django_user_model)
    api.schedule("demo.record", {"label": "a row"}, delay=600)
    page.goto("/admin/?range=24h")
    page.wait_for_selector("#tk-kinds")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 420
    page.shot("phone")
