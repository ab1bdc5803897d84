"""The admin index dashboard: what waits, what is late, what is running, who leads beat, what is coming.

Everything is read when the page (or its refresh) is drawn, by the database clock. The page asks
for its body again every few seconds (``fragment``, a server-rendered piece of HTML fetched by a
dozen lines of JavaScript), so it stays true without a reload. A range (15 min, 1 h, 6 h, 24 h)
sets the history charts' window; each chart has 60 buckets in it.

- **Lag**: p50 and p99 of the due-to-start lag per bucket (``JobAttempt``: started_at minus due_at,
  so attempts appear when they end). The axis stops at the whole window's p99, in one unit chosen
  from it; points above it are marked, so one job moved two days into the past cannot flatten a
  burst that waited 40 s.
- **Waiting**: due work not yet started: pending (not paused), claimed but not started, and the
  broker's visible messages other than the batches of those claimed jobs (now only: the broker
  keeps no history); paused work apart.
- **Finished**: succeeded and failed attempts and jobs that became dead, per minute (the rate over
  each bucket), for every kind, one (``?kind=``) or one queue's kinds (``?queue=``); beside it, per kind
  and per queue, the window's counts and, per kind, the
  totals of the outcome counters (``scheduling_outcomecounter``, /metrics' ``*_total``), which
  survive pruning.
- **Waiting and lag count from the later of due time and creation**: a job scheduled into the past
  did not wait before it existed, so one backdated job cannot fill the waiting chart's past hour
  or put its p99 at days.
- **Estimates are marked**: a count past ``SCHEDULING_STATUS_EXACT_LIMIT`` is the planner's
  estimate (``api.status()['estimated']``) and shows with "≈".
- **Next 24 hours**: due_at rows (recurrences' pending occurrences among them, counted apart in
  the totals), fixed-time ticks and broker countdowns per hour. A schedule
  firing more often than every ``FREQUENT_TICK_SECONDS`` is counted in the table, not drawn, so
  one every-minute schedule does not swamp the rest.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Collection
from typing import Any

from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from scheduling import api
from scheduling.core import conf, exceptions, kind_options
from scheduling.core import store as core_store
from scheduling.web import health, store, svg

logger = logging.getLogger(__name__)

RANGES = {"15m": 900, "1h": 3600, "6h": 21_600, "24h": 86_400}  # the history charts' windows, in seconds
DEFAULT_RANGE = "1h"
HISTORY_POINTS = 60  # buckets (lag) and samples (waiting) per window: one a minute over an hour
REFRESH_SECONDS = 5  # how often the open page asks for its body again
FREQUENT_TICK_SECONDS = 900  # fixed-time schedules firing more often than this are listed, not drawn
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

    @property
    def frequent(self) -> bool:
        """Fires more often than every ``FREQUENT_TICK_SECONDS`` (drawn apart from the next-24-hours bars)."""
        return self.ticks > HORIZON_SECONDS // FREQUENT_TICK_SECONDS


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


def recurrences_outlook() -> dict[str, int]:
    """Recurrences' pending occurrences due within 24 hours (also counted as due_at jobs), and the active ones."""
    occurrences = sum(row.count for row in store.upcoming_occurrences(HORIZON_SECONDS))
    return {"occurrences": occurrences, "active": store.recurrence_state_counts().get("active", 0)}


OUTCOMES = ("succeeded", "failed", "dead")  # the finished chart's series, in its palette's order
# attempt outcomes the chart counts as failed (a snooze or a handler's cancel is not a failure)
ATTEMPT_FAILURES = ("failed", "timed_out", "reclaimed", "retry_after", "discarded")


@dataclasses.dataclass(frozen=True)
class KindOutcomes:
    """One kind's finished work: in the window, and since the outcome counters began (they survive pruning)."""

    kind: str
    window: dict[str, int]  # succeeded, failed, dead within the window
    total: dict[str, int]  # the same from the *_total counters


def kind_outcomes(buckets: list[store.OutcomeBucket]) -> list[KindOutcomes]:
    """Per kind, what finished within the window (from ``buckets``) and in all (from the outcome counters)."""
    window: dict[str, dict[str, int]] = {}
    for b in buckets:
        counts = window.setdefault(b.kind, dict.fromkeys(OUTCOMES, 0))
        counts[b.outcome] += b.count
    total: dict[str, dict[str, int]] = {}
    for row in store.outcome_counters():
        if row.metric == "job_attempts" and row.outcome == "succeeded":
            total.setdefault(row.label, dict.fromkeys(OUTCOMES, 0))["succeeded"] += row.value
        elif row.metric == "job_attempts" and row.outcome in ATTEMPT_FAILURES:
            total.setdefault(row.label, dict.fromkeys(OUTCOMES, 0))["failed"] += row.value
        elif row.metric == "jobs_finished" and row.outcome == "dead":
            total.setdefault(row.label, dict.fromkeys(OUTCOMES, 0))["dead"] += row.value
    return [
        KindOutcomes(kind, window.get(kind, dict.fromkeys(OUTCOMES, 0)), total.get(kind, dict.fromkeys(OUTCOMES, 0)))
        for kind in sorted(set(window) | set(total))
    ]


@dataclasses.dataclass(frozen=True)
class QueueOutcomes:
    """One named queue's finished work within the window: its kinds' counts added up."""

    queue: str
    kinds: tuple[str, ...]
    window: dict[str, int]  # succeeded, failed, dead within the window


def queue_outcomes(outcomes: list[KindOutcomes], queue_of: dict[str, str]) -> list[QueueOutcomes]:
    """Per queue (a kind's named queue; ``default`` for a kind no longer registered), the window's counts."""
    kinds: dict[str, list[str]] = {}
    window: dict[str, dict[str, int]] = {}
    for k in outcomes:
        queue = queue_of.get(k.kind, "default")
        kinds.setdefault(queue, []).append(k.kind)
        counts = window.setdefault(queue, dict.fromkeys(OUTCOMES, 0))
        for outcome in OUTCOMES:
            counts[outcome] += k.window[outcome]
    return [QueueOutcomes(q, tuple(kinds[q]), window[q]) for q in sorted(kinds)]


def finished_series(
    buckets: list[store.OutcomeBucket],
    kinds: Collection[str] | None,
    start: dt.datetime,
    now: dt.datetime,
    bucket_seconds: float,
) -> list[svg.Series]:
    """Succeeded, failed and dead per minute of ``kinds`` (None: every kind), every bucket drawn (0 if none)."""
    step = dt.timedelta(seconds=bucket_seconds)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    first = epoch + step * ((start - epoch) // step)  # date_bin's bucket holding the window's start
    slots = [first + step * i for i in range(int((now - first) / step) + 1)]
    counts = {outcome: dict.fromkeys(slots, 0) for outcome in OUTCOMES}
    matched = [b for b in buckets if (kinds is None or b.kind in kinds) and b.at in counts[b.outcome]]
    if not matched:
        return [svg.Series(outcome, []) for outcome in OUTCOMES]  # drawn as "nothing finished"
    for b in matched:
        counts[b.outcome][b.at] += b.count
    per_minute = 60.0 / bucket_seconds
    return [  # dead dashed: every dead job's last attempt also failed, so its line often lies on failed's
        svg.Series(
            outcome, [(max(at, start), n * per_minute) for at, n in counts[outcome].items()], dashed=outcome == "dead"
        )
        for outcome in OUTCOMES
    ]


def range_key(value: str | None) -> str:
    """A known range's key (15m, 1h, 6h, 24h); anything else is the default."""
    return value if value in RANGES else DEFAULT_RANGE


def gather(range_name: str | None = None, kind: str | None = None, queue: str | None = None) -> dict[str, Any]:
    """Every number and chart the dashboard shows, over the history range ``range_name``; the finished chart for
    ``kind``, else for the kinds of ``queue`` (every kind when both are None or unknown)."""
    key = range_key(range_name)
    window = RANGES[key]
    now = core_store.database_now()
    status = api.status()  # with the broker's counts (None when Redis does not answer)
    beat = store.beat_heartbeat("beat")
    broker = status["broker"]
    upcoming = store.upcoming_jobs(HORIZON_SECONDS)
    fixed = fixed_outlook(now)
    kinds_overview = api.kind_overview()

    jobs_per_hour = [0] * 24
    kinds: dict[str, dict[str, Any]] = {}
    for row in upcoming:
        jobs_per_hour[min(max(row.hour, 0), 23)] += row.count
        entry = kinds.setdefault(row.kind, {"kind": row.kind, "count": 0, "first_due": row.first_due})
        entry["count"] += row.count
        entry["first_due"] = min(entry["first_due"], row.first_due)
    drawn = [f for f in fixed if not f.frequent]
    fixed_per_hour = [sum(f.per_hour[h] for f in drawn) for h in range(24)]
    delayed = broker["delayed"] if broker is not None else None
    visible = broker["visible"] if broker is not None else None
    broker_per_hour = [delayed or 0] + [0] * 23

    start = now - dt.timedelta(seconds=window)
    overall, lag = store.attempt_lag_buckets(window, window / HISTORY_POINTS)
    history = store.waiting_history(window, HISTORY_POINTS)
    bucket_seconds = window / HISTORY_POINTS
    finished = store.outcome_buckets(window, bucket_seconds)
    outcomes = kind_outcomes(finished)
    queues = queue_outcomes(outcomes, {k.kind: k.queue for k in kinds_overview})
    if kind not in {k.kind for k in outcomes}:
        kind = None
    chosen = next((q for q in queues if q.queue == queue), None) if kind is None else None
    shown = f"queue {chosen.queue}" if chosen else kind or "every kind"
    charted = [kind] if kind else (chosen.kinds if chosen else None)
    local_now = timezone.localtime(now)
    hour_labels = [f"{(local_now + dt.timedelta(hours=h)):%H}h" for h in range(24)]
    claimed_waiting = sum(k.claimed for k in kinds_overview)
    running = sum(k.running for k in kinds_overview)
    # Visible batch messages carry claimed jobs, already counted: only the other visible messages add.
    visible_other = (visible or 0) - (broker["visible_batches"] if broker is not None else 0)
    waiting = status["backlog"] + claimed_waiting + visible_other

    waiting_series = [svg.Series("due, not started", [(p.at, float(p.waiting)) for p in history])]
    if any(p.paused for p in history):
        waiting_series.append(svg.Series("paused", [(p.at, float(p.paused)) for p in history]))
    if visible:
        waiting_series.append(svg.Series("broker visible (now)", [(now, float(visible))]))

    return {
        "now": now,
        "range": key,
        "ranges": list(RANGES),
        "refresh_seconds": REFRESH_SECONDS,
        "exact_limit": conf.get().status_exact_limit,
        "status": status,
        "waiting": {
            "total": waiting,
            "due": status["backlog"],
            "claimed": claimed_waiting,
            "broker": visible,
            "broker_other": visible_other if broker is not None else None,
            "running": running,
        },
        "beat": beat,
        "beat_fresh": beat is not None and beat.age_seconds <= health.beat_max_age_seconds(),
        "beat_max_age_seconds": health.beat_max_age_seconds(),
        "broker": broker,
        "kinds": [
            k
            for k in kinds_overview
            if k.due or k.claimed or k.running or k.dead_24h or k.paused or any(v for _, v in k.option_values) or k.rate
        ],
        "kind_options": kind_options.KIND_OPTIONS,  # a column each in the kinds table
        "next24": {
            "jobs": sum(jobs_per_hour),
            "fixed": sum(f.ticks for f in fixed),
            "fixed_capped": any(f.capped for f in fixed),
            "frequent": [f for f in fixed if f.frequent],
            "broker": delayed,
            "kinds": sorted(kinds.values(), key=lambda k: k["first_due"]),
            "schedules": fixed,
            "recurrences": recurrences_outlook(),
        },
        "lag_chart": svg.lag_chart(
            [
                svg.Series("p50", [(b.at, b.p50) for b in lag if b.at is not None]),
                svg.Series("p99", [(b.at, b.p99) for b in lag if b.at is not None]),
            ],
            start=start,
            end=now,
            title=f"Due-to-start lag, p50 and p99 per {svg.span_text(window / HISTORY_POINTS).strip()}",
            clip_at=overall.p99 if overall else None,
        ),
        "lag": overall,
        "waiting_chart": svg.line_chart(
            waiting_series,
            start=start,
            end=now,
            title="Waiting work (due, not started) and paused work",
        ),
        "finished_kind": kind,
        "finished_queue": chosen.queue if chosen else None,
        "kind_outcomes": outcomes,
        "queue_outcomes": queues,
        "finished_chart": svg.line_chart(
            finished_series(finished, charted, start, now, bucket_seconds),
            start=start,
            end=now,
            title=f"Finished per minute ({shown}): succeeded, failed, dead",
            value_text=lambda value: f"{value:,.3g}/min" if value else "0",
            empty_text="nothing finished in this period",
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
