"""Timekeeper in the Django admin: scheduled jobs, fixed-time schedules, their runs, API tokens.

The admin holds no scheduling logic: it goes through the same door as application code. Adding a
job calls ``api.schedule``; changing its due time calls ``api.reschedule``; the bulk actions call
``api.cancel_many``, ``run_now_many``, ``retry_dead_many`` and ``reschedule_many`` (one UPDATE
each), which change only the rows in the state the action is for (pending, or dead for a retry)
and report the rest, with their states, as not touched. Rows are never saved with
``Model.save()`` here, so an edit cannot overwrite a claim. Fixed-time schedules are
django-celery-beat's periodic tasks with the policy inline; "run now" goes through the same gate
as beat's ticks (``gate.run_now``).

The dashboard shows on the admin index with no template in the host project: the default site's
``index_template`` (unless the project set its own) extends ``admin/index.html``, so a project
override of that template still applies underneath.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Case, FloatField, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Extract, Now
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext
from django_celery_beat import admin as beat_admin
from django_celery_beat.models import PeriodicTask

from scheduling import api
from scheduling.core import conf, exceptions, registry, store, tasknames, validation
from scheduling.models import (
    ApiToken,
    JobAttempt,
    JobState,
    KindControl,
    RunState,
    ScheduledJob,
    SchedulePolicy,
    SchedulerHeartbeat,
    ScheduleRun,
)
from scheduling.templatetags.timekeeper_admin import relative
from scheduling.web import admin_forms as admin_forms
from scheduling.web import auth

DASHBOARD_INDEX_TEMPLATE = "scheduling/admin/index.html"  # extends the project's admin/index.html, adds the dashboard
RECENT_RUNS_SHOWN = 10  # runs listed on a schedule's page (the full history is linked)
NEXT_RUNS_SHOWN = 5
SELECTION_SHOWN = 20  # jobs listed on the reschedule page


# --- Scheduled jobs -----------------------------------------------------------------------------------


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    fields = ("number", "outcome", "due", "started", "finished", "lag", "worker", "error_and_traceback")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("number",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="due at")
    def due(self, attempt: JobAttempt) -> str:
        return seconds_text(attempt.due_at)

    @admin.display(description="started")
    def started(self, attempt: JobAttempt) -> str:
        return seconds_text(attempt.started_at)

    @admin.display(description="finished")
    def finished(self, attempt: JobAttempt) -> str:
        return seconds_text(attempt.finished_at)

    @admin.display(description="due-to-start lag")
    def lag(self, attempt: JobAttempt) -> str:
        if attempt.started_at is None:
            return "—"
        return f"{max((attempt.started_at - attempt.due_at).total_seconds(), 0):.3f} s"

    @admin.display(description="error")
    def error_and_traceback(self, attempt: JobAttempt) -> str:
        """The error line, and the failure's traceback folded beneath it (frames and messages only)."""
        if not attempt.traceback:
            return attempt.error or "—"
        return format_html(
            '{}<details class="tk-traceback"><summary>traceback</summary><pre>{}</pre></details>',
            attempt.error,
            attempt.traceback,
        )


def seconds_text(value: Any) -> str:
    """A time in the current zone to the second: 2031-06-07 08:09:10 UTC."""
    if value is None:
        return "—"
    return f"{timezone.localtime(value):%Y-%m-%d %H:%M:%S %Z}"


def _to_the_second(field: str, description: str) -> Callable[[Any, Any], str]:
    """An admin display method showing the time ``field`` of a row with seconds (``seconds_text``)."""

    @admin.display(description=description)
    def show(model_admin: Any, obj: Any) -> str:
        return seconds_text(getattr(obj, field))

    return show


class CheckedSelectionMixin:
    """Actions answer 400 when ``_selected_action`` holds something that is not a row id (not a 500 in the ORM)."""

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if any(not (value.isascii() and value.isdecimal() and len(value) <= 19) for value in selected):
            return HttpResponseBadRequest("The selection holds something that is not a row id.")
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in due_at_kinds()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> QuerySet[ScheduledJob]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


def due_at_kinds() -> list[str]:
    """The registered kinds that can be rows of the jobs table: every kind but those only fixed-time schedules run."""
    fixed_only = set(SchedulePolicy.objects.values_list("kind", flat=True).distinct())
    with_rows = set(ScheduledJob.objects.filter(kind__in=fixed_only).values_list("kind", flat=True).distinct())
    return sorted(name for name in registry.all_kinds() if name not in fixed_only or name in with_rows)


class OverdueFilter(admin.SimpleListFilter):
    title = "overdue"
    parameter_name = "overdue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "overdue (pending, due time passed)"), ("no", "not overdue")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> QuerySet[ScheduledJob]:
        overdue = Q(state=JobState.PENDING, due_at__lte=Now())
        if self.value() == "yes":
            return queryset.filter(overdue)
        if self.value() == "no":
            return queryset.exclude(overdue)
        return queryset


class ChangeJobForm(forms.ModelForm):
    """A job's change page edits only the due time of a pending job (``api.reschedule``)."""

    class Meta:
        model = ScheduledJob
        fields = ["due_at"]

    def clean_due_at(self) -> Any:
        value = self.cleaned_data["due_at"]
        admin_forms.check_year(value)
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "due_at" in self.changed_data and data.get("due_at") is not None:
            # Lock the row until the admin's transaction ends: the claim skips locked rows, so the
            # state seen here is still the state when api.reschedule runs.
            state = (
                ScheduledJob.objects.select_for_update()
                .filter(pk=self.instance.pk)
                .values_list("state", flat=True)
                .first()
            )
            if state != JobState.PENDING:
                self.add_error("due_at", str(exceptions.JobNotReschedulable(self.instance.pk, state or "gone")))
        return data


class ReplaceNotAllowed(Exception):
    """Raised inside the add form's transaction when ``replace`` met a live job the person may not change."""

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"The key already has a pending job ({job_id}); replacing it needs the permission to change scheduled "
            "jobs (scheduling.change_scheduledjob). Nothing was changed: use on_conflict=error or keep, or another key."
        )


@admin.register(ScheduledJob)
class ScheduledJobAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    list_display = ("id", "kind", "key", "owner", "due", "state_badge", "priority", "attempts_of")
    list_display_links = ("id", "kind")
    list_filter = ("state", KindFilter, OverdueFilter)
    search_fields = ("key",)
    search_help_text = "A job id, or (part of) a key."
    date_hierarchy = "due_at"
    list_select_related = ("owner",)
    list_per_page = 100
    show_full_result_count = False  # one count per page view is enough on a large table
    inlines = (JobAttemptInline,)
    change_form_template = "admin/scheduling/scheduledjob/change_form.html"
    form = ChangeJobForm
    actions = ("cancel_selected", "run_now_selected", "retry_dead_selected", "reschedule_selected")
    fieldsets = (
        (None, {"fields": ("kind", "key", "state", "priority", "due_at", "due_relative", "owner")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Attempts", {"fields": ("attempts", "max_attempts", "lease_seconds", "last_error")}),
        ("Current claim", {"fields": ("claimed_time", "heartbeat_time", "claimed_by"), "classes": ("collapse",)}),
        ("History", {"fields": ("created_time", "updated_time", "finished_time")}),
    )

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return ("attention", "attention_due", "id")  # what needs a person first; see get_queryset

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduledJob]:
        """Rows ranked by what needs attention: dead, stuck claims, overdue pending, running, pending, finished.

        Within a rank: by due time, except finished jobs, the most recent first.
        """
        stuck_before = Now() - dt.timedelta(seconds=conf.get().stuck_after_seconds)
        due_epoch = Extract("due_at", "epoch")
        return (
            self.model._default_manager.get_queryset()
            .annotate(
                attention=Case(
                    When(state=JobState.DEAD, then=Value(0)),
                    When(state=JobState.CLAIMED, claimed_at__lt=stuck_before, then=Value(1)),
                    When(state=JobState.PENDING, due_at__lte=Now(), then=Value(2)),
                    When(state=JobState.CLAIMED, then=Value(3)),
                    When(state=JobState.PENDING, then=Value(4)),
                    default=Value(5),
                    output_field=IntegerField(),
                ),
                attention_due=Case(
                    When(state__in=[JobState.DONE, JobState.CANCELLED], then=-due_epoch),
                    default=due_epoch,
                    output_field=FloatField(),
                ),
            )
            .order_by(*self.get_ordering(request))
        )

    # -- list columns

    @admin.display(description="due", ordering="due_at")
    def due(self, job: ScheduledJob) -> str:
        local = timezone.localtime(job.due_at)
        return format_html('{}<br><span class="quiet">{}</span>', f"{local:%Y-%m-%d %H:%M:%S %Z}", relative(job.due_at))

    @admin.display(description="state", ordering="attention")
    def state_badge(self, job: ScheduledJob) -> str:
        overdue = job.state == JobState.PENDING and job.due_at <= timezone.now()
        stuck = getattr(job, "attention", None) == 1
        return format_html(
            '<span class="tk-state tk-state-{}{}" data-state="{}">{}{}</span>',
            job.state,
            " tk-state-late" if overdue or stuck else "",
            job.state,
            job.state,
            " (overdue)" if overdue else " (stuck)" if stuck else "",
        )

    @admin.display(description="attempts", ordering="attempts")
    def attempts_of(self, job: ScheduledJob) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="due")
    def due_relative(self, job: ScheduledJob) -> str:
        return f"{timezone.localtime(job.due_at):%Y-%m-%d %H:%M:%S %Z} ({relative(job.due_at)})"

    # Read-only times to the second (Django's own display stops at the minute).
    claimed_time = _to_the_second("claimed_at", "claimed at")
    heartbeat_time = _to_the_second("heartbeat_at", "heartbeat at")
    created_time = _to_the_second("created_at", "created at")
    updated_time = _to_the_second("updated_at", "updated at")
    finished_time = _to_the_second("finished_at", "finished at")

    @admin.display(description="payload")
    def payload_pretty(self, job: ScheduledJob) -> str:
        return format_html("<pre>{}</pre>", admin_forms.pretty_json(job.payload))

    # -- permissions and fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # jobs end by cancel; finished history is pruned by the sweeper

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        """The job's page: Save only while the due time can change (pending); buttons for what the state allows."""
        job = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if job is not None:
            editable = job.state == JobState.PENDING
            context.update(
                show_save=editable,
                show_save_and_continue=editable,
                show_save_and_add_another=False,
                job_actions=self._job_actions(job) if self.has_change_permission(request, job) else [],
            )
        return super().change_view(request, object_id, form_url, context)

    @staticmethod
    def _job_actions(job: ScheduledJob) -> list[dict[str, str]]:
        """The buttons a job's page offers: (name, label, where it posts)."""
        if job.state == JobState.DEAD:
            names = ["retry"]
        elif job.state == JobState.PENDING:
            names = ["run_now", "reschedule", "cancel"]
        else:
            names = []
        labels = {"retry": "Retry", "run_now": "Run now", "reschedule": "Reschedule…", "cancel": "Cancel job"}
        out = []
        for name in names:
            if name == "reschedule":
                url = reverse("admin:scheduling_scheduledjob_changelist")
            else:
                url = reverse("admin:scheduling_scheduledjob_act", args=[job.pk, name])
            out.append({"name": name, "label": labels[name], "url": url})
        return out

    def get_urls(self) -> list[Any]:
        act = path(
            "<int:object_id>/act/<str:action>/",
            self.admin_site.admin_view(self.act_view),
            name="scheduling_scheduledjob_act",
        )
        fragment = path(
            "dashboard/", self.admin_site.admin_view(self.dashboard_view), name="scheduling_dashboard_fragment"
        )
        return [act, fragment, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's body alone (``?range=``), fetched by the open admin index every few seconds."""
        from scheduling.web import dashboard

        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {"show": True, **dashboard.gather(request.GET.get("range"))}
        response = TemplateResponse(request, "scheduling/dashboard_body.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def act_view(self, request: HttpRequest, object_id: int, action: str) -> HttpResponse:
        """POST from a job's page: retry, cancel or run it now through the same bulk calls as the list's actions."""
        handlers = {
            "retry": self.retry_dead_selected,
            "cancel": self.cancel_selected,
            "run_now": self.run_now_selected,
        }
        job = self.get_object(request, str(object_id))
        if request.method != "POST" or action not in handlers:
            return HttpResponseBadRequest("Post one of: retry, cancel, run_now.")
        if job is None:
            return HttpResponseRedirect(reverse("admin:scheduling_scheduledjob_changelist"))
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        handlers[action](request, ScheduledJob.objects.filter(pk=job.pk))
        return HttpResponseRedirect(reverse("admin:scheduling_scheduledjob_change", args=[job.pk]))

    def get_fieldsets(self, request: HttpRequest, obj: ScheduledJob | None = None) -> Any:
        """A job that cannot be moved shows its due time once, to the second ("due"), not the editable field too."""
        if obj is not None and obj.state == JobState.PENDING:
            return self.fieldsets
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f != "due_at")})
            for name, options in self.fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: ScheduledJob | None = None) -> list[str]:
        shown = [str(f) for _name, options in self.fieldsets for f in options["fields"]]
        if obj is not None and obj.state == JobState.PENDING:
            return [f for f in shown if f != "due_at"]
        return shown

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ScheduledJob], search_term: str
    ) -> tuple[QuerySet[ScheduledJob], bool]:
        term = search_term.strip()
        if term.isdigit() and len(term) <= 19:
            return queryset.filter(Q(pk=int(term)) | Q(key__icontains=term)), False
        return super().get_search_results(request, queryset, search_term)

    # -- add and change go through scheduling.api

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> Any:
        """Schedule a job with ``api.schedule``; its errors become form errors and nothing is stored."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = admin_forms.NewJobForm(request.POST or None, user=request.user, admin_site=self.admin_site)
        if request.method == "POST" and form.is_valid():
            # Non-superusers schedule as themselves, under the JSON API's create rate and pending quota.
            owner = request.user if form.schedules_as_self else None
            try:
                validation.take_create_allowance(owner)
                with transaction.atomic():
                    validation.lock_creations(owner)
                    job, outcome = api.schedule_with_outcome(
                        form.cleaned_data["kind"], form.cleaned_data["payload"], **form.schedule_arguments()
                    )
                    if outcome == "replaced" and not self.has_change_permission(request, job):
                        raise ReplaceNotAllowed(job.pk)  # rolls the replace back: the job is as it was
                    if outcome == "created":
                        validation.check_quota(owner, job.pk)  # raising here rolls the new job back
            except ReplaceNotAllowed as exc:
                form.add_error("on_conflict", str(exc))
            except exceptions.SchedulingError as exc:
                form.add_scheduling_error(exc)
            else:
                stored = ScheduledJob.objects.get(pk=job.pk)
                self.log_addition(request, stored, [{"added": {}}])
                return self.response_add(request, stored)
        fieldsets = [
            (None, {"fields": ["kind", "payload", *(["owner"] if "owner" in form.fields else [])]}),
            ("When", {"fields": ["due_at", "delay_seconds"]}),
            ("Key, priority and retries", {"fields": ["key", "on_conflict", "priority", "max_attempts"]}),
        ]
        # django-stubs type these as ModelForm only; the admin's helpers work with any form.
        admin_form = helpers.AdminForm(form, fieldsets, {}, model_admin=self)  # type: ignore[arg-type]
        context = {
            **self.admin_site.each_context(request),
            "title": "Schedule a job",
            "subtitle": None,
            "adminform": admin_form,
            "object_id": None,
            "original": None,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []),  # type: ignore[arg-type]
            "preserved_filters": self.get_preserved_filters(request),
            "kind_help": admin_forms.kind_help(self._offered_kinds(request)),
            **(extra_context or {}),
        }
        return self.render_change_form(request, context, add=True, form_url=form_url)

    @staticmethod
    def _offered_kinds(request: HttpRequest) -> list[tuple[str, str]]:
        return admin_forms.kind_choices(None if getattr(request.user, "is_superuser", False) else request.user)

    def save_model(self, request: HttpRequest, obj: ScheduledJob, form: Any, change: bool) -> None:
        """Only the due time of a pending job changes, through ``api.reschedule`` (the form locked the row)."""
        if change and "due_at" in form.changed_data:
            obj.due_at = api.reschedule(obj.pk, due_at=form.cleaned_data["due_at"])

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        return None  # attempts are read-only

    def construct_change_message(self, request: HttpRequest, form: Any, formsets: Any, add: bool = False) -> Any:
        return [{"changed": {"fields": ["due at"]}}] if "due_at" in form.changed_data else []

    # -- bulk actions: the jobs API's bulk calls (one UPDATE each), counts of changed and not touched

    @staticmethod
    def _selection(queryset: QuerySet[ScheduledJob]) -> list[int]:
        return list(queryset.values_list("id", flat=True))

    def _report(self, request: HttpRequest, result: api.BulkResult, done: str, why_not: str) -> None:
        """``done``/``why_not`` are ngettext pairs keyed by count; ``states`` names what kept the others out."""
        if result.changed:
            self.message_user(request, done % {"count": len(result.changed)}, messages.SUCCESS)
        others = Counter[str](result.untouched.values())
        if result.missing:
            others["gone"] += len(result.missing)
        if others:
            states = ", ".join(f"{n} {state}" for state, n in sorted(others.items()))
            self.message_user(request, why_not % {"count": sum(others.values()), "states": states}, messages.WARNING)

    @admin.action(description="Cancel selected pending jobs", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        result = api.cancel_many(self._selection(queryset))
        n, m = len(result.changed), result.selected - len(result.changed)
        self._report(
            request,
            result,
            ngettext("Cancelled %(count)d job.", "Cancelled %(count)d jobs.", n),
            ngettext(
                "%(count)d job was not touched: only pending jobs can be cancelled (it was %(states)s).",
                "%(count)d jobs were not touched: only pending jobs can be cancelled (they were %(states)s).",
                m,
            ),
        )

    @admin.action(description="Run selected pending jobs now", permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        result = api.run_now_many(self._selection(queryset))
        n, m = len(result.changed), result.selected - len(result.changed)
        self._report(
            request,
            result,
            ngettext(
                "%(count)d job is due now; a worker takes it within a second.",
                "%(count)d jobs are due now; workers take them within a second.",
                n,
            ),
            ngettext(
                "%(count)d job was not touched: only pending jobs can be run now (it was %(states)s).",
                "%(count)d jobs were not touched: only pending jobs can be run now (they were %(states)s).",
                m,
            ),
        )
        self._warn_held_back(request, result.changed)

    def _warn_held_back(self, request: HttpRequest, job_ids: Sequence[int]) -> None:
        """Jobs made due whose kind is paused, or capped and full, wait: say so beside "within a second"."""
        held = {
            c.kind: c
            for c in api.kind_controls()
            if c.paused or (c.max_running is not None and c.claimed >= c.max_running)
        }
        if not held or not job_ids:
            return
        made_due = ScheduledJob.objects.filter(pk__in=job_ids, kind__in=list(held))
        waiting = Counter(made_due.values_list("kind", flat=True))
        for kind, count in sorted(waiting.items()):
            control = held[kind]
            waits = f"{count} of these jobs wait{'s' if count == 1 else ''}"
            if control.paused:
                text = f"Kind {kind} is paused: {waits} until it is resumed."
            else:
                text = f"Kind {kind} runs at most {control.max_running} at a time: {waits} for a free place."
            self.message_user(request, text, messages.WARNING)

    @admin.action(description="Retry selected dead jobs", permissions=["change"])
    def retry_dead_selected(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        result = api.retry_dead_many(self._selection(queryset))
        n, m = len(result.changed), result.selected - len(result.changed)
        self._report(
            request,
            result,
            ngettext(
                "%(count)d dead job is pending again, due now, with a fresh attempts budget.",
                "%(count)d dead jobs are pending again, due now, with a fresh attempts budget.",
                n,
            ),
            ngettext(
                "%(count)d job was not touched: only dead jobs whose key is free can be retried (%(states)s).",
                "%(count)d jobs were not touched: only dead jobs whose key is free can be retried (%(states)s).",
                m,
            ),
        )

    @admin.action(description="Reschedule selected pending jobs…", permissions=["change"])
    def reschedule_selected(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> HttpResponse | None:
        form = admin_forms.RescheduleForm(request.POST if "apply" in request.POST else None)
        selection = self._posted_selection(request, queryset)
        if "apply" in request.POST and form.is_valid():
            due_at = form.cleaned_data["due_at"]
            result = api.reschedule_many(selection, due_at=due_at)
            n, m = len(result.changed), result.selected - len(result.changed)
            when = f"{timezone.localtime(due_at):%Y-%m-%d %H:%M:%S %Z}"
            self._report(
                request,
                result,
                ngettext(
                    "Rescheduled %(count)d job to %(when)s.", "Rescheduled %(count)d jobs to %(when)s.", n
                ).replace("%(when)s", when),
                ngettext(
                    "%(count)d job was not touched: only pending jobs can be rescheduled (it was %(states)s).",
                    "%(count)d jobs were not touched: only pending jobs can be rescheduled (they were %(states)s).",
                    m,
                ),
            )
            return None
        selected = ScheduledJob.objects.filter(pk__in=selection)
        total = len(selection)
        movable = selected.filter(state=JobState.PENDING)
        context = {
            **self.admin_site.each_context(request),
            "title": "Reschedule jobs",
            "opts": self.model._meta,
            "form": form,
            "media": self.media + form.media,
            "jobs": list(selected.select_related("owner").order_by("due_at", "id")[:SELECTION_SHOWN]),
            "total": total,
            "more": max(total - SELECTION_SHOWN, 0),
            "pending": movable.count(),
            "came_due": movable.filter(due_at__lte=Now()).count(),
            "selected_ids": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": "reschedule_selected",
        }
        return TemplateResponse(request, "admin/scheduling/scheduledjob/reschedule.html", context)

    @staticmethod
    def _posted_selection(request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> list[int]:
        """The ids the person ticked (not narrowed by the list's filters, which may drop jobs that came due meanwhile).

        "Select all" means the list's rows, as Django's actions do.
        """
        if request.POST.get("select_across", "0") == "1":
            return list(queryset.values_list("id", flat=True))
        return sorted({int(value) for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)})

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


# --- Kinds: pause, resume, cap ------------------------------------------------------------------------


class KindCapForm(forms.Form):
    """The cap of one kind: a whole number, or empty for no cap."""

    max_running = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, label="max running", help_text="Empty: no cap."
    )


@admin.register(KindControl)
class KindControlAdmin(admin.ModelAdmin):
    """One page listing every registered kind with its controls and counts; changes go through ``scheduling.api``.

    Pausing keeps a kind's due jobs pending (counted as paused, not backlog); a cap bounds how many of
    its jobs are claimed or running at once, cluster-wide. Rows are never edited with ``save()`` here.
    """

    change_list_template = "admin/scheduling/kindcontrol/kinds.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        act = path(
            "<str:kind>/<str:action>/",
            self.admin_site.admin_view(self.act_view),
            name="scheduling_kindcontrol_act",
        )
        return [act, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Kinds: pause, resume, cap",
            "opts": self.model._meta,
            "kinds": api.kind_overview(),
            "can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def act_view(self, request: HttpRequest, kind: str, action: str) -> HttpResponse:
        """POST: pause, resume or cap ``kind`` through ``scheduling.api``; the message says what changed."""
        if request.method != "POST" or action not in {"pause", "resume", "cap"}:
            return HttpResponseBadRequest("Post pause, resume or cap.")
        if not self.has_change_permission(request):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse("admin:scheduling_kindcontrol_changelist"))
        try:
            if action == "pause":
                api.pause(kind)
                self.message_user(request, f"Paused {kind}: its due jobs stay pending until it is resumed.")
            elif action == "resume":
                api.resume(kind)
                self.message_user(request, f"Resumed {kind}: its due jobs are claimed again.")
            else:
                form = KindCapForm(request.POST)
                if not form.is_valid():
                    errors = "; ".join(str(e) for e in form.errors.get("max_running", ["not a whole number"]))
                    self.message_user(request, f"{kind} was not changed: the cap {errors}", messages.ERROR)
                    return back
                cap = form.cleaned_data["max_running"]
                api.set_max_running(kind, cap)
                self.message_user(
                    request,
                    f"{kind}: at most {cap} running at once." if cap is not None else f"{kind}: no cap.",
                )
        except exceptions.SchedulingError as exc:
            self.message_user(request, f"{kind} was not changed: {exc}", messages.ERROR)
        return back


# --- Fixed-time schedules: django-celery-beat's periodic tasks with Timekeeper's policy -------------------


class SchedulePolicyInline(admin.StackedInline):
    model = SchedulePolicy
    form = admin_forms.SchedulePolicyForm
    formset = admin_forms.PolicyFormSet
    extra = 1
    max_num = 1
    can_delete = False
    verbose_name = "fixed-time policy"
    verbose_name_plural = "fixed-time policy (runs through Timekeeper's exactly-once gate)"
    readonly_fields = ("anchor_at", "last_tick")
    fieldsets = admin_forms.policy_fieldsets(readonly=readonly_fields)  # the policy spec's groups

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        """The policy form offers the kinds the person may use (every kind to a superuser)."""
        formset = super().get_formset(request, obj, **kwargs)
        return type(formset.__name__, (formset,), {"user": request.user})


admin.site.unregister(PeriodicTask)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(CheckedSelectionMixin, beat_admin.PeriodicTaskAdmin):
    """django-celery-beat's admin plus the policy, a readable timing, the next runs, history and "run now"."""

    inlines = (SchedulePolicyInline,)
    list_display = ("name", "enabled", "timing", "next_run", "last_run_state", "last_run_at")
    actions = ("enable_tasks", "disable_tasks", "toggle_tasks", "run_now_selected")
    change_form_template = "admin/scheduling/periodictask/change_form.html"
    fieldsets = (
        *beat_admin.PeriodicTaskAdmin.fieldsets[:2],
        ("Timekeeper", {"fields": ("timing", "next_runs", "recent_runs")}),
        *beat_admin.PeriodicTaskAdmin.fieldsets[2:],
    )
    readonly_fields = (*beat_admin.PeriodicTaskAdmin.readonly_fields, "timing", "next_runs", "recent_runs")

    # With a policy, its expression (or interval) is the schedule's one timing: these are written from it.
    BEAT_TIMING_FIELDS = frozenset({"interval", "crontab", "crontab_translation", "solar", "clocked"})

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """Everyone but a superuser may save only ``scheduling.run_fixed`` naming itself (``admin_forms``)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        if getattr(request.user, "is_superuser", False):
            return form
        return admin_forms.restrict_periodic_task_form(form, request.user)

    def get_fieldsets(self, request: HttpRequest, obj: PeriodicTask | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not self._policy_exists(obj):
            return fieldsets
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f not in self.BEAT_TIMING_FIELDS)})
            for name, options in fieldsets
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[PeriodicTask]:
        last_state = ScheduleRun.objects.filter(schedule__periodic_task=OuterRef("pk")).order_by("-tick")
        return (
            super()
            .get_queryset(request)
            .select_related("policy")
            .annotate(last_run_state=Subquery(last_state.values("state")[:1]))
        )

    @staticmethod
    def _policy(task: PeriodicTask) -> SchedulePolicy | None:
        try:
            return task.policy  # type: ignore[attr-defined]
        except SchedulePolicy.DoesNotExist:
            return None

    @admin.display(description="timing")
    def timing(self, task: PeriodicTask) -> str:
        from scheduling.fixed import policies

        if task.pk is None:
            return "—"
        return policies.describe(task)

    @admin.display(description="next run")
    def next_run(self, task: PeriodicTask) -> str:
        runs = self._preview(task, 1)
        if isinstance(runs, str):
            return runs
        return f"{runs[0]:%Y-%m-%d %H:%M %Z}" if runs else "—"

    @admin.display(description="last run", ordering="last_run_state")
    def last_run_state(self, task: PeriodicTask) -> str:
        state = getattr(task, "last_run_state", None)
        return RunState(state).label if state else "—"

    def _preview(self, task: PeriodicTask, n: int) -> list[Any] | str:
        from scheduling.fixed import policies

        if task.pk is None or not task.enabled:
            return "disabled" if task.pk is not None else "—"
        policy = self._policy(task)
        if policy is not None and policy.suspend:
            return "suspended"
        try:
            return policies.preview(task, n=n)
        except exceptions.SchedulingError as exc:
            return f"invalid: {exc}"

    @admin.display(description=f"next {NEXT_RUNS_SHOWN} runs (in the schedule's zone)")
    def next_runs(self, task: PeriodicTask) -> str:
        runs = self._preview(task, NEXT_RUNS_SHOWN)
        if isinstance(runs, str):
            return runs
        if not runs:
            return "none"
        return format_html(
            '<ol class="tk-next-runs">{}</ol>',
            format_html_join(
                "",
                '<li>{} <span class="quiet">({})</span></li>',
                ((f"{tick:%a %Y-%m-%d %H:%M:%S %Z}", relative(tick)) for tick in runs),
            ),
        )

    @admin.display(description="recent runs")
    def recent_runs(self, task: PeriodicTask) -> str:
        policy = self._policy(task) if task.pk is not None else None
        if policy is None:
            return "not a fixed-time schedule (no policy)"
        runs = list(ScheduleRun.objects.filter(schedule=policy).order_by("-tick")[:RECENT_RUNS_SHOWN])
        link = reverse("admin:scheduling_schedulerun_changelist") + f"?schedule__id__exact={policy.pk}"
        if not runs:
            return format_html('no runs yet · <a href="{}">history</a>', link)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    f"{timezone.localtime(r.tick):%Y-%m-%d %H:%M:%S %Z}",
                    r.get_state_display(),
                    r.get_trigger_display(),
                    f"{(r.finished_at - r.started_at).total_seconds():.2f} s" if r.finished_at else "running",
                    (r.error[:120] if r.error else ""),
                )
                for r in runs
            ),
        )
        return format_html(
            '<table class="tk-runs"><thead><tr><th>tick</th><th>state</th><th>trigger</th><th>took</th>'
            '<th>error</th></tr></thead><tbody>{}</tbody></table><a href="{}">full history</a>',
            rows,
            link,
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """A periodic task with a policy runs through the gate: task ``scheduling.run_fixed`` naming itself."""

        super().save_related(request, form, formsets, change)
        task = form.instance
        policy_form = next(
            (f for fs in formsets for f in fs.forms if isinstance(f, admin_forms.SchedulePolicyForm) and f.instance.pk),
            None,
        )
        if policy_form is not None:
            from scheduling.fixed import declarations

            data = policy_form.cleaned_data
            zone = data.get("timezone") or "UTC"
            declarations.apply_policy(task, policy_form.instance, zone, data.get("every_seconds"))
        if self._policy_exists(task):
            wanted = json.dumps({"schedule": task.name})
            if task.task != tasknames.RUN_FIXED or task.kwargs != wanted:
                task.task = tasknames.RUN_FIXED
                task.kwargs = wanted
                task.save(update_fields=["task", "kwargs"])

    # -- one pause switch: "Enabled"; a policy's suspend follows it (the list's actions too)

    @admin.action(description="Enable selected tasks")
    def enable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        super().enable_tasks(request, queryset)
        self._suspend_follows_enabled(ids)

    @admin.action(description="Disable selected tasks")
    def disable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        super().disable_tasks(request, queryset)
        self._suspend_follows_enabled(ids)

    @admin.action(description="Toggle activity of selected tasks")
    def toggle_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        super().toggle_tasks(request, queryset)
        self._suspend_follows_enabled(ids)

    @staticmethod
    def _suspend_follows_enabled(task_ids: list[int]) -> None:
        policies = SchedulePolicy.objects.filter(periodic_task__in=task_ids)
        policies.filter(periodic_task__enabled=True, suspend=True).update(suspend=False)
        policies.filter(periodic_task__enabled=False, suspend=False).update(suspend=True)

    @staticmethod
    def _policy_exists(task: PeriodicTask) -> bool:
        return SchedulePolicy.objects.filter(periodic_task=task).exists()

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        run_now = path(
            "<path:object_id>/run-now/",
            self.admin_site.admin_view(self.run_now_view),
            name="django_celery_beat_periodictask_run_now",
        )
        return [run_now, *urls]

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: send one manual run of this schedule through the gate."""
        task = self.get_object(request, object_id)
        if task is None or request.method != "POST" or not self.has_change_permission(request, task):
            raise PermissionDenied
        self._run_now(request, PeriodicTask.objects.filter(pk=task.pk))
        return HttpResponseRedirect(reverse("admin:django_celery_beat_periodictask_change", args=[task.pk]))

    @admin.action(description="Run selected schedules now (through the exactly-once gate)", permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        self._run_now(request, queryset)

    def _run_now(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        from scheduling.fixed import gate

        sent, skipped = [], []
        for task in queryset.select_related("policy"):
            if self._policy(task) is None:
                skipped.append(task.name)
                continue
            try:
                gate.run_now(task)
            except exceptions.SchedulingError as exc:
                self.message_user(request, f"{task.name}: {exc}", messages.ERROR)
            else:
                sent.append(task.name)
        if sent:
            self.message_user(
                request,
                ngettext(
                    "Sent a manual run of %(names)s; it appears in the run history when a worker takes it.",
                    "Sent manual runs of %(count)d schedules (%(names)s); they appear in their run histories.",
                    len(sent),
                )
                % {"count": len(sent), "names": ", ".join(sent)},
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d periodic task was not run: %(names)s has no fixed-time policy.",
                    "%(count)d periodic tasks were not run: %(names)s have no fixed-time policy.",
                    len(skipped),
                )
                % {"count": len(skipped), "names": ", ".join(skipped)},
                messages.WARNING,
            )


@admin.register(ScheduleRun)
class ScheduleRunAdmin(admin.ModelAdmin):
    list_display = ("schedule_name", "tick", "state", "trigger", "attempt", "duration", "duplicates_refused", "worker")
    list_filter = ("state", "trigger", "schedule")
    list_select_related = ("schedule__periodic_task",)
    date_hierarchy = "tick"
    ordering = ("-tick",)
    search_fields = ("schedule__periodic_task__name", "task_id")

    @admin.display(description="schedule", ordering="schedule__periodic_task__name")
    def schedule_name(self, run: ScheduleRun) -> str:
        return run.schedule.periodic_task.name

    @admin.display(description="took")
    def duration(self, run: ScheduleRun) -> str:
        if run.finished_at is None:
            return "running"
        return f"{(run.finished_at - run.started_at).total_seconds():.2f} s"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the history is the ledger; the gate prunes it to the policy's limits


@admin.register(SchedulerHeartbeat)
class SchedulerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("role", "holder", "acquired_at", "heartbeat_at", "age")

    @admin.display(description="age (database clock)")
    def age(self, row: SchedulerHeartbeat) -> str:
        beat = store.beat_heartbeat(row.role)
        return f"{beat.age_seconds:.1f} s" if beat else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- API tokens -----------------------------------------------------------------------------------------


@admin.register(ApiToken)
class ApiTokenAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """Tokens for services calling the jobs API; the secret is shown once, on the page after "Save"."""

    list_display = ("name", "user", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    list_select_related = ("user",)
    search_fields = ("name", "user__username")
    actions = ("revoke_selected",)

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> tuple[str, ...]:
        """Adding: a superuser picks the token's user; anyone else gets a token for themselves (no user field)."""
        if obj is None:
            return ("user", "name") if self._may_issue_for_others(request) else ("name",)
        return ("user", "name", "created_at", "last_used_at", "revoked")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        # A revoked token stays revoked: its box is shown, not offered (the "revoke" action is the way there).
        return ("user", "created_at", "last_used_at", *(("revoked",) if obj.revoked else ()))

    @staticmethod
    def _may_issue_for_others(request: HttpRequest) -> bool:
        """Only a superuser issues tokens for other users: a token carries its user's every permission."""
        return bool(getattr(request.user, "is_superuser", False))

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            # Name, and revoked only one way: an unticked box (or a forged POST) never un-revokes.
            ApiToken.objects.filter(pk=obj.pk).update(name=obj.name)
            if obj.revoked:
                ApiToken.objects.filter(pk=obj.pk).update(revoked=True)
            obj.revoked = ApiToken.objects.filter(pk=obj.pk).values_list("revoked", flat=True).first() or False
            return
        user = obj.user if self._may_issue_for_others(request) else request.user
        token, raw = auth.issue_token(user, obj.name)
        obj.pk, obj.key_hash, obj.created_at, obj.user = token.pk, token.key_hash, token.created_at, token.user
        request._timekeeper_new_token = raw  # type: ignore[attr-defined] # shown by response_add, never stored

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        raw = getattr(request, "_timekeeper_new_token", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "API token created",
            "opts": self.model._meta,
            "token": obj,
            "secret": raw,
            "changelist_url": reverse("admin:scheduling_apitoken_changelist"),
        }
        response = TemplateResponse(request, "admin/scheduling/apitoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = queryset.filter(revoked=False).update(revoked=True)
        self.message_user(
            request, ngettext("Revoked %(count)d token.", "Revoked %(count)d tokens.", revoked) % {"count": revoked}
        )


if admin.site.index_template is None:  # the project's own index template wins; it can add {% timekeeper_dashboard %}
    admin.site.index_template = DASHBOARD_INDEX_TEMPLATE

from scheduling.web import recurrences_admin  # noqa: E402, F401 - registers the recurrences' admin
