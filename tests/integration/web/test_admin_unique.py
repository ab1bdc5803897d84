"""The admin's add form and uniqueness windows: unique_for and unique_states reach api.schedule."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.models import ScheduledJob
from tests import support
from tests.integration.web.test_admin import ADD, _add

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


@pytest.fixture
def admin(admin_client: Any) -> Any:
    return admin_client


def test_a_second_add_in_the_window_is_refused_or_kept(admin):
    """unique_for on the form: the same payload again is a form error with error, the first job with keep."""
    support.clear_of_a_slot_edge(3600)  # the three adds meet in one hour's slot
    first = _add(admin, payload='{"v": 1}', delay_seconds="600", unique_for="3600")
    assert first.status_code == 302, first.content.decode()[:2000]
    job = ScheduledJob.objects.get()
    assert job.unique_key is not None
    refused = _add(admin, payload='{"v": 1}', delay_seconds="5", unique_for="3600", on_conflict="error")
    assert refused.status_code == 200
    assert f"A job like this one ({job.id}, pending) already exists within its unique window." in (
        refused.content.decode()
    )
    kept = _add(
        admin,
        payload='{"v": 1}',
        delay_seconds="5",
        unique_for="3600",
        unique_states=["pending", "claimed", "running", "dead"],
        on_conflict="keep",
    )
    assert kept.status_code == 302
    assert list(ScheduledJob.objects.values_list("id", "due_at")) == [(job.id, job.due_at)]


def test_without_a_window_the_same_payload_is_a_second_job(admin):
    """No unique_for (and a kind without a window): the same payload twice makes two jobs."""
    for _ in range(2):
        assert _add(admin, payload='{"v": 1}', delay_seconds="600").status_code == 302
    assert ScheduledJob.objects.count() == 2


def test_the_chosen_states_are_stored_on_the_job(admin):
    """Ticked unique_states are the job's own (in the API's fixed order)."""
    _add(admin, delay_seconds="600", unique_for="60", unique_states=["dead", "running", "claimed", "pending"])
    assert tuple(ScheduledJob.objects.get().unique_states) == ("pending", "claimed", "running", "dead")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"unique_for": "0.5"}, "at least 1 second"),
        ({"unique_for": "-1"}, "greater than or equal to 0"),
        ({"unique_for": "60", "unique_states": ["done"]}, "unique_states must include pending"),
    ],
)
def test_bad_window_options_are_form_errors(admin, fields, says):
    """A window under a second, a negative one, or states without the waiting ones: form errors, no row."""
    response = _add(admin, delay_seconds="5", **fields)
    assert response.status_code == 200
    assert says in response.content.decode()
    assert ScheduledJob.objects.count() == 0


def test_the_add_page_shows_the_window_fields(admin):
    """The add page offers the window's length and its states."""
    page = admin.get(ADD).content.decode()
    assert 'name="unique_for"' in page
    assert page.count('name="unique_states"') == 6
