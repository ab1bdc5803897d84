"""The recurrences' admin against real PostgreSQL: list, filters, next runs, bulk actions through the API."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.utils import timezone

from scheduling import api
from scheduling.models import JobState, Recurrence, RecurrenceState, ScheduledJob
from scheduling.recurring import planner

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),
]

URL = "/admin/scheduling/recurrence/"


def test_list_shows_rule_zone_and_next_runs(admin_client: Any):
    """The list shows each recurrence's rule, zone and its next runs on its own wall clock."""
    api.recur("demo.noop", {}, key="digest:1", cron="0 9 * * *", timezone="Asia/Tokyo")
    response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    assert "digest:1" in text
    assert "0 9 * * *" in text
    assert text.count('class="tk-next-run"') == 3
    assert "09:00 JST" in text


def test_filters_by_zone_kind_and_state(admin_client: Any):
    """The zone, kind and state filters narrow the list."""
    api.recur("demo.noop", {}, key="lisbon", cron="0 9 * * *", timezone="Europe/Lisbon")
    api.recur("demo.noop", {}, key="tokyo", cron="0 9 * * *", timezone="Asia/Tokyo")
    text = admin_client.get(URL, {"timezone": "Asia/Tokyo"}).content.decode()
    assert "tokyo" in text
    assert ">lisbon<" not in text
    assert admin_client.get(URL, {"kind": "demo.noop", "state": "active"}).status_code == 200


def test_bulk_pause_and_cancel_go_through_the_api(admin_client: Any):
    """The pause and cancel actions change the selection and cancel its pending occurrences."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=600).id for i in range(3)]
    response = admin_client.post(
        URL, {"action": "pause_selected", ACTION_CHECKBOX_NAME: [str(i) for i in ids[:2]]}, follow=True
    )
    assert "Paused 2 recurrences." in response.content.decode()
    assert set(Recurrence.objects.filter(state=RecurrenceState.PAUSED).values_list("id", flat=True)) == set(ids[:2])
    response = admin_client.post(
        URL, {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(i) for i in ids]}, follow=True
    )
    assert "Cancelled 3 recurrences." in response.content.decode()
    assert ScheduledJob.objects.filter(recurrence_id__in=ids, state=JobState.PENDING).count() == 0
    response = admin_client.post(URL, {"action": "pause_selected", ACTION_CHECKBOX_NAME: [str(ids[0])]}, follow=True)
    assert "only active ones can" in response.content.decode()


def test_rows_are_read_only(admin_client: Any):
    """No add or edit: a recurrence's change page shows its fields without a save button."""
    rec = api.recur("demo.noop", {}, key="k", every=600)
    assert admin_client.get(f"{URL}add/").status_code == 403
    page = admin_client.get(f"{URL}{rec.id}/change/").content.decode()
    assert 'name="_save"' not in page


@pytest.mark.parametrize("action", ["pause_selected", "resume_selected", "cancel_selected"])
def test_an_action_on_a_selection_that_is_not_ids_is_a_400(admin_client: Any, action: str):
    """_selected_action=abc answers 400, as the jobs and tokens lists do, and changes nothing."""
    rec = api.recur("demo.noop", {}, key="k", every=600)
    response = admin_client.post(URL, {"action": action, ACTION_CHECKBOX_NAME: ["abc", str(rec.id)]})
    assert response.status_code == 400
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.ACTIVE


def test_a_recurrence_the_planner_paused_shows_why_in_the_list_and_on_its_page(admin_client: Any, django_user_model):
    """An owner deactivated: the planner pauses the recurrence and the admin shows the reason beside its state."""
    erin = django_user_model.objects.create_user("erin")
    rec = api.recur("demo.noop", {}, key="k", every=600, owner=erin)
    ScheduledJob.objects.filter(recurrence=rec).update(
        state=JobState.DONE, finished_at=timezone.now(), occurrence_at=timezone.now() - dt.timedelta(hours=1)
    )
    Recurrence.objects.filter(pk=rec.id).update(current_at=timezone.now() - dt.timedelta(hours=1))
    erin.is_active = False
    erin.save()
    planner.plan_once()
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.PAUSED
    assert "its owner is deactivated" in admin_client.get(URL).content.decode()
    assert "its owner is deactivated" in admin_client.get(f"{URL}{rec.id}/change/").content.decode()


def test_change_recurrence_grants_the_actions_never_a_rewrite(client: Any, django_user_model):
    """Staff with change_recurrence pause another user's recurrence; posting its change form is refused (403)."""
    dave = django_user_model.objects.create_user("dave", password="pw", is_staff=True)
    dave.user_permissions.add(*Permission.objects.filter(codename__in=["view_recurrence", "change_recurrence"]))
    alice = django_user_model.objects.create_user("alice")
    rec = api.recur("demo.noop", {"v": 1}, key="k", every=600, owner=alice)
    client.force_login(dave)
    edit = {"kind": "demo.record", "payload": '{"v": 2}', "every_seconds": "1", "priority": "9", "max_attempts": "1000"}
    assert client.post(f"{URL}{rec.id}/change/", edit).status_code == 403
    stored = Recurrence.objects.get(pk=rec.id)
    assert (stored.kind, stored.payload, stored.every_seconds) == ("demo.noop", {"v": 1}, 600)
    response = client.post(URL, {"action": "pause_selected", ACTION_CHECKBOX_NAME: [str(rec.id)]}, follow=True)
    assert "Paused 1 recurrence." in response.content.decode()


def test_next_runs_are_separated_by_line_breaks_not_a_literal_br(admin_client: Any):
    """The list's "Next runs" puts each instant on its own line: a <br> tag, never the text "<br>"."""
    api.recur("demo.noop", {}, key="breaks", cron="0 9 * * *")
    text = admin_client.get(URL).content.decode()
    assert "&lt;br&gt;" not in text
    assert text.count('</time><br><time class="tk-next-run"') == 2


def test_a_recurrence_page_has_no_delete_button_and_says_why(admin_client: Any):
    """The page offers no Delete (it would answer 403): a recurrence ends by cancel, as the page explains."""
    recurrence = api.recur("demo.noop", {}, key="nodelete", every=3600)
    page = admin_client.get(f"{URL}{recurrence.pk}/change/").content.decode()
    assert "deletelink" not in page
    assert f"{URL}{recurrence.pk}/delete/" not in page
    assert "A recurrence ends by cancel and is deleted only with its owner" in page


def test_a_recurrence_page_pauses_resumes_and_cancels_through_the_api(admin_client: Any):
    """The page's buttons are those of its state; each runs the list's action on this recurrence and comes back."""
    recurrence = api.recur("demo.noop", {}, key="buttons", every=3600)
    page_url = f"{URL}{recurrence.pk}/change/"

    def buttons() -> list[str]:
        return re.findall(r'name="recurrence-action" value="(\w+)"', admin_client.get(page_url).content.decode())

    assert buttons() == ["pause", "cancel"]
    response = admin_client.post(f"{URL}{recurrence.pk}/act/pause/", follow=True)
    assert response.redirect_chain[-1][0] == page_url
    assert [str(m) for m in response.context["messages"]] == ["Paused 1 recurrence."]
    assert Recurrence.objects.get(pk=recurrence.pk).state == RecurrenceState.PAUSED
    assert buttons() == ["resume", "cancel"]
    admin_client.post(f"{URL}{recurrence.pk}/act/resume/")
    admin_client.post(f"{URL}{recurrence.pk}/act/cancel/")
    assert Recurrence.objects.get(pk=recurrence.pk).state == RecurrenceState.CANCELLED
    assert buttons() == []
    assert admin_client.get(f"{URL}{recurrence.pk}/act/pause/").status_code == 400


def test_a_recurrence_page_lists_its_latest_runs_and_links_to_all(admin_client: Any):
    """The page lists the recurrence's occurrences (linked) and links to the jobs list filtered to them."""
    recurrence = api.recur("demo.noop", {}, key="runs", every=3600)
    occurrence = ScheduledJob.objects.get(recurrence_id=recurrence.pk)
    page = admin_client.get(f"{URL}{recurrence.pk}/change/").content.decode()
    assert f'<tr data-job="{occurrence.pk}">' in page
    assert f'href="/admin/scheduling/scheduledjob/?recurrence={recurrence.pk}"' in page
