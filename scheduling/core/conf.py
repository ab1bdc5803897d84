"""Timekeeper's settings: one typed, frozen object with a default for every field.

Each field ``x`` is read from the Django setting ``SCHEDULING_X`` (``claim_batch_size`` from
``SCHEDULING_CLAIM_BATCH_SIZE``) when the project defines it, else the default here; the unit is in
the name or the comment. Code reads ``conf.get().claim_batch_size``, never a string. A value of
the wrong type is an ``ImproperlyConfigured`` naming the setting, raised on first use.

The object is built once and rebuilt when a test changes a setting (``setting_changed``). The
settings reference in ``docs/configuration.md`` is generated from this class (``python -m
scheduling.core.conf``), so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

PREFIX = "SCHEDULING_"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every tunable, with its default; the comments become the settings reference."""

    # --- due_at engine: claiming --------------------------------------------------------------------
    claim_batch_size: int = 500  # rows: the most one claim statement takes
    default_batch_size: int = 50  # jobs per run_batch message unless the kind says otherwise
    claim_interval_seconds: float = 1.0  # the control loop re-reads the next due time at least this often
    max_queued_batches: int = 4  # messages: at most this many batches queued by the claim (~2 per worker process)
    control_in_workers: bool = True  # every worker runs the control loop thread (one leads); False: this one never does
    # --- due_at engine: leases and the sweeper --------------------------------------------------------
    heartbeat_seconds: float = 5.0  # a running claim's lease is renewed this often; 0 turns heartbeats off
    lease_seconds: int = 30  # a started claim whose heartbeat is older than this is dead (a kind may override)
    sweep_after_seconds: int = 900  # claimed_at age that counts as dead when heartbeats are off
    sweep_interval_seconds: float = 5.0  # the control loop takes back dead claims this often
    retention_days: int = 14  # finished jobs and attempts older than this are pruned
    prune_batch_size: int = 200  # rows per prune statement (~10-20 ms each: bench sweep)
    stuck_after_seconds: float = 300.0  # claimed longer than this counts as stuck in status
    status_exact_limit: int = 10_000  # rows: pending counts above this are planner estimates
    async_commit: bool = True  # claim-path commits skip the WAL flush wait (due_at.store._async_prefix)
    # --- kinds' defaults ------------------------------------------------------------------------------
    default_max_attempts: int = 5
    default_timeout_seconds: float = 300.0
    max_snoozes: int = 25  # times a job may raise registry.Snooze before the next one counts as a failure
    max_payload_bytes: int = 64 * 1024
    max_payload_depth: int = 32  # levels of nested lists/objects a payload may have
    max_return_value_bytes: int = 1024 * 1024  # a Django task's return value as JSON; over it the attempt fails
    handler_packages: tuple[str, ...] = ()  # packages whose modules register handlers, besides every app's jobs.py
    # --- broker deferrals -----------------------------------------------------------------------------
    broker_delay_max_seconds: float = 900.0  # like SQS DelaySeconds; must stay below the visibility timeout
    visibility_margin_seconds: float = 300.0  # the ceiling must sit this far below the visibility timeout
    # --- fixed-time schedules -------------------------------------------------------------------------
    fixed_late_seconds: float = 60.0  # beat still sends a tick it notices this late; older ones are missed
    fixed_max_catch_up: int = 100  # ticks: the most catch-up runs one planning step sends (run_all)
    fixed_recheck_seconds: float = 60.0  # beat re-reads a fixed-time schedule at least this often
    fixed_replace_wait_seconds: float = 10.0  # replace: how long a new run waits for the stopped one's lock
    fixed_clock_sync_seconds: float = 30.0  # beat reads the database clock this often; time.monotonic() in between
    fixed_min_interval_seconds: float = 60.0  # non-superusers' schedules: ticks at least this far apart (admin)
    # --- recurrences ----------------------------------------------------------------------------------
    recurrence_plan_interval_seconds: float = 1.0  # the leader plans this often (up to 5 s while its picks are slow)
    recurrence_plan_batch_size: int = 5000  # recurrences: the most one planner statement advances
    recurrence_late_seconds: float = 60.0  # an occurrence planned this late still runs; older ones are missed
    # --- web doors ------------------------------------------------------------------------------------
    health_beat_max_age_seconds: float = 30.0  # /healthz: a beat heartbeat older than this is a 503
    health_max_backlog: int = 10_000  # /healthz: more overdue jobs than this (critical kinds', the system's) is a 503
    metrics_window_seconds: float = 300.0  # /metrics and the dashboard: the recent window counted
    metrics_token: str = ""  # when set, /metrics needs "Authorization: Bearer <token>"; /healthz shows details with it
    metrics_public: bool = False  # True: /metrics answers anyone when no token is set (DEBUG off refuses otherwise)
    metrics_cache_seconds: float = 5.0  # a scrape within this long of the last one gets the same text
    admin_confirm_over: int = 100  # jobs: an admin cancel of more (or of "all N matching") asks for confirmation first
    # --- JSON API limits (superusers are exempt from the rate and the quota; docs/security.md) ------------
    api_max_job_seconds: float = 600.0  # API jobs' worst case: attempts x the kind's timeout at most this; 0: no bound
    api_create_rate_per_second: float = 10.0  # API creations per owner per second, sustained (all web processes); 0 off
    api_create_burst: int = 50  # API job creations one owner may make at once, before the rate
    api_max_pending_jobs: int = 1000  # pending jobs one API owner may hold; a create over it is a 429; 0: no quota
    api_past_due_tolerance_seconds: float = 60.0  # API: a due_at this far past is accepted (clock skew); older: 400
    api_max_recurrences: int = 100  # recurrences (active or paused) one API owner may hold; more is a 429; 0: no quota
    api_min_recurrence_interval_seconds: float = 60.0  # API recurrences: occurrences at least this far apart; 0: off
    # --- deployment: connections and probes ----------------------------------------------------------
    direct_database_url: str = ""  # locks, leadership and LISTEN connect here (not via a pooler); empty: the default DB
    liveness_dir: str = ""  # where worker and beat write their liveness files; empty: the system's temporary directory
    liveness_max_age_seconds: float = 60.0  # `timekeeper probe worker` (or beat) fails when its loop's file is older
    # --- traces --------------------------------------------------------------------------------------
    tracing: bool = False  # OpenTelemetry spans of schedule, claim and run (OTLP to OTEL_EXPORTER_OTLP_ENDPOINT)
    job_task_events: bool = True  # each job's attempt as Celery task events for Flower, when workers send task events

    @classmethod
    def from_django(cls) -> Settings:
        """Build from the Django settings, casting each value to its field's type."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = PREFIX + field.name.upper()
            if not hasattr(django_settings, name):
                continue
            values[field.name] = _cast(name, getattr(django_settings, name), field.default)
        return cls(**values)


def _cast(name: str, value: Any, default: Any) -> Any:
    kind = type(default)
    if kind is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ImproperlyConfigured(f"{name} must be a list of strings, got {value!r}.")
        return tuple(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"{name} must be True or False, got {value!r}.")
        return value
    if kind is str:
        return "" if value is None else str(value)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}.")
    try:
        number = kind(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}.") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {value!r}.")
    return number


@functools.cache
def get() -> Settings:
    """The settings in force (built on first use)."""
    return Settings.from_django()


@receiver(setting_changed)
def _forget(setting: str = "", **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        get.cache_clear()


def reference() -> str:
    """The settings reference as Markdown: one row per field, from the class above."""
    import inspect

    comments: dict[str, str] = {}
    for line in inspect.getsource(Settings).splitlines():
        head, _, comment = line.partition("#")
        field_name = head.strip().split(":", 1)[0]
        if comment and field_name and field_name.isidentifier():
            comments[field_name] = comment.strip()
    rows = ["| Django setting | default | meaning |", "| --- | --- | --- |"]
    for field in dataclasses.fields(Settings):
        default = field.default
        shown = list(default) if isinstance(default, tuple) else default
        rows.append(f"| `{PREFIX}{field.name.upper()}` | `{shown!r}` | {comments.get(field.name, '')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the reference for docs/configuration.md
    sys.stdout.write(reference())
