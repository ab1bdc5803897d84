"""Kinds in the admin: one page listing every registered kind, to pause, resume or cap it through ``scheduling.api``.

Each per-kind option (``core/kind_options.py``) gets a column, a form (``option_form``) and an
action named by its verb, all drawn from the option's row.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from scheduling import api
from scheduling.core import exceptions, kind_options, registry
from scheduling.models import (
    KindControl,
)


def option_form(option: kind_options.KindOption) -> type[forms.Form]:
    """The form that sets ``option`` of one kind: a number in its bounds, or empty for unset."""
    common: dict[str, Any] = {"required": False, "label": option.label, "help_text": f"Empty: {option.unset}."}
    field: forms.Field
    if option.type is int:
        field = forms.IntegerField(min_value=int(option.minimum), max_value=int(option.maximum), **common)
    else:
        field = forms.FloatField(min_value=option.minimum, max_value=option.maximum, **common)
    return type(f"Kind{option.noun.capitalize()}Form", (forms.Form,), {option.name: field})


OPTION_FORMS = {option.verb: option_form(option) for option in kind_options.KIND_OPTIONS}  # {verb: form}


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
            "kind_options": kind_options.KIND_OPTIONS,
            "can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def act_view(self, request: HttpRequest, kind: str, action: str) -> HttpResponse:
        """POST: pause, resume or cap ``kind`` through ``scheduling.api``; the message says what changed."""
        option = kind_options.by_verb(action)
        if request.method != "POST" or (action not in {"pause", "resume", "rate"} and option is None):
            verbs = ", ".join(["pause", "resume", *(o.verb for o in kind_options.KIND_OPTIONS), "rate"])
            return HttpResponseBadRequest(f"Post {verbs}.")
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
                assert option is not None
                form = OPTION_FORMS[option.verb](request.POST)
                if not form.is_valid():
                    errors = "; ".join(str(e) for e in form.errors.get(option.name, [f"not {option.what}"]))
                    self.message_user(request, f"{kind} was not changed: the {option.noun} {errors}", messages.ERROR)
                    return back
                value = form.cleaned_data[option.name]
                api.set_kind_option(kind, option.name, value)
                self.message_user(request, f"{kind}: {option.describe(value)}.")
        except exceptions.SchedulingError as exc:
            self.message_user(request, f"{kind} was not changed: {exc}", messages.ERROR)
        return back
