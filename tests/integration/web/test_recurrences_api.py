"""The recurrences JSON API against real PostgreSQL: each verb, owner scoping, the kind's access rule."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.utils import timezone

from scheduling import registry
from scheduling.models import JobState, Recurrence, ScheduledJob
from scheduling.recurring import planner
from scheduling.web import auth
from tasks.models import Trial

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

URL = "/api/recurrences/"


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob")


def logged_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def send(client: Client, method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body) if body is not None else ""
    return getattr(client, method)(url, data, content_type="application/json")


def create(client: Client, **body: Any) -> Any:
    return send(client, "post", URL, {"kind": "demo.noop", "key": "digest", "cron": "0 9 * * *", **body})


def test_create_returns_201_with_the_first_occurrence_and_next_runs(alice):
    """POST creates an owned recurrence, one pending occurrence, and shows the next occurrences."""
    response = create(logged_in(alice), timezone="Asia/Tokyo", payload={"u": 1})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["outcome"] == "created"
    rec = Recurrence.objects.get(pk=body["recurrence"]["id"])
    assert response["Location"] == f"/api/recurrences/{rec.id}"
    assert (rec.owner_id, rec.timezone, rec.payload) == (alice.id, "Asia/Tokyo", {"u": 1})
    assert len(body["recurrence"]["next_occurrences"]) == 5
    assert ScheduledJob.objects.filter(recurrence=rec, state=JobState.PENDING, owner=alice).count() == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"cron": "0 99 * * *"}, "invalid_schedule"),
        ({"timezone": "Nowhere/Land"}, "invalid_schedule"),
        ({"starts_at": "2030-01-01T09:00:00"}, "invalid_schedule"),
        ({"starts_at": "2030-02-01T09:00:00+00:00", "ends_at": "2030-01-01T09:00:00+00:00"}, "invalid_schedule"),
        ({"every": 60}, "invalid_schedule"),
        ({"colour": "red"}, "unknown_field"),
    ],
)
def test_bad_input_is_a_400_with_a_reason_and_stores_nothing(alice, body, code):
    """Bad cron, zone, naive or inverted times, both rules, unknown field: 400 with its code."""
    response = create(logged_in(alice), **body)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code
    assert Recurrence.objects.count() == 0
    assert ScheduledJob.objects.count() == 0


def test_the_kinds_access_rule_applies_as_for_jobs(alice, bob):
    """A kind without api access is 403; reminders need the caller's own trial, at create and at change."""
    assert create(logged_in(alice), kind="demo.fail").status_code == 403
    trial = Trial.objects.create(user=alice, ends_at=timezone.now() + dt.timedelta(days=10))
    payload = {"user_id": alice.id, "trial_id": trial.id}
    assert create(logged_in(bob), kind="reminders.trial_ending", payload=payload).status_code == 403
    response = create(logged_in(alice), kind="reminders.trial_ending", payload=payload)
    assert response.status_code == 201, response.content
    url = response.json()["recurrence"]["url"]
    other = Trial.objects.create(user=bob, ends_at=timezone.now() + dt.timedelta(days=10))
    refused = send(logged_in(alice), "patch", url, {"payload": {"user_id": bob.id, "trial_id": other.id}})
    assert refused.status_code == 403
    assert Recurrence.objects.get(pk=response.json()["recurrence"]["id"]).payload == payload


def test_owner_scoping_hides_and_protects_others_recurrences(alice, bob):
    """Another caller gets 404 on every verb and does not see the row in the list."""
    url = create(logged_in(alice)).json()["recurrence"]["url"]
    other = logged_in(bob)
    assert other.get(url).status_code == 404
    for verb in ("pause", "resume", "cancel"):
        assert send(other, "post", f"{url}/{verb}").status_code == 404
    assert send(other, "patch", url, {"timezone": "UTC"}).status_code == 404
    assert other.get(URL).json()["count"] == 0
    assert create(other).status_code == 201  # the same key is bob's own


def test_change_pause_resume_cancel_and_next(alice):
    """PATCH moves the pending occurrence; pause, resume, cancel change state; next lists n instants."""
    client = logged_in(alice)
    rec = create(client).json()["recurrence"]
    url = rec["url"]
    changed = send(client, "patch", url, {"timezone": "America/New_York", "payload": {"v": 2}})
    assert changed.status_code == 200, changed.content
    job = ScheduledJob.objects.get(pk=rec["occurrence_job"])
    assert job.payload == {"v": 2}
    assert job.occurrence_at.hour in (13, 14)
    assert len(client.get(f"{url}/next?n=3").json()["next_occurrences"]) == 3
    assert send(client, "post", f"{url}/pause").json()["state"] == "paused"
    assert send(client, "post", f"{url}/resume").json()["state"] == "active"
    assert send(client, "post", f"{url}/cancel").json()["state"] == "cancelled"
    conflict = send(client, "post", f"{url}/resume")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "state_conflict"


def test_list_filters_by_state_kind_and_zone(alice):
    """GET filters the caller's recurrences by state, kind and timezone."""
    client = logged_in(alice)
    create(client, key="a", timezone="Europe/Lisbon")
    create(client, key="b", timezone="Asia/Tokyo")
    assert client.get(URL, {"timezone": "Asia/Tokyo"}).json()["count"] == 1
    assert client.get(URL, {"kind": "demo.noop", "state": "active"}).json()["count"] == 2
    assert client.get(URL, {"state": "bogus"}).status_code == 400


def test_key_conflict_error_is_a_409(alice):
    """on_conflict=error on the caller's own key answers 409 key_conflict."""
    client = logged_in(alice)
    create(client)
    response = create(client, on_conflict="error")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "key_conflict"


def test_session_writes_need_csrf(alice):
    """A session POST without the CSRF token is refused like the jobs API's."""
    response = create(logged_in(alice, csrf=True))
    assert response.status_code == 403
    assert Recurrence.objects.count() == 0


def test_a_cron_longer_than_its_column_is_a_400_not_a_500(alice):
    """A 237-character cron whose every field is valid is refused with invalid_schedule (the column holds 200)."""
    minutes = ",".join(str(m) for m in range(60))
    hours = ",".join(str(h) for h in range(24))
    cron = f"{minutes} {hours} * * *"
    assert len(cron) == 237
    response = create(logged_in(alice), cron=cron)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_schedule"
    assert Recurrence.objects.count() == 0


# --- The jobs API's door (issue 33: findings 1, 2, 3, 5, 6, 8) -----------------------------------------


def token_client(user: Any) -> Client:
    _, raw = auth.issue_token(user, "test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def error_of(response: Any) -> dict[str, Any]:
    return response.json()["error"]


def grant(user: Any, *codenames: str) -> None:
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))


HOG = {"kind": "demo.record", "payload": {"sleep": 60}, "priority": 9, "max_attempts": 1000, "every": 3600}


def test_caller_limits_apply_at_create_and_on_every_change(alice):
    """The jobs API's 400 over_limit body is refused here too, and PATCH cannot raise attempts or priority."""
    client = token_client(alice)
    refused = send(client, "post", URL, {**HOG, "key": "hog"})
    assert (refused.status_code, error_of(refused)["code"]) == (400, "over_limit"), refused.content
    assert Recurrence.objects.count() == 0
    url = send(client, "post", URL, {"kind": "demo.record", "key": "ok", "every": 3600}).json()["recurrence"]["url"]
    for change in ({"max_attempts": 1000}, {"priority": 9}, {"kind": "demo.record", "max_attempts": 50}):
        response = send(client, "patch", url, change)
        assert (response.status_code, error_of(response)["code"]) == (400, "over_limit"), (change, response.content)
    rec = Recurrence.objects.get()
    assert (rec.priority, rec.max_attempts) == (None, None)
    job = ScheduledJob.objects.get(recurrence=rec)
    assert (job.priority, job.max_attempts) == (registry.get("demo.record").priority, 3)


@override_settings(SCHEDULING_API_CREATE_BURST=3, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001)
def test_creates_take_the_jobs_create_allowance(alice):
    """Past the burst a create is 429 rate_limited with Retry-After, before its body is read."""
    client = token_client(alice)
    statuses = [create(client, key=f"k{i}").status_code for i in range(3)]
    assert statuses == [201, 201, 201]
    refused = create(client, key="k3")
    assert (refused.status_code, error_of(refused)["code"]) == (429, "rate_limited")
    assert int(refused["Retry-After"]) >= 1
    assert Recurrence.objects.count() == 3


@override_settings(SCHEDULING_API_MAX_RECURRENCES=2)
def test_an_owner_holds_at_most_the_recurrence_quota(alice, django_user_model):
    """Quota 2: the third is 429 recurrence_quota_exceeded and stores nothing; a cancelled one frees its place."""
    client = token_client(alice)
    first = create(client, key="a").json()["recurrence"]["url"]
    assert create(client, key="b").status_code == 201
    over = create(client, key="c")
    assert (over.status_code, error_of(over)["code"], error_of(over)["limit"]) == (429, "recurrence_quota_exceeded", 2)
    assert Recurrence.objects.filter(owner=alice).count() == 2
    assert ScheduledJob.objects.filter(owner=alice).count() == 2
    assert create(client, key="a", payload={"v": 2}).status_code == 200  # a replace creates nothing
    assert send(client, "post", f"{first}/cancel").status_code == 200
    assert create(client, key="c").status_code == 201
    root = token_client(django_user_model.objects.create_superuser("root", password="pw-root"))
    assert {create(root, key=f"r{i}").status_code for i in range(3)} == {201}


@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=2)
def test_the_first_occurrence_counts_in_the_pending_quota(alice):
    """An owner the jobs API holds at the pending quota gets the same 429 quota_exceeded here, nothing stored."""
    client = token_client(alice)
    for i in range(2):
        job = send(client, "post", "/api/jobs/", {"kind": "demo.noop", "delay": 600, "key": f"j{i}"})
        assert job.status_code == 201
    over = create(client)
    assert (over.status_code, error_of(over)["code"]) == (429, "quota_exceeded"), over.content
    assert Recurrence.objects.count() == 0
    assert ScheduledJob.objects.filter(owner=alice).count() == 2


@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=2)
def test_a_resume_plans_a_job_and_counts_in_the_pending_quota(alice):
    """Paused recurrences do not hold their places: at the quota, a resume is 429 quota_exceeded and stays paused."""
    client = token_client(alice)
    urls = [create(client, key=f"r{i}").json()["recurrence"]["url"] for i in range(2)]
    for url in urls:
        assert send(client, "post", f"{url}/pause").status_code == 200
    for i in range(2):
        job = send(client, "post", "/api/jobs/", {"kind": "demo.noop", "delay": 600, "key": f"j{i}"})
        assert job.status_code == 201
    over = send(client, "post", f"{urls[0]}/resume")
    assert (over.status_code, error_of(over)["code"]) == (429, "quota_exceeded"), over.content
    assert set(Recurrence.objects.values_list("state", flat=True)) == {"paused"}
    assert ScheduledJob.objects.filter(owner=alice, state=JobState.PENDING).count() == 2
    send(client, "post", f"/api/jobs/{ScheduledJob.objects.filter(key='j0').get().id}/cancel")
    assert send(client, "post", f"{urls[0]}/resume").status_code == 200, "a place freed: it resumes"
    assert ScheduledJob.objects.filter(owner=alice, state=JobState.PENDING).count() == 2


@override_settings(SCHEDULING_API_CREATE_BURST=3, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001)
def test_a_resume_takes_the_create_allowance(alice):
    """Each resume inserts a job: pause and resume rounds are held to the create rate (429 rate_limited)."""
    client = token_client(alice)
    url = create(client).json()["recurrence"]["url"]
    statuses = []
    for _ in range(3):
        send(client, "post", f"{url}/pause")
        statuses.append(send(client, "post", f"{url}/resume").status_code)
    assert statuses == [200, 200, 429]
    assert Recurrence.objects.get().state == "paused"
    assert ScheduledJob.objects.count() == 3, "the first occurrence and two resumes' occurrences"


@override_settings(SCHEDULING_API_CREATE_BURST=2, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001)
def test_a_resume_of_an_active_recurrence_gives_the_allowance_back(alice):
    """A resume that finds the recurrence active plans nothing: its charge is given back (200, no job)."""
    client = token_client(alice)
    url = create(client).json()["recurrence"]["url"]  # the first of the two creations of the burst
    for _ in range(3):
        assert send(client, "post", f"{url}/resume").status_code == 200, "already active: idempotent"
    assert ScheduledJob.objects.count() == 1
    send(client, "post", f"{url}/pause")
    assert send(client, "post", f"{url}/resume").status_code == 200, "the second creation, still allowed"
    send(client, "post", f"{url}/pause")
    over = send(client, "post", f"{url}/resume")
    assert (over.status_code, error_of(over)["code"]) == (429, "rate_limited"), over.content
    assert ScheduledJob.objects.count() == 2


@override_settings(
    SCHEDULING_API_CREATE_BURST=3, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001, SCHEDULING_API_MAX_PENDING_JOBS=1
)
def test_a_resume_refused_over_the_quota_keeps_its_charge(alice):
    """Only a no-op resume is given back: one refused (429 quota_exceeded) spent its creation."""
    client = token_client(alice)
    url = create(client).json()["recurrence"]["url"]  # creation 1 of 3
    send(client, "post", f"{url}/pause")
    job = send(client, "post", "/api/jobs/", {"kind": "demo.noop", "delay": 600, "key": "j"})  # creation 2
    assert job.status_code == 201, job.content
    over = send(client, "post", f"{url}/resume")  # creation 3, refused
    assert (over.status_code, error_of(over)["code"]) == (429, "quota_exceeded"), over.content
    assert send(client, "post", f"/api/jobs/{job.json()['job']['id']}/cancel").status_code == 200
    spent = send(client, "post", f"{url}/resume")
    assert (spent.status_code, error_of(spent)["code"]) == (429, "rate_limited"), spent.content
    assert Recurrence.objects.get().state == "paused"


def test_a_first_occurrence_past_ten_years_is_refused_and_nothing_is_stored(alice):
    """A yearly rule starting near the window's end first runs about a year past it: 400, nothing stored."""
    client = token_client(alice)
    starts = timezone.now() + dt.timedelta(days=3650)
    day_before = starts - dt.timedelta(days=1 if (starts.month, starts.day) != (3, 1) else 2)  # never 29 February
    yearly = f"0 0 {day_before.day} {day_before.month} *"  # next due about a year after starts_at
    response = create(client, cron=yearly, starts_at=starts.isoformat())
    assert (response.status_code, error_of(response)["code"]) == (400, "invalid_schedule"), response.content
    assert "more than ten years ahead" in error_of(response)["message"]
    assert (Recurrence.objects.count(), ScheduledJob.objects.count()) == (0, 0)
    url = create(client, cron="0 9 * * *").json()["recurrence"]["url"]
    job = ScheduledJob.objects.get()
    moved = send(client, "patch", url, {"cron": yearly, "starts_at": starts.isoformat()})
    assert (moved.status_code, error_of(moved)["code"]) == (400, "invalid_schedule"), moved.content
    assert Recurrence.objects.get().expression == "0 9 * * *"
    assert ScheduledJob.objects.get().due_at == job.due_at
    # Paused, it has no pending occurrence to move: the rule is still checked (a resume would plan it).
    assert send(client, "post", f"{url}/pause").status_code == 200
    paused = send(client, "patch", url, {"cron": yearly, "starts_at": starts.isoformat()})
    assert (paused.status_code, error_of(paused)["code"]) == (400, "invalid_schedule"), paused.content
    assert Recurrence.objects.get().expression == "0 9 * * *"


@override_settings(SCHEDULING_API_MIN_RECURRENCE_INTERVAL_SECONDS=300)
def test_a_recurrence_closer_than_the_minimum_interval_is_refused(alice, django_user_model):
    """every= or a cron firing more often than the minimum: 400 too_frequent naming the field; superusers are exempt."""
    client = token_client(alice)
    for body, field in (({"every": 1}, "every"), ({"cron": "*/2 * * * *"}, "cron"), ({"cron": "0,1 9 * * *"}, "cron")):
        response = create(client, **({"cron": None} | body))
        assert (response.status_code, error_of(response)["code"]) == (400, "too_frequent"), (body, response.content)
        assert (error_of(response)["field"], error_of(response)["limit"]) == (field, 300)
    assert Recurrence.objects.count() == 0
    url = create(client, cron=None, every=300).json()["recurrence"]["url"]
    changed = send(client, "patch", url, {"every": 10})
    assert (changed.status_code, error_of(changed)["code"]) == (400, "too_frequent")
    assert send(client, "patch", url, {"cron": "*/5 * * * *"}).status_code == 200
    root = token_client(django_user_model.objects.create_superuser("root", password="pw-root"))
    assert create(root, cron=None, every=1).status_code == 201


CLOSED_KINDS = ("no.such.kind", "demo.fail", "payments.retry")  # unknown, no api access, permission alice lacks


def test_unknown_closed_and_forbidden_kinds_get_the_jobs_apis_one_403_before_the_payload(alice):
    """Whatever the payload, every closed kind gets one 403 kind_not_allowed (name aside), at create and at change."""
    client = token_client(alice)
    url = create(client).json()["recurrence"]["url"]
    payloads = {"valid": {"reference": "pay-alice"}, "schema-invalid": {"colour": 1}, "not an object": [1]}
    for name, payload in payloads.items():
        answers = set()
        for kind in CLOSED_KINDS:
            for method, target, body in (
                ("post", URL, {"kind": kind, "key": "x", "every": 3600, "payload": payload}),
                ("patch", url, {"kind": kind, "payload": payload}),
            ):
                response = send(client, method, target, body)
                error = error_of(response)
                answers.add((response.status_code, error["code"], error["message"].replace(kind, "<kind>")))
        assert answers == {
            (
                403,
                "kind_not_allowed",
                "You may not schedule jobs of kind '<kind>': no kind of that name is open to you.",
            )
        }, (name, answers)
    assert Recurrence.objects.count() == 1
    jobs_answer = send(client, "post", "/api/jobs/", {"kind": "no.such.kind", "delay": 5})
    assert (jobs_answer.status_code, error_of(jobs_answer)["code"]) == (403, "kind_not_allowed")


@pytest.fixture
def dave(django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("dave", password="pw-dave", is_staff=True)
    grant(user, "view_recurrence", "change_recurrence")
    return user


def test_staff_may_pause_resume_and_cancel_anothers_recurrence_but_not_rewrite_it(alice, dave):
    """dave (change_recurrence) gets 403 on PATCH of alice's recurrence, whatever the field; the verbs work."""
    rec = create(token_client(alice), payload={"v": 1}).json()["recurrence"]
    staff = token_client(dave)
    for change in ({"every": 1, "cron": None}, {"payload": {"v": 2}}, {"kind": "demo.record"}, {"priority": 9}):
        response = send(staff, "patch", rec["url"], change)
        assert (response.status_code, error_of(response)["code"]) == (403, "forbidden"), (change, response.content)
    stored = Recurrence.objects.get(pk=rec["id"])
    assert (stored.kind, stored.payload, stored.expression, stored.priority) == (
        "demo.noop",
        {"v": 1},
        "0 9 * * *",
        None,
    )
    for verb, state in (("pause", "paused"), ("resume", "active"), ("cancel", "cancelled")):
        response = send(staff, "post", f"{rec['url']}/{verb}")
        assert (response.status_code, response.json()["state"]) == (200, state), response.content


def test_a_moved_occurrence_takes_its_new_kinds_options(alice):
    """PATCH kind demo.noop -> demo.record: the pending occurrence gets record's attempts, lease and priority."""
    client = token_client(alice)
    rec = create(client).json()["recurrence"]
    before = ScheduledJob.objects.get(pk=rec["occurrence_job"])
    changed = send(client, "patch", rec["url"], {"kind": "demo.record", "payload": {"sleep": 1}})
    assert changed.status_code == 200, changed.content
    job = ScheduledJob.objects.get(pk=rec["occurrence_job"])
    kind = registry.get("demo.record")
    assert job.kind == "demo.record"
    assert (job.max_attempts, job.lease_seconds, job.priority) == (kind.max_attempts, kind.lease_seconds, kind.priority)
    assert (before.max_attempts, before.lease_seconds) != (job.max_attempts, job.lease_seconds)


def _claim_fail_and_plan(run_sql: Any, rec_id: int) -> None:
    """The current occurrence is claimed, the planner passes while it runs, and it fails back to pending (a retry)."""
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(),"
        " attempts = 1, occurrence_at = occurrence_at - interval '2 hours', due_at = due_at - interval '2 hours'"
        " WHERE recurrence_id = %s",
        [rec_id],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - interval '2 hours' WHERE id = %s", [rec_id])
    planner.plan_once()
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'pending', token = NULL, claimed_at = NULL,"
        " due_at = now() + interval '20 seconds' WHERE recurrence_id = %s AND state = 'claimed'",
        [rec_id],
    )


def test_a_retry_is_the_one_pending_occurrence_and_pause_resume_cancel_handle_it(alice, run_sql):
    """A failed occurrence's retry keeps the planner from planning another; pause cancels it; resume plans one."""
    client = token_client(alice)
    rec = create(client, cron=None, every=3600).json()["recurrence"]
    _claim_fail_and_plan(run_sql, rec["id"])

    def waiting() -> list[int]:
        return list(
            ScheduledJob.objects.filter(recurrence_id=rec["id"], state=JobState.PENDING).values_list(
                "attempts", flat=True
            )
        )

    assert waiting() == [1]  # the retry alone
    assert send(client, "post", f"{rec['url']}/pause").status_code == 200
    assert waiting() == []
    resumed = send(client, "post", f"{rec['url']}/resume")
    assert resumed.status_code == 200, resumed.content
    assert waiting() == [0]
    assert send(client, "post", f"{rec['url']}/cancel").status_code == 200
    assert waiting() == []


def test_cancel_leaves_a_running_occurrence_no_retry(alice, run_sql):
    """An occurrence running at cancel finishes its attempt: its budget becomes the attempts spent, no retry."""
    client = token_client(alice)
    rec = create(client, cron=None, every=3600).json()["recurrence"]
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(),"
        " attempts = 1 WHERE recurrence_id = %s",
        [rec["id"]],
    )
    assert send(client, "post", f"{rec['url']}/cancel").status_code == 200
    job = ScheduledJob.objects.get(recurrence_id=rec["id"])
    assert (job.state, job.attempts, job.max_attempts) == (JobState.CLAIMED, 1, 1)


def test_a_recurrence_the_planner_paused_shows_why(alice, run_sql):
    """An owner deactivated: the planner pauses the recurrence instead of planning, and the API says why."""
    client = token_client(alice)
    rec = create(client, cron=None, every=3600).json()["recurrence"]
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now(),"
        " occurrence_at = occurrence_at - interval '2 hours', due_at = due_at - interval '2 hours'"
        " WHERE recurrence_id = %s",
        [rec["id"]],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - interval '2 hours' WHERE id = %s", [rec["id"]])
    alice.is_active = False
    alice.save()
    assert planner.plan_once().created == 0
    assert not ScheduledJob.objects.filter(recurrence_id=rec["id"], state=JobState.PENDING).exists()
    alice.is_active = True
    alice.save()
    shown = token_client(alice).get(rec["url"]).json()
    assert (shown["state"], shown["paused_reason"]) == ("paused", "its owner is deactivated")


def test_resuming_a_deactivated_owners_recurrence_creates_no_occurrence(alice, dave):
    """Staff resume a recurrence whose owner is deactivated: 409 saying why, it stays paused, no job is created."""
    rec = create(token_client(alice), cron=None, every=3600).json()["recurrence"]
    staff = token_client(dave)
    assert send(staff, "post", f"{rec['url']}/pause").status_code == 200
    alice.is_active = False
    alice.save()
    refused = send(staff, "post", f"{rec['url']}/resume")
    assert (refused.status_code, error_of(refused)["code"]) == (409, "state_conflict"), refused.content
    assert "its owner is deactivated" in error_of(refused)["message"]
    assert staff.get(rec["url"]).json()["state"] == "paused"
    assert not ScheduledJob.objects.filter(recurrence_id=rec["id"], state=JobState.PENDING).exists()


@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=1)
def test_a_staff_resume_counts_in_the_owners_pending_quota(alice, dave):
    """dave resumes alice's recurrence: the occurrence is alice's, so alice's quota decides (dave holds none)."""
    owner = token_client(alice)
    url = create(owner).json()["recurrence"]["url"]
    assert send(owner, "post", f"{url}/pause").status_code == 200
    assert send(owner, "post", "/api/jobs/", {"kind": "demo.noop", "delay": 600}).status_code == 201
    over = send(token_client(dave), "post", f"{url}/resume")
    assert (over.status_code, error_of(over)["code"]) == (429, "quota_exceeded"), over.content
    assert error_of(over)["message"].startswith("The owner holds 1 pending jobs"), (
        "nothing of alice's jobs but the quota"
    )
    assert "due in" not in error_of(over)["message"]
    assert Recurrence.objects.get().state == "paused"
    assert ScheduledJob.objects.filter(owner=alice, state=JobState.PENDING).count() == 1
