"""The tables of fixed-time work: a ``SchedulePolicy`` beside each django-celery-beat ``PeriodicTask``.

A ``ScheduleRun`` per (schedule, tick) is the exactly-once ledger; ``SchedulerHeartbeat`` records
the leading beat process. The policies' values are ``TextChoices`` here (``DstGapPolicy`` is shared
with the recurrences).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django_celery_beat.models import PeriodicTask

__all__ = [
    "ConcurrencyPolicy",
    "DstGapPolicy",
    "MissedPolicy",
    "RunState",
    "RunTrigger",
    "SchedulePolicy",
    "ScheduleRun",
    "SchedulerHeartbeat",
]


class ConcurrencyPolicy(models.TextChoices):
    ALLOW = "allow", "allow: runs may overlap"
    FORBID = "forbid", "forbid: skip a tick while the previous run is going"
    REPLACE = "replace", "replace: stop the previous run, start the new one"


class MissedPolicy(models.TextChoices):
    SKIP = "skip", "skip missed ticks (record them)"
    RUN_ONCE = "run_once", "run the latest missed tick once"
    RUN_ALL = "run_all", "run every missed tick within the window"


class DstGapPolicy(models.TextChoices):
    SHIFT = "shift", "run at the next valid instant"
    SKIP = "skip", "do not run that day"


class SchedulePolicy(models.Model):
    periodic_task = models.OneToOneField(
        PeriodicTask,
        verbose_name="periodic task",
        on_delete=models.CASCADE,
        related_name="policy",
        help_text="The django-celery-beat entry that fires this schedule.",
    )
    kind = models.CharField("kind", max_length=100, help_text="The registered fixed-time handler to run.")
    expression = models.CharField(
        "expression",
        max_length=100,
        blank=True,
        default="",
        help_text="The cron expression or nickname as declared (e.g. @daily); empty for interval schedules.",
    )
    concurrency_policy = models.CharField(
        "concurrency policy",
        max_length=8,
        choices=ConcurrencyPolicy.choices,
        default=ConcurrencyPolicy.FORBID,
        help_text="What a tick does while the previous run is still going.",
    )
    starting_deadline_seconds = models.PositiveIntegerField(
        "starting deadline (seconds)",
        null=True,
        blank=True,
        help_text="A tick that cannot start within this many seconds is recorded as missed, not run.",
    )
    active_deadline_seconds = models.PositiveIntegerField(
        "run timeout (seconds)",
        null=True,
        blank=True,
        help_text="A run still going after this long is stopped; must be shorter than the shortest interval.",
    )
    backoff_limit = models.PositiveSmallIntegerField(
        "retries", default=0, help_text="Retries within the same tick after a failure, with backoff."
    )
    successful_history_limit = models.PositiveSmallIntegerField(
        "successful runs kept", default=3, help_text="Succeeded runs kept in the history."
    )
    failed_history_limit = models.PositiveSmallIntegerField(
        "failed runs kept", default=1, help_text="Failed, timed-out, missed or skipped runs kept in the history."
    )
    suspend = models.BooleanField("suspended", default=False, help_text="A suspended schedule fires no runs.")
    missed_policy = models.CharField(
        "missed ticks",
        max_length=8,
        choices=MissedPolicy.choices,
        default=MissedPolicy.SKIP,
        help_text="What to do with ticks missed while beat was down.",
    )
    missed_window_seconds = models.PositiveIntegerField(
        "missed-tick window (seconds)",
        default=3600,
        help_text="How far back run_all looks for missed ticks.",
    )
    dst_gap = models.CharField(
        "DST gap",
        max_length=8,
        choices=DstGapPolicy.choices,
        default=DstGapPolicy.SHIFT,
        help_text="What a tick that falls in the hour skipped by a clock change does.",
    )
    anchor_at = models.DateTimeField(
        "counting from",
        db_default=Now(),
        help_text="Ticks at or before this instant never fire; moved forward when the schedule is edited.",
    )
    last_tick = models.DateTimeField(
        "last tick", null=True, blank=True, help_text="The latest tick handed to a worker (or recorded as missed)."
    )
    payload = models.JSONField(
        "payload", default=dict, blank=True, help_text="Arguments handed to the handler on every run (a JSON object)."
    )
    timing_key = models.CharField(
        "timing fingerprint",
        max_length=300,
        blank=True,
        default="",
        editable=False,
        help_text="The timing (expression, zone, interval, suspension) the anchor was last set for; "
        "when it changes, the anchor moves forward.",
    )
    pruned_through = models.DateTimeField(
        "pruned through",
        null=True,
        blank=True,
        editable=False,
        help_text="History at or before this tick was pruned; a late delivery of such a tick is refused.",
    )

    class Meta:
        verbose_name = "schedule policy"
        verbose_name_plural = "schedule policies"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(concurrency_policy__in=["allow", "forbid", "replace"]),
                name="schedulepolicy_concurrency_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(missed_policy__in=["skip", "run_once", "run_all"]),
                name="schedulepolicy_missed_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(active_deadline_seconds__isnull=True) | models.Q(active_deadline_seconds__gte=1),
                name="schedulepolicy_timeout_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"policy of {self.periodic_task.name}"


class RunState(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    SKIPPED = "skipped", "skipped (overlap)"
    MISSED = "missed", "missed (deadline)"
    REPLACED = "replaced", "replaced"
    TIMED_OUT = "timed_out", "timed out"
    DISCARDED = "discarded", "discarded (by its handler)"  # registry.Discard: no further attempt in the tick
    CANCELLED = "cancelled", "cancelled (by its handler)"  # registry.Cancel
    ABORTED = "aborted", "aborted"  # an operator stopped it (api.abort_schedule_run)


class RunTrigger(models.TextChoices):
    BEAT = "beat", "beat"
    MANUAL = "manual", "run now"
    CATCH_UP = "catch_up", "missed-tick catch-up"


class ScheduleRun(models.Model):
    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(
        SchedulePolicy,
        verbose_name="schedule",
        on_delete=models.CASCADE,
        related_name="runs",
        help_text="The fixed-time schedule this run belongs to.",
    )
    tick = models.DateTimeField("tick", help_text="The scheduled instant this run is for.")
    state = models.CharField("state", max_length=16, choices=RunState.choices, help_text="How the run went.")
    trigger = models.CharField(
        "trigger", max_length=16, choices=RunTrigger.choices, default=RunTrigger.BEAT, help_text="What fired it."
    )
    attempt = models.PositiveSmallIntegerField("attempt", default=1, help_text="1, then up to 1 + retries.")
    worker = models.CharField("worker", max_length=200, blank=True, default="", help_text="host:pid that ran it.")
    task_id = models.CharField(
        "task id", max_length=64, blank=True, default="", help_text="The Celery task id (to stop a replaced run)."
    )
    started_at = models.DateTimeField("started", db_default=Now(), help_text="When the gate admitted the run.")
    finished_at = models.DateTimeField("finished", null=True, blank=True, help_text="When the run ended.")
    error = models.TextField("error", blank=True, default="", help_text="Error text of a failed run.")
    duplicates_refused = models.PositiveIntegerField(
        "duplicates refused", default=0, help_text="Later deliveries of the same tick refused by the gate."
    )
    holds_lock = models.BooleanField(
        "holds the overlap lock",
        null=True,
        blank=True,
        help_text="Admitted under forbid or replace: it holds the schedule's lock while it runs (empty: not "
        "recorded, judged by the schedule's policy now).",
    )
    deadline_seconds = models.FloatField(
        "deadline (seconds)",
        null=True,
        blank=True,
        help_text="How long the gate lets it run, as admitted: its active deadline, else its kind's timeout.",
    )
    abort_requested_at = models.DateTimeField(
        "abort requested at", null=True, blank=True, help_text="When an operator asked to abort the running run."
    )
    abort_requested_by = models.CharField(
        "abort requested by",
        max_length=200,
        blank=True,
        default="",
        db_default="",  # the gate's ledger insert is SQL that does not name it
        help_text="Who asked to abort it.",
    )

    class Meta:
        verbose_name = "schedule run"
        ordering = ["-tick"]
        constraints = [
            # The exactly-once gate: a second beat or a redelivered message for the same tick
            # collides here and is refused (counted in duplicates_refused).
            models.UniqueConstraint(fields=["schedule", "tick"], name="schedulerun_one_per_tick"),
            models.CheckConstraint(
                condition=models.Q(
                    state__in=[
                        "running",
                        "succeeded",
                        "failed",
                        "skipped",
                        "missed",
                        "replaced",
                        "timed_out",
                        "discarded",
                        "cancelled",
                        "aborted",
                    ]
                ),
                name="schedulerun_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(trigger__in=["beat", "manual", "catch_up"]), name="schedulerun_trigger_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(state="running") | models.Q(finished_at__isnull=False),
                name="schedulerun_final_has_finished_at",
            ),
        ]
        indexes = [
            models.Index(fields=["schedule", "state"], name="schedulerun_schedule_state_idx"),
            models.Index(fields=["started_at"], name="schedulerun_started_idx"),
            # The gate looks for a schedule's running runs (replace, orphans) on every run.
            models.Index(fields=["schedule"], name="schedulerun_running_idx", condition=models.Q(state="running")),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.tick:%Y-%m-%d %H:%M:%S%z}: {self.state}"


class SchedulerHeartbeat(models.Model):
    role = models.CharField("role", max_length=32, unique=True, help_text="What the process leads, e.g. beat.")
    holder = models.CharField("holder", max_length=200, help_text="host:pid of the leading process.")
    acquired_at = models.DateTimeField("leading since", help_text="When it took the lead.")
    heartbeat_at = models.DateTimeField("heartbeat", help_text="Its latest sign of life (database clock).")

    class Meta:
        verbose_name = "scheduler heartbeat"

    def __str__(self) -> str:
        return f"{self.role} led by {self.holder}"
