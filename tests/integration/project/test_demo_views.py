"""The demo product's trial pages: the reminder job follows the trial (start, upgrade, change of end)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.due_at import store
from scheduling.models import JobState, ScheduledJob
from tasks.models import Trial

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("carol", password="pw-carol")


@pytest.fixture
def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def local(at: dt.datetime) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%dT%H:%M")


def start(browser: Client, ends_at: dt.datetime) -> Trial:
    response = browser.post("/trials/start", {"plan": "pro", "ends_at": local(ends_at)})
    assert response.status_code == 302, response.content.decode()[:2000]
    return Trial.objects.latest("pk")


def reminder(trial: Trial) -> ScheduledJob:
    return ScheduledJob.objects.filter(key=f"trial-ending:{trial.pk}").latest("id")


def test_pages_need_a_login(client):
    """Anonymous visitors are sent to the login page; nothing is created."""
    response = client.get("/trials/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert client.post("/trials/start", {"plan": "pro"}).status_code == 302
    assert Trial.objects.count() == 0


def test_start_schedules_the_reminder_three_days_before_the_end(browser, user):
    """Starting a trial stores it and a pending reminders.trial_ending job keyed by it, owned by the user."""
    ends = (timezone.now() + dt.timedelta(days=14)).replace(second=0, microsecond=0)
    trial = start(browser, ends)
    job = reminder(trial)
    assert (job.kind, job.state, job.owner_id) == ("reminders.trial_ending", JobState.PENDING, user.pk)
    assert job.payload == {"user_id": user.pk, "trial_id": trial.pk}
    assert job.due_at == ends - dt.timedelta(days=3)
    page = browser.get(f"/trials/{trial.pk}/").content.decode()
    assert 'data-job-state="pending"' in page
    assert ">scheduled</span>" in page  # the customer's word, not the internal state or key
    assert f"trial-ending:{trial.pk}" not in page


@pytest.mark.parametrize("ends_in", [dt.timedelta(hours=-1), dt.timedelta(days=400)])
def test_an_end_in_the_past_or_too_far_is_refused(browser, ends_in):
    """An end in the past or more than a year away is a form error; no trial, no job."""
    response = browser.post("/trials/start", {"plan": "pro", "ends_at": local(timezone.now() + ends_in)})
    assert response.status_code == 400
    assert (Trial.objects.count(), ScheduledJob.objects.count()) == (0, 0)


def test_upgrade_cancels_the_reminder(browser):
    """Upgrading cancels the pending reminder by key and says so."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    response = browser.post(f"/trials/{trial.pk}/upgrade", follow=True)
    assert "is cancelled" in response.content.decode()
    assert reminder(trial).state == JobState.CANCELLED
    trial.refresh_from_db()
    assert trial.upgraded_at is not None


def test_changing_the_end_moves_the_same_reminder(browser):
    """A new end reschedules the pending reminder (same job) to three days before it."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    job = reminder(trial)
    new_end = (timezone.now() + dt.timedelta(days=20)).replace(second=0, microsecond=0)
    response = browser.post(f"/trials/{trial.pk}/end", {"ends_at": local(new_end)}, follow=True)
    assert "The reminder is now scheduled for" in response.content.decode()
    moved = reminder(trial)
    assert (moved.id, moved.due_at) == (job.id, new_end - dt.timedelta(days=3))


def test_changing_the_end_refuses_a_reminder_in_the_past_as_the_api_does(browser):
    """A new end under three days away would put the reminder in the past: refused (400), nothing moves."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    job = reminder(trial)
    response = browser.post(f"/trials/{trial.pk}/end", {"ends_at": local(timezone.now() + dt.timedelta(days=1))})
    assert response.status_code == 400
    assert "The reminder goes out 3 days before the end, which would be in the past" in response.content.decode()
    trial.refresh_from_db()
    assert abs(trial.ends_at - (timezone.now() + dt.timedelta(days=10))) < dt.timedelta(minutes=1)
    assert reminder(trial).due_at == job.due_at


def test_changing_the_end_after_the_reminder_went_out_schedules_a_new_one(browser):
    """If the reminder already ran, the new end gets a new reminder job."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    first = reminder(trial)
    ScheduledJob.objects.filter(pk=first.pk).update(state=JobState.DONE, finished_at=timezone.now())
    new_end = timezone.now() + dt.timedelta(days=30)
    browser.post(f"/trials/{trial.pk}/end", {"ends_at": local(new_end)})
    second = reminder(trial)
    assert second.id != first.id
    assert second.state == JobState.PENDING


def test_a_running_reminder_keeps_the_old_end(browser):
    """While the reminder is claimed, changing the end is refused and the trial keeps its end."""
    trial = start(browser, timezone.now() + dt.timedelta(days=2))  # reminder already due
    assert [c.id for c in store.claim_due_jobs(10)] == [reminder(trial).id]
    old_end = Trial.objects.get(pk=trial.pk).ends_at
    response = browser.post(
        f"/trials/{trial.pk}/end", {"ends_at": local(timezone.now() + dt.timedelta(days=9))}, follow=True
    )
    assert "being sent right now" in response.content.decode()
    assert Trial.objects.get(pk=trial.pk).ends_at == old_end


def test_another_users_trial_is_404(browser, django_user_model):
    """Dave cannot see, upgrade or move Carol's trial."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    dave = Client()
    dave.force_login(django_user_model.objects.create_user("dave", password="pw"))
    assert dave.get(f"/trials/{trial.pk}/").status_code == 404
    assert dave.post(f"/trials/{trial.pk}/upgrade").status_code == 404
    assert reminder(trial).state == JobState.PENDING


def test_forms_need_the_csrf_token(user):
    """A cross-site form post without the CSRF token is refused; nothing is created."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/trials/start", {"plan": "pro", "ends_at": local(timezone.now() + dt.timedelta(days=9))})
    assert response.status_code == 403
    assert Trial.objects.count() == 0


def test_trial_admin_shows_the_reminder_state_and_is_read_only(browser, admin_client):
    """The trials list in the admin shows each reminder's state; trials are not added or edited there."""
    trial = start(browser, timezone.now() + dt.timedelta(days=10))
    page = admin_client.get("/admin/tasks/trial/")
    assert page.context["cl"].result_list[0].reminder == "pending"
    assert admin_client.get("/admin/tasks/trial/add/").status_code == 403
    browser.post(f"/trials/{trial.pk}/upgrade")
    assert admin_client.get("/admin/tasks/trial/").context["cl"].result_list[0].reminder == "cancelled"


def test_an_upgraded_trial_offers_no_change_of_end_and_refuses_one(client, django_user_model):
    """After an upgrade the page shows "cancelled" and no "Change the end"; a posted change is refused."""
    user = django_user_model.objects.create_user("dora", password="pw")
    client.force_login(user)
    ends = timezone.now() + dt.timedelta(days=10)
    trial = start(client, ends)
    client.post(f"/trials/{trial.pk}/upgrade")
    page = client.get(f"/trials/{trial.pk}/").content.decode()
    assert "Change the end" not in page
    assert ">cancelled</span>" in page
    client.post(f"/trials/{trial.pk}/end", {"ends_at": (ends + dt.timedelta(days=5)).strftime("%Y-%m-%dT%H:%M")})
    trial.refresh_from_db()
    assert abs(trial.ends_at - ends) < dt.timedelta(minutes=1)
