"""The recurrences' admin list in Chromium: next runs shown, filter by zone, bulk pause, under the CSP."""

from __future__ import annotations

from typing import Any

from scheduling import api
from scheduling.models import JobState, Recurrence, RecurrenceState, ScheduledJob
from tests.browser.test_content_security_policy import Watch, log_in_admin


def test_operator_filters_recurrences_by_zone_sees_next_runs_and_pauses_them(page: Any, django_user_model: Any):
    """The list shows each recurrence's next runs on its wall clock; the zone filter and the pause action work."""
    watch = Watch(page)
    log_in_admin(page, django_user_model)
    tokyo = [api.recur("demo.noop", {}, key=f"tokyo:{i}", cron="0 9 * * *", timezone="Asia/Tokyo").id for i in range(2)]
    api.recur("demo.noop", {}, key="lisbon:0", cron="30 1 * * *", timezone="Europe/Lisbon")

    page.goto("/admin/scheduling/recurrence/")
    page.locator("#result_list").wait_for()
    assert page.locator("#result_list tbody tr").count() == 3
    page.get_by_role("link", name="Asia/Tokyo").click()
    page.locator("#result_list tbody tr").first.wait_for()
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    assert "09:00 JST" in rows.first.locator(".field-next_runs").inner_text()
    assert rows.first.locator("time.tk-next-run").count() == 3
    page.shot("tokyo")

    page.locator("#action-toggle").check()
    page.select_option("select[name=action]", "pause_selected")
    page.click("button[name=index]")
    page.locator("ul.messagelist li").first.wait_for()
    assert "Paused 2 recurrences." in page.locator("ul.messagelist").inner_text()
    page.shot("paused")
    assert set(Recurrence.objects.filter(state=RecurrenceState.PAUSED).values_list("id", flat=True)) == set(tokyo)
    assert not ScheduledJob.objects.filter(recurrence_id__in=tokyo, state=JobState.PENDING).exists()
    assert watch.violations() == []
