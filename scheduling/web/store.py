"""The web doors' readings: the named blocks of ``web/sql/readings.sql``, read-only.

What the dashboard, ``/metrics``, ``/healthz`` and the admin's beat line read: the leaders'
heartbeats, due-to-start lag, what waits and what is coming, attempt outcomes and the outcome
counters, fixed-time runs per state and the recurrence planner's numbers. Each is bounded to a
recent window and measured on the database clock. Rows come back by column name (``core.db``).
Only ``scheduling.web`` imports this module.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Sequence
from pathlib import Path

from django.db import DatabaseError, transaction

from scheduling.core import db
from scheduling.models import AttemptOutcome, RunState

SQL = db.Statements(Path(__file__).with_name("sql"))


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    holder: str
    acquired_at: dt.datetime
    heartbeat_at: dt.datetime
    age_seconds: float


def beat_heartbeat(role: str = "beat") -> Heartbeat | None:
    """The leading process's heartbeat for ``role`` with its age by the database clock."""
    return SQL.fetch_one(Heartbeat, "beat_heartbeat", {"role": role})


@dataclasses.dataclass(frozen=True)
class LagBucket:
    """One bucket of the lag histogram: bucket i holds lags in [bounds[i-1], bounds[i]) (0: below bounds[0])."""

    bucket: int
    count: int
    total_seconds: float  # the sum of the bucket's lags


def attempt_lag_histogram(window_seconds: float, bounds: Sequence[float]) -> list[LagBucket]:
    """The window's attempts' due-to-start lags per bucket (buckets without attempts are left out)."""
    return SQL.fetch_all(LagBucket, "attempt_lag_histogram", {"window": window_seconds, "bounds": list(bounds)})


@dataclasses.dataclass(frozen=True)
class LagBucketStats:
    """Due-to-start lag of the attempts that started within one bucket (``at`` None: the whole window)."""

    at: dt.datetime | None
    attempts: int
    p50: float
    p99: float
    max: float


def attempt_lag_buckets(
    window_seconds: float, bucket_seconds: float
) -> tuple[LagBucketStats | None, list[LagBucketStats]]:
    """The window's lag percentiles overall (None without attempts) and per bucket, oldest first."""
    rows = [
        row
        for row in SQL.fetch_all(
            LagBucketStats, "attempt_lag_buckets", {"window": window_seconds, "bucket": bucket_seconds}
        )
        if row.attempts  # the whole-window row comes back (with NULLs) even when nothing started
    ]
    overall = next((r for r in rows if r.at is None), None)
    return overall, [r for r in rows if r.at is not None]


@dataclasses.dataclass(frozen=True)
class WaitingPoint:
    at: dt.datetime
    waiting: int  # due and not started: pending, or claimed and not yet started
    paused: int  # due and pending, of a paused kind


def waiting_history(window_seconds: float, points: int) -> list[WaitingPoint]:
    """Waiting and paused work at ``points`` + 1 evenly spaced instants of the window, rebuilt from timestamps."""
    return SQL.fetch_all(WaitingPoint, "waiting_history", {"window": window_seconds, "points": points})


@dataclasses.dataclass(frozen=True)
class UpcomingJobs:
    """Pending jobs of one kind due within one hour of the horizon."""

    kind: str
    hour: int  # hours from now: 0 is the next hour
    count: int
    first_due: dt.datetime


def upcoming_jobs(horizon_seconds: float) -> list[UpcomingJobs]:
    """The pending jobs due within the horizon, per kind and hour from now."""
    return SQL.fetch_all(UpcomingJobs, "upcoming_jobs", {"horizon": horizon_seconds})


@dataclasses.dataclass(frozen=True)
class OutcomeCount:
    kind: str
    outcome: AttemptOutcome
    count: int


def attempt_outcomes(window_seconds: float) -> list[OutcomeCount]:
    """The attempts that ended within the window, per kind and outcome."""
    return SQL.fetch_all(OutcomeCount, "attempt_outcomes", {"window": window_seconds})


@dataclasses.dataclass(frozen=True)
class OutcomeBucket:
    """What finished of one kind in one bucket: ``succeeded`` or ``failed`` attempts, or jobs that became ``dead``."""

    at: dt.datetime
    kind: str
    outcome: str  # succeeded, failed or dead
    count: int


def outcome_buckets(window_seconds: float, bucket_seconds: float) -> list[OutcomeBucket]:
    """Succeeded and failed attempts and jobs that became dead within the window, per bucket and kind, oldest first."""
    return SQL.fetch_all(OutcomeBucket, "outcome_buckets", {"window": window_seconds, "bucket": bucket_seconds})


@dataclasses.dataclass(frozen=True)
class RunStateCount:
    """A fixed-time schedule's runs in one state, with its latest success."""

    schedule: str
    state: RunState
    count: int  # runs started within the window
    last_success: dt.datetime | None  # kept by the history limits, so possibly older than the window


def schedule_run_states(window_seconds: float) -> list[RunStateCount]:
    """The fixed-time runs per schedule and state."""
    return SQL.fetch_all(RunStateCount, "schedule_run_states", {"window": window_seconds})


@dataclasses.dataclass(frozen=True)
class HealthBacklog:
    """The overdue jobs /healthz judges (the system's and critical kinds'), exact up to the limit asked."""

    backlog: int
    oldest_overdue_seconds: float


def health_backlog(critical_kinds: Collection[str], limit: int) -> HealthBacklog:
    return SQL.fetch_all(HealthBacklog, "health_backlog", {"critical": sorted(critical_kinds), "limit": limit})[0]


@dataclasses.dataclass(frozen=True)
class CounterValue:
    metric: str  # job_attempts, jobs_finished, job_retries, jobs_reclaimed, fixed_runs
    label: str  # the kind, or the fixed-time schedule's name
    outcome: str
    value: int


def outcome_counters() -> list[CounterValue]:
    """Every monotonic outcome counter (kept by database triggers; never lowered by pruning)."""
    return SQL.fetch_all(CounterValue, "outcome_counters")


# --- The jobs list's triage ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ErrorClassCount:
    error_class: str  # the text before the first colon of last_error ("ValueError", "claim expired")
    count: int


def error_classes(sample: int, top: int) -> list[ErrorClassCount]:
    """The ``top`` commonest error classes among the ``sample`` most recently changed failed or dead jobs."""
    return SQL.fetch_all(ErrorClassCount, "error_classes", {"sample": sample, "top": top})


def state_counts(cap: int) -> dict[str, int]:
    """Jobs per state, each counted up to ``cap`` + 1 (cap + 1: more than cap)."""
    return SQL.fetch_pairs("state_counts", {"cap": cap})


def valid_jsonpath(path: str) -> bool:
    """Whether PostgreSQL parses ``path`` as a JSON path (checked in a savepoint: a refusal breaks nothing)."""
    try:
        with transaction.atomic():
            SQL.fetch_values("check_jsonpath", {"path": path})
    except DatabaseError:
        return False
    return True


def limit_statement_time(seconds: float) -> None:
    """Stop the current transaction's statements that run longer than ``seconds`` (inside ``transaction.atomic``)."""
    SQL.fetch_values("limit_statement_time", {"ms": str(max(int(seconds * 1000), 1))})


# --- Recurrences -----------------------------------------------------------------------------------


def recurrence_state_counts() -> dict[str, int]:
    return SQL.fetch_pairs("recurrence_state_counts")


@dataclasses.dataclass(frozen=True)
class PlannerLag:
    waiting: int  # active recurrences whose occurrence left pending, next not created yet
    oldest_seconds: float  # since the oldest one's occurrence instant (0 when none waits)


def recurrence_planner_lag() -> PlannerLag:
    return SQL.fetch_all(PlannerLag, "recurrence_planner_lag")[0]


@dataclasses.dataclass(frozen=True)
class UpcomingOccurrences:
    kind: str
    count: int
    first_due: dt.datetime


def upcoming_occurrences(horizon_seconds: float) -> list[UpcomingOccurrences]:
    """Pending recurrence occurrences due within the horizon, per kind."""
    return SQL.fetch_all(UpcomingOccurrences, "upcoming_occurrences", {"horizon": horizon_seconds})
