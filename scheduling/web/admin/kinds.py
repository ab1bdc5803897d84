"""Kinds in the admin: one page listing every registered kind, to pause, resume or cap it through ``scheduling.api``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from scheduling import api
from scheduling.core import exceptions, registry
from scheduling.models import (
    KindControl,
)


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
            "title": "Kinds: pause, resume, cap, rate",
            "opts": self.model._meta,
            "kinds": api.kind_overview(),
            "can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def act_view(self, request: HttpRequest, kind: str, action: str) -> HttpResponse:
        """POST: pause, resume or cap ``kind`` through ``scheduling.api``; the message says what changed."""
        if request.method != "POST" or action not in {"pause", "resume", "cap", "rate"}:
            return HttpResponseBadRequest("Post pause, resume, cap or rate.")
        if not self.has_change_permission(request):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse("admin:scheduling_kindcontrol_changelist"))
        try:
            if action == "pause":
                api.pause(kind)
                self.message_user(
                    request,
                    f"Paused {kind}: its due jobs stay pending and its fixed-time schedules' ticks are skipped "
                    "until it is resumed.",
                )
            elif action == "resume":
                api.resume(kind)
                self.message_user(request, f"Resumed {kind}: its due jobs are claimed again.")
            elif action == "rate":
                text, _, field = str(request.POST.get("rate", "")).strip().partition(" per ")
                rate = registry.Rate.parse(text, field.strip()) if text and text.lower() != "none" else None
                api.set_rate(kind, rate)
                self.message_user(request, f"{kind}: at most {rate}." if rate else f"{kind}: no rate limit.")
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
