"""The operators' audit trail: one ``AuditRecord`` per action taken through a door (admin, JSON API, CLI).

Written by ``scheduling.core.audit.record`` from the ``scheduling.api`` calls the doors share, so no
door can change a job, a kind or a token without a row here (docs/operations.md, "Audit trail").
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now

__all__ = [
    "AuditAction",
    "AuditDoor",
    "AuditRecord",
    "action_label",
]


class AuditDoor(models.TextChoices):
    ADMIN = "admin", "admin"
    API = "api", "JSON API"
    CLI = "cli", "command line"
    WEB = "web", "other web view"


class AuditAction(models.TextChoices):
    CANCEL = "cancel", "cancel"
    RESCHEDULE = "reschedule", "reschedule"
    RUN_NOW = "run_now", "run now"
    RETRY = "retry", "retry"
    ABORT = "abort", "abort"
    PAUSE = "pause", "pause kind"
    RESUME = "resume", "resume kind"
    CAP = "cap", "cap kind"
    RATE = "rate", "set kind rate"
    TOKEN_CREATE = "token_create", "create token"
    TOKEN_REVOKE = "token_revoke", "revoke token"
    RECURRENCE_PAUSE = "recurrence_pause", "pause recurrence"
    RECURRENCE_RESUME = "recurrence_resume", "resume recurrence"
    RECURRENCE_CANCEL = "recurrence_cancel", "cancel recurrence"
    SCHEDULE_RUN_NOW = "schedule_run_now", "run schedule now"
    SCHEDULE_ENABLE = "schedule_enable", "enable schedule"
    SCHEDULE_DISABLE = "schedule_disable", "disable schedule"
    SCHEDULE_TOGGLE = "schedule_toggle", "toggle schedule"


_LABELS = dict(AuditAction.choices)


def action_label(action: str) -> str:
    """How an audit action reads: its ``AuditAction`` label, or else the verb with spaces for underscores.

    The record's ``action`` column takes any verb of up to 20 characters (no choices in the schema): a
    verb a new bulk action or per-kind option records needs no entry here and no migration; an entry
    only gives it another label. ``tests/unit/core/test_audit_verbs.py`` checks the verbs' length.
    """
    return _LABELS.get(action, action.replace("_", " "))


class AuditRecordQuerySet(models.QuerySet["AuditRecord"]):
    def for_job(self, job_id: int) -> AuditRecordQuerySet:
        """The records whose action changed (or was asked to change) job ``job_id`` (the GIN index on ``job_ids``)."""
        return self.filter(job_ids__contains=[job_id])


class AuditRecord(models.Model):
    """Who did what, when, through which door, and how many rows it changed."""

    at = models.DateTimeField("at", db_default=Now(), db_index=True, help_text="When the action was taken.")
    door = models.CharField("door", max_length=10, choices=AuditDoor.choices, help_text="Where it came from.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The signed-in user or token's user; empty for the command line (see actor).",
    )
    actor = models.CharField(
        "actor", max_length=200, help_text="Who, as a name that outlives the user: username, or cli:<OS user>."
    )
    action = models.CharField(
        "action", max_length=20, help_text="What was done: a verb (AuditAction labels the usual ones)."
    )
    kind = models.CharField("kind", max_length=200, blank=True, help_text="The job kind acted on, if one.")
    target = models.CharField(
        "target", max_length=500, blank=True, help_text="What it was asked for: ids, a filter, a kind, a token."
    )
    job_ids = ArrayField(
        models.BigIntegerField(),
        verbose_name="job ids",
        default=list,
        blank=True,
        help_text="The jobs it was asked to change (for a job's History page).",
    )
    selected = models.IntegerField("selected", default=0, help_text="How many rows it was asked to change.")
    changed = models.IntegerField("changed", default=0, help_text="How many rows it changed.")
    details = models.JSONField(
        "details", default=dict, blank=True, help_text="The action's values (new due time, cap, filter)."
    )

    objects = AuditRecordQuerySet.as_manager()

    class Meta:
        verbose_name = "audit record"
        ordering = ("-at", "-id")
        indexes = [GinIndex(fields=["job_ids"], name="auditrecord_job_ids_gin")]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} via {self.door}: {self.changed} of {self.selected}"

    def get_action_display(self) -> str:
        """The action as it reads (``action_label``), as Django's display of a field with choices."""
        return action_label(self.action)
