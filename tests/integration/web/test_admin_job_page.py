"""A job's admin page and list: act from the page, tracebacks kept, what needs attention first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.utils import timezone

from scheduling import api, registry
from scheduling.core import store as core_store
from scheduling.due_at import runner
from scheduling.due_at import store as jobs_store
from scheduling.models import AuditRecord, JobAbort, JobAttempt, JobState, ScheduledJob, SchedulePolicy
from scheduling.web.admin import bulk_actions, common, job_forms
from tests import support

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

CHANGELIST = "/admin/scheduling/scheduledjob/"


def _page(job_id: int) -> str:
    return f"{CHANGELIST}{job_id}/change/"


def _dead(run_sql: Any) -> int:
    """A demo.fail job run until it is dead (three failed attempts, each with its traceback)."""
    job = api.schedule("demo.fail", {"secret": "do-not-show"}, delay=0)
    for _ in range(3):
        support.make_due(job.id)
        (claim,) = jobs_store.claim_due_jobs(10)
        runner.run_batch([(claim.id, claim.token)])
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD
    return job.id


def test_a_failed_attempt_keeps_its_traceback_without_the_payload(run_sql):
    """Each failed attempt stores the handler's traceback (where it broke), never the payload's text."""
    job_id = _dead(run_sql)
    tracebacks = list(JobAttempt.objects.filter(job_id=job_id).values_list("traceback", flat=True))
    assert len(tracebacks) == 3
    assert all("DemoFailure" in t and "tasks/demo.py" in t for t in tracebacks)
    assert not any("do-not-show" in t for t in tracebacks)


def _quote_payload(job: registry.Job) -> None:
    raise ValueError(f"cannot use {job.payload['email']}")


registry.handler("test.quotes_payload", schema={"type": "object"}, timeout=10, max_attempts=1)(_quote_payload)


def test_a_traceback_keeps_where_it_broke_but_not_a_message_quoting_the_payload(run_sql):
    """An exception whose message quotes the payload: the frames and type are kept, its message is not."""
    job = api.schedule("test.quotes_payload", {"email": "someone@example.org"}, delay=0)
    (claim,) = jobs_store.claim_due_jobs(10)
    runner.run_batch([(claim.id, claim.token)])
    (attempt,) = JobAttempt.objects.filter(job_id=job.id)
    assert "_quote_payload" in attempt.traceback
    assert "builtins.ValueError: (message withheld)" in attempt.traceback
    assert "someone@example.org" not in attempt.traceback
    assert attempt.error == "ValueError: cannot use someone@example.org", "the message is kept once, as the error"


def test_a_dead_jobs_page_has_retry_and_no_save(admin_client, run_sql):
    """A dead job's page offers Retry (no Save); pressing it makes the job pending and says so."""
    job_id = _dead(run_sql)
    page = admin_client.get(_page(job_id)).content.decode()
    assert 'name="_save"' not in page
    assert 'name="_continue"' not in page
    assert 'value="retry"' in page
    assert 'value="cancel"' not in page
    assert "Traceback (most recent call last)" in page
    assert "DemoFailure" in page
    job = ScheduledJob.objects.get(pk=job_id)
    for moment in (job.created_at, job.finished_at, job.due_at):  # to the second, not Django's minute
        assert common.seconds_text(moment) in page
    response = admin_client.post(f"{CHANGELIST}{job_id}/act/retry/", follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "1 dead job is pending again, due now, with a fresh attempts budget."
    ]
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.PENDING


def test_run_now_says_when_a_paused_or_full_kind_holds_the_job_back(admin_client):
    """Run now on a paused kind's job (or a full capped one's) warns that it waits, beside "within a second"."""
    paused = api.schedule("demo.noop", {}, delay=3600)
    capped = api.schedule("demo.record", {}, delay=3600)
    api.pause("demo.noop")
    api.set_max_running("demo.record", 1)
    response = admin_client.post(f"{CHANGELIST}{capped.id}/act/run_now/", follow=True)
    assert len(response.context["messages"]) == 1, "capped but with room: nothing to add"
    api.schedule("demo.record", {}, due_at=core_store.database_now() - dt.timedelta(hours=1))  # claimed first
    assert len(jobs_store.claim_due_jobs(10)) == 1  # the cap is taken: one demo.record claimed
    response = admin_client.post(f"{CHANGELIST}{paused.id}/act/run_now/", follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "1 job is due now; a worker takes it within a second.",
        "Kind demo.noop is paused: 1 of these jobs waits until it is resumed.",
    ]
    response = admin_client.post(f"{CHANGELIST}{capped.id}/act/run_now/", follow=True)
    assert [str(m) for m in response.context["messages"]][1] == (
        "Kind demo.record runs at most 1 at a time: 1 of these jobs waits for a free place."
    )


def test_a_job_that_cannot_change_is_titled_view_and_a_pending_one_change(admin_client, run_sql):
    """A dead job's page (nothing to save) is titled "View scheduled job"; a pending job's, "Change scheduled job"."""
    dead = _dead(run_sql)
    pending = api.schedule("demo.noop", {}, delay=3600)
    assert "<h1>View scheduled job</h1>" in admin_client.get(_page(dead)).content.decode()
    assert "| View scheduled job |" in admin_client.get(_page(dead)).content.decode()
    assert "<h1>Change scheduled job</h1>" in admin_client.get(_page(pending.pk)).content.decode()


def test_a_pending_jobs_page_cancels_and_runs_now(admin_client):
    """A pending job's page offers Run now, Reschedule and Cancel, each through the bulk calls."""
    job = api.schedule("demo.noop", {}, delay=3600)
    page = admin_client.get(_page(job.id)).content.decode()
    assert all(f'value="{name}"' in page for name in ("run_now", "reschedule", "cancel"))
    assert 'name="_save"' in page
    response = admin_client.post(f"{CHANGELIST}{job.id}/act/run_now/", follow=True)
    assert [str(m) for m in response.context["messages"]] == ["1 job is due now; a worker takes it within a second."]
    assert ScheduledJob.objects.get(pk=job.id).due_at <= timezone.now()
    asked = admin_client.post(f"{CHANGELIST}{job.id}/act/cancel/")
    assert 'id="confirm-form"' in asked.content.decode()  # a cancel asks first; nothing changed yet
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING
    response = admin_client.post(f"{CHANGELIST}{job.id}/act/cancel/", {"confirm": "yes"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["Cancelled 1 job."]
    page = admin_client.get(_page(job.id)).content.decode()
    assert 'name="_save"' not in page
    assert 'id="job-actions"' not in page


def test_an_unknown_page_action_is_refused(admin_client):
    """A job page action other than retry, cancel or run_now answers 400 and changes nothing."""
    job = api.schedule("demo.noop", {}, delay=3600)
    assert admin_client.post(f"{CHANGELIST}{job.id}/act/delete/").status_code == 400
    assert admin_client.get(f"{CHANGELIST}{job.id}/act/cancel/").status_code == 400
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


def test_the_list_puts_dead_stuck_and_overdue_first_and_finished_last(admin_client, run_sql):
    """The list ranks dead, stuck claims, overdue pending, then pending by due time, finished last."""
    later = api.schedule("demo.noop", {"n": "later"}, delay=7200).id
    soon = api.schedule("demo.noop", {"n": "soon"}, delay=3600).id
    done = api.schedule("demo.noop", {"n": "done"}, delay=60).id
    stuck = api.schedule("demo.noop", {"n": "stuck"}, delay=0).id
    jobs_store.claim_due_jobs(10)
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '1 hour' WHERE id = %s", [stuck])
    overdue = api.schedule("demo.noop", {"n": "overdue"}, delay=60).id
    support.make_due(overdue, ago="1 minute")
    dead = api.schedule("demo.noop", {"n": "dead"}, delay=60).id
    ScheduledJob.objects.filter(pk=dead).update(state=JobState.DEAD, finished_at=timezone.now())
    ScheduledJob.objects.filter(pk=done).update(state=JobState.DONE, finished_at=timezone.now())
    response = admin_client.get(CHANGELIST)
    order = [job.pk for job in response.context["cl"].result_list]
    assert order == [dead, stuck, overdue, soon, later, done]
    assert 'class="tk-state tk-state-dead"' in response.content.decode()


def test_the_kind_filter_lists_only_due_at_kinds(admin_client):
    """Kinds run only by fixed-time schedules are not offered by the list's kind filter."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=60, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="only-fixed", task="scheduling.run_fixed", interval=every)
    SchedulePolicy.objects.create(periodic_task=task, kind="reports.rebuild_cache")
    page = admin_client.get(CHANGELIST).content.decode()
    assert "?kind=demo.noop" in page
    assert "?kind=reports.rebuild_cache" not in page


def test_the_add_form_shows_each_kinds_schema_an_example_and_takes_a_priority(admin_client, admin_user):
    """The add form shows the kind's schema and an example that passes it; priority reaches the row."""
    page = admin_client.get(f"{CHANGELIST}add/").content.decode()
    assert 'data-kind="reminders.trial_ending"' in page
    assert "Example payload" in page
    assert 'class="vForeignKeyRawIdAdminField"' in page  # owner is a raw id, not a select of every user
    example = job_forms.example_payload(
        {"type": "object", "properties": {"user_id": {"type": "integer", "minimum": 1}}, "required": ["user_id"]}
    )
    assert example == {"user_id": 1}
    response = admin_client.post(
        f"{CHANGELIST}add/",
        {
            "kind": "demo.noop",
            "payload": "{}",
            "on_conflict": "error",
            "delay_seconds": "3600",
            "priority": "7",
            "owner": str(admin_user.pk),
        },
    )
    assert response.status_code == 302
    assert ScheduledJob.objects.get().priority == 7


def test_every_kinds_example_payload_passes_its_schema():
    """The example shown for each registered kind is accepted by that kind's schema."""
    from scheduling.core import registry

    checked = 0
    for kind in registry.all_kinds().values():
        if kind.schema is not None and kind.schema.get("type") == "object":
            kind.validate(job_forms.example_payload(kind.schema))
            checked += 1
    assert checked, "no registered kind has an object schema: nothing was checked"


def test_reschedule_counts_selected_jobs_that_came_due(admin_client, run_sql):
    """Jobs that came due after being ticked still count as selected and movable on the reschedule page."""
    job = api.schedule("demo.noop", {}, delay=3600)
    support.make_due(job.id, ago="1 second")
    data = {"action": "reschedule_selected", ACTION_CHECKBOX_NAME: [str(job.id)], "index": "0"}
    page = admin_client.post(f"{CHANGELIST}?overdue=no", data).content.decode()
    assert "1 job selected; 1 of them can still be moved (pending, 1 of which came due meanwhile)" in page
    admin_client.post(
        f"{CHANGELIST}?overdue=no",
        {**data, "apply": "1", "due_at": "2031-05-06T07:08:09", "select_across": "0"},
    )
    assert ScheduledJob.objects.get(pk=job.id).due_at == dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


@pytest.mark.parametrize("entry", bulk_actions.BULK_ACTIONS, ids=lambda entry: entry.name)
def test_every_bulk_action_is_a_list_action_and_a_page_button_that_changes_the_job(admin_client, run_sql, entry):
    """Each BULK_ACTIONS entry: in the list's menu, a button on a job's page in its states only, and it works there."""
    dead = JobState.DEAD in entry.states
    job_id = _dead(run_sql) if dead else api.schedule("demo.noop", {}, delay=3600).id
    if JobState.CLAIMED in entry.states:  # abort: a claim not started yet, cancelled at once
        support.make_due(job_id)
        jobs_store.claim_due_jobs(10)
    other_id = api.schedule("demo.noop", {}, delay=3600).id if dead else _dead(run_sql)
    menu = admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices
    assert entry.action in dict(menu)
    assert f'value="{entry.name}"' in admin_client.get(_page(job_id)).content.decode()
    assert f'value="{entry.name}"' not in admin_client.get(_page(other_id)).content.decode()
    before = ScheduledJob.objects.get(pk=job_id)
    later = (timezone.localtime() + dt.timedelta(hours=2)).replace(microsecond=0)
    if entry.form is None:
        response = admin_client.post(f"{CHANGELIST}{job_id}/act/{entry.name}/", {"confirm": "yes"}, follow=True)
    else:  # the page's button posts the list's action for this job: its form first, then "apply"
        data = {"action": entry.action, ACTION_CHECKBOX_NAME: [str(job_id)], "index": "0"}
        assert admin_client.post(CHANGELIST, data).context["form"].__class__ is entry.form
        applied = {**data, "apply": "1", "due_at": f"{later:%Y-%m-%dT%H:%M:%S}"}
        response = admin_client.post(CHANGELIST, applied, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert messages[0] == entry.done_message(1, {"due_at": common.seconds_text(later)})
    after = ScheduledJob.objects.get(pk=job_id)
    assert (after.state, after.due_at) != (before.state, before.due_at)


def test_the_abort_button_on_a_running_jobs_page_asks_its_worker_and_is_audited(admin_client, admin_user):
    """A running job's page offers Abort; pressing it (confirmed) writes the request naming the admin, once."""
    job = api.schedule("demo.noop", {}, delay=0)
    (claim,) = jobs_store.claim_due_jobs(10)
    jobs_store.start_jobs([(claim.id, claim.token)], "worker-1")
    page = admin_client.get(_page(job.id)).content.decode()
    assert 'value="abort"' in page
    response = admin_client.post(f"{CHANGELIST}{job.id}/act/abort/", {"confirm": "yes"}, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert messages[0] == bulk_actions.BY_NAME["abort"].done_message(1, {})
    request = JobAbort.objects.get(job_id=job.id)
    assert request.requested_by == admin_user.get_username()
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.RUNNING, "its worker cancels it, not the admin"
    assert list(AuditRecord.objects.values_list("action", "door", "changed")) == [("abort", "admin", 1)]
