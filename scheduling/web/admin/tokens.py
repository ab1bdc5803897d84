"""API tokens in the admin: issued for oneself (others: superusers only), changed by their user, revoked one way."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import ngettext

from scheduling.models import (
    ApiToken,
)
from scheduling.web import auth
from scheduling.web.admin import common


@admin.register(ApiToken)
class ApiTokenAdmin(common.CheckedSelectionMixin, admin.ModelAdmin):
    """Tokens for services calling the jobs API; the secret is shown once, on the page after "Save"."""

    list_display = ("name", "user", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    list_select_related = ("user",)
    search_fields = ("name", "user__username")
    actions = ("revoke_selected",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        """A superuser sees every token; anyone else only their own (lists, pages, actions and forged ids alike)."""
        tokens = super().get_queryset(request)
        return tokens if self._may_issue_for_others(request) else tokens.filter(user=request.user.pk)

    def has_view_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return super().has_view_permission(request, obj) and self._owns(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return super().has_change_permission(request, obj) and self._owns(request, obj)

    def _owns(self, request: HttpRequest, obj: ApiToken | None) -> bool:
        """No object, a superuser, or the token's own user: another user's token is theirs and a superuser's."""
        return obj is None or self._may_issue_for_others(request) or obj.user_id == request.user.pk

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
            obj.revoked = auth.change_token(obj.pk, name=obj.name, revoke=obj.revoked)
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
        revoked = auth.revoke_tokens(queryset.values_list("pk", flat=True))  # the person's own tokens (get_queryset)
        self.message_user(
            request, ngettext("Revoked %(count)d token.", "Revoked %(count)d tokens.", revoked) % {"count": revoked}
        )
