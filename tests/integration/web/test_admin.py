"""Timekeeper's admin against real PostgreSQL (and Redis for "run now"): actions, forms, schedules, tokens."""

from __future__ import annotations

import base64
import datetime as dt
import inspect
import json
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from scheduling import api, schedules
from scheduling.core import store as core_store
from scheduling.due_at import store as jobs_store
from scheduling.models import ApiToken, JobState, ScheduledJob, SchedulePolicy, ScheduleRun
from scheduling.web import auth

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

CHANGELIST = "/admin/scheduling/scheduledjob/"
ADD = "/admin/scheduling/scheduledjob/add/"


def _snapshot(ids: list[int]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, due_at, state, attempts, token, updated_at, finished_at FROM scheduling_scheduledjob"
            " WHERE id = ANY(%s) ORDER BY id",
            [ids],
        )
        return cursor.fetchall()


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


@pytest.fixture
def admin(admin_client: Any) -> Any:
    return admin_client


@pytest.fixture
def jobs() -> dict[str, int]:
    """Two pending jobs, one claimed, one done, one dead, and a pending bystander nobody selects."""
    made = {name: api.schedule("demo.noop", {"n": name}, delay=3600).id for name in ("p1", "p2", "bystander")}
    claimed = api.schedule("demo.noop", {"n": "claimed"}, delay=0)
    done = api.schedule("demo.noop", {"n": "done"}, delay=0)
    assert {c.id for c in jobs_store.claim_due_jobs(10)} == {claimed.id, done.id}
    ScheduledJob.objects.filter(pk=done.id).update(state=JobState.DONE, finished_at=timezone.now(), token=None)
    dead = api.schedule("demo.noop", {"n": "dead"}, delay=3600)
    ScheduledJob.objects.filter(pk=dead.id).update(state=JobState.DEAD, finished_at=timezone.now(), attempts=5)
    return {**made, "claimed": claimed.id, "done": done.id, "dead": dead.id}


def _act(client: Any, action: str, ids: list[int], **extra: Any) -> tuple[list[str], list[str]]:
    """POST an action from the changelist; returns its messages and the UPDATE statements it ran."""
    data = {"action": action, ACTION_CHECKBOX_NAME: [str(i) for i in ids], "index": "0", **extra}
    with CaptureQueriesContext(connection) as queries:
        response = client.post(CHANGELIST, data, follow=True)
    updates = [q["sql"] for q in queries.captured_queries if "UPDATE scheduling_scheduledjob" in q["sql"]]
    return _messages(response), updates


def test_cancel_action_changes_only_pending_rows_in_one_statement(admin, jobs):
    """Cancel: the pending selected jobs are cancelled by one UPDATE; the others are counted, not touched."""
    selected = [jobs[n] for n in ("p1", "p2", "claimed", "done")]
    untouched = [jobs[n] for n in ("claimed", "done", "bystander", "dead")]
    before = _snapshot(untouched)
    messages, updates = _act(admin, "cancel_selected", selected)
    assert messages == [
        "Cancelled 2 jobs.",
        "2 jobs were not touched: only pending jobs can be cancelled (they were 1 claimed, 1 done).",
    ]
    assert len(updates) == 1
    assert set(ScheduledJob.objects.filter(state=JobState.CANCELLED).values_list("id", flat=True)) == {
        jobs["p1"],
        jobs["p2"],
    }
    assert _snapshot(untouched) == before


def test_run_now_action_makes_pending_jobs_due_and_reports_one_not_touched(admin, jobs):
    """Run now: the pending job is due now; the dead one is reported in the singular and left alone."""
    before = _snapshot([jobs["dead"], jobs["p2"]])
    messages, _updates = _act(admin, "run_now_selected", [jobs["p1"], jobs["dead"]])
    assert messages[0] == "1 job is due now; a worker takes it within a second."
    assert messages[1] == "1 job was not touched: only pending jobs can be run now (it was 1 dead)."
    assert ScheduledJob.objects.get(pk=jobs["p1"]).due_at <= core_store.database_now()
    assert _snapshot([jobs["dead"], jobs["p2"]]) == before


def test_retry_dead_action_revives_only_dead_jobs(admin, jobs):
    """Retry: the dead job is pending again with a fresh budget; the pending one is not touched."""
    before = _snapshot([jobs["p1"]])
    messages, _updates = _act(admin, "retry_dead_selected", [jobs["dead"], jobs["p1"]])
    assert messages[0].startswith("1 dead job is pending again")
    assert "1 pending" in messages[1]
    revived = ScheduledJob.objects.get(pk=jobs["dead"])
    assert (revived.state, revived.attempts, revived.finished_at) == (JobState.PENDING, 0, None)
    assert _snapshot([jobs["p1"]]) == before


def test_reschedule_action_asks_for_a_time_then_moves_only_pending_jobs(admin, jobs):
    """Reschedule shows an intermediate form; applying it moves the pending jobs in one UPDATE."""
    selected = [jobs["p1"], jobs["done"]]
    page = admin.post(CHANGELIST, {"action": "reschedule_selected", ACTION_CHECKBOX_NAME: selected, "index": "0"})
    assert page.status_code == 200
    assert b'name="due_at"' in page.content
    assert b"2 jobs selected; 1 of them can still be moved" in page.content
    before = _snapshot([jobs["done"], jobs["p2"]])
    messages, updates = _act(
        admin, "reschedule_selected", selected, apply="1", due_at="2031-05-06T07:08:09", select_across="0"
    )
    assert messages[0] == "Rescheduled 1 job to 2031-05-06 07:08:09 UTC."
    assert "1 done" in messages[1]
    assert len(updates) == 1
    assert ScheduledJob.objects.get(pk=jobs["p1"]).due_at == dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    assert _snapshot([jobs["done"], jobs["p2"]]) == before


def test_reschedule_to_a_time_that_does_not_exist_is_refused(admin, jobs):
    """In Europe/Lisbon, 01:30 on the spring-forward night does not exist: form error, nothing moves."""
    before = _snapshot([jobs["p1"]])
    with timezone.override("Europe/Lisbon"):
        response = admin.post(
            CHANGELIST,
            {
                "action": "reschedule_selected",
                ACTION_CHECKBOX_NAME: [jobs["p1"]],
                "index": "0",
                "apply": "1",
                "due_at": "2026-03-29T01:30:00",
            },
        )
    assert response.status_code == 200
    assert b"couldn" in response.content  # "couldn't be interpreted in time zone Europe/Lisbon"
    assert _snapshot([jobs["p1"]]) == before


def test_delete_is_not_offered(admin, jobs):
    """Jobs end by cancel: no delete action, no delete page."""
    page = admin.get(CHANGELIST)
    assert b"delete_selected" not in page.content
    assert admin.get(f"{CHANGELIST}{jobs['p1']}/delete/").status_code == 403


def test_list_shows_local_and_relative_due_times_filters_and_search(admin, jobs):
    """The list shows kind, key, due time with a relative one, state and attempts; filters and id search work."""
    api.schedule("demo.record", {}, delay=7200, key="invoice:7")
    page = admin.get(CHANGELIST)
    text = page.content.decode().replace("\xa0", " ")
    assert "in 59 minutes" in text
    assert "0/5" in text
    assert admin.get(CHANGELIST, {"state__exact": "dead"}).context["cl"].result_count == 1
    claimed = admin.get(CHANGELIST, {"state__exact": "claimed"}).context["cl"].result_list  # via in_states
    assert [j.id for j in claimed] == [jobs["claimed"]]
    assert admin.get(CHANGELIST, {"kind": "demo.record"}).context["cl"].result_count == 1
    ScheduledJob.objects.filter(pk=jobs["p1"]).update(due_at=timezone.now() - dt.timedelta(minutes=5))
    assert [j.id for j in admin.get(CHANGELIST, {"overdue": "yes"}).context["cl"].result_list] == [jobs["p1"]]
    assert [j.id for j in admin.get(CHANGELIST, {"q": str(jobs["p2"])}).context["cl"].result_list] == [jobs["p2"]]
    assert admin.get(CHANGELIST, {"q": "invoice"}).context["cl"].result_count == 1


# --- add and change -----------------------------------------------------------------------------------------


def _add(admin: Any, **fields: Any) -> Any:
    data = {
        "kind": "demo.noop",
        "payload": "{}",
        "on_conflict": "error",
        "due_at": "",
        "delay_seconds": "",
        "key": "",
        "max_attempts": "",
        "owner": "",
    }
    data.update(fields)
    return admin.post(ADD, data)


def test_the_add_form_defaults_to_the_apis_on_conflict(admin):
    """The add form's on_conflict starts at api.schedule's default (replace), as the JSON API's does."""
    default = inspect.signature(api.schedule).parameters["on_conflict"].default
    assert default == "replace"
    form = admin.get(ADD).context["adminform"].form
    assert form.fields["on_conflict"].initial == default
    assert '<option value="replace" selected>' in admin.get(ADD).content.decode()


def test_add_schedules_through_the_api(admin, admin_user):
    """The add form calls api.schedule: the job is stored pending with the owner and key given."""
    response = _add(
        admin,
        kind="reminders.trial_ending",
        payload='{"user_id": 1, "trial_id": 2}',
        due_at="2031-01-02T03:04:05",
        key="trial-ending:2",
        owner=str(admin_user.pk),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = ScheduledJob.objects.get()
    assert (job.kind, job.payload, job.key, job.owner_id) == (
        "reminders.trial_ending",
        {"user_id": 1, "trial_id": 2},
        "trial-ending:2",
        admin_user.pk,
    )
    assert job.due_at == dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert response["Location"] == CHANGELIST


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "no.such.kind", "delay_seconds": "5"}, "Select a valid choice"),
        (
            {"kind": "reminders.trial_ending", "payload": '{"user_id": "x", "trial_id": 2}', "delay_seconds": "5"},
            "fails its schema",
        ),
        ({"payload": "{nope", "delay_seconds": "5"}, "Enter valid JSON"),
        ({"payload": '{"a": ' * 10_000 + "1" + "}" * 10_000, "delay_seconds": "5"}, "nested too deeply"),
        ({"payload": json.dumps({"x": "y" * 70_000}), "delay_seconds": "5"}, "the limit is"),
        ({"due_at": "2031-02-30T10:00:00"}, "Enter a valid date/time"),
        ({"due_at": "2031-01-01T10:00:00", "delay_seconds": "5"}, "exactly one"),
        ({}, "Give a due time or a delay"),
        ({"delay_seconds": "-5"}, "greater than or equal to 0"),
        ({"delay_seconds": "5", "max_attempts": "0"}, "greater than or equal to 1"),
    ],
)
def test_add_refuses_what_the_api_refuses_and_stores_nothing(admin, fields, says):
    """Unknown kind, bad or oversized or too-deep payload, impossible or doubled times: form errors, no row."""
    response = _add(admin, **fields)
    assert response.status_code == 200
    assert says in response.content.decode()
    assert ScheduledJob.objects.count() == 0


def test_add_with_a_taken_key_is_a_form_error(admin):
    """on_conflict=error with a key in use: the form says which job holds it; nothing is added or changed."""
    first = api.schedule("demo.noop", {"v": 1}, delay=600, key="dup")
    response = _add(admin, key="dup", delay_seconds="5", payload='{"v": 2}')
    assert response.status_code == 200
    assert f"already has a live job ({first.id})" in response.content.decode()
    assert list(ScheduledJob.objects.values_list("id", "payload")) == [(first.id, {"v": 1})]


def test_change_moves_a_pending_job_through_reschedule(admin):
    """Editing a pending job's due time reschedules it; nothing else on the row is written."""
    job = api.schedule("demo.noop", {"v": 1}, delay=600)
    response = admin.post(
        f"{CHANGELIST}{job.id}/change/",
        {
            "due_at_0": "2032-03-04",
            "due_at_1": "05:06:07",
            "attempt_set-TOTAL_FORMS": "0",
            "attempt_set-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    stored = ScheduledJob.objects.get(pk=job.id)
    assert stored.due_at == dt.datetime(2032, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    assert (stored.payload, stored.state) == ({"v": 1}, JobState.PENDING)


def test_change_page_of_a_running_job_is_read_only(admin):
    """A claimed job's page has no editable due time, and a forged post changes nothing."""
    job = api.schedule("demo.noop", {}, delay=0)
    jobs_store.claim_due_jobs(10)
    page = admin.get(f"{CHANGELIST}{job.id}/change/")
    assert b'name="due_at"' not in page.content
    before = _snapshot([job.id])
    admin.post(
        f"{CHANGELIST}{job.id}/change/",
        {
            "due_at_0": "2032-03-04",
            "due_at_1": "05:06:07",
            "attempt_set-TOTAL_FORMS": "0",
            "attempt_set-INITIAL_FORMS": "0",
        },
    )
    assert _snapshot([job.id]) == before


# --- fixed-time schedules ------------------------------------------------------------------------------------


@pytest.fixture
def schedule() -> PeriodicTask:
    """A fixed-time schedule: 03:00 daily in Lisbon, through the gate."""
    crontab = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Lisbon")
    task = PeriodicTask.objects.create(
        name="nightly-test",
        task="scheduling.run_fixed",
        kwargs=json.dumps({"schedule": "nightly-test"}),
        crontab=crontab,
    )
    SchedulePolicy.objects.create(periodic_task=task, kind="demo.record", payload={"label": "nightly"})
    return task


PREFIX = getattr(settings, "CELERY_BROKER_KEYPREFIX", "")  # this test run's keys on the shared Redis


def test_periodic_task_page_shows_timing_next_runs_and_history(admin, schedule):
    """The schedule's page describes its timing, lists the next five runs in Lisbon time and its recent runs."""
    ScheduleRun.objects.create(
        schedule=schedule.policy,
        tick=timezone.now() - dt.timedelta(days=1),
        state="succeeded",
        trigger="manual",
        finished_at=timezone.now(),
    )
    page = admin.get(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/").content.decode()
    assert "At 03:00 AM (Europe/Lisbon)" in page
    assert page.count(" 03:00:00 WET") + page.count(" 03:00:00 WEST") == 5
    assert "run now" in page  # the recent run's trigger
    assert f"schedule__id__exact={schedule.policy.pk}" in page
    listing = admin.get("/admin/django_celery_beat/periodictask/").content.decode()
    assert "At 03:00 AM (Europe/Lisbon)" in listing
    assert "succeeded" in listing


def test_a_schedule_declared_in_code_shows_beats_raw_fields_read_only_and_warns_that_sync_rewrites_it(admin, schedule):
    """A declared schedule's page shows Task (custom), One-off, Start Datetime read-only (a post cannot change
    them) and says sync overwrites edits; a schedule made in the admin keeps them editable, with no warning."""
    schedules.sync(names=["nightly-settlement"])
    declared = PeriodicTask.objects.get(name="nightly-settlement")
    page_url = f"/admin/django_celery_beat/periodictask/{declared.pk}/change/"
    response = admin.get(page_url)
    page = response.content.decode()
    assert 'id="declared-in-code"' in page
    assert "<code>manage.py timekeeper sync</code>, run at every start, writes its name, timing" in page
    form = response.context["adminform"].form
    for field in ("task", "regtask", "one_off", "start_time", "kwargs", "args", "queue"):
        assert form.fields[field].disabled, field
    assert not form.fields["enabled"].disabled
    made_here = admin.get(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/")
    assert 'id="declared-in-code"' not in made_here.content.decode()
    assert not made_here.context["adminform"].form.fields["one_off"].disabled


def test_a_declared_schedules_form_keeps_its_raw_fields_whatever_is_posted(rf, admin_user):
    """The declared schedule's form validates with a forged task, one-off and kwargs, and keeps the stored values."""
    from django.contrib import admin as django_admin

    schedules.sync(names=["nightly-settlement"])
    declared = PeriodicTask.objects.get(name="nightly-settlement")
    request = rf.get("/")
    request.user = admin_user
    model_admin = django_admin.site._registry[PeriodicTask]
    form_class = model_admin.get_form(request, declared, change=True)
    data = {
        "name": declared.name,
        "enabled": "",
        "description": declared.description,
        "task": "evil.task",
        "regtask": "",
        "one_off": "on",
        "kwargs": '{"schedule": "another"}',
        "args": "[1]",
        "headers": "{}",
        "priority": "",
        "expire_seconds": "",
    }
    form = form_class(data, instance=declared)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["task"] == "scheduling.run_fixed"
    assert form.cleaned_data["one_off"] is False
    assert form.cleaned_data["kwargs"] == declared.kwargs
    assert form.cleaned_data["enabled"] is False  # the operator's switch still changes


def test_run_now_sends_one_manual_tick_through_the_gate(admin, schedule, broker):
    """Run now sends scheduling.run_fixed with trigger manual, named fixed:<schedule> for Flower."""
    tasks = PeriodicTask.objects.filter(pk__in=[schedule.pk])
    other = PeriodicTask.objects.create(
        name="plain", task="demo.whatever", interval=IntervalSchedule.objects.create(every=10, period="seconds")
    )
    response = admin.post(
        "/admin/django_celery_beat/periodictask/",
        {
            "action": "run_now_selected",
            ACTION_CHECKBOX_NAME: [str(tasks[0].pk), str(other.pk)],
            "index": "0",
        },
        follow=True,
    )
    messages = _messages(response)
    assert messages[0].startswith("Sent a manual run of nightly-test")
    assert messages[1] == "1 periodic task was not run: plain has no fixed-time policy."
    queued = [json.loads(raw) for raw in broker.lrange(f"{PREFIX}celery", 0, -1)]
    assert len(queued) == 1
    headers = queued[0]["headers"]
    assert (headers["task"], headers["shadow"]) == ("scheduling.run_fixed", "fixed:nightly-test")
    body = json.loads(base64.b64decode(queued[0]["body"]))
    assert body[1]["trigger"] == "manual"
    assert body[1]["schedule"] == "nightly-test"


def test_policy_inline_refuses_a_timeout_not_shorter_than_the_interval(admin):
    """A run timeout as long as the interval is refused by policies.validate_policy: nothing saved."""
    interval = IntervalSchedule.objects.create(every=60, period="seconds")
    data = {
        "name": "too-long",
        "regtask": "",
        "task": "scheduling.run_fixed",
        "enabled": "on",
        "description": "",
        "interval": str(interval.pk),
        "crontab": "",
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
        "policy-0-payload": "{}",
        "policy-0-expression": "",
        "policy-0-concurrency_policy": "forbid",
        "policy-0-starting_deadline_seconds": "",
        "policy-0-active_deadline_seconds": "60",
        "policy-0-backoff_limit": "0",
        "policy-0-successful_history_limit": "3",
        "policy-0-failed_history_limit": "1",
        "policy-0-missed_policy": "skip",
        "policy-0-missed_window_seconds": "3600",
        "policy-0-dst_gap": "shift",
    }
    response = admin.post("/admin/django_celery_beat/periodictask/add/", data)
    assert response.status_code == 200
    assert "must be shorter than the schedule" in response.content.decode()
    assert not PeriodicTask.objects.filter(name="too-long").exists()
    data["policy-0-active_deadline_seconds"] = "30"
    data["kwargs"] = "{}"
    response = admin.post("/admin/django_celery_beat/periodictask/add/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    task = PeriodicTask.objects.get(name="too-long")
    assert json.loads(task.kwargs) == {"schedule": "too-long"}
    assert task.policy.active_deadline_seconds == 30


def test_policy_inline_refuses_a_payload_over_the_kinds_limit(admin, schedule, settings):
    """A superuser's policy payload over the kind's size limit is a payload error on the page; the stored one stays."""
    settings.SCHEDULING_MAX_PAYLOAD_BYTES = 1000
    data = _schedule_post(schedule, **{"policy-0-payload": json.dumps({"label": "big", "blob": "x" * 1500})})
    response = admin.post(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/", data)
    assert response.status_code == 200
    policy_form = response.context["inline_admin_formsets"][0].formset.forms[0]
    assert "the limit is 1000 bytes" in " ".join(policy_form.errors["payload"])
    assert SchedulePolicy.objects.get(pk=schedule.policy.pk).payload == {"label": "nightly"}
    data["policy-0-payload"] = json.dumps({"label": "small", "blob": "x" * 100})
    response = admin.post(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert SchedulePolicy.objects.get(pk=schedule.policy.pk).payload["label"] == "small"


def _schedule_post(task: PeriodicTask, **changes: Any) -> dict[str, Any]:
    """The change form of a schedule with a policy, as the page posts it, with ``changes`` applied."""
    policy = task.policy
    data: dict[str, Any] = {
        "name": task.name,
        "regtask": "",
        "task": task.task,
        "enabled": "on",
        "description": "",
        "start_time_0": "",
        "start_time_1": "",
        "args": "[]",
        "kwargs": task.kwargs,
        "expires": "",
        "expire_seconds": "",
        "queue": "",
        "exchange": "",
        "routing_key": "",
        "priority": "",
        "headers": "{}",
        "policy-TOTAL_FORMS": "1",
        "policy-INITIAL_FORMS": "1",
        "policy-MIN_NUM_FORMS": "0",
        "policy-MAX_NUM_FORMS": "1",
        "policy-0-id": str(policy.pk),
        "policy-0-periodic_task": str(task.pk),
        "policy-0-kind": policy.kind,
        "policy-0-payload": json.dumps(policy.payload),
        "policy-0-expression": "0 3 * * *",
        "policy-0-timezone": "Europe/Lisbon",
        "policy-0-every_seconds": "",
        "policy-0-concurrency_policy": policy.concurrency_policy,
        "policy-0-starting_deadline_seconds": "",
        "policy-0-active_deadline_seconds": "",
        "policy-0-backoff_limit": str(policy.backoff_limit),
        "policy-0-successful_history_limit": str(policy.successful_history_limit),
        "policy-0-failed_history_limit": str(policy.failed_history_limit),
        "policy-0-missed_policy": policy.missed_policy,
        "policy-0-missed_window_seconds": str(policy.missed_window_seconds),
        "policy-0-dst_gap": policy.dst_gap,
    }
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def test_a_schedule_page_edits_timing_only_on_the_policy(admin, schedule):
    """With a policy, beat's crontab/interval/solar/clocked fields are not on the form; its expression and zone are."""
    page = admin.get(f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/").content.decode()
    for beat_field in ("crontab", "interval", "solar", "clocked"):
        assert f'name="{beat_field}"' not in page, beat_field
    assert 'name="policy-0-expression"' in page
    assert 'value="0 3 * * *"' in page  # the crontab's fields, shown as the policy's expression
    assert 'name="policy-0-timezone"' in page
    assert 'value="Europe/Lisbon"' in page


def test_editing_the_expression_rewrites_the_crontab_and_the_next_runs(admin, schedule):
    """Saving a new expression and zone writes beat's crontab from it, and the preview follows."""
    url = f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/"
    data = _schedule_post(schedule, **{"policy-0-expression": "30 6 * * *", "policy-0-timezone": "America/New_York"})
    response = admin.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule.refresh_from_db()
    crontab = schedule.crontab
    assert (crontab.minute, crontab.hour, str(crontab.timezone)) == ("30", "6", "America/New_York")
    assert schedule.policy.expression == "30 6 * * *"
    page = admin.get(url).content.decode()
    assert page.count(" 06:30:00 EST") + page.count(" 06:30:00 EDT") == 5
    response = admin.post(url, _schedule_post(schedule, **{"policy-0-expression": "@weekly"}))
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule.refresh_from_db()
    crontab = schedule.crontab
    assert (crontab.minute, crontab.hour, crontab.day_of_week, str(crontab.timezone)) == (
        "0",
        "0",
        "0",
        "Europe/Lisbon",
    )
    assert "At 12:00 AM, only on Sunday (Europe/Lisbon)" in admin.get(url).content.decode()


def test_an_interval_replaces_the_crontab_and_a_bad_expression_is_refused(admin, schedule):
    """every_seconds makes beat's interval the timing; an invalid expression is a form error and nothing changes."""
    url = f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/"
    response = admin.post(url, _schedule_post(schedule, **{"policy-0-expression": "61 * * * *"}))
    assert response.status_code == 200
    schedule.refresh_from_db()
    assert schedule.crontab.hour == "3"
    too_long = _schedule_post(schedule, **{"policy-0-expression": "", "policy-0-every_seconds": "3000000000"})
    response = admin.post(url, too_long)  # past beat's integer column: a form error, not a DataError
    assert response.status_code == 200
    assert "less than or equal to 2147483647" in response.content.decode()
    schedule.refresh_from_db()
    assert schedule.crontab.hour == "3"
    data = _schedule_post(schedule, **{"policy-0-expression": "", "policy-0-every_seconds": "600"})
    response = admin.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule.refresh_from_db()
    assert schedule.crontab is None
    assert (schedule.interval.every, schedule.interval.period) == (600, "seconds")


def test_one_pause_switch_stops_runs(admin, schedule):
    """The page has one pause control ("Enabled"); unticking it suspends the policy, beat drops it, no runs preview."""
    from scheduling.fixed import policies

    url = f"/admin/django_celery_beat/periodictask/{schedule.pk}/change/"
    page = admin.get(url).content.decode()
    assert 'name="enabled"' in page
    assert "suspend" not in page.split('id="policy-group"', 1)[-1].split("</fieldset>", 1)[0]
    assert 'name="policy-0-suspend"' not in page
    response = admin.post(url, _schedule_post(schedule, enabled=None))
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule.refresh_from_db()
    policy = SchedulePolicy.objects.get(periodic_task=schedule)
    assert (schedule.enabled, policy.suspend) == (False, True)
    assert policies.tick_state(policy, schedule).suspended
    assert not PeriodicTask.objects.enabled().filter(pk=schedule.pk).exists()
    assert "disabled" in admin.get(url).content.decode()
    response = admin.post(url, _schedule_post(schedule))
    assert response.status_code == 302
    schedule.refresh_from_db()
    policy.refresh_from_db()
    assert (schedule.enabled, policy.suspend) == (True, False)
    assert not policies.tick_state(policy, schedule).suspended


def test_list_actions_keep_suspend_with_enabled(admin, schedule):
    """Disabling from the list suspends the policy; enabling resumes it: the two flags never disagree."""
    for action, enabled in (("disable_tasks", False), ("enable_tasks", True), ("toggle_tasks", False)):
        admin.post(
            "/admin/django_celery_beat/periodictask/",
            {"action": action, ACTION_CHECKBOX_NAME: [str(schedule.pk)], "index": "0"},
        )
        schedule.refresh_from_db()
        policy = SchedulePolicy.objects.get(periodic_task=schedule)
        assert (schedule.enabled, policy.suspend) == (enabled, not enabled), action


# --- API tokens ---------------------------------------------------------------------------------------------


def test_token_is_shown_once_and_only_its_hash_is_stored(admin, admin_user, client):
    """Creating a token shows the secret on the next page only; the row holds its SHA-256; the API accepts it."""
    response = admin.post("/admin/scheduling/apitoken/add/", {"user": str(admin_user.pk), "name": "billing"})
    assert response.status_code == 200
    secret = response.context["secret"]
    assert secret.startswith("tk_")
    assert secret in response.content.decode()
    token = ApiToken.objects.get(name="billing")
    assert token.key_hash == auth.hash_token(secret)
    assert secret not in admin.get(f"/admin/scheduling/apitoken/{token.pk}/change/").content.decode()
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
    admin.post(
        "/admin/scheduling/apitoken/", {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [token.pk], "index": "0"}
    )
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


# --- the dashboard -----------------------------------------------------------------------------------------------


def _card(page: str, metric: str) -> str:
    start = page.index(f'data-metric="{metric}"')
    value = page.index('class="tk-value">', start) + len('class="tk-value">')
    return page[value : page.index("</span>", value)].strip()


def test_dashboard_numbers_follow_the_table(admin, schedule):
    """The index shows backlog, pending and the next 24 hours; they change when jobs are added and cancelled."""
    page = admin.get("/admin/").content.decode()
    assert "/admin/scheduling/scheduledjob/" in page, "the app list is still there, under the dashboard"
    assert (_card(page, "backlog"), _card(page, "pending")) == ("0", "0")
    assert _card(page, "beat") == "no leader"
    job = api.schedule("demo.noop", {}, delay=0)
    api.schedule("demo.record", {}, delay=7200)
    page = admin.get("/admin/").content.decode()
    assert (_card(page, "backlog"), _card(page, "pending")) == ("1", "2")
    assert "demo.record" in page
    assert "nightly-test" in page
    assert "At 03:00 AM (Europe/Lisbon)" in page
    assert "<svg" in page
    api.cancel(job.id)
    page = admin.get("/admin/").content.decode()
    assert (_card(page, "backlog"), _card(page, "pending")) == ("0", "1")


def test_dashboard_is_hidden_from_staff_without_job_permissions(client, django_user_model):
    """A staff member who may not view jobs sees the admin index without the dashboard."""
    user = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    client.force_login(user)
    page = client.get("/admin/").content.decode()
    assert "timekeeper-dashboard" not in page


def test_admin_posts_need_the_csrf_token(admin_user):
    """A staff session posting an action or the add form without the CSRF token gets 403; nothing changes."""
    from django.test import Client

    job = api.schedule("demo.noop", {}, delay=600)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    cancel = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [job.id], "index": "0"}
    assert client.post(CHANGELIST, cancel).status_code == 403
    assert client.post(ADD, {"kind": "demo.noop", "payload": "{}", "delay_seconds": "1"}).status_code == 403
    assert list(ScheduledJob.objects.values_list("id", "state")) == [(job.id, JobState.PENDING)]


def test_abort_action_on_the_runs_list_asks_a_running_run_and_reports_a_finished_one(admin, schedule):
    """The runs list's abort action writes who asked on the running run; a finished run is reported, untouched."""
    policy = SchedulePolicy.objects.get(periodic_task=schedule)
    now = timezone.now()
    running = ScheduleRun.objects.create(schedule=policy, tick=now, state="running")
    finished = ScheduleRun.objects.create(
        schedule=policy, tick=now - dt.timedelta(days=1), state="succeeded", finished_at=now
    )
    response = admin.post(
        "/admin/scheduling/schedulerun/",
        {"action": "abort_selected", ACTION_CHECKBOX_NAME: [str(running.pk), str(finished.pk)], "index": "0"},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert any("Asked 1 running run to stop" in m for m in shown)
    assert any("1 run was not running" in m for m in shown)
    running.refresh_from_db()
    finished.refresh_from_db()
    assert (running.state, running.abort_requested_by) == ("running", "admin")
    assert (finished.state, finished.abort_requested_by) == ("succeeded", "")
