"""The jobs API's uniqueness windows: unique_for and unique_states in the body, 409 duplicate_job."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.models import ScheduledJob
from tests import support
from tests.integration.web.test_jobs_api import URL, error_of, logged_in, post_json

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


def test_a_second_job_in_the_window_is_kept_or_refused(alice):
    """unique_for in the body: the same payload again is kept (200), or 409 duplicate_job naming it with error."""
    support.clear_of_a_slot_edge(3600)  # the three posts meet in one hour's slot
    client = logged_in(alice)
    body = {"kind": "demo.noop", "payload": {"v": 1}, "delay": 600, "unique_for": 3600}
    first = post_json(client, URL, body)
    assert first.status_code == 201
    kept = post_json(client, URL, {**body, "on_conflict": "keep"})
    assert (kept.status_code, kept.json()["outcome"]) == (200, "kept")
    assert kept.json()["job"]["id"] == first.json()["job"]["id"]
    refused = post_json(
        client, URL, {**body, "on_conflict": "error", "unique_states": ["pending", "claimed", "running"]}
    )
    assert refused.status_code == 409
    error = error_of(refused)
    assert (error["code"], error["job_id"], error["state"]) == ("duplicate_job", first.json()["job"]["id"], "pending")
    assert ScheduledJob.objects.count() == 1


@pytest.mark.parametrize("extra", [{"unique_for": -5}, {"unique_for": "soon"}, {"unique_states": ["done"]}])
def test_bad_window_options_are_400(alice, extra):
    """A negative or non-numeric window, or unique_states without the waiting states: 400 invalid_schedule."""
    response = post_json(logged_in(alice), URL, {"kind": "demo.noop", "delay": 60, "unique_for": 60, **extra})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_schedule"
