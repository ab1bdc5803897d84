"""Job handlers and the demo product's tables (trials, notifications, payments)."""

from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Timekeeper demo product"
    default_auto_field = "django.db.models.BigAutoField"
