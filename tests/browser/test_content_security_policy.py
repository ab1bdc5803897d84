"""The Content-Security-Policy in a real browser: every admin, dashboard and demo page works under it, no violation.

Chromium reports each blocked script, style or connection as a ``securitypolicyviolation`` event and a
console error starting "Refused to"; both are collected from the first byte of every page (an init
script), and each page also proves its inline script ran (the dashboard refreshes itself, the add
form fills the example payload, django-celery-beat's crontab helper hides its row). Playwright's
``wait_for_function`` with a string is eval'd inside the page, which the policy refuses
(no ``unsafe-eval``): these tests wait with locators, or poll from Python.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django_celery_beat.models import CrontabSchedule, PeriodicTask
from playwright.sync_api import expect

from scheduling import api
from scheduling.models import SchedulePolicy
from tasks.models import Trial
from tests.e2e import harness

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

COLLECT_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sourceFile || ""));
});
"""


class Watch:
    """The CSP violations and "Refused to" console messages of a page, across navigations."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.console: list[str] = []
        page.add_init_script(COLLECT_VIOLATIONS)
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if "Refused to" in message.text or "Content Security Policy" in message.text:
            self.console.append(message.text)

    def visit(self, url: str) -> Any:
        """Open ``url``; its response carries the policy (with a nonce where the page has inline code)."""
        response = self.page.goto(url)
        assert response.status == 200, (url, response.status)
        policy = response.headers.get("content-security-policy", "")
        assert "default-src 'self'" in policy, (url, policy)
        assert "script-src 'self'" in policy, (url, policy)
        assert "unsafe-inline" not in policy, (url, policy)
        return response

    def violations(self) -> list[str]:
        return [*self.page.evaluate("window.__csp || []"), *self.console]


def log_in_admin(page: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("operator", "op@example.invalid", "op-password")
    page.goto("/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "op-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#timekeeper-dashboard")


def test_admin_and_dashboard_pages_run_under_the_policy_with_no_violation(page, django_user_model):
    """Dashboard, jobs, add form, a job, kinds, periodic tasks, tokens: their inline scripts run, nothing is refused."""
    watch = Watch(page)
    log_in_admin(page, django_user_model)
    job = api.schedule("demo.record", {"label": "csp"}, delay=600)
    crontab = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Lisbon")
    with_policy = PeriodicTask.objects.create(
        name="csp-nightly", task="scheduling.run_fixed", kwargs=json.dumps({"schedule": "csp-nightly"}), crontab=crontab
    )
    SchedulePolicy.objects.create(periodic_task=with_policy, kind="demo.record", payload={"label": "nightly"})

    watch.visit("/admin/")
    page.wait_for_selector("#timekeeper-dashboard[data-refreshed-at]", timeout=30_000)  # its script refreshed it
    page.shot("dashboard")

    watch.visit("/admin/scheduling/scheduledjob/add/")
    page.select_option("#id_kind", "demo.record")
    expect(page.locator("#id_payload")).to_have_value(re.compile("label"))  # the inline script filled it
    page.shot("add-form")
    for url in (
        "/admin/scheduling/scheduledjob/",
        f"/admin/scheduling/scheduledjob/{job.id}/change/",
        "/admin/scheduling/kindcontrol/",
        "/admin/django_celery_beat/periodictask/",
        f"/admin/django_celery_beat/periodictask/{with_policy.pk}/change/",
        "/admin/scheduling/schedulerun/",
        "/admin/scheduling/apitoken/",
    ):
        watch.visit(url)
    watch.visit("/admin/django_celery_beat/periodictask/add/")
    page.wait_for_selector(".field-crontab_translation", state="hidden")  # django-celery-beat's script ran
    page.shot("periodic-task-add")

    watch.visit("/admin/scheduling/apitoken/add/")
    page.select_option("#id_user", label="operator")  # a superuser picks the token's user
    page.fill("#id_name", "csp-token")
    page.click("input[name=_save]")
    page.wait_for_selector("#api-token")
    assert page.evaluate("getComputedStyle(document.getElementById('api-token')).userSelect") == "all"
    page.shot("token-created")
    assert watch.violations() == []


def test_demo_pages_run_under_the_policy_with_no_violation(page, django_user_model):
    """The demo's login, trial list, start form and trial page: styled (the nonce'd style applies), nothing refused."""
    watch = Watch(page)
    django_user_model.objects.create_user("customer", password="customer-password")
    watch.visit("/accounts/login/")
    page.fill("#id_username", "customer")
    page.fill("#id_password", "customer-password")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_selector("#start-trial")
    assert page.evaluate("getComputedStyle(document.body).maxWidth") != "none"  # base.html's inline style applied
    page.click("#start-trial button[type=submit]")
    page.wait_for_url("**/trials/*/")
    trial = Trial.objects.get()
    watch.visit(f"/trials/{trial.id}/")
    watch.visit("/trials/")
    page.shot("trials")
    assert watch.violations() == []


def test_the_watch_sees_a_violation(page, django_user_model):
    """The detector can fail: an inline style attribute added to the page is refused and reported."""
    watch = Watch(page)
    log_in_admin(page, django_user_model)
    watch.visit("/admin/")
    page.evaluate("document.body.insertAdjacentHTML('beforeend', '<div id=\"tk-probe\" style=\"color: red\">x</div>')")
    # Polled from here: wait_for_function's string predicate is eval'd in the page, which the policy refuses.
    seen = harness.wait_for(watch.violations, 10, interval=0.1, message="the probe's violation")
    assert any("style-src" in v for v in seen)
