"""A bug inside the jobs API is a generic 500 whose log lines hold no payload text, whatever the exception says."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduling.core import store as core_store
from scheduling.due_at import store as jobs_store
from scheduling.web import auth

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

MARKER = "4111-1111-1111-1111-card-of-Ms-Example"  # what a payload might carry, and must never be logged


@pytest.fixture
def token_headers(django_user_model: Any) -> dict[str, str]:
    user = django_user_model.objects.create_user("logger-test", password="pw")
    _, raw = auth.issue_token(user, "t")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def _explode(*args: Any, **kwargs: Any) -> Any:
    """A store function gone wrong in the way that leaks: the payload in the exception's message (and its cause's)."""
    try:
        raise KeyError({"card": MARKER})
    except KeyError as inner:
        raise ValueError(f"cannot store {{'card': {MARKER!r}}}") from inner


def test_a_500_logs_no_payload_text(client: Any, token_headers: dict[str, str], monkeypatch: Any, caplog: Any):
    """A bug in POST /api/jobs/ is a generic 500; the log has the traceback but not the payload."""
    monkeypatch.setattr(jobs_store, "insert_job", _explode)
    caplog.set_level(logging.DEBUG)
    response = client.post(
        "/api/jobs/",
        {"kind": "demo.noop", "payload": {"card": MARKER}, "delay": 60},
        content_type="application/json",
        **token_headers,
    )
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert MARKER not in response.content.decode()
    logged = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert "ValueError: (message withheld)" in logged
    assert "KeyError: (message withheld)" in logged
    assert "in _explode" in logged  # the frames are there, with their code lines
    assert MARKER not in logged


def test_a_500_on_a_job_logs_its_id(client: Any, token_headers: dict[str, str], monkeypatch: Any, caplog: Any):
    """A bug while rescheduling logs the job id, and nothing of the request body."""
    created = client.post(
        "/api/jobs/",
        {"kind": "demo.noop", "payload": {}, "delay": 60},
        content_type="application/json",
        **token_headers,
    ).json()["job"]
    monkeypatch.setattr(core_store, "database_clock", _explode)  # a delay counts from the call's clock
    caplog.set_level(logging.DEBUG)
    response = client.post(
        f"/api/jobs/{created['id']}/reschedule",
        {"delay": 120},
        content_type="application/json",
        **token_headers,
    )
    assert response.status_code == 500
    assert f"(job {created['id']})" in caplog.text
    assert MARKER not in caplog.text + "".join(str(r.__dict__) for r in caplog.records)
