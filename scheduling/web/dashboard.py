"""The admin index dashboard: what is late, what is running, who leads beat, what the next 24 hours hold.

Everything is read when the page is drawn, by the database clock. The two charts cover the last
hour: the due-to-start lag per minute (from ``JobAttempt``: started_at minus due_at, so attempts
appear when they end) and the backlog per minute, rebuilt from row timestamps (see the
``backlog_history`` query for what that reconstruction can and cannot see). The next 24 hours
count due_at rows per hour, fixed-time ticks per hour (``policies.preview``) and the broker's
delayed countdowns, which are all due within the broker ceiling (minutes), so in the first hour.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from scheduling import api
from scheduling.core import exceptions, store
from scheduling.web import health, svg

logger = logging.getLogger(__name__)

HISTORY_SECONDS = 3600  # the charts cover the last hour
HISTORY_POINTS = 60  # one backlog sample per minute
HORIZON_SECONDS = 86_400  # "the next 24 hours"
FIXED_TICKS_CAP = 1440  # ticks counted per schedule in the horizon (one a minute); more show as "1440+"


@dataclasses.dataclass(frozen=True)
class FixedOutlook:
    """A fixed-time schedule's ticks within the horizon."""

    task_id: int
    name: str
    description: str
    ticks: int
    capped: bool
    next_tick: dt.datetime | None
    per_hour: list[int]
    error: str = ""


def fixed_outlook(now: dt.datetime) -> list[FixedOutlook]:
    """Every enabled, unsuspended fixed-time schedule's ticks in the next 24 hours."""
    from scheduling.fixed import policies

    end = now + dt.timedelta(seconds=HORIZON_SECONDS)
    out: list[FixedOutlook] = []
    tasks = (
        PeriodicTask.objects.filter(enabled=True, policy__isnull=False, policy__suspend=False)
        .select_related("policy", "crontab", "interval")
        .order_by("name")
    )
    for task in tasks:
        try:
            upcoming = [t for t in policies.preview(task, n=FIXED_TICKS_CAP + 1, after=now) if t <= end]
        except exceptions.SchedulingError as exc:
            out.append(FixedOutlook(task.pk, task.name, "", 0, False, None, [0] * 24, error=str(exc)))
            continue
        per_hour = [0] * 24
        for tick in upcoming[:FIXED_TICKS_CAP]:
            per_hour[min(int((tick - now).total_seconds() // 3600), 23)] += 1
        out.append(
            FixedOutlook(
                task.pk,
                task.name,
                policies.describe(task),
                min(len(upcoming), FIXED_TICKS_CAP),
                len(upcoming) > FIXED_TICKS_CAP,
                upcoming[0] if upcoming else None,
                per_hour,
            )
        )
    return out


def gather() -> dict[str, Any]:
    """Every number and chart the dashboard shows."""
    now = store.database_now()
    status = api.status()  # with the broker's counts (None when Redis does not answer)
    beat = store.beat_heartbeat("beat")
    broker = status["broker"]
    upcoming = store.upcoming_jobs(HORIZON_SECONDS)
    fixed = fixed_outlook(now)

    jobs_per_hour = [0] * 24
    kinds: dict[str, dict[str, Any]] = {}
    for row in upcoming:
        jobs_per_hour[min(max(row.hour, 0), 23)] += row.count
        entry = kinds.setdefault(row.kind, {"kind": row.kind, "count": 0, "first_due": row.first_due})
        entry["count"] += row.count
        entry["first_due"] = min(entry["first_due"], row.first_due)
    fixed_per_hour = [sum(f.per_hour[h] for f in fixed) for h in range(24)]
    delayed = broker["delayed"] if broker is not None else None
    broker_per_hour = [delayed or 0] + [0] * 23

    start = now - dt.timedelta(seconds=HISTORY_SECONDS)
    lag = store.attempt_lag_by_minute(HISTORY_SECONDS)
    backlog = store.backlog_history(HISTORY_SECONDS, HISTORY_POINTS)
    local_now = timezone.localtime(now)
    hour_labels = [f"{(local_now + dt.timedelta(hours=h)):%H}h" for h in range(24)]

    return {
        "now": now,
        "status": status,
        "beat": beat,
        "beat_fresh": beat is not None and beat.age_seconds <= health.beat_max_age_seconds(),
        "beat_max_age_seconds": health.beat_max_age_seconds(),
        "broker": broker,
        "next24": {
            "jobs": sum(jobs_per_hour),
            "fixed": sum(f.ticks for f in fixed),
            "fixed_capped": any(f.capped for f in fixed),
            "broker": delayed,
            "kinds": sorted(kinds.values(), key=lambda k: k["first_due"]),
            "schedules": fixed,
        },
        "lag_chart": svg.line_chart(
            [
                svg.Series("p50", [(m.minute, m.p50) for m in lag]),
                svg.Series("p95", [(m.minute, m.p95) for m in lag]),
                svg.Series("max", [(m.minute, m.max) for m in lag]),
            ],
            start=start,
            end=now,
            title="Due-to-start lag per minute, last hour",
            value_text=svg.seconds_text,
            empty_text="no attempts ended in the last hour",
        ),
        "lag_attempts": sum(m.attempts for m in lag),
        "backlog_chart": svg.line_chart(
            [svg.Series("backlog", [(point.at, float(point.backlog)) for point in backlog])],
            start=start,
            end=now,
            title="Backlog (pending and overdue), last hour",
        ),
        "next24_chart": svg.stacked_bars(
            [
                ("due_at jobs", jobs_per_hour),
                ("fixed-time ticks", fixed_per_hour),
                ("broker countdowns", broker_per_hour),
            ],
            labels=hour_labels,
            title="Work due per hour, next 24 hours",
        ),
    }
