"""The doors over kind controls: the kinds JSON API, the admin's Kinds page, ``manage.py timekeeper kinds``."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client

from scheduling import api, exceptions
from scheduling.models import KindControl, ScheduledJob

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
    user.user_permissions.add(Permission.objects.get(codename__in=["change_kindcontrol"]))
    client = Client()
    client.force_login(user)
    return client


def _post(client: Client, url: str, body: Any = None) -> Any:
    if body is None:
        return client.post(url, "", content_type="application/json")
    return client.post(url, json.dumps(body), content_type="application/json")


def _control(kind: str) -> tuple[bool, int | None]:
    row = KindControl.objects.filter(kind=kind).first()
    return (row.paused, row.max_running) if row else (False, None)


def test_api_pauses_resumes_and_caps_a_kind(operator):
    """POST pause, cap and resume change the kind's controls and answer with its overview."""
    api.schedule("demo.noop", {}, delay=0)
    body = _post(operator, f"{KINDS}demo.noop/pause").json()
    assert (body["kind"], body["paused"], body["due"]) == ("demo.noop", True, 1)
    assert _post(operator, f"{KINDS}demo.noop/cap", {"max_running": 3}).json()["max_running"] == 3
    assert _post(operator, f"{KINDS}demo.noop/resume").json()["paused"] is False
    assert _control("demo.noop") == (False, 3)
    assert _post(operator, f"{KINDS}demo.noop/cap", {"max_running": None}).json()["max_running"] is None
    listed = {k["kind"]: k for k in operator.get(KINDS).json()["results"]}
    assert {"demo.noop", "reminders.trial_ending"} <= set(listed)
    assert listed["demo.noop"]["max_running"] is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"max_running": 0}, "invalid_cap"),
        ({"max_running": "3"}, "invalid_cap"),
        ({"max_running": True}, "invalid_cap"),
        ({"max_running": 10**500}, "invalid_cap"),  # math.isfinite() overflows on it
        ({}, "invalid_request"),
        ({"max_running": 2, "extra": 1}, "unknown_field"),
    ],
)
def test_api_refuses_a_bad_cap_with_400_and_the_reason(operator, body, code):
    """A cap that is not a whole number from 1, or null, is a 400 naming the reason; nothing changes."""
    response = _post(operator, f"{KINDS}demo.noop/cap", body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert _control("demo.noop") == (False, None)


def test_api_unknown_kind_is_404(operator):
    """Controls of a kind nobody registered are a 404, and no control row is made."""
    response = _post(operator, f"{KINDS}no.such.kind/pause")
    assert (response.status_code, response.json()["error"]["code"]) == (404, "unknown_kind")
    assert not KindControl.objects.exists()


def test_a_kind_whose_code_is_gone_can_still_be_resumed_and_uncapped(operator):
    """A control left on a kind no longer registered can be lifted (API and Python), but not set again."""
    KindControl.objects.create(kind="gone.kind", paused=True, max_running=3)
    response = _post(operator, f"{KINDS}gone.kind/resume")
    assert response.status_code == 200, response.content
    assert _control("gone.kind") == (False, 3)
    assert _post(operator, f"{KINDS}gone.kind/cap", {"max_running": None}).status_code == 200
    assert _control("gone.kind") == (False, None)
    assert _post(operator, f"{KINDS}gone.kind/pause").status_code == 404, "no new control on an unknown kind"
    assert _post(operator, f"{KINDS}gone.kind/cap", {"max_running": 2}).status_code == 404
    api.resume("gone.kind")  # the Python API lifts it too, once a row exists
    with pytest.raises(exceptions.UnknownJobKind):
        api.resume("never.registered")


def test_api_needs_staff_with_the_kindcontrol_permission(django_user_model):
    """A customer, or staff without scheduling.change_kindcontrol, gets 403 with the reason; anonymous 401."""
    customer = django_user_model.objects.create_user("carol", password="pw")
    staff = django_user_model.objects.create_user("sam", password="pw", is_staff=True)
    for user, says in ((customer, "staff"), (staff, "scheduling.change_kindcontrol")):
        client = Client()
        client.force_login(user)
        for response in (client.get(KINDS), _post(client, f"{KINDS}demo.noop/pause")):
            assert response.status_code == 403
            assert says in response.json()["error"]["message"]
    assert Client().get(KINDS).status_code == 401
    assert not KindControl.objects.exists()


def test_api_create_takes_a_priority_and_refuses_one_outside_0_to_9(django_user_model):
    """POST /api/jobs/ stores the priority given; 10, -1, "3" or true are a 400 naming the range."""
    alice = django_user_model.objects.create_user("alice", password="pw")
    alice.user_permissions.add(Permission.objects.get(codename="prioritize_job"))  # priority 8 is above demo.noop's 0
    client = Client()
    client.force_login(alice)
    made = _post(client, "/api/jobs/", {"kind": "demo.noop", "delay": 60, "priority": 8})
    assert made.status_code == 201
    assert made.json()["job"]["priority"] == 8
    for bad in (10, -1, "3", True, 2.5):
        response = _post(client, "/api/jobs/", {"kind": "demo.noop", "delay": 60, "priority": bad})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_priority"
        assert "0 to 9" in response.json()["error"]["message"]
    assert ScheduledJob.objects.count() == 1


def test_admin_kinds_page_lists_every_kind_and_pauses_resumes_caps(operator):
    """The Kinds page lists registered kinds; its buttons pause, cap and resume through scheduling.api."""
    page = operator.get(KINDS_PAGE).content.decode()
    assert 'data-kind="demo.noop"' in page
    assert 'data-kind="reports.settlement"' in page
    response = operator.post(f"{KINDS_PAGE}demo.noop/pause/", follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "Paused demo.noop: its due jobs stay pending and its fixed-time schedules' ticks are skipped "
        "until it is resumed."
    ]
    assert 'data-kind="demo.noop" data-paused="true"' in response.content.decode()
    operator.post(f"{KINDS_PAGE}demo.noop/cap/", {"max_running": "2"})
    assert _control("demo.noop") == (True, 2)
    response = operator.post(f"{KINDS_PAGE}demo.noop/cap/", {"max_running": "0"}, follow=True)
    assert "was not changed" in str(list(response.context["messages"])[-1])
    operator.post(f"{KINDS_PAGE}demo.noop/resume/")
    operator.post(f"{KINDS_PAGE}demo.noop/cap/", {"max_running": ""})
    assert _control("demo.noop") == (False, None)


def test_admin_kinds_page_calls_an_unpaused_kind_active_not_running(operator):
    """A kind that is not paused reads "active" (not "running" beside a count of 0 running) and the page says
    that a pause skips the kind's fixed-time ticks too."""
    page = operator.get(KINDS_PAGE).content.decode()
    row = page[page.index('data-kind="demo.noop"') :]
    assert re.search(r'<td class="tk-kind-state">\s*active\s*</td>', row[: row.index("</tr>")])
    assert "skips the ticks of its fixed-time schedules" in page


def test_admin_kinds_page_refuses_changes_without_the_permission(django_user_model):
    """A staff member who may only view kind controls sees the page without buttons and cannot post."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_kindcontrol"))
    client = Client()
    client.force_login(user)
    page = client.get(KINDS_PAGE).content.decode()
    assert 'data-kind="demo.noop"' in page
    assert "Pause</button>" not in page
    assert client.post(f"{KINDS_PAGE}demo.noop/pause/").status_code == 403
    assert not KindControl.objects.exists()


def test_command_pauses_caps_resumes_and_lists():
    """timekeeper kinds pause/cap/resume change the controls; list --json shows them."""
    out = io.StringIO()
    call_command("timekeeper", "kinds", "pause", "demo.noop", stdout=out)
    call_command("timekeeper", "kinds", "cap", "demo.noop", "4", stdout=out)
    assert _control("demo.noop") == (True, 4)
    call_command("timekeeper", "kinds", "resume", "demo.noop", stdout=out)
    call_command("timekeeper", "kinds", "cap", "demo.noop", "none", stdout=out)
    assert _control("demo.noop") == (False, None)
    listing = io.StringIO()
    call_command("timekeeper", "kinds", "list", "--json", stdout=listing)
    assert "demo.noop" in {k["kind"] for k in json.loads(listing.getvalue())}
    table = io.StringIO()
    call_command("timekeeper", "kinds", "list", stdout=table)
    assert table.getvalue().splitlines()[0].split()[:3] == ["kind", "paused", "cap"]


@pytest.mark.parametrize(
    ("args", "says"),
    [(("pause", "no.such"), "timekeeper kinds list"), (("cap", "demo.noop", "zero"), "whole number")],
)
def test_command_refuses_unknown_kinds_and_bad_caps(args, says):
    """An unknown kind or a cap that is not a number is a CommandError a person can act on."""
    with pytest.raises(CommandError, match=says):
        call_command("timekeeper", "kinds", *args)
    assert not KindControl.objects.exists()
