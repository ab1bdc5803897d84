"""The demo product's tables in the admin: trials with their reminder's state, and the side-effect records."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import CharField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Concat
from django.http import HttpRequest

from scheduling.models import ScheduledJob
from tasks.models import Execution, Notification, Payment, Trial


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Trial)
class TrialAdmin(ReadOnlyAdmin):
    """Trials are started, moved and upgraded on the product's pages, which keep the reminder job in step."""

    list_display = ("id", "user", "plan", "ends_at", "upgraded_at", "reminder_state")
    list_filter = ("plan",)
    list_select_related = ("user",)
    search_fields = ("user__username",)
    date_hierarchy = "ends_at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Trial]:
        key = Concat(Value("trial-ending:"), OuterRef("pk"), output_field=CharField())
        latest = ScheduledJob.objects.filter(key=key, owner_id=OuterRef("user_id")).order_by("-id").values("state")[:1]
        return super().get_queryset(request).annotate(reminder=Subquery(latest))

    @admin.display(description="reminder", ordering="reminder")
    def reminder_state(self, trial: Trial) -> str:
        return getattr(trial, "reminder", None) or "none"


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("sent_at", "user", "channel", "subject", "idempotency_key")
    list_select_related = ("user",)
    search_fields = ("idempotency_key", "subject")


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ("reference", "amount_cents", "state", "attempts", "updated_at")
    list_filter = ("state",)
    search_fields = ("reference",)


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "kind", "idempotency_key", "pid")
    list_filter = ("kind",)
    search_fields = ("idempotency_key",)
