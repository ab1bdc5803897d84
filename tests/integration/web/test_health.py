"""/healthz's backlog part: it counts the system's jobs and critical kinds' jobs, so no API caller can flip it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client, override_settings

from scheduling import api
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
