"""The audit trail in the admin: every operator action, filterable by action, door, actor, date and job.

Read-only: the records are written by ``scheduling.core.audit.record`` from the ``scheduling.api``
calls every door shares; nobody edits or deletes them here. A job's History page lists the records
that name it (``ScheduledJobAdmin.history_view``) and links here, filtered to that job.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from scheduling.core import validation
from scheduling.models import AuditRecord, action_label
from scheduling.web.admin import common


class _RecordedValues(admin.SimpleListFilter):
    """The values of column ``parameter_name`` recorded so far (the first 100), each shown by ``label``."""

    def label(self, value: str) -> str:
        return value

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        field = str(self.parameter_name)
        values = AuditRecord.objects.order_by(field).values_list(field, flat=True).distinct()[:100]
        return [(value, self.label(value)) for value in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        return queryset.filter(**{str(self.parameter_name): self.value()}) if self.value() else queryset


class ActorFilter(_RecordedValues):
    """Who acted: a username, or cli:<OS user> (kept as text, so it outlives a deleted user)."""

    title = "actor"
    parameter_name = "actor"


class ActionFilter(_RecordedValues):
    """What was done: the verbs recorded so far, by their labels (a new verb shows without an entry anywhere)."""

    title = "action"
    parameter_name = "action"

    def label(self, value: str) -> str:
        return action_label(value)


class JobFilter(admin.SimpleListFilter):
    """The records naming one job (``?job=<id>``, the link from a job's History page)."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, f"#{value}")] if value and validation.row_id_text(value) is not None else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        found = validation.row_id_text(self.value() or "")
        return queryset if found is None else queryset.filter(job_ids__contains=[found])


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ("when", "actor", "door", "action_text", "kind", "target_text", "selected", "changed")
    list_filter = (ActionFilter, "door", ActorFilter, ("at", admin.DateFieldListFilter), JobFilter)
    search_fields = ("actor", "kind", "target")
    search_help_text = "An actor, a kind, or words of the target (a job id as #123)."
    date_hierarchy = "at"
    list_select_related = ("user",)
    list_per_page = 100
    show_full_result_count = False
    fields = (
        "when",
        "actor",
        "user",
        "door",
        "action_text",
        "kind",
        "target",
        "selected",
        "changed",
        "details",
        "jobs",
    )
    readonly_fields = fields

    when = common.to_the_second("at", "at")

    @admin.display(description="action", ordering="action")
    def action_text(self, record: AuditRecord) -> str:
        return record.get_action_display()

    @admin.display(description="target")
    def target_text(self, record: AuditRecord) -> str:
        return record.target

    @admin.display(description="jobs")
    def jobs(self, record: AuditRecord) -> str:
        """Links to the first jobs it named (all of them are in the record)."""
        if not record.job_ids:
            return "—"
        shown = record.job_ids[:50]
        links = format_html(
            ", ".join(["<a href='{}'>#{}</a>"] * len(shown)),
            *[part for i in shown for part in (reverse("admin:scheduling_scheduledjob_change", args=[i]), i)],
        )
        more = len(record.job_ids) - len(shown)
        return format_html("{}{}", links, f" … and {more} more" if more > 0 else "")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
