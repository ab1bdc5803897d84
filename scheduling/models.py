"""Timekeeper's tables.

Per-entity future work is a ``ScheduledJob`` row with a ``due_at``; each try is a ``JobAttempt``.
Fixed-time work is a django-celery-beat ``PeriodicTask`` with a ``SchedulePolicy`` beside it and a
``ScheduleRun`` per (schedule, tick). ``SchedulerHeartbeat`` records the leading beat process.

Invariants are database constraints; every state change is a conditional UPDATE in ``store``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce, Now
from django_celery_beat.models import PeriodicTask


class JobState(models.TextChoices):
    PENDING = "pending", "pending"
    CLAIMED = "claimed", "claimed"
    DONE = "done", "done"
    CANCELLED = "cancelled", "cancelled"
    DEAD = "dead", "dead"


LIVE_STATES = (JobState.PENDING, JobState.CLAIMED)
FINAL_STATES = (JobState.DONE, JobState.CANCELLED, JobState.DEAD)


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMED_OUT = "timed_out", "timed out"
    RECLAIMED = "reclaimed", "reclaimed"


MIN_PRIORITY, MAX_PRIORITY = 0, 9  # the claim walks priorities MAX_PRIORITY..MIN_PRIORITY


class ScheduledJobQuerySet(models.QuerySet["ScheduledJob"]):
    def pending(self) -> ScheduledJobQuerySet:
        return self.filter(state=JobState.PENDING)

    def due(self) -> ScheduledJobQuerySet:
        """Pending rows whose due time has passed by the database clock (the backlog)."""
        return self.filter(state=JobState.PENDING, due_at__lte=Now())

    def live(self) -> ScheduledJobQuerySet:
        return self.filter(state__in=LIVE_STATES)

    def for_owner(self, user: Any) -> ScheduledJobQuerySet:
        """What ``user`` may see: every row with the admin's view permission, their own rows otherwise.

        The staff flag alone grants nothing: the API asks for the same model permissions as the admin.
        """
        if getattr(user, "is_active", False) and user.has_perm("scheduling.view_scheduledjob"):
            return self
        return self.filter(owner_id=getattr(user, "pk", None))


class ScheduledJob(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.CharField("kind", max_length=100, help_text="The registered handler that runs this job.")
    payload = models.JSONField("payload", default=dict, help_text="Arguments for the handler, checked by its schema.")
    due_at = models.DateTimeField("due at", help_text="When the job becomes due (database clock).")
    state = models.CharField(
        "state",
        max_length=16,
        choices=JobState.choices,
        default=JobState.PENDING,
        help_text="Where the job is in its life.",
    )
    token = models.UUIDField(
        "claim token", null=True, blank=True, help_text="Fencing token, new at every claim; completion must present it."
    )
    claimed_at = models.DateTimeField(
        "claimed at", null=True, blank=True, help_text="When the current claim was taken."
    )
    heartbeat_at = models.DateTimeField(
        "heartbeat at", null=True, blank=True, help_text="Last sign of life from the worker holding the claim."
    )
    claimed_by = models.CharField(
        "claimed by", max_length=200, blank=True, default="", help_text="host:pid of the worker running the claim."
    )
    lease_seconds = models.PositiveIntegerField(
        "lease (seconds)", help_text="A claim whose heartbeat is older than this is taken back by the sweeper."
    )
    attempts = models.PositiveIntegerField("attempts", default=0, help_text="Claims taken so far.")
    max_attempts = models.PositiveIntegerField("max attempts", help_text="After this many attempts the job is dead.")
    priority = models.PositiveSmallIntegerField(
        "priority",
        default=0,
        db_default=0,
        help_text=f"{MIN_PRIORITY}-{MAX_PRIORITY}: among due jobs, a higher priority is claimed first.",
    )
    last_error = models.TextField("last error", blank=True, default="", help_text="The latest failure's error text.")
    run_alone = models.BooleanField(
        "run alone",
        default=False,
        db_default=False,
        help_text="Set when the job's batch died with its process: from then on it is sent in a batch of its own, "
        "so a crash is charged to the job that causes it.",
    )
    key = models.CharField(
        "key",
        max_length=200,
        null=True,
        blank=True,
        help_text="Optional business key: at most one job waiting to run per owner and key "
        "(e.g. trial-ending:42), beside any running one; jobs without an owner share the system's namespace.",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="scheduled_jobs",
        help_text="The user the job belongs to; others cannot see it through the API.",
    )
    # Written when the owner is deleted (scheduling.api.retire_owner): owner is then empty, and this keeps the
    # job from reading as the system's (a handler asking job.owner_id gets OwnerDeleted).
    former_owner = models.CharField(
        "former owner",
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The deleted user this job belonged to (username and id); empty while the owner exists "
        "and for the system's jobs.",
    )
    created_at = models.DateTimeField("created at", db_default=Now(), help_text="When the job was scheduled.")
    updated_at = models.DateTimeField("updated at", db_default=Now(), help_text="Last state change.")
    finished_at = models.DateTimeField(
        "finished at", null=True, blank=True, help_text="When the job reached done, cancelled or dead."
    )
    return_value = models.JSONField(
        "return value",
        null=True,
        blank=True,
        help_text="What a Django task (scheduling.backends) returned, written with its outcome; empty for other kinds.",
    )
    recurrence = models.ForeignKey(
        "Recurrence",
        verbose_name="recurrence",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_index=False,  # the unique (recurrence, occurrence_at) index serves look-ups by recurrence
        related_name="occurrences",
        help_text="The recurrence this job is an occurrence of, if any.",
    )
    occurrence_at = models.DateTimeField(
        "occurrence",
        null=True,
        blank=True,
        help_text="The recurrence's scheduled instant this job is for (its due time unless moved by run now).",
    )
    # Per-call overrides of the kind's contract (scheduling.api.schedule(timeout=, backoff=, atomic=)):
    # empty means the kind's; the runner, the claim's hard limit and the sweeper read these first.
    timeout_seconds = models.FloatField(
        "timeout (seconds)",
        null=True,
        blank=True,
        help_text="This job's timeout, chosen when it was scheduled; empty: its kind's.",
    )
    backoff_base_seconds = models.FloatField(
        "backoff base (seconds)",
        null=True,
        blank=True,
        help_text="This job's backoff between failed attempts (first step), chosen when it was scheduled; "
        "empty: its kind's.",
    )
    backoff_cap_seconds = models.FloatField(
        "backoff cap (seconds)",
        null=True,
        blank=True,
        help_text="This job's longest wait between failed attempts; empty: its kind's.",
    )
    atomic = models.BooleanField(
        "atomic",
        null=True,
        blank=True,
        help_text="Whether this job's writes commit with its outcome (yes) or as it goes (no); empty: its kind's.",
    )

    objects = ScheduledJobQuerySet.as_manager()

    class Meta:
        db_table = "scheduling_scheduledjob"
        verbose_name = "scheduled job"
        ordering = ["due_at", "id"]
        # The JSON API lets a caller holding it ask any priority, past the kind's bound for callers.
        permissions = [("prioritize_job", "Can schedule jobs through the API above a kind's caller priority")]
        indexes = [
            # The claim's only access path: small, because finished rows are not in it.
            models.Index(fields=["due_at"], name="scheduledjob_pending_due_idx", condition=models.Q(state="pending")),
            # The claim walks it one priority at a time, highest first (a range of due_at per priority).
            models.Index(
                fields=["priority", "due_at"], name="scheduledjob_pending_prio_idx", condition=models.Q(state="pending")
            ),
            # A capped kind's claim takes its room of rows from this, most urgent first, whatever else is due.
            models.Index(
                fields=["kind", "-priority", "due_at"],
                name="scheduledjob_pending_kind_idx",
                condition=models.Q(state="pending"),
            ),
            models.Index(
                fields=["heartbeat_at"], name="scheduledjob_claimed_hb_idx", condition=models.Q(state="claimed")
            ),
            models.Index(
                fields=["finished_at"],
                name="scheduledjob_finished_idx",
                condition=models.Q(state__in=["done", "cancelled", "dead"]),
            ),
            models.Index(fields=["kind", "state"], name="scheduledjob_kind_state_idx"),
            models.Index(fields=["owner", "state"], name="scheduledjob_owner_state_idx"),
        ]
        constraints = [
            # Keys are per owner: one waiting job per (owner, key), NULL owner = the system's namespace
            # (coalesce to 0, no user has that id). Waiting: pending and never run, or claimed on its
            # first attempt and not yet started by a worker. A started (running) job is outside the
            # index, so schedule(key=K) never meets its row lock and a successor can wait beside it;
            # the rows a failed, released or swept attempt returns to pending (attempts >= 1) are
            # outside it too, so those paths never meet a unique violation. The upserts name this
            # predicate in ON CONFLICT (queries.sql); pending retries are found there by look-up.
            models.UniqueConstraint(
                Coalesce("owner", models.Value(0)),
                "key",
                name="scheduledjob_waiting_owner_key_uniq",
                condition=models.Q(key__isnull=False)
                & (models.Q(state="pending", attempts=0) | models.Q(state="claimed", claimed_by="", attempts=1)),
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "claimed", "done", "cancelled", "dead"]),
                name="scheduledjob_state_valid",
            ),
            models.CheckConstraint(condition=models.Q(max_attempts__gte=1), name="scheduledjob_max_attempts_positive"),
            models.CheckConstraint(
                condition=models.Q(attempts__lte=models.F("max_attempts")), name="scheduledjob_attempts_within_max"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="claimed") | models.Q(token__isnull=False, claimed_at__isnull=False),
                name="scheduledjob_claim_has_token",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "claimed"]) | models.Q(finished_at__isnull=False),
                name="scheduledjob_final_has_finished_at",
            ),
            models.CheckConstraint(condition=models.Q(lease_seconds__gte=1), name="scheduledjob_lease_positive"),
            models.CheckConstraint(
                condition=models.Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                name="scheduledjob_priority_range",
            ),
            # Each occurrence of a recurrence at most once (a cancelled one frees its instant, so a
            # resumed recurrence can plan it again). The planner's insert names it in ON CONFLICT.
            models.UniqueConstraint(
                "recurrence",
                "occurrence_at",
                name="scheduledjob_one_per_occurrence",
                condition=models.Q(recurrence__isnull=False) & ~models.Q(state="cancelled"),
            ),
            models.CheckConstraint(
                condition=(models.Q(timeout_seconds__isnull=True) | models.Q(timeout_seconds__gt=0))
                & (
                    models.Q(backoff_base_seconds__isnull=True, backoff_cap_seconds__isnull=True)
                    | models.Q(backoff_base_seconds__gt=0, backoff_cap_seconds__gte=models.F("backoff_base_seconds"))
                ),
                name="scheduledjob_overrides_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.id} ({self.state})"


class KindControl(models.Model):
    """An operator's controls over one job kind: paused, and a cap on how many of it run at once."""

    kind = models.CharField("kind", max_length=100, primary_key=True, help_text="The registered job kind.")
    paused = models.BooleanField(
        "paused", default=False, help_text="While paused, due jobs of the kind stay pending (not claimed)."
    )
    max_running = models.PositiveIntegerField(
        "max running",
        null=True,
        blank=True,
        help_text="At most this many jobs of the kind claimed or running cluster-wide; empty: no cap.",
    )
    updated_at = models.DateTimeField("updated at", db_default=Now(), help_text="Last change of the controls.")

    class Meta:
        db_table = "scheduling_kindcontrol"
        verbose_name = "kind control"
        ordering = ["kind"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_running__isnull=True) | models.Q(max_running__gte=1),
                name="kindcontrol_max_running_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.kind


class JobAttempt(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        ScheduledJob,
        verbose_name="job",
        on_delete=models.CASCADE,
        related_name="attempt_set",
        help_text="The job tried.",
    )
    number = models.PositiveIntegerField("attempt", help_text="1 for the first try.")
    token = models.UUIDField("claim token", help_text="The claim this attempt ran under.")
    worker = models.CharField("worker", max_length=200, blank=True, default="", help_text="host:pid that ran it.")
    due_at = models.DateTimeField("due at", help_text="The due time this attempt was for (to measure lag).")
    started_at = models.DateTimeField("started", null=True, blank=True, help_text="When the handler started.")
    finished_at = models.DateTimeField("finished", help_text="When the outcome was recorded.")
    outcome = models.CharField("outcome", max_length=16, choices=AttemptOutcome.choices, help_text="How it ended.")
    error = models.TextField("error", blank=True, default="", help_text="Error text for failures and timeouts.")
    traceback = models.TextField(
        "traceback",
        blank=True,
        default="",
        db_default="",
        help_text="Where a failed attempt broke: the last 16,000 characters of its traceback (no payload, no locals).",
    )

    class Meta:
        db_table = "scheduling_jobattempt"
        verbose_name = "job attempt"
        ordering = ["job_id", "number"]
        indexes = [
            models.Index(fields=["finished_at"], name="jobattempt_finished_idx"),
            models.Index(fields=["job", "number"], name="jobattempt_job_number_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id}: {self.outcome}"


# --- Fixed-time schedules ---------------------------------------------------------------------------


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

    class Meta:
        verbose_name = "schedule run"
        ordering = ["-tick"]
        constraints = [
            # The exactly-once gate: a second beat or a redelivered message for the same tick
            # collides here and is refused (counted in duplicates_refused).
            models.UniqueConstraint(fields=["schedule", "tick"], name="schedulerun_one_per_tick"),
            models.CheckConstraint(
                condition=models.Q(
                    state__in=["running", "succeeded", "failed", "skipped", "missed", "replaced", "timed_out"]
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


class ApiToken(models.Model):
    """A bearer token for services calling the jobs API; only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        on_delete=models.CASCADE,
        related_name="api_tokens",
        help_text="The account the token acts as (jobs are scoped to it).",
    )
    name = models.CharField("name", max_length=100, help_text="What the token is for, e.g. billing-service.")
    key_hash = models.CharField(
        "key hash", max_length=64, unique=True, help_text="SHA-256 of the token; the token itself is shown once."
    )
    created_at = models.DateTimeField("created at", db_default=Now(), help_text="When the token was issued.")
    last_used_at = models.DateTimeField("last used", null=True, blank=True, help_text="Latest request made with it.")
    revoked = models.BooleanField("revoked", default=False, help_text="A revoked token is refused.")

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.user_id})"


class ApiRateBucket(models.Model):
    """One owner's allowance of job creations through the JSON API (a GCRA bucket, on the database clock).

    ``full_at`` is when the owner's burst is whole again: each creation moves it ``1/rate`` seconds
    on (from now, if it had passed), and a creation that would move it further than ``burst/rate``
    ahead of now is refused (``store.take_create_allowance``). One row per owner, shared by every web
    process; deleting rows only forgives.
    """

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="+",
        help_text="The user whose creations are counted.",
    )
    full_at = models.DateTimeField(
        "full at", help_text="When the owner's burst allowance is whole again (database clock)."
    )

    class Meta:
        verbose_name = "API rate bucket"

    def __str__(self) -> str:
        return f"rate bucket of {self.owner_id}"


class OutcomeCounter(models.Model):
    """A monotonic count of outcomes (``/metrics``' ``*_total`` counters), kept apart from the rows the pruner deletes.

    Written by database triggers (migration 0015) in the transaction that records the outcome, one
    row per (metric, label, outcome), so a count survives pruning and restarts and never goes down.
    One exception: ``refused_messages`` (per task), a broker message refused for its signature,
    leaves no row for a trigger to see, so the refusal adds it (``store.count_refused_message``).
    """

    metric = models.CharField(
        "metric",
        max_length=32,
        help_text="job_attempts, jobs_finished, job_retries, jobs_reclaimed, fixed_runs or refused_messages.",
    )
    label = models.CharField(
        "label", max_length=200, help_text="The job's kind, the fixed-time schedule's name, or the refused task's name."
    )
    outcome = models.CharField("outcome", max_length=16, blank=True, default="", help_text="How it ended ('' if n/a).")
    value = models.BigIntegerField("value", default=0, help_text="How many so far.")

    class Meta:
        verbose_name = "outcome counter"
        constraints = [
            models.UniqueConstraint(fields=["metric", "label", "outcome"], name="outcomecounter_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.metric}{{{self.label},{self.outcome}}} = {self.value}"


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

    At most one pending occurrence at a time (``current_job``); the planner creates the next when
    it has left pending (``scheduling.recurring``).
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
        help_text="The user the recurrence belongs to; others cannot see it through the API.",
    )
    expression = models.CharField(
        "cron expression",
        max_length=200,
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
