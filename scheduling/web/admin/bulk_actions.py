"""The scheduled jobs' bulk actions, declared once.

Each ``BulkAction`` names a bulk call of ``scheduling.api`` (ids in, a ``BulkResult`` out: one
conditional statement that changes only the jobs in the states it is for) and says how the admin
offers it. From this one table ``ScheduledJobAdmin`` (``jobs.py``) derives the list's actions, the
buttons on a job's page (for the states that allow them) and the view those buttons post to
(``act/<name>/``). Adding a bulk action is one entry here, the api function it calls, and a test;
when no statement fits, its statement in ``due_at/sql/schedule.sql`` too (ids in, changed ids out,
run by ``store.change_jobs``: no store function of its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils.translation import ngettext

from scheduling import api
from scheduling.models import JobState
from scheduling.web.admin import job_forms


@dataclasses.dataclass(frozen=True)
class BulkAction:
    """One bulk action on scheduled jobs: its call, the states it changes, and its words."""

    name: str  # the job page's button value and its URL: <id>/act/<name>/
    action: str  # the list action's name (the changelist's POST "action")
    call: Callable[..., api.BulkResult]  # scheduling.api's bulk call: call(ids, **form data) -> BulkResult
    states: tuple[str, ...]  # the states it changes: a job's page offers the button in these
    label: str  # the button on a job's page
    description: str  # the entry in the list's action menu
    done: tuple[str, str]  # ngettext pair for the changed jobs: %(count)d, and the form's fields by name
    why_not: tuple[str, str]  # ngettext pair for the others: %(count)d, %(states)s (what they were)
    permission: str = "change"  # the model permission it needs (ModelAdmin.has_<permission>_permission)
    form: type[forms.Form] | None = None  # asks for input first, on admin/scheduling/scheduledjob/<name>.html
    due_now: bool = False  # the changed jobs are due now: say which wait behind a paused or capped kind
    confirm: bool = False  # cannot be undone: a job's page, "all N matching" and selections over
    # SCHEDULING_ADMIN_CONFIRM_OVER jobs ask first (admin/scheduling/scheduledjob/confirm.html)

    def done_message(self, count: int, values: dict[str, Any]) -> str:
        return ngettext(*self.done, count) % {"count": count, **values}

    def why_not_message(self, count: int, states: str) -> str:
        return ngettext(*self.why_not, count) % {"count": count, "states": states}


PENDING = (JobState.PENDING,)

BULK_ACTIONS: tuple[BulkAction, ...] = (
    BulkAction(
        name="run_now",
        action="run_now_selected",
        call=api.run_now_many,
        states=PENDING,
        label="Run now",
        description="Run selected pending jobs now",
        done=(
            "%(count)d job is due now; a worker takes it within a second.",
            "%(count)d jobs are due now; workers take them within a second.",
        ),
        why_not=(
            "%(count)d job was not touched: only pending jobs can be run now (it was %(states)s).",
            "%(count)d jobs were not touched: only pending jobs can be run now (they were %(states)s).",
        ),
        due_now=True,
    ),
    BulkAction(
        name="reschedule",
        action="reschedule_selected",
        call=api.reschedule_many,
        states=PENDING,
        label="Reschedule…",
        description="Reschedule selected pending jobs…",
        done=("Rescheduled %(count)d job to %(due_at)s.", "Rescheduled %(count)d jobs to %(due_at)s."),
        why_not=(
            "%(count)d job was not touched: only pending jobs can be rescheduled (it was %(states)s).",
            "%(count)d jobs were not touched: only pending jobs can be rescheduled (they were %(states)s).",
        ),
        form=job_forms.RescheduleForm,
    ),
    BulkAction(
        name="cancel",
        action="cancel_selected",
        call=api.cancel_many,
        states=PENDING,
        label="Cancel job",
        description="Cancel selected pending jobs",
        done=("Cancelled %(count)d job.", "Cancelled %(count)d jobs."),
        why_not=(
            "%(count)d job was not touched: only pending jobs can be cancelled (it was %(states)s).",
            "%(count)d jobs were not touched: only pending jobs can be cancelled (they were %(states)s).",
        ),
        confirm=True,
    ),
    BulkAction(
        name="abort",
        action="abort_selected",
        call=api.abort_many,
        states=(JobState.CLAIMED, JobState.RUNNING),
        label="Abort job",
        description="Abort selected running jobs",
        done=(
            "Aborted %(count)d job: if running, its worker interrupts it within a heartbeat and cancels it "
            "(atomic writes rolled back); if not started, it is cancelled now.",
            "Aborted %(count)d jobs: running ones are interrupted by their workers within a heartbeat and "
            "cancelled (atomic writes rolled back); those not started are cancelled now.",
        ),
        why_not=(
            "%(count)d job was not touched: only claimed or running jobs can be aborted (it was %(states)s).",
            "%(count)d jobs were not touched: only claimed or running jobs can be aborted (they were %(states)s).",
        ),
        confirm=True,
    ),
    BulkAction(
        name="retry",
        action="retry_dead_selected",
        call=api.retry_dead_many,
        states=(JobState.DEAD,),
        label="Retry",
        description="Retry selected dead jobs",
        done=(
            "%(count)d dead job is pending again, due now, with a fresh attempts budget.",
            "%(count)d dead jobs are pending again, due now, with a fresh attempts budget.",
        ),
        why_not=(
            "%(count)d job was not touched: only dead jobs whose key is free can be retried (%(states)s).",
            "%(count)d jobs were not touched: only dead jobs whose key is free can be retried (%(states)s).",
        ),
    ),
)

BY_NAME = {entry.name: entry for entry in BULK_ACTIONS}


def list_action(entry: BulkAction) -> Callable[[Any, HttpRequest, Any], HttpResponse | None]:
    """The list's action for ``entry``, run by ``ScheduledJobAdmin.run_bulk_action`` on the selection."""

    def run(model_admin: Any, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return model_admin.run_bulk_action(entry, request, model_admin.selection(entry, request, queryset))

    run.__name__ = entry.action
    return admin.action(description=entry.description, permissions=[entry.permission])(run)
