"""Least privilege in the admin: staff holding exactly the permissions named, through Django's test client.

Tokens are issued for oneself (others: superusers only) and stay revoked; the add form schedules as
the person filling it and replaces only with the change permission; periodic tasks of non-superusers
run ``scheduling.run_fixed`` with a policy of a kind they may use, nothing else.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from scheduling import api
from scheduling.models import ApiToken, JobState, Recurrence, ScheduledJob, SchedulePolicy
from scheduling.web import auth

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

TOKEN_ADD = "/admin/scheduling/apitoken/add/"
JOB_ADD = "/admin/scheduling/scheduledjob/add/"
TASK_ADD = "/admin/django_celery_beat/periodictask/add/"


def staff(django_user_model: Any, name: str, *codenames: str) -> Client:
    """A logged-in staff member holding exactly ``codenames`` (and nothing from is_superuser)."""
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    permissions = Permission.objects.filter(codename__in=codenames)
    assert permissions.count() == len(codenames), codenames
    user.user_permissions.add(*permissions)
    client = Client()
    client.force_login(user)
    client.user = user  # type: ignore[attr-defined]
    return client


@pytest.fixture
def root(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", password="pw-root")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob")


# --- 1. tokens are issued for oneself; for others by a superuser only ---------------------------------------


def test_staff_with_add_apitoken_issues_tokens_only_for_themselves(django_user_model, root):
    """add_apitoken alone: no user choice on the form; a forged user (the superuser) is ignored: the token is theirs."""
    clerk = staff(django_user_model, "clerk", "add_apitoken")  # exactly the one permission
    page = clerk.get(TOKEN_ADD).content.decode()
    assert 'name="name"' in page
    assert 'name="user"' not in page
    response = clerk.post(TOKEN_ADD, {"user": str(root.pk), "name": "mint"})
    assert response.status_code == 200, response.content.decode()[:2000]
    secret = response.context["secret"]
    assert list(ApiToken.objects.values_list("name", "user_id")) == [("mint", clerk.user.pk)]
    caller = auth.identify(Client().get("/", HTTP_AUTHORIZATION=f"Bearer {secret}").wsgi_request)
    assert caller.user == clerk.user
    assert not ApiToken.objects.filter(user=root).exists()


def test_a_superuser_still_issues_tokens_for_other_users(client, root, bob):
    """A superuser picks the token's user on the add form."""
    client.force_login(root)
    assert 'name="user"' in client.get(TOKEN_ADD).content.decode()
    response = client.post(TOKEN_ADD, {"user": str(bob.pk), "name": "bobs-service"})
    assert response.status_code == 200
    assert list(ApiToken.objects.values_list("name", "user_id")) == [("bobs-service", bob.pk)]


# --- 6. a revoked token stays revoked ---------------------------------------------------------------------------


def test_a_revoked_token_stays_revoked_when_its_box_is_unticked(client, root):
    """Revoked by the action, then its page posted with the box unticked: still revoked, the API still says 401."""
    client.force_login(root)
    token, secret = auth.issue_token(root, "svc")
    client.post(
        "/admin/scheduling/apitoken/", {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [token.pk], "index": "0"}
    )
    change = f"/admin/scheduling/apitoken/{token.pk}/change/"
    page = client.get(change).content.decode()
    assert 'name="revoked"' not in page, "a revoked token's box is shown, not offered"
    response = client.post(change, {"name": "svc-renamed"})  # an unticked checkbox posts nothing
    assert response.status_code == 302
    response = client.post(change, {"name": "svc-renamed", "revoked": ""})
    token.refresh_from_db()
    assert (token.name, token.revoked) == ("svc-renamed", True)
    assert Client().get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


def test_a_live_token_can_be_revoked_on_its_page(client, root):
    """Ticking the box on a live token's page revokes it."""
    client.force_login(root)
    token, _secret = auth.issue_token(root, "svc")
    response = client.post(f"/admin/scheduling/apitoken/{token.pk}/change/", {"name": "svc", "revoked": "on"})
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked


# --- tokens: non-superusers see and change only their own -----------------------------------------------------


TOKENS = "/admin/scheduling/apitoken/"


def test_staff_with_change_apitoken_see_and_change_only_their_own_tokens(django_user_model, root, bob):
    """change_apitoken alone: the list shows only one's own tokens; others' pages, renames, revokes do nothing."""
    clerk = staff(django_user_model, "clerk", "change_apitoken")  # exactly the one permission
    own, _ = auth.issue_token(clerk.user, "clerk-svc")
    bobs, bobs_secret = auth.issue_token(bob, "bob-svc")
    roots, _ = auth.issue_token(root, "root-svc")
    listing = clerk.get(TOKENS)
    assert listing.status_code == 200
    assert [t.pk for t in listing.context["cl"].result_list] == [own.pk]
    for other in (bobs, roots):
        page = f"{TOKENS}{other.pk}/change/"
        assert clerk.get(page).status_code == 302  # "does not exist", as for a missing id
        clerk.post(page, {"name": "taken", "revoked": "on"})
    clerk.post(TOKENS, {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [bobs.pk, roots.pk], "index": "0"})
    assert sorted(ApiToken.objects.exclude(pk=own.pk).values_list("name", "revoked")) == [
        ("bob-svc", False),
        ("root-svc", False),
    ]
    assert Client().get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {bobs_secret}").status_code == 200
    response = clerk.post(f"{TOKENS}{own.pk}/change/", {"name": "clerk-renamed", "revoked": "on"})
    assert response.status_code == 302
    own.refresh_from_db()
    assert (own.name, own.revoked) == ("clerk-renamed", True)


def test_a_superuser_sees_and_revokes_every_users_token(client, root, bob):
    """A superuser's list holds every token, and the revoke action reaches another user's."""
    client.force_login(root)
    bobs, _ = auth.issue_token(bob, "bob-svc")
    auth.issue_token(root, "root-svc")
    assert len(client.get(TOKENS).context["cl"].result_list) == 2
    client.post(TOKENS, {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [bobs.pk], "index": "0"})
    bobs.refresh_from_db()
    assert bobs.revoked


# --- 3. the add form: as oneself, and replace needs change_scheduledjob -----------------------------------------


def _add_job(client: Client, **fields: Any) -> Any:
    data = {"kind": "demo.noop", "payload": "{}", "on_conflict": "error", "delay_seconds": "600", "key": ""}
    data.update(fields)
    return client.post(JOB_ADD, data)


def _row(job_id: int) -> tuple[Any, ...]:
    job = ScheduledJob.objects.get(pk=job_id)
    return (job.payload, job.due_at, job.priority, job.max_attempts, job.owner_id, job.state, job.updated_at)


def test_add_only_staff_schedule_as_themselves_and_a_forged_owner_is_ignored(django_user_model, bob):
    """add_scheduledjob: no owner field; a posted owner (Bob) is ignored: the job is the clerk's."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob")
    assert 'name="owner"' not in clerk.get(JOB_ADD).content.decode()
    response = _add_job(clerk, owner=str(bob.pk), key="mine")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert list(ScheduledJob.objects.values_list("key", "owner_id")) == [("mine", clerk.user.pk)]


def test_add_only_staff_cannot_replace_another_owners_or_the_systems_job(django_user_model, bob):
    """replace with Bob's key, or a system key and no owner: a new job of the clerk's; theirs are unchanged."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob")
    bobs = api.schedule("demo.noop", {"v": "bob"}, delay=3600, key="trial-ending:42", owner=bob)
    systems = api.schedule("demo.noop", {"v": "system"}, delay=3600, key="nightly:1")
    before = {bobs.id: _row(bobs.id), systems.id: _row(systems.id)}
    for key in ("trial-ending:42", "nightly:1"):
        response = _add_job(clerk, key=key, on_conflict="replace", payload='{"v": "evil"}', delay_seconds="0", owner="")
        assert response.status_code == 302, response.content.decode()[:2000]
    assert {bobs.id: _row(bobs.id), systems.id: _row(systems.id)} == before
    mine = ScheduledJob.objects.exclude(pk__in=[bobs.id, systems.id])
    assert sorted(mine.values_list("key", "owner_id")) == [
        ("nightly:1", clerk.user.pk),
        ("trial-ending:42", clerk.user.pk),
    ]


def test_replace_that_meets_a_live_job_needs_change_scheduledjob(django_user_model):
    """Without change_scheduledjob a replace meeting a pending job is a form error, nothing changes; with it, done."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob")
    response = _add_job(clerk, key="k", payload='{"v": 1}')
    assert response.status_code == 302
    job = ScheduledJob.objects.get()
    before = _row(job.id)
    response = _add_job(clerk, key="k", on_conflict="replace", payload='{"v": 2}', delay_seconds="0")
    assert response.status_code == 200
    assert "needs the permission to change scheduled jobs" in response.content.decode()
    assert _row(job.id) == before
    assert ScheduledJob.objects.count() == 1
    clerk.user.user_permissions.add(Permission.objects.get(codename="change_scheduledjob"))
    response = _add_job(clerk, key="k", on_conflict="replace", payload='{"v": 2}', delay_seconds="0")
    assert response.status_code == 302, response.content.decode()[:2000]
    job.refresh_from_db()
    assert (job.payload, job.state, ScheduledJob.objects.count()) == ({"v": 2}, JobState.PENDING, 1)


def test_a_superuser_still_chooses_the_owner(client, root, bob):
    """The owner field stays for superusers: the job is stored as Bob's."""
    client.force_login(root)
    assert 'name="owner"' in client.get(JOB_ADD).content.decode()
    response = _add_job(client, owner=str(bob.pk), key="for-bob")
    assert response.status_code == 302
    assert list(ScheduledJob.objects.values_list("key", "owner_id")) == [("for-bob", bob.pk)]


# --- the add form holds staff to the JSON API's caller limits, past-due rule, rate and quota -------------------


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"max_attempts": "1000"}, "max_attempts", "max_attempts 1000 is over the limit for demo.noop"),
        ({"priority": "9"}, "priority", "needs the scheduling.prioritize_job permission"),
        ({"due_at": "2001-01-01T00:00:00", "delay_seconds": ""}, "due_at", "is in the past"),
    ],
)
def test_add_only_staff_are_held_to_the_callers_bounds(django_user_model, fields, field, words):
    """add_scheduledjob: max_attempts 1000, priority 9 or a due time in 2001 is a form error; nothing stored."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob")
    response = _add_job(clerk, **fields)
    assert response.status_code == 200, response.content.decode()[:2000]
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert words in " ".join(errors[field]), errors
    assert not ScheduledJob.objects.exists()


def test_staff_with_prioritize_job_may_ask_priority_9_in_the_add_form(django_user_model):
    """add_scheduledjob + prioritize_job: priority 9 is stored, as the JSON API allows such a caller."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob", "prioritize_job")
    response = _add_job(clerk, priority="9")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert list(ScheduledJob.objects.values_list("priority", "owner_id")) == [(9, clerk.user.pk)]


@override_settings(SCHEDULING_API_CREATE_BURST=2, SCHEDULING_API_CREATE_RATE_PER_SECOND=0.001)
def test_the_add_form_spends_the_same_create_rate_as_the_api(django_user_model, root):
    """Burst 2: two adds are stored, the third is refused naming the rate; a superuser is exempt."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob")
    assert [_add_job(clerk).status_code for _ in range(3)] == [302, 302, 200]
    response = _add_job(clerk)
    assert "Too many jobs created" in response.content.decode()
    assert ScheduledJob.objects.filter(owner=clerk.user).count() == 2
    admin = Client()
    admin.force_login(root)
    assert [_add_job(admin).status_code for _ in range(3)] == [302, 302, 302]


@override_settings(SCHEDULING_API_CREATE_RATE_PER_SECOND=0, SCHEDULING_API_MAX_PENDING_JOBS=2)
def test_the_add_form_keeps_the_pending_quota(django_user_model):
    """Quota 2: the third pending job is refused and rolled back; a replace of one's own job still goes through."""
    clerk = staff(django_user_model, "clerk", "add_scheduledjob", "view_scheduledjob", "change_scheduledjob")
    assert [_add_job(clerk, key=f"k{n}").status_code for n in range(3)] == [302, 302, 200]
    assert sorted(ScheduledJob.objects.values_list("key", flat=True)) == ["k0", "k1"]
    response = _add_job(clerk, key="k0", on_conflict="replace", payload='{"v": 2}')
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ScheduledJob.objects.get(key="k0").payload == {"v": 2}


# --- 4. periodic tasks: run_fixed only, kinds the person may use ------------------------------------------------


# Periodic-task staff: django-celery-beat's task permissions, and the policy inline's (an inline needs its own).
BEAT_PERMISSIONS = (
    "add_periodictask",
    "change_periodictask",
    "view_periodictask",
    "view_crontabschedule",
    "add_schedulepolicy",
    "change_schedulepolicy",
    "view_schedulepolicy",
)


def _task_post(name: str, crontab: CrontabSchedule, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "regtask": "",
        "task": "scheduling.run_fixed",
        "enabled": "on",
        "description": "",
        "interval": "",
        "crontab": str(crontab.pk),
        "solar": "",
        "clocked": "",
        "start_time_0": "",
        "start_time_1": "",
        "args": "[]",
        "kwargs": "{}",
        "expires": "",
        "expire_seconds": "",
        "queue": "",
        "exchange": "",
        "routing_key": "",
        "priority": "",
        "headers": "{}",
        "policy-TOTAL_FORMS": "1",
        "policy-INITIAL_FORMS": "0",
        "policy-MIN_NUM_FORMS": "0",
        "policy-MAX_NUM_FORMS": "1",
        "policy-0-kind": "demo.record",
        "policy-0-payload": '{"label": "nightly"}',
        "policy-0-expression": "0 3 * * *",
        "policy-0-timezone": "UTC",
        "policy-0-every_seconds": "",
        "policy-0-concurrency_policy": "forbid",
        "policy-0-starting_deadline_seconds": "",
        "policy-0-active_deadline_seconds": "",
        "policy-0-backoff_limit": "0",
        "policy-0-successful_history_limit": "3",
        "policy-0-failed_history_limit": "1",
        "policy-0-missed_policy": "skip",
        "policy-0-missed_window_seconds": "3600",
        "policy-0-dst_gap": "shift",
    }
    data.update(changes)
    return data


@pytest.fixture
def crontab() -> CrontabSchedule:
    return CrontabSchedule.objects.create(minute="0", hour="3", timezone="UTC")


def test_periodic_task_staff_are_offered_only_run_fixed_and_the_kinds_they_may_use(django_user_model):
    """The task select lists scheduling.run_fixed alone; the policy's kind select lists API kinds the person may use."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    page = clerk.get(TASK_ADD).content.decode()
    assert 'value="scheduling.run_fixed"' in page
    for other in ("scheduling.run_deferred", "scheduling.run_batch", "scheduling.sweep"):
        assert f'value="{other}"' not in page, other
    assert 'value="demo.record"' in page
    for kind in ("demo.fail", "demo.sleep", "payments.retry"):
        assert f'value="{kind}"' not in page, kind


@pytest.mark.parametrize(
    ("changes", "field_says"),
    [
        ({"task": "scheduling.run_deferred", "kwargs": json.dumps({"kind": "payments.retry"})}, "Only a superuser"),
        ({"regtask": "scheduling.run_deferred"}, "Select a valid choice"),
        ({"headers": json.dumps({"task": "scheduling.run_deferred"})}, "Only a superuser may set headers"),
        ({"args": json.dumps(["payments.retry", {"reference": "x"}, 1, "d"])}, "Only a superuser may set args"),
        ({"kwargs": json.dumps({"schedule": "someone-elses"})}, "takes only"),
        ({"policy-0-kind": "payments.retry", "policy-0-payload": '{"reference": "r"}'}, "Select a valid choice"),
        ({"policy-0-kind": "demo.fail", "policy-0-payload": "{}"}, "Select a valid choice"),
    ],
)
def test_forged_periodic_task_posts_are_refused_and_save_nothing(django_user_model, crontab, changes, field_says):
    """Another task, args, headers, foreign kwargs or a kind they may not use: a form error, no task or policy saved."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    response = clerk.post(TASK_ADD, _task_post("forged", crontab, **changes))
    assert response.status_code == 200
    assert field_says in response.content.decode()
    assert not PeriodicTask.objects.filter(name="forged").exists()
    assert not SchedulePolicy.objects.exists()


def test_periodic_task_staff_save_a_run_fixed_schedule_of_a_kind_they_may_use(django_user_model, crontab):
    """The allowed shape saves: run_fixed naming itself, with a demo.record policy."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    response = clerk.post(TASK_ADD, _task_post("allowed", crontab))
    assert response.status_code == 302, response.content.decode()[:3000]
    task = PeriodicTask.objects.get(name="allowed")
    assert (task.task, json.loads(task.kwargs), task.args, task.headers) == (
        "scheduling.run_fixed",
        {"schedule": "allowed"},
        "[]",
        "{}",
    )
    assert task.policy.kind == "demo.record"


def test_a_superuser_may_still_save_any_periodic_task(client, root, crontab):
    """Superusers keep django-celery-beat's free task field (e.g. celery.backend_cleanup)."""
    client.force_login(root)
    data = _task_post("cleanup", crontab, task="celery.backend_cleanup", **{"policy-TOTAL_FORMS": "0"})
    response = client.post(TASK_ADD, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert PeriodicTask.objects.get(name="cleanup").task == "celery.backend_cleanup"


def test_a_policy_payload_is_judged_by_the_kinds_access_too(django_user_model, crontab, bob):
    """With tasks.schedule_payment, a policy retrying Bob's payment is refused; retrying one's own saves."""
    from tasks.models import Payment

    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS, "schedule_payment")
    Payment.objects.create(reference="pay-bob", amount_cents=100, owner=bob)
    Payment.objects.create(reference="pay-clerk", amount_cents=100, owner=clerk.user)
    assert 'value="payments.retry"' in clerk.get(TASK_ADD).content.decode()
    bobs = {"policy-0-kind": "payments.retry", "policy-0-payload": '{"reference": "pay-bob"}'}
    response = clerk.post(TASK_ADD, _task_post("retry-bob", crontab, **bobs))
    assert response.status_code == 200
    assert "You may not schedule jobs of kind" in response.content.decode()
    assert not PeriodicTask.objects.filter(name="retry-bob").exists()
    own = {"policy-0-kind": "payments.retry", "policy-0-payload": '{"reference": "pay-clerk"}'}
    response = clerk.post(TASK_ADD, _task_post("retry-own", crontab, **own))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert PeriodicTask.objects.get(name="retry-own").policy.payload == {"reference": "pay-clerk"}


# --- periodic-task staff cannot make a schedule that hogs the workers (SCHEDULING_FIXED_MIN_INTERVAL_SECONDS) ------


def _every(seconds: str, **policy: str) -> dict[str, str]:
    """Policy fields of an interval schedule with overlapping runs allowed, plus ``policy`` (without the prefix)."""
    fields = {"expression": "", "every_seconds": seconds, "concurrency_policy": "allow", **policy}
    return {f"policy-0-{name}": value for name, value in fields.items()}


@pytest.mark.parametrize(
    ("policy", "field_says"),
    [
        (_every("1", backoff_limit="1000"), "only a superuser may schedule runs closer than 60s"),
        (_every("59", active_deadline_seconds="10"), "SCHEDULING_FIXED_MIN_INTERVAL_SECONDS"),
        (_every("60"), "A run may take 60s (the run timeout, else the kind&#x27;s timeout)"),
        (_every("600", active_deadline_seconds="600"), "must be shorter than the schedule"),
        (_every("3600", active_deadline_seconds="59", backoff_limit="20"), "21 attempts x 59s = 1239s a tick"),
        ({"policy-0-expression": "* * * * *", "policy-0-backoff_limit": "1"}, "A run may take 60s"),
    ],
)
def test_periodic_task_staff_cannot_save_a_schedule_that_holds_the_workers(
    django_user_model, crontab, policy, field_says
):
    """Interval under the minimum, timeout not under the interval, attempts x timeout over the bound: nothing saved."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    response = clerk.post(TASK_ADD, _task_post("hog", crontab, **policy))
    assert response.status_code == 200
    assert field_says in response.content.decode()
    assert not PeriodicTask.objects.filter(name="hog").exists()
    assert not SchedulePolicy.objects.exists()


def test_periodic_task_staff_save_a_schedule_within_the_bounds(django_user_model, crontab):
    """Every 60 s, a 50 s run timeout, 11 attempts (550 s, within 600 s): saved."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    policy = _every("60", active_deadline_seconds="50", backoff_limit="10")
    response = clerk.post(TASK_ADD, _task_post("within", crontab, **policy))
    assert response.status_code == 302, response.content.decode()[:3000]
    stored = PeriodicTask.objects.get(name="within").policy
    assert (stored.active_deadline_seconds, stored.backoff_limit) == (50, 10)


@override_settings(SCHEDULING_FIXED_MIN_INTERVAL_SECONDS=3600)
def test_the_change_page_holds_staff_to_the_same_bounds(django_user_model, crontab):
    """A schedule saved within the bounds cannot be moved under them on its change page; the stored one is unchanged."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    response = clerk.post(TASK_ADD, _task_post("daily", crontab))
    assert response.status_code == 302, response.content.decode()[:3000]
    task = PeriodicTask.objects.get(name="daily")
    change = {
        **_task_post("daily", crontab, **_every("600", active_deadline_seconds="30")),
        "policy-INITIAL_FORMS": "1",
        "policy-0-id": str(task.policy.pk),
        "policy-0-periodic_task": str(task.pk),
    }
    response = clerk.post(f"/admin/django_celery_beat/periodictask/{task.pk}/change/", change)
    assert response.status_code == 200
    assert "closer than 3600s" in response.content.decode()
    task.refresh_from_db()
    assert (task.policy.expression, task.interval_id, task.policy.concurrency_policy) == ("0 3 * * *", None, "forbid")


def test_a_superuser_may_still_save_a_one_second_schedule(client, root, crontab):
    """Superusers are not held to the staff bounds: every second, overlap allowed, 1000 retries."""
    client.force_login(root)
    response = client.post(TASK_ADD, _task_post("fast", crontab, **_every("1", backoff_limit="1000")))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert PeriodicTask.objects.get(name="fast").policy.backoff_limit == 1000


@pytest.mark.parametrize(
    ("policy", "saves"),
    [
        (_every("3600", active_deadline_seconds="59", missed_policy="run_all"), False),
        (_every("3600", active_deadline_seconds="59", missed_policy="run_once"), True),
        (_every("3600", active_deadline_seconds="59", missed_policy="run_all", concurrency_policy="forbid"), True),
    ],
)
def test_periodic_task_staff_cannot_combine_run_all_with_overlapping_runs(django_user_model, crontab, policy, saves):
    """missed_policy=run_all with concurrency_policy=allow is a form error naming both; either one alone saves."""
    clerk = staff(django_user_model, "clerk", *BEAT_PERMISSIONS)
    response = clerk.post(TASK_ADD, _task_post("catch-up", crontab, **policy))
    if saves:
        assert response.status_code == 302, response.content.decode()[:3000]
        assert PeriodicTask.objects.get(name="catch-up").policy.missed_policy == policy["policy-0-missed_policy"]
        return
    assert response.status_code == 200
    page = response.content.decode()
    assert "missed_policy=run_all with concurrency_policy=allow" in page
    assert "SCHEDULING_FIXED_MAX_CATCH_UP" in page
    assert not PeriodicTask.objects.filter(name="catch-up").exists()
    assert not SchedulePolicy.objects.exists()


def test_a_superuser_may_still_combine_run_all_with_overlapping_runs(client, root, crontab):
    """Superusers are not held to the catch-up bound: run_all with overlap allowed saves."""
    client.force_login(root)
    policy = _every("3600", active_deadline_seconds="59", missed_policy="run_all")
    response = client.post(TASK_ADD, _task_post("catch-up", crontab, **policy))
    assert response.status_code == 302, response.content.decode()[:3000]
    stored = PeriodicTask.objects.get(name="catch-up").policy
    assert (stored.missed_policy, stored.concurrency_policy) == ("run_all", "allow")


# --- beat's shared timing rows: superusers only (a row re-times every task using it, past fixed.bounds) ------------

INTERVALS = "/admin/django_celery_beat/intervalschedule/"
CRONTABS = "/admin/django_celery_beat/crontabschedule/"
TASKS_USING = {  # the rows' inline of the periodic tasks using them (read-only, but its management form is posted)
    "periodictask_set-TOTAL_FORMS": "0",
    "periodictask_set-INITIAL_FORMS": "0",
    "periodictask_set-MIN_NUM_FORMS": "0",
    "periodictask_set-MAX_NUM_FORMS": "1000",
}
EVERY_SECOND = {"every": "1", "period": "seconds", **TASKS_USING}
EVERY_MINUTE = {"minute": "*", "hour": "*", "day_of_month": "*", "month_of_year": "*", "day_of_week": "*"}
CRONTAB_FIELDS = {**EVERY_MINUTE, "timezone": "UTC", **TASKS_USING}


def test_staff_with_beat_timing_permissions_cannot_add_change_or_delete_timing_rows(django_user_model, crontab):
    """add/change_intervalschedule, change_crontabschedule: 403 on add and change pages; a POST changes nothing."""
    from django_celery_beat.models import IntervalSchedule

    interval = IntervalSchedule.objects.create(every=3600, period=IntervalSchedule.SECONDS)
    clerk = staff(
        django_user_model, "clerk", "add_intervalschedule", "change_intervalschedule", "change_crontabschedule"
    )
    assert clerk.get(f"{INTERVALS}{interval.pk}/change/").status_code == 403
    response = clerk.post(f"{INTERVALS}{interval.pk}/change/", EVERY_SECOND)
    assert response.status_code == 403
    assert clerk.get(f"{INTERVALS}add/").status_code == 403
    assert clerk.post(f"{INTERVALS}add/", EVERY_SECOND).status_code == 403
    assert clerk.get(f"{CRONTABS}{crontab.pk}/change/").status_code == 403
    response = clerk.post(f"{CRONTABS}{crontab.pk}/change/", CRONTAB_FIELDS)
    assert response.status_code == 403
    assert clerk.post(f"{INTERVALS}{interval.pk}/delete/", {"post": "yes"}).status_code == 403
    assert list(IntervalSchedule.objects.values_list("every", "period")) == [(3600, "seconds")]
    crontab.refresh_from_db()
    assert (crontab.minute, crontab.hour) == ("0", "3")


def test_staff_with_view_permission_see_timing_rows_read_only(django_user_model, crontab):
    """view_crontabschedule: the change page shows the row (200) with no save button; a POST is refused."""
    clerk = staff(django_user_model, "clerk", "view_crontabschedule")
    page = clerk.get(f"{CRONTABS}{crontab.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert clerk.post(f"{CRONTABS}{crontab.pk}/change/", CRONTAB_FIELDS).status_code == 403
    crontab.refresh_from_db()
    assert (crontab.minute, crontab.hour) == ("0", "3")


def test_a_superuser_still_changes_timing_rows(client, root, crontab):
    """A superuser changes a shared interval and crontab on their change pages."""
    from django_celery_beat.models import IntervalSchedule

    interval = IntervalSchedule.objects.create(every=3600, period=IntervalSchedule.SECONDS)
    client.force_login(root)
    response = client.post(f"{INTERVALS}{interval.pk}/change/", EVERY_SECOND)
    assert response.status_code == 302, response.content.decode()[:3000]
    response = client.post(f"{CRONTABS}{crontab.pk}/change/", CRONTAB_FIELDS)
    assert response.status_code == 302, response.content.decode()[:3000]
    interval.refresh_from_db()
    crontab.refresh_from_db()
    assert (interval.every, crontab.minute, crontab.hour) == (1, "*", "*")


# --- recurrences end by cancel: no delete page of their own, no bulk delete (they go only with their owner) ------

RECURRENCES = "/admin/scheduling/recurrence/"


@pytest.mark.parametrize("who", ["staff", "superuser"])
def test_a_recurrences_own_delete_page_is_refused(django_user_model, client, root, bob, who):
    """delete_recurrence (or a superuser): GET and POST of a recurrence's delete page are 403; the row stays."""
    recurrence = api.recur("demo.record", {}, key="digest", every=3600, owner=bob)
    if who == "staff":
        client = staff(django_user_model, "clerk", "view_recurrence", "delete_recurrence")
    else:
        client.force_login(root)
    assert client.get(f"{RECURRENCES}{recurrence.id}/delete/").status_code == 403
    assert client.post(f"{RECURRENCES}{recurrence.id}/delete/", {"post": "yes"}).status_code == 403
    assert Recurrence.objects.filter(pk=recurrence.id, state="active").exists()


@pytest.mark.parametrize("who", ["staff", "superuser"])
def test_recurrences_have_no_bulk_delete(django_user_model, client, root, bob, who):
    """The list offers no delete_selected, and a forged delete_selected POST deletes nothing."""
    recurrence = api.recur("demo.record", {}, key="digest", every=3600, owner=bob)
    if who == "staff":
        client = staff(django_user_model, "clerk", "view_recurrence", "change_recurrence", "delete_recurrence")
    else:
        client.force_login(root)
    page = client.get(RECURRENCES)
    assert page.status_code == 200
    assert 'value="delete_selected"' not in page.content.decode()
    forged = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(recurrence.id)], "post": "yes"}
    client.post(RECURRENCES, forged)
    assert Recurrence.objects.filter(pk=recurrence.id).exists()
