"""The operator's console in a real browser at 1,280 px: the finished-work chart and the jobs list's triage columns.

Screenshots: ``tests/artifacts/browser/<test>/`` (git-ignored; CI keeps them as artifacts).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models.functions import Now

from scheduling import api, testing
from scheduling.models import ScheduledJob
from tests import support

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

VIEWPORT_WIDTH = 1280  # the conftest's context


def log_in(page: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("operator", "op@example.invalid", "op-password")
    page.goto("/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "op-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#timekeeper-dashboard")


def some_history() -> None:
    """Jobs that succeeded, failed and died, some with long keys and errors, one a recurrence's occurrence."""
    api.schedule_many("demo.noop", [{"user_id": n} for n in range(6)], delay=0)
    for n in range(3):
        api.schedule("demo.fail", {"user_id": n}, delay=0, max_attempts=1, key=f"invoice-reminder:customer-{n}:2026-12")
    support.make_due()
    testing.run_due()
    api.recur("demo.noop", {"digest": True}, key="weekly-digest:account-42", every=3600)
    for n in range(3):
        job = api.schedule(
            "demo.noop", {"user_id": 100 + n}, delay=600 * (n + 1), key=f"a-rather-long-key-{n}-" + "x" * 60
        )
        ScheduledJob.objects.filter(pk=job.pk).update(
            last_error="ConnectionError: the payment provider at https://payments.example.invalid/v2/charges "
            "did not answer within 30 s (attempt 2 of 5)",
            attempts=1,
            updated_at=Now(),
        )


def test_the_dashboard_draws_what_finished_per_minute_per_kind(page, django_user_model):
    """The finished chart draws succeeded, failed and dead lines; a kind's name redraws it for that kind alone."""
    some_history()
    log_in(page, django_user_model)
    chart = page.locator("#tk-finished svg")
    chart.wait_for()
    assert chart.locator("polyline").count() == 3
    legend = chart.locator("text").all_text_contents()
    assert {"succeeded", "failed", "dead"} <= set(legend)
    assert "Finished per minute (every kind)" in chart.get_attribute("aria-label")
    noop = page.locator('#tk-finished-kinds tr[data-finished-kind="demo.noop"] td').all_inner_texts()
    assert noop[:4] == ["demo.noop", "6", "0", "0"]
    page.locator("#tk-finished").scroll_into_view_if_needed()
    page.shot("finished-every-kind")
    page.locator('#tk-finished-kinds a[data-finished-kind="demo.fail"]').click()
    page.wait_for_selector('#tk-finished svg[aria-label^="Finished per minute (demo.fail)"]')
    assert "kind=demo.fail" in page.url
    page.locator("#tk-finished").scroll_into_view_if_needed()
    page.shot("finished-demo-fail")


def test_the_jobs_list_fits_1280_px_with_its_triage_columns(page, django_user_model):
    """At 1,280 px every column of the jobs list is inside the window, due times sit on one line, and the error
    class links to the jobs that failed the same way."""
    some_history()
    log_in(page, django_user_model)
    page.goto("/admin/scheduling/scheduledjob/")
    page.wait_for_selector("#result_list")
    assert page.evaluate("window.innerWidth") == VIEWPORT_WIDTH
    headers = page.locator("#result_list thead th").all_inner_texts()
    for name in ("STARTED", "DURATION", "ERROR CLASS", "LAST ERROR"):
        assert name in [h.strip().upper() for h in headers], headers
    table = page.locator("#result_list").bounding_box()
    assert table is not None
    assert table["x"] + table["width"] <= VIEWPORT_WIDTH, "the table runs past the window's right edge"
    overflow = page.evaluate("(() => { const r = document.querySelector('#changelist .results');"
                             " return r.scrollWidth - r.clientWidth; })()")  # fmt: skip
    assert overflow <= 0, "a column is cut off (the results scroll sideways)"
    lines = page.evaluate(
        "Array.from(document.querySelectorAll('#result_list td.field-due .tk-when[title]'))"
        ".map(e => e.getClientRects().length)"
    )
    assert lines, "no due times"
    assert set(lines) == {1}, "a due time wraps"
    counts = page.locator("#tk-state-counts").inner_text()
    assert "done" in counts
    assert "dead" in counts
    assert "ConnectionError (3)" in page.locator("#changelist-filter").inner_text()
    page.shot("jobs-list-1280")
    page.locator("a.tk-error-class", has_text="DemoFailure").first.click()
    page.wait_for_url("**error_class=DemoFailure**")
    assert page.locator("#result_list tbody tr").count() == 3
    page.shot("jobs-list-one-error-class")
    page.fill("#searchbar", "user_id=2")  # within the error class chosen: one of the three
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=user_id**")
    assert page.locator("#result_list tbody tr").count() == 1
    page.shot("payload-search")
