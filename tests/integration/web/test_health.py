"""/healthz's backlog part: it counts the system's jobs and critical kinds' jobs, so no API caller can flip it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client, override_settings

from scheduling import api, registry
from scheduling.core import store
from scheduling.models import ScheduledJob
from scheduling.web import auth
from tasks.models import Trial

pytestmark = pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: no collectstatic here


@pytest.mark.django_db
@override_settings(SCHEDULING_HEALTH_MAX_BACKLOG=100, SCHEDULING_API_CREATE_RATE_PER_SECOND=0)
def test_one_owners_overdue_jobs_leave_healthz_up_while_a_critical_kinds_backlog_flips_it(
    django_user_model: Any, admin_client: Client
):
    """200 overdue jobs posted by one ordinary owner: /healthz stays 200; 101 overdue critical-kind jobs: 503."""
    alice = django_user_model.objects.create_user("alice", password="pw-alice")
    _, raw = auth.issue_token(alice, "flood")
    caller = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for _ in range(200):
        body = json.dumps({"kind": "demo.record", "payload": {}, "delay": 0})
        assert caller.post("/api/jobs/", body, content_type="application/json").status_code == 201
    now = store.database_now()
    assert ScheduledJob.objects.filter(owner=alice, state="pending", due_at__lte=now).count() == 200
    assert api.status(include_broker=False)["backlog"] == 200, "status() and /metrics still count every job"
    response = Client().get("/healthz")
    assert response.status_code == 200, response.content
    detail = admin_client.get("/healthz").json()["checks"]["backlog"]
    assert (detail["status"], detail["backlog"]) == ("ok", 0)
    assert detail["critical_kinds"] == ["payments.retry", "reminders.trial_ending"]

    trial = Trial.objects.create(user=alice, ends_at=now + dt.timedelta(days=3))
    payloads = [{"user_id": alice.pk, "trial_id": trial.pk}] * 101
    api.schedule_many("reminders.trial_ending", payloads, due_at=now - dt.timedelta(minutes=5), owner=alice)
    response = Client().get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["backlog"])
    detail = admin_client.get("/healthz").json()["checks"]["backlog"]
    assert detail["backlog"] == 101
    assert detail["oldest_overdue_seconds"] >= 300


@pytest.mark.django_db
@override_settings(SCHEDULING_HEALTH_MAX_BACKLOG=2)
def test_a_paused_or_rate_limited_kinds_waiting_jobs_do_not_flip_healthz(admin_client: Client):
    """Jobs held back by the operator (a pause, a rate) are counted apart, as status() does: /healthz stays up."""
    past = store.database_now() - dt.timedelta(minutes=5)
    api.schedule_many("demo.noop", [{}] * 3, due_at=past)
    api.schedule_many("demo.record", [{}] * 3, due_at=past)
    api.set_rate("demo.noop", registry.Rate(1, 3600))
    api.pause("demo.record")
    assert (api.status(include_broker=False)["backlog"], api.status(include_broker=False)["rate_limited"]) == (0, 3)
    response = Client().get("/healthz")
    assert response.status_code == 200, response.content
    assert admin_client.get("/healthz").json()["checks"]["backlog"]["backlog"] == 0
    api.set_rate("demo.noop", None)
    response = Client().get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["backlog"]), "lifted: its jobs count again"
