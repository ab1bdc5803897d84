"""The jobs JSON API against real PostgreSQL: every status code, owner scoping, CSRF and tokens."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.utils import timezone

from scheduling import api
from scheduling.core import store as core_store
from scheduling.due_at import store as jobs_store
from scheduling.models import ApiToken, JobAbort, JobState, ScheduledJob
from scheduling.web import auth
from tasks.models import Trial

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

URL = "/api/jobs/"


def _snapshot() -> list[tuple[Any, ...]]:
    """Every job row as stored, to prove a refused request changed nothing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, kind, payload::text, due_at, state, attempts, key, owner_id, updated_at"
            " FROM scheduling_scheduledjob ORDER BY id"
        )
        return cursor.fetchall()


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob")


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    """A staff member with the admin's view and change permissions on jobs."""
    user = django_user_model.objects.create_user("operator", password="pw-op", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="scheduling", codename__in=_JOB_PERMISSIONS)
    )
    return user


_JOB_PERMISSIONS = ["view_scheduledjob", "change_scheduledjob"]


def logged_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def post_json(client: Client, url: str, body: Any, **extra: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json", **extra)


def soon(minutes: int = 30) -> str:
    return (timezone.now() + dt.timedelta(minutes=minutes)).isoformat()


def error_of(response: Any) -> dict[str, Any]:
    return response.json()["error"]


# --- create ---------------------------------------------------------------------------------------------


def test_create_returns_201_with_location_and_stores_an_owned_job(alice):
    """POST with kind, payload and an aware due_at creates a pending job owned by the caller."""
    due = soon()
    trial = Trial.objects.create(user=alice, ends_at=timezone.now() + dt.timedelta(days=10))
    TRIAL = {"user_id": alice.id, "trial_id": trial.id}
    response = post_json(logged_in(alice), URL, {"kind": "reminders.trial_ending", "payload": TRIAL, "due_at": due})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["outcome"] == "created"
    job = ScheduledJob.objects.get(pk=body["job"]["id"])
    assert response["Location"] == f"/api/jobs/{job.id}"
    assert (job.kind, job.payload, job.state, job.owner_id) == ("reminders.trial_ending", TRIAL, "pending", alice.id)
    assert job.due_at == dt.datetime.fromisoformat(due)
    assert body["job"]["max_attempts"] == 5


def test_create_with_delay_uses_the_database_clock(alice):
    """A delay in seconds is added to the database clock at the call (clock_timestamp())."""
    response = post_json(logged_in(alice), URL, {"kind": "demo.noop", "delay": 120, "max_attempts": 2})
    assert response.status_code == 201
    job = ScheduledJob.objects.get(pk=response.json()["job"]["id"])
    ahead = (job.due_at - core_store.database_clock()).total_seconds()
    assert 110 < ahead <= 120
    assert job.max_attempts == 2


def deep_json(depth: int) -> str:
    return '{"kind": "demo.noop", "delay": 1, "payload": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ("{not json", "invalid_json", "not valid JSON"),
        ("[1, 2]", "invalid_json", "must be a JSON object"),
        ('{"kind": "demo.noop", "delay": NaN}', "invalid_json", "NaN"),
        (deep_json(10_000), "invalid_json", "nested too deeply"),
        (
            '{"kind": "reminders.trial_ending", "delay": 1, "payload": {"user_id": "x", "trial_id": 2}}',
            "invalid_payload",
            "user_id",
        ),
        ('{"kind": "reminders.trial_ending", "delay": 1, "payload": [1]}', "invalid_payload", "JSON object"),
        ('{"kind": "demo.noop", "due_at": "2030-01-01T10:00:00"}', "invalid_schedule", "timezone-aware"),
        ('{"kind": "demo.noop", "due_at": "2030-02-30T10:00:00+00:00"}', "invalid_schedule", "not a valid ISO-8601"),
        ('{"kind": "demo.noop", "due_at": "0001-01-01T00:00:00+05:00"}', "invalid_schedule", "out of range"),
        ('{"kind": "demo.noop", "due_at": 1700000000}', "invalid_schedule", "ISO-8601"),
        ('{"kind": "demo.noop", "due_at": "2030-01-01T10:00:00+00:00", "delay": 5}', "invalid_schedule", "exactly one"),
        ('{"kind": "demo.noop"}', "invalid_schedule", "exactly one"),
        ('{"kind": "demo.noop", "delay": -1}', "invalid_schedule", ">= 0"),
        ('{"kind": "demo.noop", "delay": "10"}', "invalid_schedule", "seconds"),
        ('{"kind": "demo.noop", "delay": 1, "max_attempts": 0}', "invalid_schedule", "max_attempts"),
        ('{"kind": "demo.noop", "delay": 1, "on_conflict": "merge", "key": "k"}', "invalid_schedule", "on_conflict"),
        ('{"kind": "demo.noop", "delay": 1, "colour": "red"}', "unknown_field", "colour"),
        ('{"delay": 1}', "invalid_request", "kind is required"),
        (b'{"kind": "demo.noop", "delay": 1, "payload": {"x": "\xff"}}', "invalid_json", "not valid JSON"),
    ],
)
def test_bad_create_is_400_with_the_reason_and_stores_nothing(alice, body, code, says):
    """Bad JSON, kind, payload, time or field: 400 naming the problem, and no row."""
    response = logged_in(alice).post(URL, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == code
    assert says in error_of(response)["message"]
    assert ScheduledJob.objects.count() == 0


def test_payload_over_the_limit_is_413_and_stores_nothing(alice, settings):
    """A payload whose JSON encoding is over SCHEDULING_MAX_PAYLOAD_BYTES is refused with 413."""
    settings.SCHEDULING_MAX_PAYLOAD_BYTES = 1000
    response = post_json(logged_in(alice), URL, {"kind": "demo.noop", "delay": 1, "payload": {"blob": "x" * 1200}})
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"
    assert error_of(response)["limit"] == 1000
    assert ScheduledJob.objects.count() == 0


def test_body_over_the_limit_is_413_before_it_is_parsed(alice):
    """A request body far over the payload limit is refused from its Content-Length (64 KiB default)."""
    body = json.dumps({"kind": "demo.noop", "delay": 1, "payload": {"blob": "x" * 200_000}})
    response = logged_in(alice).post(URL, body, content_type="application/json")
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"
    assert ScheduledJob.objects.count() == 0


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("application/x-www-form-urlencoded", "kind=demo.noop&delay=1"),
        ("text/plain", '{"kind": "demo.noop", "delay": 1}'),
    ],
)
def test_wrong_content_type_is_415_and_stores_nothing(alice, content_type, data):
    """Anything but application/json is refused with 415."""
    response = logged_in(alice).post(URL, data, content_type=content_type)
    assert response.status_code == 415
    assert "application/json" in error_of(response)["message"]
    assert ScheduledJob.objects.count() == 0


# --- methods and authentication -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("put", URL, "GET, HEAD, POST"),
        ("delete", "/api/jobs/{id}", "GET, HEAD"),
        ("get", "/api/jobs/{id}/cancel", "POST"),
        ("patch", "/api/jobs/{id}/reschedule", "POST"),
    ],
)
def test_wrong_method_is_405_with_allow_and_changes_nothing(alice, method, path, allow):
    """A method the endpoint does not take is 405 with an Allow header, and nothing changes."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    before = _snapshot()
    response = getattr(logged_in(alice), method)(path.format(id=job.id))
    assert response.status_code == 405
    assert response["Allow"] == allow
    assert _snapshot() == before


def test_anonymous_and_bad_tokens_are_401(alice):
    """No session and no token, a malformed header, an unknown or revoked token, or an inactive user: 401."""
    _token, raw = auth.issue_token(alice, "billing")
    revoked, revoked_raw = auth.issue_token(alice, "old")
    ApiToken.objects.filter(pk=revoked.pk).update(revoked=True)
    anonymous = Client()
    response = anonymous.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert post_json(anonymous, URL, {"kind": "demo.noop", "delay": 1}).status_code == 401
    for header in ["Basic YWxpY2U6cHc=", "Bearer", "Bearer tk_wrong", f"Bearer {revoked_raw}", raw]:
        assert anonymous.get(URL, HTTP_AUTHORIZATION=header).status_code == 401, header
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    assert anonymous.get(URL, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    assert ScheduledJob.objects.count() == 0


def test_session_post_without_csrf_token_is_403_and_stores_nothing(alice):
    """A browser session must send the CSRF token; without it the request is refused with 403."""
    client = logged_in(alice, csrf=True)
    response = post_json(client, URL, {"kind": "demo.noop", "delay": 1})
    assert response.status_code == 403
    assert error_of(response)["code"] == "csrf_failed"
    assert ScheduledJob.objects.count() == 0
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").status_code == 403
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


def test_session_post_with_csrf_token_is_accepted(alice):
    """The same session request with the CSRF cookie and header goes through."""
    client = logged_in(alice, csrf=True)
    client.get("/admin/login/")  # any page that renders a form sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = post_json(client, URL, {"kind": "demo.noop", "delay": 1}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201, response.content


def test_bearer_token_needs_no_csrf_and_acts_as_its_user(alice):
    """A service with a bearer token creates jobs without CSRF; they belong to the token's user."""
    token, raw = auth.issue_token(alice, "billing")
    assert ApiToken.objects.get(pk=token.pk).key_hash == auth.hash_token(raw)
    assert raw not in str(list(ApiToken.objects.values_list(flat=False)))
    service = Client(enforce_csrf_checks=True)
    response = post_json(service, URL, {"kind": "demo.noop", "delay": 60}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 201, response.content
    assert ScheduledJob.objects.get(pk=response.json()["job"]["id"]).owner_id == alice.id
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


# --- owner scoping --------------------------------------------------------------------------------------------


def test_another_owners_job_is_404_for_every_verb_and_unchanged(alice, bob):
    """Bob cannot see, cancel or reschedule Alice's job: 404 each time, and the row is untouched."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    before = _snapshot()
    client = logged_in(bob)
    assert client.get(f"/api/jobs/{job.id}").status_code == 404
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").status_code == 404
    assert post_json(client, f"/api/jobs/{job.id}/reschedule", {"delay": 5}).status_code == 404
    assert client.get(URL).json()["count"] == 0
    assert _snapshot() == before


def test_staff_see_and_change_every_job(alice, staff):
    """Staff with the admin's view and change permissions list everyone's jobs and may cancel them."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    api.schedule("demo.noop", {}, delay=600, owner=None)
    client = logged_in(staff)
    assert client.get(URL).json()["count"] == 2
    assert client.get(f"/api/jobs/{job.id}").status_code == 200
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").json()["state"] == "cancelled"


def test_a_key_used_by_another_owner_is_a_separate_job_and_left_alone(alice, bob):
    """Keys are per owner: Bob's job under Alice's key text is his own; hers is neither shown nor changed."""
    job = api.schedule("demo.noop", {"v": 1}, delay=600, key="shared-key", owner=alice)
    before = _snapshot()
    bobs = None
    for on_conflict in ("replace", "keep", "error"):
        response = post_json(
            logged_in(bob),
            URL,
            {"kind": "demo.noop", "payload": {"v": 2}, "delay": 5, "key": "shared-key", "on_conflict": on_conflict},
        )
        if on_conflict == "error":  # meets Bob's own job from the first round, never Alice's
            assert response.status_code == 409
            assert error_of(response)["job_id"] == bobs
        else:
            assert response.status_code in (200, 201), response.content
            assert response.json()["job"]["owner"] == bob.id
            bobs = response.json()["job"]["id"]
            assert bobs != job.id
    assert [row for row in _snapshot() if row[0] == job.id] == [row for row in before if row[0] == job.id]
    assert ScheduledJob.objects.filter(key="shared-key").count() == 2


def test_own_key_replace_keep_and_error(alice):
    """With their own key: replace moves the job (200), keep returns it (200), error is 409."""
    client = logged_in(alice)
    first = post_json(client, URL, {"kind": "demo.noop", "payload": {"v": 1}, "delay": 600, "key": "mine"}).json()
    replaced = post_json(client, URL, {"kind": "demo.noop", "payload": {"v": 2}, "delay": 900, "key": "mine"})
    assert replaced.status_code == 200
    assert replaced.json()["outcome"] == "replaced"
    assert replaced.json()["job"]["id"] == first["job"]["id"]
    assert replaced.json()["job"]["payload"] == {"v": 2}
    kept = post_json(
        client, URL, {"kind": "demo.noop", "payload": {"v": 3}, "delay": 5, "key": "mine", "on_conflict": "keep"}
    )
    assert (kept.status_code, kept.json()["outcome"], kept.json()["job"]["payload"]) == (200, "kept", {"v": 2})
    refused = post_json(client, URL, {"kind": "demo.noop", "delay": 5, "key": "mine", "on_conflict": "error"})
    assert refused.status_code == 409
    assert error_of(refused)["code"] == "key_conflict"
    assert ScheduledJob.objects.count() == 1


# --- get, cancel, reschedule -----------------------------------------------------------------------------------


def test_get_shows_the_job_with_its_attempts(alice):
    """GET /api/jobs/<id> returns the job and its attempt history."""
    job = api.schedule("demo.noop", {"n": 1}, delay=600, owner=alice)
    body = logged_in(alice).get(f"/api/jobs/{job.id}").json()
    assert (body["id"], body["state"], body["payload"], body["attempt_history"]) == (job.id, "pending", {"n": 1}, [])


def test_unknown_and_huge_ids_are_404(alice):
    """A job id that does not exist, even past the bigint range, is 404 (not a database error)."""
    client = logged_in(alice)
    assert client.get("/api/jobs/999999999").status_code == 404
    assert client.get("/api/jobs/99999999999999999999").status_code == 404
    assert client.post("/api/jobs/99999999999999999999/cancel", content_type="application/json").status_code == 404


def test_cancel_a_pending_job_then_409_naming_its_state(alice):
    """Cancel works once; a second cancel is 409 and says the job is cancelled."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    client = logged_in(alice)
    response = client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    again = client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json")
    assert again.status_code == 409
    assert error_of(again)["state"] == "cancelled"
    assert "cancelled" in error_of(again)["message"]


def test_cancel_and_reschedule_of_a_claimed_job_are_409_and_change_nothing(alice):
    """A claimed (running) job cannot be cancelled or moved: 409 with state=claimed."""
    job = api.schedule("demo.noop", {}, delay=0, owner=alice)
    assert [c.id for c in jobs_store.claim_due_jobs(10)] == [job.id]
    before = _snapshot()
    client = logged_in(alice)
    response = client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json")
    assert (response.status_code, error_of(response)["state"]) == (409, "claimed")
    response = post_json(client, f"/api/jobs/{job.id}/reschedule", {"delay": 60})
    assert (response.status_code, error_of(response)["state"]) == (409, "claimed")
    assert _snapshot() == before


def test_abort_a_running_job_is_202_a_claim_200_and_a_finished_job_409(alice):
    """POST .../abort: 202 for a running job (its worker stops it), 200 for a claim (cancelled), 409 once done."""
    running = api.schedule("demo.noop", {}, delay=0, owner=alice)
    claimed = api.schedule("demo.noop", {"n": 2}, delay=0, owner=alice)
    claims = {c.id: c.token for c in jobs_store.claim_due_jobs(10)}
    jobs_store.start_jobs([(running.id, claims[running.id])], "worker-1")
    client = logged_in(alice)
    response = client.post(f"/api/jobs/{running.id}/abort", content_type="application/json")
    assert (response.status_code, response.json()["abort"], response.json()["state"]) == (202, "requested", "running")
    response = client.post(f"/api/jobs/{claimed.id}/abort", content_type="application/json")
    assert (response.status_code, response.json()["abort"], response.json()["state"]) == (200, "cancelled", "cancelled")
    again = client.post(f"/api/jobs/{claimed.id}/abort", content_type="application/json")
    assert (again.status_code, error_of(again)["code"], error_of(again)["state"]) == (
        409,
        "state_conflict",
        "cancelled",
    )
    assert "before the abort arrived" in error_of(again)["message"]


def test_abort_of_another_owners_job_is_404_and_asks_nothing(alice, bob):
    """Bob cannot abort (or learn of) Alice's running job."""
    job = api.schedule("demo.noop", {}, delay=0, owner=alice)
    (claim,) = jobs_store.claim_due_jobs(10)
    jobs_store.start_jobs([(claim.id, claim.token)], "worker-1")
    assert logged_in(bob).post(f"/api/jobs/{job.id}/abort", content_type="application/json").status_code == 404
    assert not JobAbort.objects.exists()


def test_cancel_with_an_empty_body_works(alice):
    """A cancel with Content-Length 0 and no content type (what curl -X POST sends) is accepted."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    response = logged_in(alice).generic("POST", f"/api/jobs/{job.id}/cancel", b"")
    assert response.status_code == 200
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.CANCELLED


def test_cancel_with_a_form_body_is_415(alice):
    """A cancel may have no body or a JSON one; a form body is 415 and the job stays pending."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    response = logged_in(alice).post(
        f"/api/jobs/{job.id}/cancel", "x=1", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


def test_reschedule_moves_a_pending_job(alice):
    """POST /reschedule with an aware due_at moves the job there."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    due = (timezone.now() + dt.timedelta(days=2)).replace(microsecond=0)
    response = post_json(logged_in(alice), f"/api/jobs/{job.id}/reschedule", {"due_at": due.isoformat()})
    assert response.status_code == 200
    assert ScheduledJob.objects.get(pk=job.id).due_at == due


@pytest.mark.parametrize(
    "body",
    [
        {"due_at": "2031-01-01T00:00:00"},
        {"due_at": "2031-13-01T00:00:00Z"},
        {},
        {"delay": 1, "due_at": soon()},
        {"when": "later"},
    ],
)
def test_bad_reschedule_is_400_and_leaves_the_job(alice, body):
    """A naive, impossible, missing or doubled time (or an unknown field) is 400; the job keeps its due time."""
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    before = _snapshot()
    response = post_json(logged_in(alice), f"/api/jobs/{job.id}/reschedule", body)
    assert response.status_code == 400, response.content
    assert _snapshot() == before


# --- list -------------------------------------------------------------------------------------------------------


def test_list_filters_and_pages(alice):
    """state, kind and key filter the caller's jobs; page and page_size page them with next/previous links."""
    for i in range(5):
        api.schedule("demo.noop", {"i": i}, delay=600 + i, owner=alice)
    keyed = api.schedule("demo.record", {}, delay=700, key="report:1", owner=alice)
    api.cancel(keyed.id)
    client = logged_in(alice)
    page1 = client.get(URL, {"kind": "demo.noop", "page_size": 2}).json()
    assert (page1["count"], page1["pages"], page1["previous"]) == (5, 3, None)
    assert [j["payload"]["i"] for j in page1["results"]] == [0, 1]
    page2 = client.get(page1["next"]).json()
    assert [j["payload"]["i"] for j in page2["results"]] == [2, 3]
    assert client.get(URL, {"state": "cancelled"}).json()["results"][0]["id"] == keyed.id
    assert client.get(URL, {"state": "pending,cancelled"}).json()["count"] == 6
    assert client.get(URL, {"key": "report:1"}).json()["count"] == 1
    claimed = api.schedule("demo.noop", {}, delay=600, owner=alice)
    ScheduledJob.objects.filter(pk=claimed.id).update(due_at=timezone.now() - dt.timedelta(seconds=1))
    assert [c.id for c in jobs_store.claim_due_jobs(10)] == [claimed.id]
    # claimed rows are read through the claimed set's index (ScheduledJobQuerySet.in_states), alone or with others
    assert [j["id"] for j in client.get(URL, {"state": "claimed"}).json()["results"]] == [claimed.id]
    assert client.get(URL, {"state": "claimed,cancelled"}).json()["count"] == 2


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"state": "sleeping"}, 400),
        ({"page": "0"}, 400),
        ({"page_size": "500"}, 400),
        ({"page": "x"}, 400),
        ({"colour": "red"}, 400),
        ({"page": "9"}, 404),
    ],
)
def test_bad_list_parameters_are_refused(alice, query, status):
    """Unknown states, parameters or page numbers are 400; a page past the end is 404."""
    api.schedule("demo.noop", {}, delay=600, owner=alice)
    response = logged_in(alice).get(URL, query)
    assert response.status_code == status
    assert "error" in response.json()
