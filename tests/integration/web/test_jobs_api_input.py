"""Unstorable text, odd offsets, odd digits and absurd due times are 4xx, never 500."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from scheduling import api, exceptions
from scheduling.models import ScheduledJob
from scheduling.web import auth

pytestmark = pytest.mark.django_db
URL = "/api/jobs/"


@pytest.fixture
def alice_client(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user("alice", password="pw-alice")
    _, raw = auth.issue_token(user, "test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=True)


@pytest.fixture
def admin_client_(django_user_model: Any) -> Client:
    root = django_user_model.objects.create_superuser("root", password="pw-root")
    client = Client(raise_request_exception=True)
    client.force_login(root)
    return client


def _rows() -> list[tuple[Any, ...]]:
    """Every job row, to prove a refused request stored or changed nothing."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, payload::text, due_at, state, key FROM scheduling_scheduledjob ORDER BY id")
        return cursor.fetchall()


# JSON text written by hand: "\\u0000" and a lone "\\ud800" are valid JSON escapes json.loads accepts.
BAD_BODIES = [
    '{"kind": "demo.noop", "delay": 5, "key": "a\\u0000b"}',
    '{"kind": "demo.noop", "delay": 5, "key": "a\\ud800b"}',
    '{"kind": "demo.noop", "delay": 5, "payload": {"v": "x\\u0000"}}',
    '{"kind": "demo.noop", "delay": 5, "payload": {"v": ["ok", {"deep": "\\udfff"}]}}',
    '{"kind": "demo.noop", "delay": 5, "payload": {"na\\u0000me": 1}}',
    '{"kind": "demo.noop", "delay": 5, "payload": {"\\ud800": 1}}',
    '{"kind": "demo.no\\u0000op", "delay": 5}',
    '{"kind": "demo.noop", "due_at": "2030-01-01T00:00:00+16:00"}',
    '{"kind": "demo.noop", "due_at": "2030-01-01T00:00:00+23:59:59.999999"}',
    '{"kind": "demo.noop", "due_at": "2030-01-01T00:00:00-23:59"}',
    '{"kind": "demo.noop", "due_at": "2030-01-01T00:00:00+05:30:15"}',
    '{"kind": "demo.noop", "due_at": "0001-01-01T00:00:00+00:00"}',
    '{"kind": "demo.noop", "due_at": "1999-12-31T23:59:59+00:00"}',
    '{"kind": "demo.noop", "due_at": "9999-12-31T23:59:59+00:00"}',
    '{"kind": "demo.noop", "due_at": "2030-01-01T00:00:00\\u0000+00:00"}',
]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_create_refuses_unstorable_text_offsets_and_absurd_times_with_400(alice_client, body):
    """NUL, lone surrogates (key, kind, payload keys/values at any depth), offsets past ±15:59, year 1: 400."""
    response = alice_client.post(URL, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"]
    assert _rows() == []


@pytest.mark.parametrize(
    "due_at",
    ["2030-01-01T00:00:00+16:00", "2030-01-01T00:00:00+23:59:59.999999", "0001-01-01T00:00:00Z", "2000-01-01T00:00Z"],
)
def test_reschedule_refuses_bad_offsets_and_times_with_400(alice_client, due_at):
    """Rescheduling to an offset PostgreSQL refuses, outside 2000-01-01..+10 years or in the past is 400; unchanged."""
    created = alice_client.post(URL, json.dumps({"kind": "demo.noop", "delay": 600}), content_type="application/json")
    job_id = created.json()["job"]["id"]
    before = _rows()
    response = alice_client.post(
        f"/api/jobs/{job_id}/reschedule", json.dumps({"due_at": due_at}), content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert _rows() == before


def test_a_valid_unusual_offset_is_stored_as_the_same_instant(alice_client):
    """+14:00 (Kiribati) is accepted and stored as that instant in UTC."""
    body = json.dumps({"kind": "demo.noop", "due_at": "2030-01-01T12:00:00+14:00"})
    response = alice_client.post(URL, body, content_type="application/json")
    assert response.status_code == 201
    stored = ScheduledJob.objects.get(pk=response.json()["job"]["id"]).due_at
    assert stored == dt.datetime(2029, 12, 31, 22, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "query",
    ["page=²", "page_size=²", "page=\u0661", "page=99999999999999999999", "key=a%00b", "kind=demo%00", "state=%00"],
)
def test_list_refuses_odd_digits_and_nul_filters_with_400(alice_client, query):
    """Superscript and non-ASCII digits, huge numbers and NUL in key/kind/state filters are 400, not 500."""
    response = alice_client.get(f"{URL}?{query}")
    assert response.status_code == 400, response.content


@pytest.mark.parametrize(
    "path",
    [
        "/admin/scheduling/scheduledjob/?kind=demo%00",
        "/admin/scheduling/scheduledjob/?state=%00",
        "/admin/scheduling/scheduledjob/?q=%00",
        "/admin/scheduling/schedulerun/?state=%00",
        "/admin/auth/user/?q=a%00",
    ],
)
def test_admin_filters_with_nul_are_400(admin_client_, path):
    """NUL in the admin's ?kind=, ?state= or search filters is a 400, on every admin list."""
    assert admin_client_.get(path).status_code == 400


@pytest.mark.parametrize("suffix", ["\x00", "abc", "²"])
def test_admin_action_with_a_bad_selection_is_400_and_changes_nothing(admin_client_, suffix):
    """A NUL or a non-id in _selected_action is a 400, and no job is cancelled."""
    job = api.schedule("demo.noop", {}, delay=600)
    for content_type in ("multipart", "urlencoded"):
        data = {"action": "cancel_selected", "_selected_action": [str(job.id), f"{job.id}{suffix}"]}
        if content_type == "multipart":
            response = admin_client_.post("/admin/scheduling/scheduledjob/", data)
        else:
            from urllib.parse import urlencode

            response = admin_client_.post(
                "/admin/scheduling/scheduledjob/",
                urlencode(data, doseq=True),
                content_type="application/x-www-form-urlencoded",
            )
        assert response.status_code == 400
    assert ScheduledJob.objects.get(pk=job.id).state == "pending"


def test_admin_add_form_refuses_year_one(admin_client_):
    """The admin's add form refuses a due time in year 1 with a form error; nothing is stored."""
    response = admin_client_.post(
        "/admin/scheduling/scheduledjob/add/",
        {"kind": "demo.noop", "payload": "{}", "due_at": "0001-01-01T00:00:00", "on_conflict": "error"},
    )
    assert response.status_code == 200
    assert ScheduledJob.objects.count() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: api.schedule("demo.noop", {}, due_at=dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
        lambda: api.schedule(
            "demo.noop", {}, due_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=16)))
        ),
        lambda: api.schedule("demo.noop", {}, delay=5, key="k\x00"),
        lambda: api.schedule("demo.noop", {"\ud800": 1}, delay=5),
        lambda: api.cancel(key="k\x00"),
    ],
)
def test_python_api_refuses_the_same_input_before_the_database(call):
    """scheduling.api raises a named SchedulingError for year 1, +16:00 and NUL/surrogate text."""
    with pytest.raises(exceptions.SchedulingError):
        call()
    assert _rows() == []


def test_year_one_cannot_reach_metrics_or_healthz_as_two_thousand_years_overdue(alice_client):
    """With year-1 due times refused, the oldest overdue age stays that of real jobs (none here)."""
    body = json.dumps({"kind": "demo.noop", "due_at": "0001-01-01T00:00:00+00:00"})
    assert alice_client.post(URL, body, content_type="application/json").status_code == 400
    assert api.status(include_broker=False)["oldest_overdue_seconds"] < 86_400
