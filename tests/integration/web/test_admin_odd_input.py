"""The jobs admin given what a person may type or a URL may carry: a page with the reason, never a 500.

Each case below was a 500 (a database error, ``int()`` of a digit only ``str.isdigit()`` takes, a
recursion) or a success message for a change that was not made; nothing stored changes.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from scheduling import api
from scheduling.models import JobState, ScheduledJob

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

CHANGELIST = "/admin/scheduling/scheduledjob/"
PAST_BIGINT = "9999999999999999999"  # 19 digits, like every bigint, and past its largest


def _rows() -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, due_at, state, payload::text, updated_at FROM scheduling_scheduledjob ORDER BY id")
        return cursor.fetchall()


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


@pytest.mark.parametrize(
    ("term", "says"),
    [
        ('a="\\ud800"', "unpaired UTF-16 surrogate"),
        ('a="\\u0000"', "NUL character"),
        ("a=" + "[" * 3000, "nests too deeply"),
        (".".join(["a"] * 5000) + "=1", "more than 32 levels"),
        ("a=" + "[" * 40 + "]" * 40, "more than 32 levels"),
    ],
)
def test_a_payload_search_postgresql_cannot_take_is_refused_with_the_reason(admin_client, term, says):
    api.schedule("demo.noop", {"a": 1}, delay=600)
    before = _rows()
    response = admin_client.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    assert any(says in message for message in _messages(response)), _messages(response)
    assert _rows() == before


@pytest.mark.parametrize("term", ["a=NaN", "a=Infinity", "a=1e999"])
def test_numbers_json_has_not_are_searched_as_text(admin_client, term):
    """NaN, Infinity and 1e999 are no JSON numbers PostgreSQL takes: they are looked for as the text typed."""
    text = api.schedule("demo.noop", {"a": term.partition("=")[2]}, delay=600)
    api.schedule("demo.noop", {"a": 1}, delay=600)
    response = admin_client.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    assert [job.pk for job in response.context["cl"].result_list] == [text.id]


@pytest.mark.parametrize(
    ("path", "query"),
    [
        (CHANGELIST, {"q": "\u00b2"}),  # a digit to str.isdigit(), not to int()
        (CHANGELIST, {"q": PAST_BIGINT}),
        (CHANGELIST, {"recurrence": "\u00b2"}),
        (CHANGELIST, {"recurrence": PAST_BIGINT}),
        ("/admin/scheduling/auditrecord/", {"job": PAST_BIGINT}),
        ("/admin/scheduling/auditrecord/", {"job": "\u00b2"}),
    ],
)
def test_ids_in_urls_that_no_row_can_have_are_no_500(admin_client, path, query):
    api.schedule("demo.noop", {}, delay=600)
    response = admin_client.get(path, query)
    assert response.status_code in (200, 302), response.content[:500]


def test_the_history_of_a_job_id_past_bigint_is_no_500(admin_client):
    response = admin_client.get(f"{CHANGELIST}{PAST_BIGINT}/history/")
    assert response.status_code in (200, 302, 404)


def test_a_selection_holding_an_id_past_bigint_is_a_400_and_changes_nothing(admin_client):
    job = api.schedule("demo.noop", {}, delay=600)
    before = _rows()
    response = admin_client.post(
        CHANGELIST, {"action": "cancel_selected", "_selected_action": [str(job.id), PAST_BIGINT], "index": "0"}
    )
    assert response.status_code == 400
    assert _rows() == before


def test_the_add_form_refuses_a_payload_postgresql_cannot_store_and_shows_it_again(admin_client):
    """A lone surrogate typed as an escape: a form error naming it, the text shown as typed, nothing stored."""
    response = admin_client.post(
        f"{CHANGELIST}add/",
        {"kind": "demo.noop", "payload": '{"a": "\\ud800"}', "delay_seconds": "60", "on_conflict": "replace"},
    )
    assert response.status_code == 200
    assert "unpaired UTF-16 surrogate" in response.content.decode()
    assert ScheduledJob.objects.count() == 0


def test_moving_a_job_that_left_pending_after_its_page_was_shown_says_why_not(admin_client):
    """The page was shown while pending; the job finished; its due time posted is a form error, not "changed"."""
    job = api.schedule("demo.noop", {}, delay=600)
    api.cancel(job.id)
    before = _rows()
    response = admin_client.post(
        f"{CHANGELIST}{job.id}/change/",
        {
            "due_at_0": "2032-03-04",
            "due_at_1": "05:06:07",
            "attempt_set-TOTAL_FORMS": "0",
            "attempt_set-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200, "the form again, not a redirect after a save"
    assert f"Job {job.id} is cancelled; only a pending job can be rescheduled." in response.content.decode()
    assert not any("changed successfully" in message for message in _messages(response))
    assert _rows() == before
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.CANCELLED
