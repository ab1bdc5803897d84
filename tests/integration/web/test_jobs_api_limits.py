"""The jobs API's limits through its real door (a token and Django's test client, real PostgreSQL).

What one caller may ask of a kind (attempts, priority, payload bounds), due times in the past,
the per-owner create rate and pending quota (429 with Retry-After), and one answer for unknown
and closed kinds whatever the payload.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, override_settings

from scheduling.core import conf, store
from scheduling.models import ScheduledJob
from scheduling.web import auth
from tasks.models import Payment
from tests.e2e import harness
from tests.integration.web import test_jobs_api_fuzz as test_api_fuzz

pytestmark = pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: no collectstatic here

URL = "/api/jobs/"
HOG = {"kind": "demo.record", "payload": {"sleep": 3600}, "priority": 9, "max_attempts": 1000, "delay": 0}


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


def token_client(user: Any) -> Client:
    _, raw = auth.issue_token(user, "test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post(client: Client, body: Any, url: str = URL) -> Any:
    return client.post(url, body if isinstance(body, str) else json.dumps(body), content_type="application/json")


def error_of(response: Any) -> dict[str, Any]:
    return response.json()["error"]


def grant(user: Any, codename: str) -> None:
    user.user_permissions.add(Permission.objects.get(codename=codename))


# --- One caller cannot hold every worker ----------------------------------------------------------


@pytest.mark.django_db
def test_the_four_request_worker_hog_is_refused_with_400s_naming_each_bound(alice):
    """sleep 3600, priority 9, max_attempts 1000 on demo.record: four 400s, and each field alone names its bound."""
    client = token_client(alice)
    for _ in range(4):
        response = post(client, HOG)
        assert response.status_code == 400, response.content
    sleep_only = post(client, {**HOG, "priority": None, "max_attempts": None})
    assert (sleep_only.status_code, error_of(sleep_only)["code"]) == (400, "invalid_payload")
    assert "sleep" in error_of(sleep_only)["message"]
    assert "maximum" in error_of(sleep_only)["message"]
    priority_only = post(client, {**HOG, "payload": {}, "max_attempts": None})
    assert (priority_only.status_code, error_of(priority_only)["code"]) == (400, "over_limit")
    assert (error_of(priority_only)["field"], error_of(priority_only)["limit"]) == ("priority", 0)
    assert "scheduling.prioritize_job" in error_of(priority_only)["message"]
    attempts_only = post(client, {**HOG, "payload": {}, "priority": None})
    assert (attempts_only.status_code, error_of(attempts_only)["code"]) == (400, "over_limit")
    assert (error_of(attempts_only)["field"], error_of(attempts_only)["limit"]) == ("max_attempts", 3)
    assert "SCHEDULING_API_MAX_JOB_SECONDS (600 s)" in error_of(attempts_only)["message"]
    assert ScheduledJob.objects.count() == 0
    within = post(client, {"kind": "demo.record", "payload": {"sleep": 60}, "max_attempts": 3, "delay": 0})
    assert within.status_code == 201, within.content
    job = ScheduledJob.objects.get()
    assert (job.max_attempts, job.priority) == (3, 0)


@pytest.mark.django_db
def test_a_caller_with_prioritize_job_may_ask_a_higher_priority(alice):
    """Priority 9 is 400 for Alice, then 201 and stored once she holds scheduling.prioritize_job."""
    assert post(token_client(alice), {"kind": "demo.noop", "delay": 60, "priority": 9}).status_code == 400
    grant(alice, "prioritize_job")
    response = post(token_client(alice), {"kind": "demo.noop", "delay": 60, "priority": 9})
    assert response.status_code == 201, response.content
    assert ScheduledJob.objects.get().priority == 9


@pytest.mark.django_db
def test_the_attempts_bound_follows_the_job_seconds_setting(alice):
    """With SCHEDULING_API_MAX_JOB_SECONDS = 120, demo.record (60 s a try) allows 2 attempts: 3 is a 400."""
    with override_settings(SCHEDULING_API_MAX_JOB_SECONDS=120):
        response = post(token_client(alice), {"kind": "demo.record", "delay": 5, "max_attempts": 3})
        assert (response.status_code, error_of(response)["limit"]) == (400, 2)
        assert post(token_client(alice), {"kind": "demo.record", "delay": 5, "max_attempts": 2}).status_code == 201


# --- The past is refused ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_due_at_in_the_past_is_refused_on_create_and_reschedule(alice):
    """2000-01-01 and five minutes ago are 400 due_at_in_past; 30 s ago (clock skew) is accepted."""
    client = token_client(alice)
    now = store.database_now()
    for past in ("2000-01-01T00:00:00+00:00", (now - dt.timedelta(minutes=5)).isoformat()):
        response = post(client, {"kind": "demo.noop", "due_at": past})
        assert (response.status_code, error_of(response)["code"]) == (400, "due_at_in_past"), response.content
    assert ScheduledJob.objects.count() == 0
    skewed = post(client, {"kind": "demo.noop", "due_at": (now - dt.timedelta(seconds=30)).isoformat()})
    assert skewed.status_code == 201, skewed.content
    job_id = skewed.json()["job"]["id"]
    moved = post(client, {"due_at": "2000-01-01T00:00:00+00:00"}, f"/api/jobs/{job_id}/reschedule")
    assert (moved.status_code, error_of(moved)["code"]) == (400, "due_at_in_past")
    assert ScheduledJob.objects.get(pk=job_id).due_at == now - dt.timedelta(seconds=30)


# --- Rate and quota: 429 with Retry-After ----------------------------------------------------------


@pytest.mark.django_db
def test_the_default_rate_limit_answers_429_with_retry_after_past_the_burst(alice, django_user_model):
    """Default settings, 60 creates at once: 50 are 201, then 429 rate_limited with Retry-After; root is exempt."""
    client = token_client(alice)
    statuses = [post(client, {"kind": "demo.noop", "delay": 60}).status_code for _ in range(60)]
    assert statuses == [201] * 50 + [429] * 10  # now() is the test transaction's: no refill in between
    refused = post(client, {"kind": "no.such.kind", "delay": 60})
    assert (refused.status_code, error_of(refused)["code"]) == (429, "rate_limited")
    assert refused["Retry-After"] == "1"  # one emission interval (0.1 s), rounded up to whole seconds
    assert "SCHEDULING_API_CREATE_RATE_PER_SECOND" in error_of(refused)["message"]
    assert ScheduledJob.objects.filter(owner=alice).count() == 50
    root = token_client(django_user_model.objects.create_superuser("root", password="pw-root"))
    assert {post(root, {"kind": "demo.noop", "delay": 60}).status_code for _ in range(60)} == {201}
    settings = conf.get()
    assert (settings.api_create_burst, settings.api_create_rate_per_second) == (50, 10.0), "the defaults ran here"


@pytest.mark.django_db
@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=3)
def test_the_pending_quota_answers_429_with_retry_after_and_counts_only_new_jobs(alice, django_user_model):
    """Quota 3: the 4th create is 429 quota_exceeded (Retry-After: the first job's due time), a replace is not."""
    client = token_client(alice)
    for i in range(3):
        assert post(client, {"kind": "demo.noop", "delay": 600 + i, "key": f"k{i}"}).status_code == 201
    over = post(client, {"kind": "demo.noop", "delay": 5})
    assert (over.status_code, error_of(over)["code"], error_of(over)["limit"]) == (429, "quota_exceeded", 3)
    assert 590 <= int(over["Retry-After"]) <= 600
    assert ScheduledJob.objects.filter(owner=alice).count() == 3
    replaced = post(client, {"kind": "demo.noop", "delay": 900, "key": "k0"})
    assert (replaced.status_code, replaced.json()["outcome"]) == (200, "replaced")
    first = ScheduledJob.objects.get(owner=alice, key="k1")
    assert post(client, {}, f"/api/jobs/{first.id}/cancel").status_code == 200
    assert post(client, {"kind": "demo.noop", "delay": 5}).status_code == 201
    root = token_client(django_user_model.objects.create_superuser("root", password="pw-root"))
    assert {post(root, {"kind": "demo.noop", "delay": 60}).status_code for _ in range(5)} == {201}


@pytest.mark.django_db(transaction=True)
@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=1)
def test_concurrent_creates_cannot_race_past_the_quota(alice):
    """Six requests of one owner at once under quota 1, each on its own connection: exactly one 201, five 429."""
    clients = [token_client(alice) for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    answers: list[int] = []

    def call(client: Client) -> None:
        try:
            barrier.wait()
            answers.append(post(client, {"kind": "demo.noop", "delay": 600}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [201] + [429] * 5
    assert ScheduledJob.objects.filter(owner=alice).count() == 1


# --- Access before the payload ------------------------------------------------------------------


def _payloads(limit: int) -> dict[str, Any]:
    """Bodies' payloads: valid for every kind tried, schema-invalid, over the payload limit, unstorable, too deep."""
    deep: Any = 1
    for _ in range(40):
        deep = {"a": deep}
    return {
        "valid": {"reference": "pay-alice"},
        "schema-invalid": {"reference": 12, "colour": "red"},
        "not an object": [1, 2],
        "over the payload limit": {"reference": "x" * (limit + 1)},
        "unstorable text": {"reference": "a\u0000b"},
        "too deep": deep,
    }


CLOSED_KINDS = ["no.such.kind", "demo.fail", "payments.retry", "reports.settlement"]


@pytest.mark.django_db
@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0)
def test_unknown_and_closed_kinds_get_one_answer_whatever_the_payload(alice):
    """Unknown, API-less and permission-gated kinds: one status, code and message (name aside) for every payload."""
    Payment.objects.create(reference="pay-alice", amount_cents=100, owner=alice)
    client = token_client(alice)
    limit = conf.get().max_payload_bytes
    bodies = {name: json.dumps({"kind": "{KIND}", "payload": p, "delay": 5}) for name, p in _payloads(limit).items()}
    bodies["body over the limit"] = json.dumps({"kind": "{KIND}", "delay": 5, "payload": {"x": "y" * (limit + 17_000)}})
    bodies["bad priority and attempts"] = json.dumps({"kind": "{KIND}", "delay": 5, "priority": 9, "max_attempts": 999})
    bodies["past due_at"] = json.dumps({"kind": "{KIND}", "due_at": "2000-01-01T00:00:00Z"})
    for case, body in bodies.items():
        answers = set()
        for kind in CLOSED_KINDS:
            response = post(client, body.replace("{KIND}", kind))
            error = error_of(response)
            message = error["message"].replace(kind, "<kind>")
            if case == "body over the limit":  # it gives the body's length, which the kind's name is part of
                message = re.sub(r"The body is \d+ bytes", "The body is N bytes", message)
            answers.add((response.status_code, error["code"], message))
        assert len(answers) == 1, (case, answers)
        status, code, _ = answers.pop()
        expected = (413, "body_too_large") if case == "body over the limit" else (403, "kind_not_allowed")
        assert (status, code) == expected, case
    assert ScheduledJob.objects.count() == 0
    grant(alice, "schedule_payment")  # the same payloads now reach payments.retry's checks, and say so
    opened = post(token_client(alice), bodies["schema-invalid"].replace("{KIND}", "payments.retry"))
    assert (opened.status_code, error_of(opened)["code"]) == (400, "invalid_payload")


@pytest.mark.django_db(transaction=True)
@override_settings(SCHEDULING_API_CREATE_BURST=3, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001)
def test_the_rate_limit_is_shared_by_every_web_process(alice, django_user_model):
    """Burst 3 in this process and in a runserver process alike: three creates here, the 4th there is 429, and back."""
    env = {
        **harness.base_env(),
        "SCHEDULING_API_CREATE_BURST": "3",
        "SCHEDULING_API_CREATE_RATE_PER_SECOND": "0.001",  # one creation back every 1,000 s
    }
    port = test_api_fuzz.free_port()
    argv = [sys.executable, "manage.py", "runserver", "--noreload", "--nothreading", f"127.0.0.1:{port}"]
    proc = harness.Proc("runserver", argv, env, harness.ARTIFACTS / "api-rate")
    base = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(
            lambda: test_api_fuzz.answers(f"{base}/api/jobs/openapi.json") or proc.popen.poll() is not None,
            60,
            message="runserver",
        )
        assert proc.popen.poll() is None, proc.log()[-4000:]
        _, raw = auth.issue_token(alice, "two-processes")
        here = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert [post(here, {"kind": "demo.noop", "delay": 60}).status_code for _ in range(3)] == [201] * 3
        status, headers = _post_to(base, raw, {"kind": "demo.noop", "delay": 60})
        assert status == 429
        assert int(headers["Retry-After"]) > 900
        bob = django_user_model.objects.create_user("bob", password="pw-bob")
        _, bobs = auth.issue_token(bob, "two-processes")
        assert [_post_to(base, bobs, {"kind": "demo.noop", "delay": 60})[0] for _ in range(3)] == [201] * 3
        assert post(Client(HTTP_AUTHORIZATION=f"Bearer {bobs}"), {"kind": "demo.noop", "delay": 60}).status_code == 429
    finally:
        proc.stop()
    assert ScheduledJob.objects.count() == 6


def _post_to(base: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` to the server at ``base`` with ``token``: (status, headers), errors included."""
    request = urllib.request.Request(  # noqa: S310 - our own server on 127.0.0.1
        f"{base}{URL}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own server
            return response.status, response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers
