"""Scheduled jobs in the admin: the list ranked by what needs attention, a job's page, the bulk actions.

Adding a job calls ``api.schedule``; changing its due time calls ``api.reschedule``; the bulk
actions call ``api.cancel_many``, ``run_now_many``, ``retry_dead_many`` and ``reschedule_many`` (one
UPDATE each), which change only the rows in the state the action is for (pending, or dead for a
retry) and report the rest, with their states, as not touched. Rows are never saved with
``Model.save()`` here, so an edit cannot overwrite a claim.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import OperationalError, transaction
from django.db.models import Case, FloatField, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Extract, Now
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import ngettext

from scheduling import api
from scheduling.core import audit, conf, exceptions, registry, validation
from scheduling.models import (
    CLAIM_STATES,
    AuditRecord,
    JobAttempt,
    JobState,
    ScheduledJob,
    SchedulePolicy,
)
from scheduling.models.due_at import ScheduledJobQuerySet
from scheduling.templatetags.timekeeper_admin import relative
from scheduling.web import store as web_store
from scheduling.web.admin import bulk_actions, common, job_forms

SELECTION_SHOWN = 20  # jobs listed on the reschedule and confirmation pages
ERROR_CLASSES_SHOWN = 12  # error classes offered by the list's filter, the commonest first
ERROR_CLASS_SAMPLE = 10_000  # dead jobs (the latest) and failed pending ones read to rank the error classes
STATE_COUNT_CAP = 10_000  # per-state counts above the list are exact up to this many rows, then "10,000+"
SEARCH_TIMEOUT_SECONDS = 2.0  # a search (payload or key) that runs longer is stopped, and the page says so
LAST_ERROR_SHOWN = 60  # characters of the last error's first line in the list (the whole text is its tooltip)
HISTORY_SHOWN = 200  # audit records listed on a job's History page (the audit list has them all)
FINISHED = (JobState.DONE, JobState.CANCELLED, JobState.DEAD)


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
        return common.seconds_text(attempt.due_at)

    @admin.display(description="started")
    def started(self, attempt: JobAttempt) -> str:
        return common.seconds_text(attempt.started_at)

    @admin.display(description="finished")
    def finished(self, attempt: JobAttempt) -> str:
        return common.seconds_text(attempt.finished_at)

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


class StateFilter(admin.SimpleListFilter):
    """Django's own state filter (same parameter), with claimed rows read through the claimed set's index."""

    title = "state"
    parameter_name = "state__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(value), str(label)) for value, label in JobState.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> QuerySet[ScheduledJob]:
        value = self.value()
        return cast(ScheduledJobQuerySet, queryset).in_states([value]) if value else queryset


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


def error_class_of(text: str) -> str:
    """The class of an error text, as the list groups them: what precedes its first colon ("ValueError")."""
    return text.split(":", 1)[0][:80]


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999: JSON has no infinity (PostgreSQL refuses it), so it is searched as text
        raise ValueError(text)
    return number


def _no_constant(text: str) -> Any:
    raise ValueError(text)  # NaN, Infinity: not JSON either


def payload_containing(path: str, value: str) -> dict[str, Any]:
    """``a.b`` and ``5`` as ``{"a": {"b": 5}}``: the value as JSON when it parses (5, true, "x"), else as text.

    ``ValueError`` naming the reason when PostgreSQL could not take it: text it cannot store (a NUL,
    an unpaired surrogate), or deeper than any kind's payload may be (no payload could match).
    """
    parts = path.split(".")
    try:
        parsed: Any = json.loads(value, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the value nests too deeply") from None
    except ValueError:
        parsed = value
    deepest = registry.largest_limits().max_payload_depth or 0
    if len(parts) + validation.payload_depth(parsed) > deepest:
        raise ValueError(f"the field path and the value nest more than {deepest} levels, deeper than any payload")
    for part in reversed(parts):
        parsed = {part: parsed}
    problem = validation.payload_text_problem(parsed)
    if problem:
        raise ValueError(problem)
    return cast(dict[str, Any], parsed)


class ErrorClassFilter(admin.SimpleListFilter):
    """The commonest error classes of failed and dead jobs, with counts (``web_store.error_classes``, sampled)."""

    title = "error class"
    parameter_name = "error_class"
    ANY = "*"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        classes = web_store.error_classes(ERROR_CLASS_SAMPLE, ERROR_CLASSES_SHOWN)
        out = [(self.ANY, "any error")]
        out += [(c.error_class, f"{c.error_class or '(empty)'} ({c.count:,})") for c in classes]
        if self.value() and self.value() not in {value for value, _label in out}:
            out.append((str(self.value()), str(self.value())))  # a class linked from elsewhere, outside the top
        return out

    def queryset(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> QuerySet[ScheduledJob]:
        value = self.value()
        if not value:
            return queryset
        if value == self.ANY:
            return queryset.exclude(last_error="")
        return queryset.filter(Q(last_error__startswith=f"{value}:") | Q(last_error=value))


class RecurrenceFilter(admin.SimpleListFilter):
    """A recurrence's occurrences (``?recurrence=<id>``), linked from its page; offered only while it is chosen."""

    title = "recurrence"
    parameter_name = "recurrence"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = str(self.value() or "")
        return [(value, f"recurrence #{value}")] if validation.row_id_text(value) is not None else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> QuerySet[ScheduledJob]:
        found = validation.row_id_text(str(self.value() or ""))
        return queryset if found is None else queryset.filter(recurrence_id=found)


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


@admin.register(ScheduledJob)
class ScheduledJobAdmin(common.CheckedSelectionMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "kind_and_recurrence",
        "key_short",
        "due",
        "state_badge",
        "priority_of",
        "attempts_of",
        "started",
        "duration",
        "error_class",
        "last_error_short",
    )
    list_display_links = ("id",)
    list_filter = (StateFilter, KindFilter, OverdueFilter, ErrorClassFilter, RecurrenceFilter)
    search_fields = ("key",)
    search_help_text = (
        "A job id; (part of) a key or a payload value (user-5); a payload field: user_id=5, account.id=7 "
        '(JSON containment); or a JSON path: $.items[*] ? (@.sku == "A1").'
    )
    date_hierarchy = "due_at"
    list_select_related = ("owner",)
    list_per_page = 100
    show_full_result_count = False  # one count per page view is enough on a large table
    inlines = (JobAttemptInline,)
    change_form_template = "admin/scheduling/scheduledjob/change_form.html"
    form = job_forms.ChangeJobForm
    actions = tuple(bulk_actions.list_action(entry) for entry in bulk_actions.BULK_ACTIONS)  # the one table
    fieldsets = (
        (None, {"fields": ("kind", "key", "state", "priority", "due_at", "due_relative", "owner", "recurrence_link")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Attempts", {"fields": ("attempts", "max_attempts", "lease_seconds", "last_error")}),
        ("Current claim", {"fields": ("claimed_time", "heartbeat_time", "claimed_by"), "classes": ("collapse",)}),
        ("History", {"fields": ("created_time", "updated_time", "finished_time")}),
        ("Uniqueness window", {"fields": ("unique_key", "unique_states"), "classes": ("collapse",)}),
    )

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return ("attention", "attention_due", "id")  # what needs a person first; see get_queryset

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduledJob]:
        """Rows ranked by what needs attention: dead, stuck claims, overdue pending, running, pending, finished.

        Within a rank: by due time, except finished jobs, the most recent first.
        """
        stuck_before = Now() - dt.timedelta(seconds=conf.get().stuck_after_seconds)
        due_epoch = Extract("due_at", "epoch")
        last_attempt = JobAttempt.objects.filter(job=OuterRef("pk")).order_by("-number")  # jobattempt_job_number_idx
        return (
            self.model._default_manager.get_queryset()
            .without_return_value()  # a Django task's value: the admin does not show it
            .annotate(
                last_started=Subquery(last_attempt.values("started_at")[:1]),
                last_finished=Subquery(last_attempt.values("finished_at")[:1]),
            )
            .annotate(
                attention=Case(
                    When(state=JobState.DEAD, then=Value(0)),
                    When(state__in=CLAIM_STATES, claimed_at__lt=stuck_before, then=Value(1)),
                    When(state=JobState.PENDING, due_at__lte=Now(), then=Value(2)),
                    When(state__in=CLAIM_STATES, then=Value(3)),
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

    @admin.display(description="kind", ordering="kind")
    def kind_and_recurrence(self, job: ScheduledJob) -> str:
        """The kind, and the recurrence the job is an occurrence of, linked."""
        if job.recurrence_id is None:
            return job.kind
        url = reverse("admin:scheduling_recurrence_change", args=[job.recurrence_id])
        return format_html(
            '{}<br><a class="tk-recurrence-link" href="{}">↻ recurrence #{}</a>', job.kind, url, job.recurrence_id
        )

    @admin.display(description="key · owner", ordering="key")
    def key_short(self, job: ScheduledJob) -> str:
        """The key (clipped, whole in its tooltip) and, beneath it, the owner."""
        owner = str(job.owner) if job.owner_id is not None else job.former_owner or ""
        key = format_html('<span class="tk-clip" title="{}">{}</span>', job.key, job.key) if job.key else "-"
        if not owner:
            return key
        return format_html('{}<br><span class="quiet tk-clip" title="{}">{}</span>', key, owner, owner)

    @admin.display(description="due", ordering="due_at")
    def due(self, job: ScheduledJob) -> str:
        local = timezone.localtime(job.due_at)
        return format_html(
            '<span class="tk-when" title="{}">{}</span><br><span class="quiet tk-when">{}</span>',
            f"{local:%Y-%m-%d %H:%M:%S %Z}",
            f"{local:%Y-%m-%d %H:%M:%S}",
            relative(job.due_at),
        )

    @admin.display(description="started", ordering="last_started")
    def started(self, job: ScheduledJob) -> str:
        """When the latest attempt started; for a claim a worker runs now, when it was claimed."""
        at = self._running_since(job) or getattr(job, "last_started", None)
        if at is None:
            return "-"
        local = timezone.localtime(at)
        shown = f"{local:%H:%M:%S}" if local.date() == timezone.localdate() else f"{local:%m-%d %H:%M}"
        return format_html('<span class="tk-when" title="{}">{}</span>', f"{local:%Y-%m-%d %H:%M:%S %Z}", shown)

    @admin.display(description="duration")
    def duration(self, job: ScheduledJob) -> str:
        """The latest attempt's run time; for a running claim, how long it has run so far."""
        running = self._running_since(job)
        if running is not None:
            return format_html('<span class="tk-when">{} …</span>', common.duration_text(timezone.now() - running))
        started, finished = getattr(job, "last_started", None), getattr(job, "last_finished", None)
        if started is None or finished is None:
            return "-"
        return format_html('<span class="tk-when">{}</span>', common.duration_text(finished - started))

    @staticmethod
    def _running_since(job: ScheduledJob) -> dt.datetime | None:
        return job.claimed_at if job.state == JobState.RUNNING else None

    @admin.display(description="error class")
    def error_class(self, job: ScheduledJob) -> str:
        if not job.last_error:
            return "-"
        name = error_class_of(job.last_error)
        url = reverse("admin:scheduling_scheduledjob_changelist") + "?" + urlencode({"error_class": name})
        return format_html('<a class="tk-error-class" href="{}">{}</a>', url, name)

    @admin.display(description="last error")
    def last_error_short(self, job: ScheduledJob) -> str:
        if not job.last_error:
            return "-"
        line = job.last_error.splitlines()[0]
        name, colon, message = line.partition(":")
        if colon and message.strip() and error_class_of(line) == name:
            line = message.strip()  # the class has its own column
        shown = line if len(line) <= LAST_ERROR_SHOWN else f"{line[: LAST_ERROR_SHOWN - 1]}…"
        return format_html('<span class="tk-error" title="{}">{}</span>', job.last_error[:1000], shown)

    @admin.display(description="recurrence")
    def recurrence_link(self, job: ScheduledJob) -> str:
        if job.recurrence_id is None:
            return "-"
        url = reverse("admin:scheduling_recurrence_change", args=[job.recurrence_id])
        occurrence = f", occurrence of {common.seconds_text(job.occurrence_at)}" if job.occurrence_at else ""
        return format_html('<a href="{}">recurrence #{}</a>{}', url, job.recurrence_id, occurrence)

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

    @admin.display(description="prio", ordering="priority")
    def priority_of(self, job: ScheduledJob) -> int:
        return job.priority

    @admin.display(description="tries", ordering="attempts")
    def attempts_of(self, job: ScheduledJob) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="due")
    def due_relative(self, job: ScheduledJob) -> str:
        """The due time, and how far off it is while the job may still run; a finished job says it ended instead."""
        when = f"{timezone.localtime(job.due_at):%Y-%m-%d %H:%M:%S %Z}"
        if job.state in FINISHED:
            ended = f" {relative(job.finished_at)}" if job.finished_at else ""
            return f"was due {when}; {job.state}{ended}, will not run"
        return f"{when} ({relative(job.due_at)})"

    # Read-only times to the second (Django's own display stops at the minute).
    claimed_time = common.to_the_second("claimed_at", "claimed at")
    heartbeat_time = common.to_the_second("heartbeat_at", "heartbeat at")
    created_time = common.to_the_second("created_at", "created at")
    updated_time = common.to_the_second("updated_at", "updated at")
    finished_time = common.to_the_second("finished_at", "finished at")

    @admin.display(description="payload")
    def payload_pretty(self, job: ScheduledJob) -> str:
        return format_html("<pre>{}</pre>", common.pretty_json(job.payload))

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
            context |= {
                "title": f"{'Change' if editable else 'View'} {self.model._meta.verbose_name}",
                "show_save": editable,
                "show_save_and_continue": editable,
                "show_save_and_add_another": False,
                "job_actions": self._job_actions(request, job),
            }
        return super().change_view(request, object_id, form_url, context)

    def _job_actions(self, request: HttpRequest, job: ScheduledJob) -> list[dict[str, Any]]:
        """The buttons a job's page offers (``bulk_actions.BULK_ACTIONS`` for its state and the person's permissions).

        An action that asks for input posts the list's action for this one job (its page comes next);
        the others post to ``act/<name>/``.
        """
        out = []
        for entry in bulk_actions.BULK_ACTIONS:
            if job.state not in entry.states or not self._may(request, entry, job):
                continue
            if entry.form is not None:
                url = reverse("admin:scheduling_scheduledjob_changelist")
            else:
                url = reverse("admin:scheduling_scheduledjob_act", args=[job.pk, entry.name])
            out.append(
                {
                    "name": entry.name,
                    "label": entry.label,
                    "url": url,
                    "asks": entry.form is not None,
                    "action": entry.action,
                }
            )
        return out

    def _may(self, request: HttpRequest, entry: bulk_actions.BulkAction, job: ScheduledJob | None = None) -> bool:
        return bool(getattr(self, f"has_{entry.permission}_permission")(request, job))

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
        query = request.GET
        context = {"show": True, **dashboard.gather(query.get("range"), query.get("kind"), query.get("queue"))}
        response = TemplateResponse(request, "scheduling/dashboard_body.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def act_view(self, request: HttpRequest, object_id: int, action: str) -> HttpResponse:
        """POST from a job's page: one of ``bulk_actions.BULK_ACTIONS`` on this job, as the list's action runs it."""
        entry = bulk_actions.BY_NAME.get(action)
        job = self.get_object(request, str(object_id))
        if request.method != "POST" or entry is None or entry.form is not None:
            names = ", ".join(e.name for e in bulk_actions.BULK_ACTIONS if e.form is None)
            return HttpResponseBadRequest(f"Post one of: {names}.")
        if job is None:
            return HttpResponseRedirect(reverse("admin:scheduling_scheduledjob_changelist"))
        if not self._may(request, entry, job):
            raise PermissionDenied
        if entry.confirm and "confirm" not in request.POST:
            return self._confirm(request, entry, [job.pk], across=False)
        self.run_bulk_action(entry, request, [job.pk])
        return HttpResponseRedirect(reverse("admin:scheduling_scheduledjob_change", args=[job.pk]))

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        """Django's History (the admin's own log entries) with the audit trail's records naming this job."""
        records: list[AuditRecord] = []
        found = validation.row_id_text(object_id)
        if found is not None:
            records = list(AuditRecord.objects.for_job(found).select_related("user")[:HISTORY_SHOWN])
        context = {
            "audit_records": records,
            "audit_url": reverse("admin:scheduling_auditrecord_changelist") + f"?job={object_id}",
            **(extra_context or {}),
        }
        return super().history_view(request, object_id, context)

    @staticmethod
    def _due_at_editable(request: HttpRequest, obj: ScheduledJob | None) -> bool:
        """A pending job's due time is a field; so is one posted for a job that has left pending since its page
        was shown: the form then says why it was not moved (``JobNotReschedulable``), not "changed successfully"."""
        if obj is None:
            return False
        return obj.state == JobState.PENDING or (request.method == "POST" and "due_at_0" in request.POST)

    def get_fieldsets(self, request: HttpRequest, obj: ScheduledJob | None = None) -> Any:
        """A job that cannot be moved shows its due time once, to the second ("due"), not the editable field too."""
        if self._due_at_editable(request, obj):
            return self.fieldsets
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f != "due_at")})
            for name, options in self.fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: ScheduledJob | None = None) -> list[str]:
        shown = [str(f) for _name, options in self.fieldsets for f in options["fields"]]
        if self._due_at_editable(request, obj):
            return [f for f in shown if f != "due_at"]
        return shown

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ScheduledJob], search_term: str
    ) -> tuple[QuerySet[ScheduledJob], bool]:
        """An id; a JSON path (``$...``); a payload field (``a.b=value``, JSON containment, the GIN index of
        migration 0027); otherwise (part of) a key, or a payload value anywhere equal to the term.

        Each search runs under ``SEARCH_TIMEOUT_SECONDS`` (``changelist_view``).
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        found = validation.row_id_text(term)
        if found is not None:
            return queryset.filter(Q(pk=found) | Q(key__icontains=term)), False
        if term.startswith("$"):
            if not web_store.valid_jsonpath(term):
                self.message_user(request, f"Not a JSON path: {term}", messages.ERROR)
                return queryset.none(), False
            return cast(ScheduledJobQuerySet, queryset).payload_path_matches(term), False
        path, eq, value = term.partition("=")
        if eq and path.strip() and " " not in path.strip():
            try:
                contained = payload_containing(path.strip(), value.strip())
            except ValueError as exc:
                self.message_user(request, f"Cannot search the payload for {term[:100]}: {exc}.", messages.ERROR)
                return queryset.none(), False
            return queryset.filter(payload__contains=contained), False
        anywhere = cast(ScheduledJobQuerySet, queryset).payload_has_value(term)
        return queryset.filter(Q(key__icontains=term) | anywhere), False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """The list, with per-state counts above it; a search runs under a statement timeout."""
        context = {"state_counts": self._state_counts(), **(extra_context or {})}
        if not request.GET.get("q", "").strip():
            return super().changelist_view(request, context)
        try:
            with transaction.atomic():
                web_store.limit_statement_time(SEARCH_TIMEOUT_SECONDS)
                response = super().changelist_view(request, context)
                if hasattr(response, "render"):
                    response.render()  # the page's queries run here, under the limit
                return response
        except OperationalError as exc:
            if getattr(exc.__cause__, "pgcode", None) != "57014":  # query_canceled: the limit, nothing else
                raise
        self.message_user(
            request,
            f"The search took longer than {SEARCH_TIMEOUT_SECONDS:g} s and was stopped: narrow it with a filter "
            "(state, kind) or search a payload field (user_id=5), which an index serves.",
            messages.ERROR,
        )
        query = request.GET.copy()
        query.pop("q", None)
        return HttpResponseRedirect(f"{request.path}?{query.urlencode()}")

    def _state_counts(self) -> list[dict[str, Any]]:
        counts = web_store.state_counts(STATE_COUNT_CAP)
        url = reverse("admin:scheduling_scheduledjob_changelist")
        return [
            {
                "state": state,
                "count": count,
                "text": f"{STATE_COUNT_CAP:,}+" if count > STATE_COUNT_CAP else f"{count:,}",
                "url": f"{url}?{urlencode({'state__exact': state})}",
            }
            for state, count in ((str(s), counts.get(str(s), 0)) for s in JobState.values)
        ]

    # -- add and change go through scheduling.api

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> Any:
        """Schedule a job with ``api.schedule``; its errors become form errors and nothing is stored."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = job_forms.NewJobForm(request.POST or None, user=request.user, admin_site=self.admin_site)
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
                        raise job_forms.ReplaceNotAllowed(job.pk)  # rolls the replace back: the job is as it was
                    if outcome == "created":
                        validation.check_quota(owner, job.pk)  # raising here rolls the new job back
            except job_forms.ReplaceNotAllowed as exc:
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
            ("Uniqueness window", {"fields": ["unique_for", "unique_states"]}),
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
            "kind_help": job_forms.kind_help(self._offered_kinds(request)),
            **(extra_context or {}),
        }
        return self.render_change_form(request, context, add=True, form_url=form_url)

    @staticmethod
    def _offered_kinds(request: HttpRequest) -> list[tuple[str, str]]:
        return common.kind_choices(None if getattr(request.user, "is_superuser", False) else request.user)

    def save_model(self, request: HttpRequest, obj: ScheduledJob, form: Any, change: bool) -> None:
        """Only the due time of a pending job changes, through ``api.reschedule`` (the form locked the row)."""
        if change and "due_at" in form.changed_data:
            obj.due_at = api.reschedule(obj.pk, due_at=form.cleaned_data["due_at"])

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        return None  # attempts are read-only

    def construct_change_message(self, request: HttpRequest, form: Any, formsets: Any, add: bool = False) -> Any:
        return [{"changed": {"fields": ["due at"]}}] if "due_at" in form.changed_data else []

    # -- bulk actions (bulk_actions.BULK_ACTIONS): the jobs API's bulk calls, counts of changed and not touched

    def run_bulk_action(
        self, entry: bulk_actions.BulkAction, request: HttpRequest, selection: list[int]
    ) -> HttpResponse | None:
        """Run ``entry``'s bulk call on ``selection`` (after its form, if it asks for input) and report it."""
        values: dict[str, Any] = {}
        across = request.POST.get("select_across", "0") == "1"
        if (
            entry.confirm
            and "confirm" not in request.POST
            and (across or len(selection) > conf.get().admin_confirm_over)
        ):
            return self._confirm(request, entry, selection, across=across)
        if entry.form is not None:
            form = entry.form(request.POST if "apply" in request.POST else None)
            if not ("apply" in request.POST and form.is_valid()):
                return self._ask(request, entry, form, selection)
            values = dict(form.cleaned_data)
        with audit.noting(**({"filter": request.GET.urlencode() or "(none)", "all_matching": True} if across else {})):
            result = entry.call(selection, **values)
        shown = {name: common.seconds_text(v) if isinstance(v, dt.datetime) else v for name, v in values.items()}
        if result.changed:
            self.message_user(request, entry.done_message(len(result.changed), shown), messages.SUCCESS)
        others = Counter[str](result.untouched.values())
        if result.missing:
            others["gone"] += len(result.missing)
        if others:
            states = ", ".join(f"{n} {state}" for state, n in sorted(others.items()))
            self.message_user(request, entry.why_not_message(sum(others.values()), states), messages.WARNING)
        if entry.due_now:
            self._warn_held_back(request, result.changed)
        return None

    def _ask(
        self, request: HttpRequest, entry: bulk_actions.BulkAction, form: forms.Form, selection: list[int]
    ) -> HttpResponse:
        """The page of an action that asks for input: its form and the selection, posted back with ``apply``."""
        selected = ScheduledJob.objects.filter(pk__in=selection)
        total = len(selection)
        movable = selected.filter(state__in=entry.states)
        context = {
            **self.admin_site.each_context(request),
            "title": entry.description.rstrip("…"),
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
            "action": entry.action,
        }
        return TemplateResponse(request, f"admin/scheduling/scheduledjob/{entry.name}.html", context)

    def _confirm(
        self, request: HttpRequest, entry: bulk_actions.BulkAction, selection: list[int], *, across: bool
    ) -> HttpResponse:
        """Ask before an action that cannot be undone: what it would change, posted back with ``confirm``."""
        selected = ScheduledJob.objects.filter(pk__in=selection)
        changeable = selected.filter(state__in=entry.states).count()
        verb = entry.name.replace("_", " ")
        if len(selection) == 1 and not across:
            confirm_label = f"Yes, {verb} this job"
        else:
            confirm_label = ngettext("Yes, %(verb)s %(count)d job", "Yes, %(verb)s %(count)d jobs", changeable) % {
                "verb": verb,
                "count": changeable,
            }
        context = {
            **self.admin_site.each_context(request),
            "title": "Are you sure?",
            "confirm_label": confirm_label,
            "opts": self.model._meta,
            "entry": entry,
            "jobs": list(selected.select_related("owner").order_by("due_at", "id")[:SELECTION_SHOWN]),
            "total": len(selection),
            "more": max(len(selection) - SELECTION_SHOWN, 0),
            "changeable": changeable,
            "across": across,
            "filters": request.GET.urlencode(),
            "selected_ids": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": entry.action if request.POST.get("action") else "",
            "job_page": reverse("admin:scheduling_scheduledjob_change", args=[selection[0]])
            if len(selection) == 1
            else "",
        }
        return TemplateResponse(request, "admin/scheduling/scheduledjob/confirm.html", context)

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

    @staticmethod
    def selection(entry: bulk_actions.BulkAction, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> list[int]:
        """The ids an action runs on: the list's selected rows; for an action that asks for input, the ids the
        person ticked (not narrowed by the list's filters, which may drop jobs that came due meanwhile).

        "Select all" means the list's rows, as Django's actions do.
        """
        if entry.form is None:
            return list(queryset.values_list("id", flat=True))
        if request.POST.get("select_across", "0") == "1":
            return list(queryset.values_list("id", flat=True))
        return sorted({int(value) for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)})

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions
