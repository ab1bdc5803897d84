"""The demo product: trials whose ending reminder is a scheduled job.

Starting a trial schedules ``reminders.trial_ending`` three days before the end, keyed
``trial-ending:<trial id>`` and owned by the user; upgrading cancels it by key; changing the end
reschedules it by key. Keys are per owner, so every look-up names the trial's user: a job another
user created under the same key text is never shown, moved or cancelled here. The trial and its
job change in one transaction, so neither exists without the other. Each page shows the reminder
job's state as Timekeeper sees it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from scheduling import api, exceptions
from scheduling.models import ScheduledJob
from tasks.forms import ChangeEndForm, StartTrialForm
from tasks.models import Trial

logger = logging.getLogger(__name__)

REMINDER_KIND = "reminders.trial_ending"
REMINDER_BEFORE = dt.timedelta(days=3)  # the reminder goes out this long before the trial ends


def reminder_due(ends_at: dt.datetime) -> dt.datetime:
    """When the reminder is due: three days before the end (already due for a shorter trial)."""
    return ends_at - REMINDER_BEFORE


def reminder_jobs(trials: list[Trial]) -> dict[str, ScheduledJob]:
    """The latest reminder job of each trial, by key, among its user's jobs (one query)."""
    wanted = {(t.user_id, t.reminder_key) for t in trials}
    latest: dict[str, ScheduledJob] = {}
    if not wanted:
        return latest
    owners = {owner for owner, _ in wanted}
    jobs = ScheduledJob.objects.filter(key__in=[key for _, key in wanted], owner_id__in=owners, kind=REMINDER_KIND)
    for job in jobs.order_by("id"):
        if (job.owner_id, job.key) in wanted:
            latest[job.key or ""] = job
    return latest


def _schedule_reminder(trial: Trial) -> ScheduledJob:
    return api.schedule(
        REMINDER_KIND,
        {"user_id": trial.user_id, "trial_id": trial.pk},
        due_at=reminder_due(trial.ends_at),
        key=trial.reminder_key,
        on_conflict="replace",
        owner=trial.user_id,
    )


@login_required
@require_GET
def trial_list(request: HttpRequest) -> HttpResponse:
    """The user's trials with their reminders, and the form to start one."""
    trials = list(Trial.objects.filter(user=_user(request)).order_by("-created_at")[:50])
    jobs = reminder_jobs(trials)
    rows = [(t, jobs.get(t.reminder_key)) for t in trials]
    return render(request, "tasks/trial_list.html", {"rows": rows, "form": StartTrialForm()})


@login_required
@require_POST
def trial_start(request: HttpRequest) -> HttpResponse:
    """Create a trial and schedule its reminder, together."""
    form = StartTrialForm(request.POST)
    if not form.is_valid():
        trials = list(Trial.objects.filter(user=_user(request)).order_by("-created_at")[:50])
        jobs = reminder_jobs(trials)
        rows = [(t, jobs.get(t.reminder_key)) for t in trials]
        return render(request, "tasks/trial_list.html", {"rows": rows, "form": form}, status=400)
    with transaction.atomic():
        trial = Trial.objects.create(
            user=_user(request), plan=form.cleaned_data["plan"], ends_at=form.cleaned_data["ends_at"]
        )
        job = _schedule_reminder(trial)
    messages.success(request, f"Trial started. The reminder (job #{job.pk}) is due {_when(job.due_at)}.")
    return redirect("tasks:trial-detail", trial_id=trial.pk)


def reminder_due_floor(refusal: exceptions.DueAtInPast) -> dt.datetime:
    """The earliest trial end whose reminder the API accepts, from its refusal's limit (the earliest due time)."""
    return dt.datetime.fromisoformat(str(refusal.limit)) + REMINDER_BEFORE


def _when(at: dt.datetime) -> str:
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M %Z}"


def _user(request: HttpRequest) -> Any:
    """The logged-in user (every view is behind ``login_required``)."""
    return request.user


def _own_trial(request: HttpRequest, trial_id: int, *, lock: bool = False) -> Trial:
    trials = Trial.objects.select_for_update() if lock else Trial.objects.all()
    return get_object_or_404(trials, pk=trial_id, user=_user(request))


@login_required
@require_GET
def trial_detail(request: HttpRequest, trial_id: int) -> HttpResponse:
    """One trial, its reminder job's state, and the upgrade and change-end forms."""
    trial = _own_trial(request, trial_id)
    job = reminder_jobs([trial]).get(trial.reminder_key)
    context: dict[str, Any] = {
        "trial": trial,
        "job": job,
        "reminder_due": reminder_due(trial.ends_at),
        "change_form": ChangeEndForm(initial={"ends_at": timezone.localtime(trial.ends_at)}),
    }
    return render(request, "tasks/trial_detail.html", context)


@login_required
@require_POST
def trial_upgrade(request: HttpRequest, trial_id: int) -> HttpResponse:
    """Upgrade: the trial is over, and its reminder is cancelled (by key)."""
    with transaction.atomic():
        trial = _own_trial(request, trial_id, lock=True)
        if trial.upgraded_at is not None:
            messages.info(request, "This trial was already upgraded.")
            return redirect("tasks:trial-detail", trial_id=trial.pk)
        trial.upgraded_at = timezone.now()
        trial.save(update_fields=["upgraded_at"])
        try:
            api.cancel(key=trial.reminder_key, owner=trial.user_id)
        except exceptions.JobNotFound:
            messages.success(request, "Upgraded. The reminder had already gone out or been cancelled.")
        except exceptions.JobNotCancellable:
            messages.warning(request, "Upgraded. The reminder is being sent right now; it may still arrive.")
        else:
            messages.success(request, "Upgraded. The reminder is cancelled.")
    return redirect("tasks:trial-detail", trial_id=trial.pk)


@login_required
@require_POST
def trial_change_end(request: HttpRequest, trial_id: int) -> HttpResponse:
    """Move the trial's end; its reminder moves with it (or a new one is scheduled if it already went out)."""
    trial = _own_trial(request, trial_id)
    form = ChangeEndForm(request.POST)
    if form.is_valid():
        try:  # the reminder's due time, refused as the JSON API refuses a past due_at
            api.check_not_past(reminder_due(form.cleaned_data["ends_at"]))
        except exceptions.DueAtInPast as exc:
            form.add_error(
                "ends_at",
                f"The reminder goes out {REMINDER_BEFORE.days} days before the end, which would be in the past: "
                f"choose an end after {_when(reminder_due_floor(exc))}.",
            )
    if not form.is_valid():
        job = reminder_jobs([trial]).get(trial.reminder_key)
        context = {"trial": trial, "job": job, "reminder_due": reminder_due(trial.ends_at), "change_form": form}
        return render(request, "tasks/trial_detail.html", context, status=400)
    with transaction.atomic():
        trial = _own_trial(request, trial_id, lock=True)
        if trial.upgraded_at is not None:
            messages.info(request, "This trial is upgraded: it has no end to change.")
            return redirect("tasks:trial-detail", trial_id=trial.pk)
        trial.ends_at = form.cleaned_data["ends_at"]
        trial.save(update_fields=["ends_at"])
        try:
            due = api.reschedule(key=trial.reminder_key, due_at=reminder_due(trial.ends_at), owner=trial.user_id)
        except exceptions.JobNotFound:
            job = _schedule_reminder(trial)
            messages.success(request, f"The end moved. A new reminder is scheduled for {_when(job.due_at)}.")
        except exceptions.JobNotReschedulable:
            transaction.set_rollback(True)
            messages.error(request, "The reminder is being sent right now; try again in a moment.")
        else:
            messages.success(request, f"The end moved. The reminder is now scheduled for {_when(due)}.")
    return redirect("tasks:trial-detail", trial_id=trial.pk)
