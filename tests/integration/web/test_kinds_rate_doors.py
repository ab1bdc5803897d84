"""Rate limits through every door: the kinds JSON API, the admin's Kinds page, ``manage.py timekeeper kinds rate``."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client

from scheduling.models import AuditRecord, KindControl

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

KINDS = "/api/kinds/"
KINDS_PAGE = "/admin/scheduling/kindcontrol/"


@pytest.fixture
def operator(django_user_model: Any) -> Client:
    """A staff member with the kind-control permission, logged in."""
    user = django_user_model.objects.create_user("operator", password="pw-op", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_kindcontrol"))
    client = Client()
    client.force_login(user)
    return client


def _rate(kind: str) -> tuple[int | None, float | None, str]:
    row = KindControl.objects.filter(kind=kind).first()
    return (row.rate_limit, row.rate_period_seconds, row.rate_partition_by) if row else (None, None, "")


def _post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def test_api_sets_and_lifts_a_kinds_rate(operator):
    """POST rate {"rate": "10/s", "partition_by": "partner"} limits the kind; {"rate": null} lifts it; listed."""
    body = _post(operator, f"{KINDS}demo.noop/rate", {"rate": "10/s", "partition_by": "partner"}).json()
    assert body["rate"] == "10/s per partner"
    assert _rate("demo.noop") == (10, 1.0, "partner")
    listed = {k["kind"]: k for k in operator.get(KINDS).json()["results"]}
    assert listed["demo.noop"]["rate"] == "10/s per partner"
    assert _post(operator, f"{KINDS}demo.noop/rate", {"rate": None}).json()["rate"] == ""
    assert _rate("demo.noop") == (None, None, "")
    assert AuditRecord.objects.filter(action="rate").count() == 2


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"rate": "fast"}, "invalid_rate"),
        ({"rate": 10}, "invalid_request"),
        ({}, "invalid_request"),
        ({"rate": "1/s", "x": 1}, "unknown_field"),
        ({"rate": "²/s"}, "invalid_rate"),  # a digit to str.isdigit(), not to int()
        ({"rate": "\u0661\u0660/s"}, "invalid_rate"),  # Arabic-Indic digits: not what an operator typed
        ({"rate": "10/\u0661s"}, "invalid_rate"),
        ({"rate": "10/s", "partition_by": 0}, "invalid_rate"),  # was read as no partition
        ({"rate": "10/s", "partition_by": False}, "invalid_rate"),
        ({"rate": "10/s", "partition_by": []}, "invalid_rate"),
    ],
)
def test_api_refuses_a_bad_rate_with_400(operator, body, code):
    """A rate that is not "N/period" (or null) is a 400 naming the reason; nothing changes."""
    response = _post(operator, f"{KINDS}demo.noop/rate", body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert _rate("demo.noop") == (None, None, "")


def test_admin_kinds_page_sets_and_lifts_a_rate(operator):
    """The Kinds page's rate field takes "5/2s per partner" and, emptied, lifts the rate."""
    page = operator.get(KINDS_PAGE).content.decode()
    assert 'aria-label="rate of demo.noop"' in page
    operator.post(f"{KINDS_PAGE}demo.noop/rate/", {"rate": "5/2s per partner"})
    assert _rate("demo.noop") == (5, 2.0, "partner")
    assert 'value="5/2s per partner"' in operator.get(KINDS_PAGE).content.decode()
    response = operator.post(f"{KINDS_PAGE}demo.noop/rate/", {"rate": "lots"}, follow=True)
    assert "was not changed" in str(list(response.context["messages"])[-1])
    operator.post(f"{KINDS_PAGE}demo.noop/rate/", {"rate": ""})
    assert _rate("demo.noop") == (None, None, "")


def test_command_sets_lists_and_lifts_a_rate():
    """timekeeper kinds rate KIND 100/h --partition-by user; list shows it; 'none' lifts it; nonsense is refused."""
    out = io.StringIO()
    call_command("timekeeper", "kinds", "rate", "demo.noop", "100/h", "--partition-by", "user", stdout=out)
    assert _rate("demo.noop") == (100, 3600.0, "user")
    table = io.StringIO()
    call_command("timekeeper", "kinds", "list", stdout=table)
    assert table.getvalue().splitlines()[0].split()[:4] == ["kind", "paused", "cap", "rate"]
    assert "100/h per user" in table.getvalue()
    call_command("timekeeper", "kinds", "rate", "demo.noop", "none", stdout=out)
    assert _rate("demo.noop") == (None, None, "")
    with pytest.raises(CommandError, match="rate reads like"):
        call_command("timekeeper", "kinds", "rate", "demo.noop", "quick")
