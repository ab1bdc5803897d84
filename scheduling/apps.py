"""The scheduling app: registers its system checks and the signals that keep schedule edits safe.

Its models need django-celery-beat's: ``import_models`` says so in one line (scheduling.E005)
before Django would fail on them with a traceback.
"""

from __future__ import annotations

import contextlib
import importlib

from django.apps import AppConfig, apps
from django.core.exceptions import ImproperlyConfigured


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Timekeeper scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def import_models(self) -> None:
        if not apps.is_installed("django_celery_beat"):  # before our models import django_celery_beat's
            raise ImproperlyConfigured(
                "scheduling.E005: Timekeeper needs django-celery-beat's tables (fixed-time schedules are its "
                "periodic tasks): add 'django_celery_beat' to INSTALLED_APPS, beside 'scheduling'."
            )
        super().import_models()

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save, pre_delete
        from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

        from scheduling import (
            api,
            checks,  # registers the checks on import (and says whether TASKS uses our backend)
        )
        from scheduling.fixed import policies
        from scheduling.models import Recurrence, SchedulePolicy
        from scheduling.recurring import api as recurring_api
        from scheduling.recurring import checks as recurring_checks  # noqa: F401 - registers E010, W009

        if checks.uses_timekeeper_tasks():  # its registry finder: tasks found by module path in every process
            # Django 5.2 without the django-tasks package: TASKS cannot work, and says so where it is used.
            with contextlib.suppress(ImportError):
                importlib.import_module("scheduling.backends")

        # A deleted user's waiting jobs and recurrences are cancelled first; their jobs keep who owned them.
        pre_delete.connect(api.on_owner_deleted, sender=get_user_model(), dispatch_uid="timekeeper-owner-deleted")
        # A recurrence deleted with its owner takes its pending occurrence with it (cancelled).
        pre_delete.connect(recurring_api.on_recurrence_deleted, sender=Recurrence, dispatch_uid="timekeeper-recurrence")
        # Safe edits of fixed-time schedules: a save that changes the timing moves the anchor.
        post_save.connect(policies.on_policy_saved, sender=SchedulePolicy, dispatch_uid="timekeeper-policy-timing")
        post_save.connect(policies.on_periodic_task_saved, sender=PeriodicTask, dispatch_uid="timekeeper-task-timing")
        post_save.connect(policies.on_crontab_saved, sender=CrontabSchedule, dispatch_uid="timekeeper-crontab-timing")
        post_save.connect(policies.on_interval_saved, sender=IntervalSchedule, dispatch_uid="timekeeper-interval-time")
