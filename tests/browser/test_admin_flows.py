"""Real browser flows: an operator in the admin, and a customer going through the trial pages.

Headless Debian Chromium driven by Playwright against the live server, with a real Celery worker
where a flow needs one (a fixed-time "run now"). Screenshots: ``tests/artifacts/browser/<test>/``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from scheduling.models import JobState, ScheduledJob, SchedulePolicy
from tasks.models import Trial
from tests.e2e import harness

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


def card(page: Any, metric: str) -> str:
    """A number on the admin dashboard."""
    return page.locator(f'[data-metric="{metric}"] .tk-value').inner_text().strip()


def messages(page: Any) -> list[str]:
    """The admin's messages on the page the last action led to (waits for them)."""
    page.wait_for_selector("ul.messagelist li")
    return [m.strip() for m in page.locator("ul.messagelist li").all_inner_texts()]


def add_job(page: Any, label: str, delay: int) -> None:
    page.goto("/admin/scheduling/scheduledjob/add/")
    page.select_option("#id_kind", "demo.record")
    page.fill("#id_payload", json.dumps({"label": label}))
    page.fill("#id_delay_seconds", str(delay))
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/scheduling/scheduledjob/")


def run_action(page: Any, job_ids: list[int], action: str) -> None:
    page.goto("/admin/scheduling/scheduledjob/")
    for job_id in job_ids:
        page.check(f'input[name="_selected_action"][value="{job_id}"]')
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_operator_schedules_cancels_reschedules_and_runs_a_schedule_now(page, django_user_model, workers):
    """Log in, add two jobs, cancel one, reschedule the other, run a fixed schedule now; the dashboard follows."""
    django_user_model.objects.create_superuser("operator", "op@example.invalid", "op-password")
    crontab = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Lisbon")
    schedule = PeriodicTask.objects.create(
        name="browser-nightly",
        task="scheduling.run_fixed",
        kwargs=json.dumps({"schedule": "browser-nightly"}),
        crontab=crontab,
    )
    SchedulePolicy.objects.create(periodic_task=schedule, kind="demo.record", payload={"label": "nightly"})
    worker = workers.worker(concurrency=1)

    page.goto("/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "op-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#timekeeper-dashboard")
    assert (card(page, "pending"), card(page, "backlog")) == ("0", "0")
    page.shot("dashboard-empty")

    add_job(page, "to cancel", 3600)
    add_job(page, "to move", 7200)
    cancel_id, move_id = ScheduledJob.objects.order_by("id").values_list("id", flat=True)
    page.shot("two-jobs")
    page.goto("/admin/")
    assert card(page, "pending") == "2"
    assert "demo.record" in page.locator('[data-mechanism="due_at"]').first.inner_text()
    page.shot("dashboard-two-pending")

    run_action(page, [cancel_id], "cancel_selected")
    assert messages(page) == ["Cancelled 1 job."]
    page.shot("cancelled")
    assert ScheduledJob.objects.get(pk=cancel_id).state == JobState.CANCELLED

    run_action(page, [move_id], "reschedule_selected")
    page.wait_for_selector("#reschedule-form")
    page.fill("#id_due_at", "2031-06-07T08:09:10")
    page.shot("reschedule-form")
    page.click("#reschedule-form input[type=submit]")
    page.wait_for_url("**/admin/scheduling/scheduledjob/")
    assert messages(page) == ["Rescheduled 1 job to 2031-06-07 08:09:10 UTC."]
    assert ScheduledJob.objects.get(pk=move_id).due_at == dt.datetime(2031, 6, 7, 8, 9, 10, tzinfo=dt.UTC)
    page.goto("/admin/")
    assert card(page, "pending") == "1"
    page.shot("dashboard-one-pending")

    harness.wait_for(lambda: "ready" in worker.log(), timeout=120, message="the worker did not start")
    page.goto(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/")
    assert "At 03:00 AM (Europe/Lisbon)" in page.content()
    page.click("#run-now-form button")
    assert messages(page)[0].startswith("Sent a manual run of browser-nightly")
    deadline = time.monotonic() + 90
    while "Succeeded" not in page.locator(".field-recent_runs").inner_text().title():
        assert time.monotonic() < deadline, "the manual run never showed up as succeeded"
        time.sleep(1)
        page.reload()
    assert "run now" in page.locator(".field-recent_runs").inner_text()
    page.shot("schedule-ran-now")


def test_customer_starts_a_trial_moves_its_end_and_upgrades(page, django_user_model):
    """Log in, start a trial (reminder pending), change its end (reminder moves), upgrade (reminder cancelled)."""
    django_user_model.objects.create_user("carol", "carol@example.invalid", "carol-password")
    page.goto("/trials/")
    page.wait_for_url("**/accounts/login/**")
    page.fill("#id_username", "carol")
    page.fill("#id_password", "carol-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/trials/")
    page.shot("no-trials")

    ends = timezone.localtime() + dt.timedelta(days=10)
    page.fill("#id_ends_at", ends.strftime("%Y-%m-%dT%H:%M"))
    page.click("#start-trial button")
    page.wait_for_selector("#reminder-state")
    assert page.locator("#reminder-state").get_attribute("data-job-state") == "pending"
    trial = Trial.objects.get()
    job = ScheduledJob.objects.get(key=f"trial-ending:{trial.pk}")
    assert job.due_at == trial.ends_at - dt.timedelta(days=3)
    page.shot("trial-started")

    new_end = timezone.localtime() + dt.timedelta(days=20)
    page.fill("#change-end #id_ends_at", new_end.strftime("%Y-%m-%dT%H:%M"))
    page.click("#change-end button")
    page.wait_for_selector("text=The reminder is now scheduled for")
    moved = ScheduledJob.objects.get(pk=job.pk)
    assert moved.due_at == new_end.replace(second=0, microsecond=0) - dt.timedelta(days=3)
    assert (new_end - dt.timedelta(days=3)).strftime("%Y-%m-%d") in page.locator("#reminder-due").inner_text()
    page.shot("end-moved")

    page.click("#upgrade button")
    page.wait_for_selector("text=is cancelled")
    assert page.locator("#reminder-state").get_attribute("data-job-state") == "cancelled"
    assert ScheduledJob.objects.get(pk=job.pk).state == JobState.CANCELLED
    page.shot("upgraded")
