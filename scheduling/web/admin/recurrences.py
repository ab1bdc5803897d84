"""The recurrences' admin: list (filters by kind, state, zone; owner and key search), next runs, bulk actions.

Rows are read-only here: every change goes through ``scheduling.api`` (the bulk pause, resume and
cancel calls, one statement each), so the admin means what the API means; ``change_recurrence``
grants those three actions on anyone's recurrence, never a rewrite of its kind, payload or rule
(its occurrences run as its owner). A recurrence the planner paused shows why beside its state. Imported by
``scheduling/web/admin/__init__.py``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from scheduling import api
from scheduling.core import exceptions
from scheduling.models import Recurrence, ScheduledJob
from scheduling.recurring import api as recurring_api
from scheduling.web.admin import common

NEXT_RUNS_SHOWN = 3  # occurrence instants shown per row of the list
PAST_RUNS_SHOWN = 10  # a recurrence's latest occurrences listed on its page (all: the jobs list, filtered)
PAGE_ACTIONS = {  # the buttons of a recurrence's page: the list's action each runs, for the states it applies to
    "pause": ("pause_selected", "Pause", ("active",)),
    "resume": ("resume_selected", "Resume", ("paused",)),
    "cancel": ("cancel_selected", "Cancel", ("active", "paused", "ended")),
}


class ZoneFilter(admin.SimpleListFilter):
    """The zones recurrences use (one query: the distinct zones)."""

    title = "time zone"
    parameter_name = "timezone"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        zones = Recurrence.objects.order_by("timezone").values_list("timezone", flat=True).distinct()[:200]
        return [(zone, zone) for zone in zones]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Recurrence]) -> QuerySet[Recurrence]:
        return queryset.filter(timezone=self.value()) if self.value() else queryset


class RecurrenceKindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        kinds = Recurrence.objects.order_by("kind").values_list("kind", flat=True).distinct()[:200]
        return [(kind, kind) for kind in kinds]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Recurrence]) -> QuerySet[Recurrence]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


@admin.register(Recurrence)
class RecurrenceAdmin(common.CheckedSelectionMixin, admin.ModelAdmin):
    list_display = ("id", "key", "kind", "owner", "rule", "timezone", "state_badge", "next_runs")
    list_display_links = ("id", "key")
    list_filter = ("state", RecurrenceKindFilter, ZoneFilter)
    search_fields = ("key", "owner__username")
    search_help_text = "(Part of) a key, or an owner's username."
    list_select_related = ("owner",)
    list_per_page = 100
    show_full_result_count = False  # a million rows: one count per page view is enough
    actions = ("pause_selected", "resume_selected", "cancel_selected")
    ordering = ("id",)
    fields = (
        "key",
        "kind",
        "owner",
        "state",
        "paused_reason",
        "recheck_access",
        "expression",
        "every_seconds",
        "timezone",
        "dst_gap",
        "missed",
        "starts_at",
        "ends_at",
        "payload",
        "priority",
        "max_attempts",
        "current_at",
        "current_job",
        "next_runs",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields

    @admin.display(description="rule")
    def rule(self, recurrence: Recurrence) -> str:
        if recurrence.expression:
            return recurrence.expression
        return f"every {recurrence.every_seconds:g} s"

    @admin.display(description="state", ordering="state")
    def state_badge(self, recurrence: Recurrence) -> str:
        badge = format_html(
            '<span class="tk-state tk-state-{}" data-state="{}">{}</span>',
            recurrence.state,
            recurrence.state,
            recurrence.state,
        )
        if not recurrence.paused_reason:
            return badge
        return format_html('{}<br><small class="tk-paused-reason">{}</small>', badge, recurrence.paused_reason)

    @admin.display(description="next runs")
    def next_runs(self, recurrence: Recurrence) -> str:
        try:
            instants = recurring_api.preview(recurrence, NEXT_RUNS_SHOWN)
        except exceptions.SchedulingError:
            return "(rule cannot be computed)"
        if not instants:
            return "-"
        return format_html_join(
            mark_safe("<br>"),
            '<time class="tk-next-run" datetime="{}">{}</time>',
            ((i.isoformat(), _local(i, recurrence)) for i in instants),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # recurrences are made by api.recur() (code, the JSON API, the CLI)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # They end by cancel: no delete page of their own (delete_view), no bulk delete (get_actions).
        # A recurrence may go only with its owner, whose delete page asks this for each of theirs: its
        # pending occurrence is cancelled first, the history stays.
        return obj is not None and super().has_delete_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)  # actions, not edits

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        """The recurrence's page: pause, resume and cancel buttons for its state, its latest runs, no Delete
        (a recurrence ends by cancel; it goes only with its owner, and the page says so)."""
        context = dict(extra_context or {})
        recurrence = self.get_object(request, object_id)
        if recurrence is not None:
            may = self.has_change_permission(request)  # the list's actions ask the same
            jobs_url = reverse("admin:scheduling_scheduledjob_changelist")
            context |= {
                "show_delete": False,
                "recurrence_actions": [
                    {
                        "name": name,
                        "label": label,
                        "url": reverse("admin:scheduling_recurrence_act", args=[recurrence.pk, name]),
                    }
                    for name, (_action, label, states) in PAGE_ACTIONS.items()
                    if may and recurrence.state in states
                ],
                "past_runs": list(
                    ScheduledJob.objects.filter(recurrence_id=recurrence.pk).order_by("-due_at", "-id")[
                        :PAST_RUNS_SHOWN
                    ]
                ),
                "past_runs_url": f"{jobs_url}?recurrence={recurrence.pk}",
            }
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[Any]:
        act = path(
            "<int:object_id>/act/<str:action>/",
            self.admin_site.admin_view(self.act_view),
            name="scheduling_recurrence_act",
        )
        return [act, *super().get_urls()]

    def act_view(self, request: HttpRequest, object_id: int, action: str) -> HttpResponse:
        """POST from a recurrence's page: pause, resume or cancel it, as the list's action of that name does."""
        if request.method != "POST" or action not in PAGE_ACTIONS:
            return HttpResponseBadRequest(f"Post one of: {', '.join(PAGE_ACTIONS)}.")
        if not self.has_change_permission(request):
            raise PermissionDenied
        getattr(self, PAGE_ACTIONS[action][0])(request, self.get_queryset(request).filter(pk=object_id))
        return HttpResponseRedirect(reverse("admin:scheduling_recurrence_change", args=[object_id]))

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        raise PermissionDenied("A recurrence ends by cancel; it is deleted only with its owner.")

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # no bulk delete either, whatever the permissions
        return actions

    # -- bulk actions: the API's bulk calls, with counts of the changed and the others

    def _report(self, request: HttpRequest, result: recurring_api.BulkResult, verb: str, allowed: str) -> None:
        n = len(result.changed)
        if n:
            self.message_user(
                request,
                ngettext("%(verb)s %(count)d recurrence.", "%(verb)s %(count)d recurrences.", n)
                % {"verb": verb, "count": n},
                messages.SUCCESS,
            )
        others = Counter[str](result.untouched.values())
        if result.missing:
            others["gone"] += len(result.missing)
        if others:
            m = sum(others.values())
            states = ", ".join(f"{k} {state}" for state, k in sorted(others.items()))
            self.message_user(
                request,
                ngettext(
                    "%(count)d recurrence was not touched: only %(allowed)s ones can (it was %(states)s).",
                    "%(count)d recurrences were not touched: only %(allowed)s ones can (they were %(states)s).",
                    m,
                )
                % {"count": m, "allowed": allowed, "states": states},
                messages.WARNING,
            )

    @admin.action(description="Pause selected recurrences", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Recurrence]) -> None:
        result = api.pause_recurrences(queryset.values_list("id", flat=True))
        self._report(request, result, "Paused", "active")

    @admin.action(description="Resume selected recurrences", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Recurrence]) -> None:
        result = api.resume_recurrences(queryset.values_list("id", flat=True))
        self._report(request, result, "Resumed", "paused")

    @admin.action(description="Cancel selected recurrences", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Recurrence]) -> None:
        result = api.cancel_recurrences(queryset.values_list("id", flat=True))
        self._report(request, result, "Cancelled", "active, paused or ended")


def _local(instant: dt.datetime, recurrence: Recurrence) -> str:
    """The instant on the recurrence's own wall clock, and in the site's zone."""
    own = instant.astimezone(ZoneInfo(recurrence.timezone))
    return f"{own:%Y-%m-%d %H:%M %Z} ({timezone.localtime(instant):%H:%M %Z})"
