"""The recurrences JSON API against real PostgreSQL: each verb, owner scoping, the kind's access rule."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.models import JobState, Recurrence, ScheduledJob
from tasks.models import Trial

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

URL = "/api/recurrences/"


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob")


def logged_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def send(client: Client, method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body) if body is not None else ""
    return getattr(client, method)(url, data, content_type="application/json")


def create(client: Client, **body: Any) -> Any:
    return send(client, "post", URL, {"kind": "demo.noop", "key": "digest", "cron": "0 9 * * *", **body})


def test_create_returns_201_with_the_first_occurrence_and_next_runs(alice):
    """POST creates an owned recurrence, one pending occurrence, and shows the next occurrences."""
    response = create(logged_in(alice), timezone="Asia/Tokyo", payload={"u": 1})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["outcome"] == "created"
    rec = Recurrence.objects.get(pk=body["recurrence"]["id"])
    assert response["Location"] == f"/api/recurrences/{rec.id}"
    assert (rec.owner_id, rec.timezone, rec.payload) == (alice.id, "Asia/Tokyo", {"u": 1})
    assert len(body["recurrence"]["next_occurrences"]) == 5
    assert ScheduledJob.objects.filter(recurrence=rec, state=JobState.PENDING, owner=alice).count() == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"cron": "0 99 * * *"}, "invalid_schedule"),
        ({"timezone": "Nowhere/Land"}, "invalid_schedule"),
        ({"starts_at": "2030-01-01T09:00:00"}, "invalid_schedule"),
        ({"starts_at": "2030-02-01T09:00:00+00:00", "ends_at": "2030-01-01T09:00:00+00:00"}, "invalid_schedule"),
        ({"every": 60}, "invalid_schedule"),
        ({"kind": "no.such"}, "unknown_kind"),
        ({"colour": "red"}, "unknown_field"),
    ],
)
def test_bad_input_is_a_400_with_a_reason_and_stores_nothing(alice, body, code):
    """Bad cron, zone, naive or inverted times, both rules, unknown kind or field: 400 with its code."""
    response = create(logged_in(alice), **body)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code
    assert Recurrence.objects.count() == 0
    assert ScheduledJob.objects.count() == 0


def test_the_kinds_access_rule_applies_as_for_jobs(alice, bob):
    """A kind without api access is 403; reminders need the caller's own trial, at create and at change."""
    assert create(logged_in(alice), kind="demo.fail").status_code == 403
    trial = Trial.objects.create(user=alice, ends_at=timezone.now() + dt.timedelta(days=10))
    payload = {"user_id": alice.id, "trial_id": trial.id}
    assert create(logged_in(bob), kind="reminders.trial_ending", payload=payload).status_code == 403
    response = create(logged_in(alice), kind="reminders.trial_ending", payload=payload)
    assert response.status_code == 201, response.content
    url = response.json()["recurrence"]["url"]
    other = Trial.objects.create(user=bob, ends_at=timezone.now() + dt.timedelta(days=10))
    refused = send(logged_in(alice), "patch", url, {"payload": {"user_id": bob.id, "trial_id": other.id}})
    assert refused.status_code == 403
    assert Recurrence.objects.get(pk=response.json()["recurrence"]["id"]).payload == payload


def test_owner_scoping_hides_and_protects_others_recurrences(alice, bob):
    """Another caller gets 404 on every verb and does not see the row in the list."""
    url = create(logged_in(alice)).json()["recurrence"]["url"]
    other = logged_in(bob)
    assert other.get(url).status_code == 404
    for verb in ("pause", "resume", "cancel"):
        assert send(other, "post", f"{url}/{verb}").status_code == 404
    assert send(other, "patch", url, {"timezone": "UTC"}).status_code == 404
    assert other.get(URL).json()["count"] == 0
    assert create(other).status_code == 201  # the same key is bob's own


def test_change_pause_resume_cancel_and_next(alice):
    """PATCH moves the pending occurrence; pause, resume, cancel change state; next lists n instants."""
    client = logged_in(alice)
    rec = create(client).json()["recurrence"]
    url = rec["url"]
    changed = send(client, "patch", url, {"timezone": "America/New_York", "payload": {"v": 2}})
    assert changed.status_code == 200, changed.content
    job = ScheduledJob.objects.get(pk=rec["occurrence_job"])
    assert job.payload == {"v": 2}
    assert job.occurrence_at.hour in (13, 14)
    assert len(client.get(f"{url}/next?n=3").json()["next_occurrences"]) == 3
    assert send(client, "post", f"{url}/pause").json()["state"] == "paused"
    assert send(client, "post", f"{url}/resume").json()["state"] == "active"
    assert send(client, "post", f"{url}/cancel").json()["state"] == "cancelled"
    conflict = send(client, "post", f"{url}/resume")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "state_conflict"


def test_list_filters_by_state_kind_and_zone(alice):
    """GET filters the caller's recurrences by state, kind and timezone."""
    client = logged_in(alice)
    create(client, key="a", timezone="Europe/Lisbon")
    create(client, key="b", timezone="Asia/Tokyo")
    assert client.get(URL, {"timezone": "Asia/Tokyo"}).json()["count"] == 1
    assert client.get(URL, {"kind": "demo.noop", "state": "active"}).json()["count"] == 2
    assert client.get(URL, {"state": "bogus"}).status_code == 400


def test_key_conflict_error_is_a_409(alice):
    """on_conflict=error on the caller's own key answers 409 key_conflict."""
    client = logged_in(alice)
    create(client)
    response = create(client, on_conflict="error")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "key_conflict"


def test_session_writes_need_csrf(alice):
    """A session POST without the CSRF token is refused like the jobs API's."""
    response = create(logged_in(alice, csrf=True))
    assert response.status_code == 403
    assert Recurrence.objects.count() == 0


def test_a_cron_longer_than_its_column_is_a_400_not_a_500(alice):
    """A 237-character cron whose every field is valid is refused with invalid_schedule (the column holds 200)."""
    minutes = ",".join(str(m) for m in range(60))
    hours = ",".join(str(h) for h in range(24))
    cron = f"{minutes} {hours} * * *"
    assert len(cron) == 237
    response = create(logged_in(alice), cron=cron)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_schedule"
    assert Recurrence.objects.count() == 0
