"""The recurrences' admin against real PostgreSQL: list, filters, next runs, bulk actions through the API."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from scheduling import api
from scheduling.models import JobState, Recurrence, RecurrenceState, ScheduledJob

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
