"""The tables of per-entity future work: ``ScheduledJob`` rows with a ``due_at``, each try a ``JobAttempt``.

Also ``KindControl`` (an operator's pause and cap per kind), the jobs' and attempts' states as
``TextChoices``, and the priority bounds. Invariants are database constraints; every state change
is a conditional UPDATE in ``scheduling.due_at.store``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Now

__all__ = [
    "CLAIM_STATES",
    "FINAL_STATES",
    "LIVE_STATES",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "AttemptOutcome",
    "JobAbort",
    "JobAttempt",
    "JobState",
    "KindControl",
    "KindRate",
    "ScheduledJob",
    "ScheduledJobQuerySet",
]


class JobState(models.TextChoices):
    PENDING = "pending", "pending"
    CLAIMED = "claimed", "claimed"  # claimed by the leader, its batch message queued: not started
    RUNNING = "running", "running"  # started by a worker (claimed_by says which), under its lease
    DONE = "done", "done"
    CANCELLED = "cancelled", "cancelled"
    DEAD = "dead", "dead"


LIVE_STATES = (JobState.PENDING, JobState.CLAIMED, JobState.RUNNING)
CLAIM_STATES = (JobState.CLAIMED, JobState.RUNNING)  # holding a claim token: queued or running
FINAL_STATES = (JobState.DONE, JobState.CANCELLED, JobState.DEAD)


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMED_OUT = "timed_out", "timed out"
    RECLAIMED = "reclaimed", "reclaimed"
    # A handler's choice (registry.Snooze, RetryAfter, Discard, Cancel): the reason is the attempt's error.
    SNOOZED = "snoozed", "snoozed"
    RETRY_AFTER = "retry_after", "retry after"
    DISCARDED = "discarded", "discarded"
    CANCELLED = "cancelled", "cancelled"
    ABORTED = "aborted", "aborted"  # an operator's abort interrupted it (api.abort)


MIN_PRIORITY, MAX_PRIORITY = 0, 9  # the claim walks priorities MAX_PRIORITY..MIN_PRIORITY


class ScheduledJobQuerySet(models.QuerySet["ScheduledJob"]):
    def pending(self) -> ScheduledJobQuerySet:
        return self.filter(state=JobState.PENDING)

    def due(self) -> ScheduledJobQuerySet:
        """Pending rows whose due time has passed by the database clock (the backlog)."""
        return self.filter(state=JobState.PENDING, due_at__lte=Now())

    def live(self) -> ScheduledJobQuerySet:
        return self.filter(state__in=LIVE_STATES)

    def in_states(self, states: Sequence[str]) -> ScheduledJobQuerySet:
        """Rows in any of ``states``; claimed and running ones through the claimed set's index (``claimed_at``)."""
        others = [s for s in states if s not in CLAIM_STATES]
        claims = [s for s in states if s in CLAIM_STATES]
        match = models.Q(state__in=others)
        if claims:
            match |= models.Q(state__in=claims, claimed_at__isnull=False)
        return self.filter(match)

    def payload_path_matches(self, path: str) -> ScheduledJobQuerySet:
        """Rows whose payload matches the JSON path ``path`` (``@?``, served by ``scheduledjob_payload_gin``)."""
        return self.filter(RawSQL("payload @? %s::jsonpath", [path], output_field=models.BooleanField()))

    def payload_has_value(self, value: str) -> models.Q:
        """A condition: the payload holds the string ``value`` anywhere (at any depth; a scan, no index serves it)."""
        return models.Q(
            RawSQL(
                "jsonb_path_exists(payload, 'strict $.** ? (@ == $v)', jsonb_build_object('v', %s::text))",
                [value],
                output_field=models.BooleanField(),
            )
        )

    def for_owner(self, user: Any) -> ScheduledJobQuerySet:
        """What ``user`` may see: every row with the admin's view permission, their own rows otherwise.

        The staff flag alone grants nothing: the API asks for the same model permissions as the admin.
        A Django task's return value is not read (``without_return_value``): the API does not show it.
        """
        if getattr(user, "is_active", False) and user.has_perm("scheduling.view_scheduledjob"):
            return self.without_return_value()
        return self.filter(owner_id=getattr(user, "pk", None)).without_return_value()

    def without_return_value(self) -> ScheduledJobQuerySet:
        """The rows without ``return_value`` (up to SCHEDULING_MAX_RETURN_VALUE_BYTES each): reads not showing it."""
        return self.defer("return_value")


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
        db_index=False,  # the (owner, state) index serves the foreign key: one index less on every write
        help_text="The user the job belongs to; others cannot see it through the API.",
    )
    # Written when the owner is deleted (scheduling.api.retire_owner): owner is then empty, and this keeps the
    # job from reading as the system's (a handler asking job.owner_id gets OwnerDeleted).
    retired = models.BooleanField(
        "retired",
        default=False,
        db_default=False,
        help_text="Its recurrence was paused or cancelled while it was claimed or running: it finishes the "
        "attempt it is on and never returns to pending.",
    )
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
    task_result_id = models.UUIDField(
        "task result id",
        null=True,
        blank=True,
        help_text="A Django task's result id (random, never the job's id: scheduling.backends); empty for other kinds.",
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
    # Uniqueness windows (schedule(unique_for=...)): the unique index scheduledjob_unique_window_uniq
    # (migration 0030, raw SQL: its predicate compares two columns) holds one row per unique_key among
    # the rows whose state is in their own unique_states.
    unique_key = models.CharField(
        "unique key",
        max_length=100,
        null=True,
        blank=True,
        help_text="What makes it unique within its window: a hash of kind, owner and key (or payload), and the slot.",
    )
    unique_states = ArrayField(
        models.CharField(max_length=16),
        verbose_name="unique states",
        null=True,
        blank=True,
        help_text="The states in which this job holds its unique key (a second job of the key is a conflict).",
    )

    objects = ScheduledJobQuerySet.as_manager()

    class Meta:
        db_table = "scheduling_scheduledjob"
        verbose_name = "scheduled job"
        ordering = ["due_at", "id"]
        # The JSON API lets a caller holding it ask any priority, past the kind's bound for callers.
        permissions = [("prioritize_job", "Can schedule jobs through the API above a kind's caller priority")]
        indexes = [
            # The next due times, the backlog, the claim's look at the head: small, because finished rows are not in it.
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
            # The claimed set, for the statements that read all of it (the sweeper, the counts): each
            # says `claimed_at IS NOT NULL` (true of every claim: scheduledjob_claim_has_token) to use
            # it. A statement that addresses claims by id does not, so it reads them by primary key:
            # the planner cannot prefer a scan of every claim, and of every dead version of one since
            # the last vacuum (claim, start and heartbeat each add one), when its statistics say few
            # rows are claimed. Measured in a spike of 100,000 (docs/operations.md, "Spikes").
            models.Index(
                fields=["heartbeat_at"],
                name="scheduledjob_claimed_set_idx",
                condition=models.Q(state__in=["claimed", "running"], claimed_at__isnull=False),
            ),
            models.Index(
                fields=["finished_at"],
                name="scheduledjob_finished_idx",
                condition=models.Q(state__in=["done", "cancelled", "dead"]),
            ),
            models.Index(fields=["kind", "state"], name="scheduledjob_kind_state_idx"),
            # The admin's payload search (user_id=5: payload @> '{"user_id": 5}', or a JSON path with @?);
            # jsonb_path_ops keeps it about a third of a default GIN index (migration 0027, built concurrently).
            GinIndex(fields=["payload"], opclasses=["jsonb_path_ops"], name="scheduledjob_payload_gin"),
            models.Index(fields=["owner", "state"], name="scheduledjob_owner_state_idx"),
            # The jobs API's list walks an owner's jobs by (due_at, id) from a cursor: an index range, no sort.
            models.Index(fields=["owner", "due_at", "id"], name="scheduledjob_owner_due_idx"),
        ]
        constraints = [
            # Keys are per owner: one waiting job per (owner, key), NULL owner = the system's namespace
            # (coalesce to 0, no user has that id). Waiting: pending and never run, or claimed on its
            # first attempt (not yet started by a worker). A started (running) job is outside the
            # index, so schedule(key=K) never meets its row lock and a successor can wait beside it;
            # the rows a failed, released or swept attempt returns to pending (attempts >= 1) are
            # outside it too, so those paths never meet a unique violation (one given back uncharged
            # beside a waiting successor is refunded, not uncounted: lifecycle.py). The upserts name this
            # predicate in ON CONFLICT (due_at/sql/schedule.sql); pending retries are found there by look-up.
            models.UniqueConstraint(
                Coalesce("owner", models.Value(0)),
                "key",
                name="scheduledjob_waiting_owner_key_uniq",
                condition=models.Q(key__isnull=False)
                & (models.Q(state="pending", attempts=0) | models.Q(state="claimed", attempts=1)),
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "claimed", "running", "done", "cancelled", "dead"]),
                name="scheduledjob_state_valid",
            ),
            models.CheckConstraint(condition=models.Q(max_attempts__gte=1), name="scheduledjob_max_attempts_positive"),
            models.CheckConstraint(
                condition=models.Q(attempts__lte=models.F("max_attempts")), name="scheduledjob_attempts_within_max"
            ),
            models.CheckConstraint(
                condition=~models.Q(state__in=["claimed", "running"])
                | models.Q(token__isnull=False, claimed_at__isnull=False),
                name="scheduledjob_claim_has_token",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "claimed", "running"]) | models.Q(finished_at__isnull=False),
                name="scheduledjob_final_has_finished_at",
            ),
            models.CheckConstraint(condition=models.Q(lease_seconds__gte=1), name="scheduledjob_lease_positive"),
            models.CheckConstraint(
                condition=models.Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                name="scheduledjob_priority_range",
            ),
            # A task's result id names one job (get_result, cancel and reschedule look it up here).
            models.UniqueConstraint(
                fields=["task_result_id"],
                name="scheduledjob_task_result_id_uniq",
                condition=models.Q(task_result_id__isnull=False),
            ),
            # Each occurrence of a recurrence at most once (a cancelled one frees its instant, so a
            # resumed recurrence can plan it again). The planner's insert names it in ON CONFLICT.
            models.UniqueConstraint(
                "recurrence",
                "occurrence_at",
                name="scheduledjob_one_per_occurrence",
                condition=models.Q(recurrence__isnull=False) & ~models.Q(state="cancelled"),
            ),
            # One live occurrence per recurrence, its retries included: the planner plans the next
            # only once it is finished (scheduling.recurring), and this index makes that the rule
            # whatever races. Not final rather than a list of live states, so a new live state is in.
            models.UniqueConstraint(
                fields=["recurrence"],
                name="scheduledjob_one_live_occurrence",
                condition=models.Q(recurrence__isnull=False) & ~models.Q(state__in=["done", "cancelled", "dead"]),
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
    rate_limit = models.PositiveIntegerField(
        "rate limit",
        null=True,
        blank=True,
        help_text="At most this many jobs of the kind claimed (started) per rate period, cluster-wide; empty: none.",
    )
    rate_period_seconds = models.FloatField(
        "rate period (seconds)", null=True, blank=True, help_text="The sliding window of the rate limit, in seconds."
    )
    rate_partition_by = models.CharField(
        "rate partitioned by",
        max_length=100,
        blank=True,
        db_default="",
        help_text="A payload field: the rate limit holds for each of its values apart; empty: one limit for the kind.",
    )
    rate_set_by_operator = models.BooleanField(
        "rate set by an operator",
        db_default=False,
        help_text="The rate was set at runtime (api.set_rate): the handler's registered rate no longer replaces it.",
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
            models.CheckConstraint(
                condition=models.Q(rate_limit__isnull=True, rate_period_seconds__isnull=True)
                | models.Q(rate_limit__gte=1, rate_period_seconds__gt=0),
                name="kindcontrol_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.kind


class KindRate(models.Model):
    """The recent starts of a rate-limited kind (one row per partition), written by the claim statement.

    ``starts_at[i]`` is when a claim took ``starts[i]`` of its jobs (the database clock, read after
    the claim locked the kind's control row); entries older than the rate period are dropped as
    the claim writes. The claim's room is the limit minus the starts inside the sliding window, and
    at most ``tokens`` (a bucket refilled at the limit per period, holding at most a twentieth of
    the limit, at least 2, or the whole limit after two idle periods): the window makes the limit
    exact, the bucket spreads the starts over it.

    ``handler_starts`` is the same window at the handlers' starts: a worker takes a start permit
    before a rate-limited job's handler runs (``due_at/starts.py``), so a batch that crossed the
    queue late cannot bunch its starts with the next claim's.
    """

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField("kind", max_length=100, help_text="The rate-limited job kind.")
    partition = models.CharField(
        "partition",
        max_length=200,
        blank=True,
        db_default="",
        help_text="The partition field's value; empty: the kind.",
    )
    starts_at = ArrayField(
        models.DateTimeField(),
        verbose_name="starts at",
        db_default=RawSQL("'{}'", []),
        help_text="When each recent claim took jobs.",
    )
    starts = ArrayField(
        models.IntegerField(),
        verbose_name="starts",
        db_default=RawSQL("'{}'", []),
        help_text="How many jobs each recent claim took.",
    )

    tokens = models.FloatField(
        "tokens",
        db_default=0.0,
        help_text="Starts the kind may take at once now (refilled at the limit per period, up to its burst).",
    )
    tokens_at = models.DateTimeField("tokens at", db_default=Now(), help_text="When tokens was last written.")
    handler_starts = ArrayField(
        models.DateTimeField(),
        verbose_name="handler starts",
        db_default=RawSQL("'{}'", []),
        help_text="When each recent handler started (the runner's start permits, due_at/starts.py).",
    )

    class Meta:
        db_table = "scheduling_kindrate"
        verbose_name = "kind rate window"
        constraints = [models.UniqueConstraint(fields=["kind", "partition"], name="kindrate_one_row_per_partition")]

    def __str__(self) -> str:
        return f"{self.kind} {self.partition}".strip()


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


class JobAbort(models.Model):
    """An operator's request to abort a running job (``api.abort``): the worker that runs it reads it back.

    A row of its own, not columns of the job: a running atomic job's row is locked by its chunk's
    transaction (``lock_claims``, FOR UPDATE) for as long as its handler runs, so an UPDATE of it, or
    a foreign key's check against it, would wait for the very handler it asks to stop. The request
    names the claim (``token``): it stops that attempt, never a later one of the same job. The
    worker's heartbeat reads it with the renewal (docs/architecture.md, "Aborting a running job").
    """

    job_id = models.BigIntegerField(
        "job", primary_key=True, help_text="The ScheduledJob asked to stop (no foreign key: see the model's docstring)."
    )
    token = models.UUIDField("claim token", help_text="The claim (attempt) the abort stops.")
    requested_at = models.DateTimeField("requested at", db_default=Now(), help_text="When the abort was asked for.")
    requested_by = models.CharField(
        "requested by", max_length=200, help_text="Who asked: the operator (as in the audit trail), or the code."
    )

    class Meta:
        db_table = "scheduling_jobabort"
        verbose_name = "job abort"

    def __str__(self) -> str:
        return f"abort of job {self.job_id} by {self.requested_by}"
