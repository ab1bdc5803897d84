"""The audit trail: every door (admin, JSON API, CLI) records who did what through ``scheduling.api``'s calls."""

from __future__ import annotations

import datetime as dt
import getpass
import io
import json

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from scheduling import api
from scheduling.core import audit
from scheduling.models import ApiToken, AuditRecord, JobState, ScheduledJob
from scheduling.web import auth

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

CHANGELIST = "/admin/scheduling/scheduledjob/"


def _records() -> list[tuple[str, str, str, int, int]]:
    return list(AuditRecord.objects.order_by("id").values_list("actor", "door", "action", "selected", "changed"))


def _pending(n: int) -> list[int]:
    return [api.schedule("demo.noop", {"n": i}, delay=3600).id for i in range(n)]


def test_application_code_is_not_recorded():
    """Outside a door (application code, the engine), the api calls write no audit record."""
    ids = _pending(2)
    api.cancel_many(ids)
    api.pause("demo.noop")
    assert AuditRecord.objects.count() == 0


def test_admin_list_actions_and_job_page_are_recorded_with_the_user(admin_client, admin_user):
    """The admin's cancel, run now, reschedule and a job page's cancel each leave one record: user, door, counts."""
    ids = _pending(4)
    done = api.schedule("demo.noop", {}, delay=3600).id
    ScheduledJob.objects.filter(pk=done).update(state=JobState.DONE, finished_at=timezone.now())
    post = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(ids[0]), str(done)], "index": "0"}
    admin_client.post(CHANGELIST, post)
    admin_client.post(CHANGELIST, {**post, "action": "run_now_selected", ACTION_CHECKBOX_NAME: [str(ids[1])]})
    when = (timezone.localtime() + dt.timedelta(hours=2)).replace(microsecond=0)
    later = {"apply": "1", "due_at": f"{when:%Y-%m-%dT%H:%M:%S}", ACTION_CHECKBOX_NAME: [str(ids[2])]}
    admin_client.post(CHANGELIST, {**post, "action": "reschedule_selected", **later})
    admin_client.post(f"{CHANGELIST}{ids[3]}/act/cancel/", {"confirm": "yes"})
    assert _records() == [
        ("admin", "admin", "cancel", 2, 1),
        ("admin", "admin", "run_now", 1, 1),
        ("admin", "admin", "reschedule", 1, 1),
        ("admin", "admin", "cancel", 1, 1),
    ]
    first = AuditRecord.objects.order_by("id").first()
    assert first is not None
    assert (first.user_id, first.job_ids) == (admin_user.pk, sorted([ids[0], done]))
    moved = AuditRecord.objects.get(action="reschedule")
    assert dt.datetime.fromisoformat(moved.details["due_at"]) == when


def test_admin_all_matching_records_the_filter(admin_client):
    """ "Select all N matching" records the list's filter beside the ids it reached."""
    ids = _pending(3)
    post = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(ids[0])], "select_across": "1", "index": "0"}
    admin_client.post(f"{CHANGELIST}?kind=demo.noop", {**post, "confirm": "yes"})
    record = AuditRecord.objects.get()
    assert (record.action, record.selected, record.changed) == ("cancel", 3, 3)
    assert record.details == {"filter": "kind=demo.noop", "all_matching": True}


def test_admin_kind_controls_and_tokens_are_recorded(admin_client, admin_user):
    """Pause, resume, cap from the Kinds page, and a token issued and revoked in the admin, are recorded."""
    for action, data in (("pause", {}), ("cap", {"max_running": "4"}), ("resume", {})):
        admin_client.post(f"/admin/scheduling/kindcontrol/demo.noop/{action}/", data)
    admin_client.post("/admin/scheduling/apitoken/add/", {"name": "ci", "user": admin_user.pk})
    token = ApiToken.objects.get()
    admin_client.post(
        "/admin/scheduling/apitoken/", {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [str(token.pk)]}
    )
    assert [r[2] for r in _records()] == ["pause", "cap", "resume", "token_create", "token_revoke"]
    cap = AuditRecord.objects.get(action="cap")
    assert (cap.kind, cap.details, cap.door) == ("demo.noop", {"max_running": 4}, "admin")
    assert "'ci'" in AuditRecord.objects.get(action="token_create").target


def test_json_api_records_the_tokens_user(django_user_model):
    """The JSON API's cancel, reschedule and kind pause are recorded as the token's user, door "api"."""
    user = django_user_model.objects.create_user("svc", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_kindcontrol"))
    _, raw = auth.issue_token(user, "svc")  # outside a door: not recorded
    client = Client(headers={"Authorization": f"Bearer {raw}"})
    job = client.post("/api/jobs/", json.dumps({"kind": "demo.noop", "payload": {}, "delay": 3600}), "application/json")
    job_id = job.json()["job"]["id"]
    moved = client.post(f"/api/jobs/{job_id}/reschedule", json.dumps({"delay": 60}), "application/json")
    assert moved.status_code == 200
    assert client.post(f"/api/jobs/{job_id}/cancel", "", "application/json").status_code == 200
    assert client.post("/api/kinds/demo.noop/pause", "", "application/json").status_code == 200
    assert _records() == [
        ("svc", "api", "reschedule", 1, 1),
        ("svc", "api", "cancel", 1, 1),
        ("svc", "api", "pause", 1, 1),
    ]
    assert list(AuditRecord.objects.for_job(job_id).values_list("action", flat=True)) == ["cancel", "reschedule"]


def test_cli_records_the_os_user(monkeypatch):
    """``manage.py timekeeper`` cancel, retry, reschedule and kinds are recorded as cli:<OS user>, door "cli"."""
    monkeypatch.delenv("SUDO_USER", raising=False)
    ids = _pending(2)
    out = io.StringIO()
    call_command("timekeeper", "cancel", str(ids[0]), stdout=out, stderr=out)
    call_command("timekeeper", "reschedule", str(ids[1]), "--in", "60", stdout=out, stderr=out)
    call_command("timekeeper", "kinds", "pause", "demo.noop", stdout=out, stderr=out)
    name = f"cli:{getpass.getuser()}"
    assert _records() == [
        (name, "cli", "cancel", 1, 1),
        (name, "cli", "reschedule", 1, 1),
        (name, "cli", "pause", 1, 1),
    ]
    assert AuditRecord.objects.filter(user__isnull=False).count() == 0


def test_the_cli_names_the_sudo_caller(monkeypatch):
    """Under sudo the record names who ran sudo, not root."""
    monkeypatch.setenv("SUDO_USER", "alice")
    assert audit.cli_actor().name == "cli:alice"


def test_a_record_commits_with_the_change_or_not_at_all(admin_user):
    """The record is written in the caller's transaction: a rolled-back cancel leaves no record."""
    from django.db import transaction

    ids = _pending(1)
    with audit.acting(audit.Actor(door="admin", user=admin_user)):
        try:
            with transaction.atomic():
                api.cancel_many(ids)
                assert AuditRecord.objects.count() == 1
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
    assert AuditRecord.objects.count() == 0
    assert ScheduledJob.objects.get(pk=ids[0]).state == JobState.PENDING


def test_admin_recurrence_and_fixed_schedule_actions_are_recorded(admin_client, broker):
    """Pausing and cancelling recurrences, disabling and running a fixed-time schedule now are recorded."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    from scheduling.models import SchedulePolicy

    first = api.recur("demo.noop", {}, key="digest:1", cron="0 9 * * *", timezone="Asia/Tokyo")
    second = api.recur("demo.noop", {}, key="digest:2", cron="0 9 * * *", timezone="Asia/Tokyo")
    recurrences = "/admin/scheduling/recurrence/"
    both = {ACTION_CHECKBOX_NAME: [str(first.id), str(second.id)], "index": "0"}
    admin_client.post(recurrences, {**both, "action": "pause_selected"})
    admin_client.post(recurrences, {**both, "action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(first.id)]})
    crontab = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Lisbon")
    task = PeriodicTask.objects.create(
        name="nightly-audit", task="scheduling.run_fixed", kwargs='{"schedule": "nightly-audit"}', crontab=crontab
    )
    SchedulePolicy.objects.create(periodic_task=task, kind="demo.record", payload={})
    tasks = "/admin/django_celery_beat/periodictask/"
    one = {ACTION_CHECKBOX_NAME: [str(task.pk)], "index": "0"}
    admin_client.post(tasks, {**one, "action": "run_now_selected"})
    admin_client.post(tasks, {**one, "action": "disable_tasks"})
    assert [(a, s, c) for _, _, a, s, c in _records()] == [
        ("recurrence_pause", 2, 2),
        ("recurrence_cancel", 1, 1),
        ("schedule_run_now", 1, 1),
        ("schedule_disable", 1, 1),
    ]
    run = AuditRecord.objects.get(action="schedule_run_now")
    assert (run.kind, run.target, run.door) == ("demo.record", "schedule nightly-audit", "admin")
    assert AuditRecord.objects.get(action="recurrence_pause").details == {"recurrence_ids": [first.id, second.id]}
