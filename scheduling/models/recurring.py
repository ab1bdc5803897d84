"""The table of recurring per-entity work: a ``Recurrence`` plans its occurrences as ``ScheduledJob`` rows."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce, Now

from scheduling.models.due_at import MAX_PRIORITY, ScheduledJob
from scheduling.models.fixed import DstGapPolicy

__all__ = [
    "MAX_CRON_LENGTH",
    "Recurrence",
    "RecurrenceMissed",
    "RecurrenceQuerySet",
    "RecurrenceState",
]


MAX_CRON_LENGTH = 200  # characters of a cron expression: the column's length, and what cron_fields accepts


class RecurrenceState(models.TextChoices):
    ACTIVE = "active", "active"
    PAUSED = "paused", "paused"
    CANCELLED = "cancelled", "cancelled"
    ENDED = "ended", "ended"  # its ends_at passed: no further occurrence


class RecurrenceMissed(models.TextChoices):
    SKIP = "skip", "skip missed occurrences"
    RUN_ONCE = "run_once", "run the latest missed occurrence once"


class RecurrenceQuerySet(models.QuerySet["Recurrence"]):
    def for_owner(self, user: Any) -> RecurrenceQuerySet:
        """What ``user`` may see: every row with the admin's view permission, their own rows otherwise."""
        if getattr(user, "is_active", False) and user.has_perm("scheduling.view_recurrence"):
            return self
        return self.filter(owner_id=getattr(user, "pk", None))


class Recurrence(models.Model):
    """Recurring per-entity work: a cron expression (or interval) on its own zone, run as due_at jobs.

    At most one live (not finished) occurrence at a time, its retries included (``current_job``,
    and a unique index on the jobs' recurrence); the planner creates the next once it has finished
    (``scheduling.recurring``).
    """

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField("kind", max_length=100, help_text="The registered handler each occurrence runs.")
    payload = models.JSONField(
        "payload", default=dict, help_text="Arguments for every occurrence, checked by its schema."
    )
    key = models.CharField(
        "key", max_length=200, help_text="Business key, unique per owner (e.g. digest:42); names it in the API."
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="recurrences",
        db_index=False,  # the (owner, state) index serves the foreign key: one index less on every write
        help_text="The user the recurrence belongs to; others cannot see it through the API.",
    )
    expression = models.CharField(
        "cron expression",
        max_length=MAX_CRON_LENGTH,
        blank=True,
        default="",
        help_text="Five cron fields or a nickname; empty for every=.",
    )
    every_seconds = models.FloatField(
        "every (seconds)", null=True, blank=True, help_text="A fixed interval instead of a cron expression."
    )
    timezone = models.CharField(
        "time zone", max_length=64, default="UTC", help_text="The wall clock of the expression."
    )
    dst_gap = models.CharField(
        "DST gap",
        max_length=8,
        choices=DstGapPolicy.choices,
        default=DstGapPolicy.SHIFT,
        help_text="A fixed wall time the clock skips: run when the gap ends (shift) or not that day (skip).",
    )
    missed = models.CharField(
        "missed occurrences",
        max_length=8,
        choices=RecurrenceMissed.choices,
        default=RecurrenceMissed.SKIP,
        help_text="Occurrences that passed while paused or unplanned: skip them, or run the latest once.",
    )
    starts_at = models.DateTimeField("starts at", null=True, blank=True, help_text="No occurrence before this instant.")
    ends_at = models.DateTimeField("ends at", null=True, blank=True, help_text="No occurrence after this instant.")
    anchor_at = models.DateTimeField(
        "anchor", help_text="Origin of an every= grid (its start, or when it was created)."
    )
    state = models.CharField(
        "state",
        max_length=16,
        choices=RecurrenceState.choices,
        default=RecurrenceState.ACTIVE,
        help_text="active plans occurrences; paused and cancelled do not; ended passed its end.",
    )
    paused_reason = models.CharField(
        "why paused",
        max_length=200,
        blank=True,
        default="",
        help_text="Why the planner paused it (its owner lost access, its kind or rule is unusable); empty otherwise.",
    )
    recheck_access = models.BooleanField(
        "access re-checked",
        default=False,
        help_text="Made by an outside caller (the JSON API): the planner pauses it when its owner may no longer "
        "schedule its kind.",
    )
    priority = models.PositiveSmallIntegerField(
        "priority", null=True, blank=True, help_text="Each occurrence's priority (empty: the kind's)."
    )
    max_attempts = models.PositiveIntegerField(
        "max attempts", null=True, blank=True, help_text="Each occurrence's attempts budget (empty: the kind's)."
    )
    current_at = models.DateTimeField(
        "latest occurrence", null=True, blank=True, help_text="The instant of the latest occurrence created."
    )
    current_job = models.ForeignKey(
        ScheduledJob,
        verbose_name="latest occurrence job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        # No database constraint: the sweeper prunes old finished jobs with plain SQL, and a
        # recurrence's latest occurrence may be one of them (the planner reads a missing job as
        # "left pending").
        db_constraint=False,
        related_name="+",
        help_text="The job of the latest occurrence (pending until it is claimed).",
    )
    created_at = models.DateTimeField("created at", db_default=Now(), help_text="When the recurrence was made.")
    updated_at = models.DateTimeField("updated at", db_default=Now(), help_text="Last change.")

    objects = RecurrenceQuerySet.as_manager()

    class Meta:
        db_table = "scheduling_recurrence"
        verbose_name = "recurrence"
        ordering = ["id"]
        indexes = [
            # The planner's access path: active recurrences whose latest occurrence is due.
            models.Index(
                fields=["current_at"], name="recurrence_active_current_idx", condition=models.Q(state="active")
            ),
            models.Index(fields=["kind", "state"], name="recurrence_kind_state_idx"),
            models.Index(fields=["owner", "state"], name="recurrence_owner_state_idx"),
        ]
        constraints = [
            models.UniqueConstraint(Coalesce("owner", models.Value(0)), "key", name="recurrence_owner_key_uniq"),
            models.CheckConstraint(
                condition=(models.Q(expression="") & models.Q(every_seconds__gt=0))
                | (~models.Q(expression="") & models.Q(every_seconds__isnull=True)),
                name="recurrence_cron_or_every",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=["active", "paused", "cancelled", "ended"]), name="recurrence_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(starts_at__isnull=True)
                | models.Q(ends_at__isnull=True)
                | models.Q(ends_at__gt=models.F("starts_at")),
                name="recurrence_ends_after_start",
            ),
            models.CheckConstraint(
                condition=models.Q(priority__isnull=True) | models.Q(priority__lte=MAX_PRIORITY),
                name="recurrence_priority_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} ({self.state})"
