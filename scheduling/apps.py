"""The scheduling app: registers its system checks, nothing else."""

from __future__ import annotations

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Timekeeper scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from scheduling import checks  # noqa: F401 - registers the checks on import
