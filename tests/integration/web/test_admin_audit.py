"""The admin's audit list, a job's History, the confirmation before a cancel, and a finished job's due line."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import override_settings

from scheduling import api
from scheduling.models import AuditRecord, JobState, ScheduledJob

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

CHANGELIST = "/admin/scheduling/scheduledjob/"
AUDIT = "/admin/scheduling/auditrecord/"


def _pending(n: int) -> list[int]:
    return [api.schedule("demo.noop", {"n": i}, delay=3600).id for i in range(n)]


def _cancel(client, ids, **extra):
    data = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(i) for i in ids], "index": "0", **extra}
    return client.post(CHANGELIST, data)


def test_a_jobs_history_lists_who_cancelled_it(admin_client):
    """After a cancel from its page, the job's History names the action, the user, the door and the count."""
    job_id = _pending(1)[0]
    admin_client.post(f"{CHANGELIST}{job_id}/act/cancel/", {"confirm": "yes"})
    page = admin_client.get(f"{CHANGELIST}{job_id}/history/").content.decode()
    assert 'data-action="cancel" data-door="admin"' in page
    assert "<td>admin</td>" in page
    assert "1 of 1" in page
    assert "have a change history" not in page  # Django's words for an empty History


@override_settings(SCHEDULING_ADMIN_CONFIRM_OVER=2)
def test_a_bulk_cancel_over_the_threshold_asks_first(admin_client):
    """Over SCHEDULING_ADMIN_CONFIRM_OVER jobs, cancel shows a confirmation and changes nothing until confirmed."""
    ids = _pending(3)
    asked = _cancel(admin_client, ids)
    assert asked.templates[0].name == "admin/scheduling/scheduledjob/confirm.html"
    assert "3 jobs selected; 3 of them would change" in asked.content.decode()
    assert set(ScheduledJob.objects.values_list("state", flat=True)) == {JobState.PENDING}
    assert AuditRecord.objects.count() == 0
    _cancel(admin_client, ids, confirm="yes")
    assert set(ScheduledJob.objects.values_list("state", flat=True)) == {JobState.CANCELLED}
    assert AuditRecord.objects.get().changed == 3


def test_a_small_cancel_needs_no_confirmation_but_all_matching_does(admin_client):
    """Two ticked jobs are cancelled at once; "all N matching" asks first whatever N is."""
    ids = _pending(3)
    _cancel(admin_client, ids[:2])
    assert ScheduledJob.objects.filter(state=JobState.CANCELLED).count() == 2
    asked = _cancel(admin_client, ids[2:], select_across="1")
    assert "matching the list" in asked.content.decode()
    assert ScheduledJob.objects.get(pk=ids[2]).state == JobState.PENDING


def test_the_audit_list_filters_by_action_door_actor_and_job(admin_client):
    """The audit records' list filters by action, door, actor and job id."""
    ids = _pending(2)
    _cancel(admin_client, ids[:1])
    admin_client.post("/admin/scheduling/kindcontrol/demo.noop/pause/")
    listed = admin_client.get(AUDIT)
    assert listed.status_code == 200
    assert listed.context["cl"].result_count == 2
    for query, expected in (
        ("?action=pause", ["pause"]),
        ("?door=admin", ["pause", "cancel"]),
        ("?actor=admin", ["pause", "cancel"]),
        ("?actor=nobody", []),
        (f"?job={ids[0]}", ["cancel"]),
        (f"?job={ids[1]}", []),
    ):
        shown = [r.action for r in admin_client.get(AUDIT + query).context["cl"].result_list]
        assert shown == expected, query
    record = AuditRecord.objects.get(action="cancel")
    assert admin_client.get(f"{AUDIT}{record.pk}/change/").status_code == 200
    assert admin_client.post(f"{AUDIT}{record.pk}/delete/").status_code == 403


def test_a_cancelled_jobs_page_does_not_say_it_is_due(admin_client):
    """A cancelled job's page says it will not run, not "in 59 minutes"."""
    job_id = _pending(1)[0]
    api.cancel(job_id)
    page = admin_client.get(f"{CHANGELIST}{job_id}/change/").content.decode()
    assert "cancelled" in page
    assert "will not run" in page
    assert re.search(r"\(in \d+\s(minute|hour)", page) is None  # timeuntil's words: "(in 59 minutes)"


def test_a_project_without_the_audit_middleware_is_warned():
    """manage.py check warns (scheduling.W015) when the admin is installed without the audit middleware."""
    from django.conf import settings

    from scheduling import checks

    assert checks.check_audit_middleware() == []
    without = [m for m in settings.MIDDLEWARE if m != checks.AUDIT_MIDDLEWARE]
    with override_settings(MIDDLEWARE=without):
        assert [w.id for w in checks.check_audit_middleware()] == ["scheduling.W015"]


def test_a_verb_without_an_audit_action_entry_is_recorded_listed_filtered_and_labelled(admin_client, admin_user):
    """A new bulk action's verb (here "expedite") needs no AuditAction entry and no migration: it is written,
    the list shows it, the action filter offers it, and it reads as itself; a known verb keeps its label."""
    from scheduling.core import audit
    from scheduling.models import AuditAction
    from scheduling.web.admin.audit import ActionFilter

    assert "expedite" not in AuditAction.values
    with audit.acting(audit.Actor(door="admin", user=admin_user)):
        audit.record("expedite", changed=1, job_ids=[7])
        audit.record("run_now", changed=1, job_ids=[8])
    listed = admin_client.get(AUDIT)
    assert [r.action for r in listed.context["cl"].result_list] == ["run_now", "expedite"]
    page = listed.content.decode()
    assert "expedite" in page
    assert "run now" in page  # AuditAction's label, not the verb
    (action_filter,) = [f for f in listed.context["cl"].filter_specs if isinstance(f, ActionFilter)]
    assert list(action_filter.lookup_choices) == [("expedite", "expedite"), ("run_now", "run now")]
    shown = [r.action for r in admin_client.get(AUDIT + "?action=expedite").context["cl"].result_list]
    assert shown == ["expedite"]
    record = AuditRecord.objects.get(action="expedite")
    assert record.get_action_display() == "expedite"
    detail = admin_client.get(f"{AUDIT}{record.pk}/change/")
    assert detail.status_code == 200
    assert "expedite" in detail.content.decode()
