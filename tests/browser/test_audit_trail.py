"""An operator's cancel in a real browser: the confirmation first, then the job's History names who did it.

Headless Chromium against the live server. Screenshots (the confirmation page, the History, the
audit list): ``tests/artifacts/browser/<test>/`` (git-ignored, kept as CI artifacts).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from scheduling import api
from scheduling.models import AuditRecord, JobState, ScheduledJob

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

JOBS = "/admin/scheduling/scheduledjob/"


def log_in(page: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("ops-anna", "anna@example.invalid", "anna-password")
    page.goto("/admin/login/")
    page.fill("#id_username", "ops-anna")
    page.fill("#id_password", "anna-password")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")


def test_a_cancel_from_the_job_page_asks_then_shows_in_its_history(page, django_user_model):
    """Cancel job asks first ("No" changes nothing); confirmed, the History lists ops-anna, admin, cancel, 1 of 1."""
    job = api.schedule("demo.record", {"label": "to cancel"}, delay=6 * 86400)
    log_in(page, django_user_model)
    page.goto(f"{JOBS}{job.id}/change/")
    page.click('button[value="cancel"]')
    page.wait_for_selector("#confirm-form")
    assert "1 job selected; 1 of them would change" in page.inner_text("#confirm-summary")
    assert page.get_attribute("#confirm-form input[type=submit]", "value") == "Yes, cancel this job"
    page.shot("confirm-one-job")
    page.click("text=No, take me back")
    page.wait_for_url(f"**{JOBS}{job.id}/change/")
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING

    page.click('button[value="cancel"]')
    page.click("#confirm-form input[type=submit]")
    page.wait_for_selector("ul.messagelist li")
    assert "Cancelled 1 job." in page.inner_text("ul.messagelist")
    assert "will not run" in page.inner_text("body")  # not "in 6 days"
    page.shot("job-cancelled")

    page.goto(f"{JOBS}{job.id}/history/")
    row = page.locator('#audit-trail tr[data-action="cancel"]')
    assert row.count() == 1
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert cells[:4] == ["ops-anna", "admin", "cancel", "1 of 1"]
    page.shot("history")

    page.click("text=All audit records naming this job")
    page.wait_for_selector("#result_list")
    assert "ops-anna" in page.inner_text("#result_list")
    page.shot("audit-list")


def test_a_bulk_cancel_of_all_matching_asks_with_the_count(page, django_user_model):
    """ "Select all N matching" then Cancel shows the count and the filter; confirmed, all of them are cancelled."""
    ids = api.schedule_many("demo.record", [{"label": f"bulk {i}"} for i in range(101)], delay=3600)
    api.schedule("demo.noop", {}, delay=3600)  # outside the filter: left alone
    log_in(page, django_user_model)
    page.goto(f"{JOBS}?kind=demo.record")  # 100 on the page, 101 matching
    page.check("#action-toggle")
    page.click(".actions .question a")  # "Select all 101 scheduled jobs"
    page.select_option("select[name=action]", "cancel_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#confirm-form")
    summary = page.inner_text("#confirm-summary")
    assert "All 101 jobs matching the list's filter (kind=demo.record)" in summary
    assert "… and 81 more" in page.inner_text("#confirm-jobs")
    assert page.get_attribute("#confirm-form input[type=submit]", "value") == "Yes, cancel 101 jobs"
    page.shot("confirm-all-matching")
    assert set(ScheduledJob.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.PENDING}
    page.click("#confirm-form input[type=submit]")
    page.wait_for_selector("ul.messagelist li")
    assert "Cancelled 101 jobs." in page.inner_text("ul.messagelist")
    assert ScheduledJob.objects.filter(state=JobState.PENDING).count() == 1
    record = AuditRecord.objects.get()
    assert (record.actor, record.changed, record.details["filter"]) == ("ops-anna", 101, "kind=demo.record")
    page.shot("cancelled-all")


@override_settings(SCHEDULING_ADMIN_CONFIRM_OVER=2)
def test_only_a_selection_over_the_threshold_asks(page, django_user_model):
    """With the threshold at 2, two ticked jobs are cancelled at once and three ask first."""
    ids = [api.schedule("demo.record", {"label": f"t {i}"}, delay=3600).id for i in range(5)]
    log_in(page, django_user_model)
    page.goto(JOBS)
    for job_id in ids[:2]:
        page.check(f'input[name="_selected_action"][value="{job_id}"]')
    page.select_option("select[name=action]", "cancel_selected")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist li")
    assert "Cancelled 2 jobs." in page.inner_text("ul.messagelist")
    for job_id in ids[2:]:
        page.check(f'input[name="_selected_action"][value="{job_id}"]')
    page.select_option("select[name=action]", "cancel_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#confirm-form")
    page.shot("confirm-over-threshold")
    assert ScheduledJob.objects.filter(state=JobState.PENDING).count() == 3
