"""Bad input at every door: a clear, named error, and nothing stored or changed.

The doors: ``scheduling.api.schedule()`` / ``defer()`` / ``reschedule()``, the management commands,
the jobs API and the admin. The broker's door (a pickle message pushed straight into the queue a
real worker consumes) is tested in ``tests/e2e/project/test_security.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import zoneinfo
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django_celery_beat.models import PeriodicTask

from scheduling import api, exceptions
from scheduling.core import conf
from scheduling.models import JobState, ScheduledJob

UTC = dt.UTC
LISBON = zoneinfo.ZoneInfo("Europe/Lisbon")


def deeply_nested(depth: int = 10_000) -> dict[str, Any]:
    """``{"a": {"a": ... }}`` ``depth`` levels deep."""
    payload: dict[str, Any] = {}
    for _ in range(depth):
        payload = {"a": payload}
    return payload


def _snapshot() -> list[tuple[Any, ...]]:
    """Every row of the job table, as stored (to prove a refusal changed nothing)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, kind, payload::text, due_at, state, attempts, key, updated_at FROM scheduling_scheduledjob"
            " ORDER BY id"
        )
        return cursor.fetchall()


def _soon() -> dt.datetime:
    return dt.datetime.now(UTC) + dt.timedelta(minutes=5)


SCHEDULE_CASES: list[tuple[str, Callable[[], Any], type[Exception]]] = [
    ("unknown kind", lambda: api.schedule("no.such.kind", {}, delay=1), exceptions.UnknownJobKind),
    ("payload not an object", lambda: api.schedule("demo.record", ["a"], delay=1), exceptions.InvalidPayload),
    (
        "payload fails its schema",
        lambda: api.schedule("reminders.trial_ending", {"user_id": "seven", "trial_id": 1}, delay=1),
        exceptions.InvalidPayload,
    ),
    (
        "payload with an unknown field",
        lambda: api.schedule("reminders.trial_ending", {"user_id": 1, "trial_id": 1, "x": 1}, delay=1),
        exceptions.InvalidPayload,
    ),
    (
        "payload over the size limit",
        lambda: api.schedule("demo.record", {"blob": "x" * (conf.get().max_payload_bytes + 1)}, delay=1),
        exceptions.PayloadTooLarge,
    ),
    ("10,000-deep nesting", lambda: api.schedule("demo.record", deeply_nested(), delay=1), exceptions.InvalidPayload),
    ("NaN in the payload", lambda: api.schedule("demo.record", {"n": math.nan}, delay=1), exceptions.InvalidPayload),
    ("not JSON at all", lambda: api.schedule("demo.record", {"n": object()}, delay=1), exceptions.InvalidPayload),
    (
        "naive datetime",
        lambda: api.schedule("demo.record", {}, due_at=dt.datetime(2026, 3, 29, 1, 30)),  # naive on purpose
        exceptions.InvalidSchedule,
    ),
    (
        "due_at not a datetime",
        lambda: api.schedule("demo.record", {}, due_at="2026-02-30T10:00:00Z"),
        exceptions.InvalidSchedule,
    ),
    (
        "both due_at and delay",
        lambda: api.schedule("demo.record", {}, due_at=_soon(), delay=1),
        exceptions.InvalidSchedule,
    ),
    ("neither due_at nor delay", lambda: api.schedule("demo.record", {}), exceptions.InvalidSchedule),
    ("negative delay", lambda: api.schedule("demo.record", {}, delay=-1), exceptions.InvalidSchedule),
    ("NaN delay", lambda: api.schedule("demo.record", {}, delay=math.nan), exceptions.InvalidSchedule),
    ("infinite delay", lambda: api.schedule("demo.record", {}, delay=math.inf), exceptions.InvalidSchedule),
    ("boolean delay", lambda: api.schedule("demo.record", {}, delay=True), exceptions.InvalidSchedule),
    ("text delay", lambda: api.schedule("demo.record", {}, delay="10"), exceptions.InvalidSchedule),
    (
        "delay of a century",
        lambda: api.schedule("demo.record", {}, delay=100 * 366 * 86_400),
        exceptions.InvalidSchedule,
    ),
    ("delay too large for a float", lambda: api.schedule("demo.record", {}, delay=10**400), exceptions.InvalidSchedule),
    ("negative delay past a float", lambda: api.defer("demo.record", {}, -(10**400)), exceptions.InvalidSchedule),
    ("blank key", lambda: api.schedule("demo.record", {}, delay=1, key="  "), exceptions.InvalidSchedule),
    ("key too long", lambda: api.schedule("demo.record", {}, delay=1, key="k" * 201), exceptions.InvalidSchedule),
    (
        "unknown on_conflict",
        lambda: api.schedule("demo.record", {}, delay=1, key="k", on_conflict="merge"),
        exceptions.InvalidSchedule,
    ),
    ("zero max_attempts", lambda: api.schedule("demo.record", {}, delay=1, max_attempts=0), exceptions.InvalidSchedule),
    (
        "huge max_attempts",
        lambda: api.schedule("demo.record", {}, delay=1, max_attempts=10**6),
        exceptions.InvalidSchedule,
    ),
    ("defer: unknown kind", lambda: api.defer("no.such.kind", {}, 1), exceptions.UnknownJobKind),
    ("defer: no kind", lambda: api.defer(None, {}, 1), exceptions.UnknownJobKind),  # was an AttributeError
    ("schedule: a list as the kind", lambda: api.schedule(["a"], {}, delay=1), exceptions.UnknownJobKind),
    (
        "defer: keys of mixed types",  # encoded unsorted, then a TypeError when the message was signed
        lambda: api.defer("demo.record", {1: "a", "b": 2}, 1),
        exceptions.InvalidPayload,
    ),
    ("defer: 10,000-deep nesting", lambda: api.defer("demo.record", deeply_nested(), 1), exceptions.InvalidPayload),
    (
        "defer: payload over the size limit",
        lambda: api.defer("demo.record", {"blob": "x" * (conf.get().max_payload_bytes + 1)}, 1),
        exceptions.PayloadTooLarge,
    ),
    ("defer: negative delay", lambda: api.defer("demo.record", {}, -5), exceptions.InvalidSchedule),
    ("defer: NaN delay", lambda: api.defer("demo.record", {}, math.nan), exceptions.InvalidSchedule),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("case", "call", "error"), SCHEDULE_CASES, ids=[c[0] for c in SCHEDULE_CASES])
def test_schedule_and_defer_refuse_bad_input(
    case: str, call: Callable[[], Any], error: type[Exception], django_capture_on_commit_callbacks
) -> None:
    """schedule()/defer() raise the named SchedulingError; no row is stored and no message is sent."""
    existing = api.schedule("demo.record", {"label": "bystander"}, delay=3600, key="bystander")
    before = _snapshot()
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, exceptions.SchedulingError)
    assert str(raised.value), "the error says what is wrong"
    assert callbacks == [], "no message is queued for sending"
    assert _snapshot() == before
    assert ScheduledJob.objects.get(pk=existing.id).state == JobState.PENDING


@pytest.mark.django_db
def test_dst_gap_and_overlap_times_are_refused_only_when_naive() -> None:
    """A naive wall time in Lisbon's spring-forward gap is refused; an aware one is one exact instant."""
    with pytest.raises(exceptions.InvalidSchedule, match="timezone-aware"):
        api.schedule("demo.record", {}, due_at=dt.datetime(2026, 3, 29, 1, 30))  # naive on purpose
    assert ScheduledJob.objects.count() == 0
    aware = dt.datetime(2026, 10, 25, 1, 30, tzinfo=LISBON, fold=1)  # the second 01:30 (after fall-back)
    job = api.schedule("demo.record", {}, due_at=aware)
    stored = ScheduledJob.objects.get(pk=job.id).due_at
    assert stored == aware.astimezone(UTC) == dt.datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


@pytest.mark.django_db
def test_reschedule_and_cancel_refuse_bad_input() -> None:
    """reschedule()/cancel() refuse a naive time, a missing job and a finished job, changing nothing."""
    job = api.schedule("demo.record", {}, delay=3600)
    done = api.schedule("demo.record", {}, delay=3600)
    api.cancel(done.id)
    before = _snapshot()
    with pytest.raises(exceptions.InvalidSchedule):
        api.reschedule(job.id, due_at=dt.datetime(2026, 3, 29, 1, 30))  # naive on purpose
    with pytest.raises(exceptions.InvalidSchedule):
        api.reschedule(job.id, delay=-3)
    with pytest.raises(exceptions.JobNotFound):
        api.reschedule(10**15, delay=3)
    with pytest.raises(exceptions.JobNotFound):
        api.cancel(10**15)
    with pytest.raises(exceptions.JobNotFound):
        api.cancel(2**70)  # past bigint: no such job, not a database error
    for not_an_id in (True, 1.0, "1.0"):  # True is an int to Python: it would have named job 1
        with pytest.raises(exceptions.InvalidSchedule, match="job_id must be a whole number"):
            api.cancel(not_an_id)
        with pytest.raises(exceptions.InvalidSchedule, match="job_id must be a whole number"):
            api.abort(not_an_id)
        with pytest.raises(exceptions.InvalidSchedule, match="job_id must be a whole number"):
            api.cancel_many([job.id, not_an_id])
    with pytest.raises(exceptions.InvalidSchedule, match="job_id must be a whole number"):
        api.reschedule(True, delay=3)
    with pytest.raises(exceptions.JobNotFound, match="a 16610-bit number"):
        api.cancel(10**5000)  # past 4,300 digits str() refuses it: the message does not write it out
    assert api.cancel_many([2**70]).changed == ()  # no row can have it: left out, not a database error
    with pytest.raises(exceptions.JobNotReschedulable):
        api.reschedule(done.id, delay=3)
    with pytest.raises(exceptions.JobNotCancellable):
        api.cancel(done.id)
    with pytest.raises(exceptions.InvalidSchedule):
        api.cancel()
    assert _snapshot() == before


# --- Management commands ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_management_commands_refuse_bad_arguments() -> None:
    """Commands given unknown names, options or values raise CommandError and write nothing."""
    before_tasks = list(PeriodicTask.objects.order_by("id").values_list("id", "name", "enabled"))
    before_jobs = _snapshot()
    with pytest.raises(CommandError, match="no-such-schedule"):
        call_command("timekeeper", "sync", "no-such-schedule")
    with pytest.raises(CommandError):
        call_command("timekeeper", "status", "--format=xml")
    for owner in ["", "x" * 151]:
        with pytest.raises(CommandError, match="--owner"):
            call_command("seed_demo", owner=owner)
    assert list(PeriodicTask.objects.order_by("id").values_list("id", "name", "enabled")) == before_tasks
    assert _snapshot() == before_jobs


# --- The same bad job at every door: schedule(), the jobs API (token), the admin add form ---------------

LIMIT = 64 * 1024  # SCHEDULING_MAX_PAYLOAD_BYTES's default, which these cases are written against

DOOR_CASES: list[tuple[str, dict[str, Any], int]] = [
    # (case, the job as JSON-able fields, the API's status)
    ("unknown kind", {"kind": "no.such.kind", "payload": {}, "delay": 5}, 403),  # the API: as a closed kind
    (
        "payload failing its schema",
        {"kind": "reminders.trial_ending", "payload": {"user_id": "x", "trial_id": 2}, "delay": 5},
        400,
    ),
    ("payload over the size limit", {"kind": "demo.record", "payload": {"blob": "x" * (LIMIT + 1)}, "delay": 5}, 413),
    ("10,000-deep nesting", {"kind": "demo.record", "payload": deeply_nested(), "delay": 5}, 400),
    ("impossible date", {"kind": "demo.record", "payload": {}, "due_at": "2026-02-30T10:00:00Z"}, 400),
    ("naive Lisbon gap time", {"kind": "demo.record", "payload": {}, "due_at": "2026-03-29T01:30:00"}, 400),
]


def _call_schedule(fields: dict[str, Any]) -> None:
    due_at = fields.get("due_at")
    if due_at is not None:
        try:  # what a Python caller would have: fromisoformat refuses Feb 30 itself; the naive time parses
            due_at = dt.datetime.fromisoformat(due_at)
        except ValueError as exc:
            raise exceptions.InvalidSchedule(str(exc)) from None
    api.schedule(fields["kind"], fields["payload"], due_at=due_at, delay=fields.get("delay"))


def _admin_form(fields: dict[str, Any]) -> dict[str, str]:
    due = fields.get("due_at", "")
    return {
        "kind": fields["kind"],
        "payload": _dumps_deep(fields["payload"]),
        "on_conflict": "error",
        "due_at": due.removesuffix("Z"),  # the admin's due time is local wall time (here Europe/Lisbon)
        "delay_seconds": str(fields.get("delay", "")),
        "key": "",
        "max_attempts": "",
        "owner": "",
    }


def _body(fields: dict[str, Any]) -> str:
    """The API request body for ``fields`` (the payload may be too deep for json.dumps)."""
    return json.dumps({**fields, "payload": "<payload>"}).replace('"<payload>"', _dumps_deep(fields["payload"]))


def _dumps_deep(value: Any) -> str:
    """JSON text of ``value``; built by hand when it is too deep for json.dumps."""
    try:
        return json.dumps(value)
    except RecursionError:
        depth = 0
        while isinstance(value, dict) and value:
            value, depth = value["a"], depth + 1
        return '{"a": ' * depth + "{}" + "}" * depth


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
@pytest.mark.parametrize(("case", "fields", "status"), DOOR_CASES, ids=[c[0] for c in DOOR_CASES])
def test_every_door_refuses_the_same_bad_job(
    case: str, fields: dict[str, Any], status: int, admin_client, django_user_model, django_capture_on_commit_callbacks
) -> None:
    """schedule(), POST /api/jobs/ with a token and the admin add form all refuse it clearly; no row, no message."""
    from django.test import Client
    from django.utils import timezone

    from scheduling.web import auth

    caller = django_user_model.objects.create_user("service")
    _token, raw = auth.issue_token(caller, "fault-14")
    bystander = api.schedule("demo.record", {"label": "bystander"}, delay=3600)
    before = _snapshot()
    with django_capture_on_commit_callbacks() as callbacks:
        with pytest.raises(exceptions.SchedulingError):
            _call_schedule(fields)
        response = Client().post(
            "/api/jobs/", _body(fields), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
        )
        with timezone.override("Europe/Lisbon"):
            page = admin_client.post("/admin/scheduling/scheduledjob/add/", _admin_form(fields))
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert error["status"] == status
    assert error["code"]
    assert error["message"]
    assert page.status_code == 200, "the add form is shown again with its errors"
    assert page.context["adminform"].form.errors, "the form says what is wrong"
    assert callbacks == [], "no wake-up or deferral is sent"
    assert _snapshot() == before
    assert ScheduledJob.objects.get(pk=bystander.id).state == JobState.PENDING


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
def test_a_kinds_own_payload_limit_holds_at_every_door(admin_client, django_user_model) -> None:
    """A kind's Limits (200 bytes, under the setting's 64 KiB) refuse a 300-byte payload at every door; none stored."""
    from django.test import Client
    from django_celery_beat.models import PeriodicTask

    from scheduling import registry, schedules, testing
    from scheduling.models import Recurrence
    from scheduling.web import auth

    caller = django_user_model.objects.create_user("limited")
    _token, raw = auth.issue_token(caller, "limits")
    payload = {"blob": "x" * 300}
    with testing.isolated_registry(keep_tasks=False):
        registry.handler(
            "limits.small", schema={"type": "object"}, timeout=10, api=registry.Access(),
            limits=registry.Limits(max_payload_bytes=200),
        )(lambda job: None)  # fmt: skip
        python_doors: list[Callable[[], Any]] = [
            lambda: api.schedule("limits.small", payload, delay=5),
            lambda: api.schedule_many("limits.small", [payload], delay=5),
            lambda: api.defer("limits.small", payload, 5),
            lambda: api.recur("limits.small", payload, key="k", every=60),
            lambda: schedules.sync(declarations=[schedules.make(name="limited", kind="limits.small", every=60,
                                                                payload=payload)]),
        ]  # fmt: skip
        for door in python_doors:
            with pytest.raises(exceptions.PayloadTooLarge, match="the limit is 200 bytes"):
                door()
        response = Client().post(
            "/api/jobs/",
            json.dumps({"kind": "limits.small", "payload": payload, "delay": 5}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {raw}",
        )
        assert (response.status_code, response.json()["error"]["limit"]) == (413, 200)
        page = admin_client.post(
            "/admin/scheduling/scheduledjob/add/",
            {"kind": "limits.small", "payload": json.dumps(payload), "on_conflict": "error", "delay_seconds": "5"},
        )
        assert "the limit is 200 bytes" in str(page.context["adminform"].form.errors)
        api.schedule("limits.small", {"blob": "x" * 100}, delay=5)  # under the kind's limit: stored
    assert [row[1] for row in _snapshot()] == ["limits.small"]
    assert not Recurrence.objects.exists()
    assert not PeriodicTask.objects.filter(name="limited").exists()


# --- Hostile requests at the API and admin doors -------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
def test_hostile_requests_are_refused_with_their_status_and_change_nothing(django_user_model) -> None:
    """Wrong content type 415, wrong method 405, missing CSRF or a kind not allowed 403, another owner's job 404."""
    from django.test import Client

    alice = django_user_model.objects.create_user("alice", password="pw-a")
    bob = django_user_model.objects.create_user("bob", password="pw-b")
    staff = django_user_model.objects.create_user("ops", password="pw-o", is_staff=True, is_superuser=True)
    mine = api.schedule("demo.record", {"who": "alice"}, delay=3600, owner=alice)
    theirs = api.schedule("demo.record", {"who": "bob"}, delay=3600, owner=bob, key="bob:1")
    session = Client(enforce_csrf_checks=True)
    session.force_login(alice)
    good = json.dumps({"kind": "demo.record", "payload": {}, "delay": 60})
    before = _snapshot()
    form = "application/x-www-form-urlencoded"
    as_json = "application/json"
    not_allowed = json.dumps({"kind": "demo.fail", "payload": {}, "delay": 60})  # no api Access
    huge = json.dumps({"kind": "demo.record", "payload": {"x": "y" * 200_000}, "delay": 1})
    attempts = [
        (415, lambda: _csrf_post(session, "/api/jobs/", '{"kind": "demo.record", "delay": 1}', "text/plain")),
        (415, lambda: _csrf_post(session, "/api/jobs/", "kind=demo.record&delay=1", form)),
        (405, lambda: session.put("/api/jobs/", good, content_type=as_json)),
        (405, lambda: session.delete(f"/api/jobs/{mine.id}")),
        (405, lambda: session.get(f"/api/jobs/{mine.id}/cancel")),
        (403, lambda: session.post("/api/jobs/", good, content_type=as_json)),  # no CSRF token
        (403, lambda: session.post(f"/api/jobs/{mine.id}/cancel")),
        (404, lambda: session.get(f"/api/jobs/{theirs.id}")),
        (404, lambda: _csrf_post(session, f"/api/jobs/{theirs.id}/cancel", "", as_json)),
        (404, lambda: _csrf_post(session, f"/api/jobs/{theirs.id}/reschedule", '{"delay": 5}', as_json)),
        (403, lambda: _csrf_post(session, "/api/jobs/", not_allowed, as_json)),
        (401, lambda: Client().post("/api/jobs/", good, content_type=as_json)),
        (413, lambda: _csrf_post(session, "/api/jobs/", huge, as_json)),
    ]
    for expected, request in attempts:
        response = request()
        assert response.status_code == expected, (expected, response.content[:300])
        assert response.json()["error"]["message"]
        assert _snapshot() == before
    # The admin: a staff session without the CSRF token is refused too, and cancels nothing.
    admin = Client(enforce_csrf_checks=True)
    admin.force_login(staff)
    refused = admin.post(
        "/admin/scheduling/scheduledjob/",
        {"action": "cancel_selected", "_selected_action": [mine.id, theirs.id], "index": "0"},
    )
    assert refused.status_code == 403
    assert _snapshot() == before
    # Non-staff users do not get into the admin at all.
    visitor = Client()
    visitor.force_login(alice)
    assert visitor.get(f"/admin/scheduling/scheduledjob/{theirs.id}/change/").status_code == 302
    assert _snapshot() == before


def _csrf_post(client: Any, url: str, body: str, content_type: str) -> Any:
    """POST with the session's CSRF cookie echoed in the header, as a well-behaved browser page would."""
    client.get("/admin/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    return client.post(url, body, content_type=content_type, HTTP_X_CSRFTOKEN=token)
