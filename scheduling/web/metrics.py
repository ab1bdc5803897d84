"""``/metrics`` in Prometheus text format: a collector that reads PostgreSQL and Redis at scrape time.

Nothing is counted in process memory, so every web process answers the same and a restart loses
nothing. The database is the record; these are views of it:

- Gauges of the moment: ``timekeeper_backlog_jobs`` (pending and due), ``timekeeper_oldest_overdue_seconds``,
  ``timekeeper_pending_jobs``, ``timekeeper_claimed_jobs``, ``timekeeper_stuck_jobs``,
  ``timekeeper_due_next_24h_jobs``, ``timekeeper_dead_jobs_last_24h``,
  ``timekeeper_beat_heartbeat_age_seconds``, and the broker's ``timekeeper_broker_delayed_messages``
  (countdowns not yet due) with ``timekeeper_broker_messages{state}``.
- Activity over the last ``SCHEDULING_METRICS_WINDOW_SECONDS`` (default 300, exported as
  ``timekeeper_metrics_window_seconds``): ``timekeeper_job_attempts_recent{kind,outcome}``,
  ``timekeeper_fixed_runs_recent{schedule,state}`` and the ``timekeeper_due_to_start_lag_seconds``
  histogram (attempt start minus its due time). These are gauges over a sliding window, not
  counters: history is pruned (``SCHEDULING_RETENTION_DAYS`` and the run history limits), so a
  count of rows would go down, and ``rate()`` would read that as a reset. Divide by the window for
  a rate; ``histogram_quantile()`` applies to the histogram as it is (no ``rate()``).
- ``timekeeper_fixed_last_success_timestamp_seconds{schedule}`` for "the nightly job did not run" alerts.
- Counters that survive pruning and restarts (``*_total``; ``rate()`` and ``increase()`` apply):
  ``timekeeper_job_attempts_total{kind,outcome}``, ``timekeeper_jobs_finished_total{kind,outcome}``
  (done, dead), ``timekeeper_job_retries_total{kind}``, ``timekeeper_jobs_reclaimed_total{kind}`` and
  ``timekeeper_fixed_runs_total{schedule,outcome}``, read from ``scheduling_outcomecounter``, which
  database triggers update in the transaction that records each outcome (migrations 0015 and 0022); and
  ``timekeeper_refused_messages_total{task}``, the ``run_deferred`` and ``run_fixed`` messages
  workers refused for a bad signature (counted by the refusal itself: such a message leaves no row).
- ``timekeeper_control_heartbeat_age_seconds``: since the leading control loop was last seen turning.
- ``timekeeper_up{part}``: 1 when the part (database, broker) answered this scrape; its metrics are
  missing when it did not.

Set ``SCHEDULING_METRICS_TOKEN`` to require ``Authorization: Bearer <token>`` on ``/metrics``.
With ``DEBUG`` off and no token, ``/metrics`` answers 401 unless ``SCHEDULING_METRICS_PUBLIC = True``
opens it on purpose. A scrape reads several aggregates over the job tables (0.2-0.3 s at 100k rows),
so each web process computes the text at most once per ``SCHEDULING_METRICS_CACHE_SECONDS`` (5 s),
one computation at a time; concurrent scrapers wait for it and share it instead of each loading
the database.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from django import db
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from scheduling import api
from scheduling.core import conf, tasknames
from scheduling.web import store

logger = logging.getLogger(__name__)

LAG_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def window_seconds() -> float:
    return conf.get().metrics_window_seconds


def broker_counts() -> dict[str, Any] | None:
    """The broker's message counts from ``scheduling.deferrals.countdowns`` (None when Redis did not answer)."""
    try:
        from scheduling.deferrals import countdowns
    except ImportError:  # the broker path is not installed: no counts, reported as the broker being down
        return None
    return countdowns.broker_counts()


def _gauge(name: str, doc: str, value: float, unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, unit=unit)


def lag_histogram(window: float) -> HistogramMetricFamily:
    """The window's due-to-start lags as a Prometheus histogram (cumulative buckets)."""
    rows = store.attempt_lag_histogram(window, LAG_BUCKETS_SECONDS)
    per_bucket = {row.bucket: row.count for row in rows}
    total_sum = sum(float(row.total_seconds or 0) for row in rows)
    buckets: list[tuple[str, float]] = []
    running = 0
    for i, bound in enumerate(LAG_BUCKETS_SECONDS):
        running += per_bucket.get(i, 0)  # width_bucket index i: lags below bounds[i]
        buckets.append((repr(bound), running))
    buckets.append(("+Inf", running + per_bucket.get(len(LAG_BUCKETS_SECONDS), 0)))
    return HistogramMetricFamily(
        "timekeeper_due_to_start_lag_seconds",
        "How long after its due time each attempt started, over the metrics window.",
        buckets=buckets,
        sum_value=total_sum,
    )


class TimekeeperCollector(Collector):
    """Reads the numbers at scrape time; a part that does not answer is reported by ``timekeeper_up``."""

    def describe(self) -> list[Metric]:
        return []  # no collection at registration time (it would query the database at import)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("timekeeper_up", "1 when the part answered this scrape.", labels=["part"])
        window = window_seconds()
        try:
            database = list(self._database(window))
        except db.Error:
            logger.warning("metrics: the database did not answer", exc_info=True)
            database = []
            up.add_metric(["database"], 0)
        else:
            up.add_metric(["database"], 1)
        yield from database
        counts = broker_counts()
        up.add_metric(["broker"], 0 if counts is None else 1)
        yield from self._queues()
        if counts is not None:
            yield _gauge(
                "timekeeper_broker_delayed_messages",
                "Countdown messages on the broker whose time has not come (held by workers or queued).",
                counts["delayed"],
            )
            by_state = GaugeMetricFamily(
                "timekeeper_broker_messages", "Messages on the broker by state.", labels=["state"]
            )
            for state in ("visible", "delayed", "in_flight"):
                by_state.add_metric([state], counts[state])
            yield by_state
        yield up
        yield _gauge(
            "timekeeper_metrics_window_seconds", "The window of the *_recent metrics and the lag histogram.", window
        )

    def _queues(self) -> Iterator[Metric]:
        """Per named queue: its due jobs and the live workers serving it (for the unserved-queue alert)."""
        try:
            queues = api.queue_status()
        except db.Error:
            return
        due = GaugeMetricFamily("timekeeper_queue_due_jobs", "Pending and due jobs per named queue.", labels=["queue"])
        workers = GaugeMetricFamily(
            "timekeeper_queue_live_workers", "Live workers serving each named queue (-Q).", labels=["queue"]
        )
        for q in queues:
            due.add_metric([q.queue], q.due)
            if q.live_workers is not None:
                workers.add_metric([q.queue], q.live_workers)
        yield due
        yield workers

    def _database(self, window: float) -> Iterator[Metric]:
        status = api.status(include_broker=False)  # read below, apart, so one part failing spares the other
        yield _gauge("timekeeper_backlog_jobs", "Pending jobs whose due time has passed.", status["backlog"])
        yield _gauge("timekeeper_paused_jobs", "Due jobs of paused kinds (waiting on purpose).", status["paused"])
        yield _gauge(
            "timekeeper_rate_limited_jobs",
            "Due jobs of rate-limited kinds (waiting for their rate).",
            status["rate_limited"],
        )
        yield _gauge(
            "timekeeper_oldest_overdue_seconds",
            "Age of the oldest pending job past its due time (0 when none).",
            status["oldest_overdue_seconds"],
        )
        yield _gauge("timekeeper_pending_jobs", "Jobs waiting for their due time or a worker.", status["pending"])
        yield _gauge("timekeeper_claimed_jobs", "Jobs claimed by a worker (running or about to).", status["claimed"])
        yield _gauge("timekeeper_stuck_jobs", "Claimed jobs past their lease or claimed for too long.", status["stuck"])
        yield _gauge("timekeeper_due_next_24h_jobs", "Pending jobs due within 24 hours.", status["due_next_24h"])
        yield _gauge("timekeeper_dead_jobs_last_24h", "Jobs that died in the last 24 hours.", status["dead_last_24h"])
        beat = store.beat_heartbeat("beat")
        if beat is not None:
            yield _gauge(
                "timekeeper_beat_heartbeat_age_seconds",
                "Seconds since the leading beat's heartbeat (database clock).",
                beat.age_seconds,
            )
        attempts = GaugeMetricFamily(
            "timekeeper_job_attempts_recent",
            "Job attempts that ended within the metrics window, by kind and outcome.",
            labels=["kind", "outcome"],
        )
        for counted in store.attempt_outcomes(window):
            attempts.add_metric([counted.kind, counted.outcome.value], counted.count)
        yield attempts
        yield lag_histogram(window)
        runs = GaugeMetricFamily(
            "timekeeper_fixed_runs_recent",
            "Fixed-time runs that started within the metrics window, by schedule and state.",
            labels=["schedule", "state"],
        )
        last_success = GaugeMetricFamily(
            "timekeeper_fixed_last_success_timestamp_seconds",
            "When each fixed-time schedule last finished a run successfully (Unix time).",
            labels=["schedule"],
        )
        latest: dict[str, float] = {}
        for row in store.schedule_run_states(window):
            runs.add_metric([row.schedule, row.state.value], row.count)
            if row.last_success is not None:
                latest[row.schedule] = max(latest.get(row.schedule, 0.0), row.last_success.timestamp())
        for name, at in sorted(latest.items()):
            last_success.add_metric([name], at)
        yield runs
        yield last_success
        control = store.beat_heartbeat("control")
        if control is not None:
            yield _gauge(
                "timekeeper_control_heartbeat_age_seconds",
                "Seconds since the leading control loop (claim and sweep) was last seen turning (database clock).",
                control.age_seconds,
            )
        yield from outcome_counters()
        yield from recurrence_metrics()


# metric in scheduling_outcomecounter -> (Prometheus name without _total, help, label names)
COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "job_attempts": ("timekeeper_job_attempts", "Job attempts ended, by kind and outcome.", ("kind", "outcome")),
    "jobs_finished": (
        "timekeeper_jobs_finished",
        "Jobs that reached a final outcome (done or dead), by kind.",
        ("kind", "outcome"),
    ),
    "job_retries": ("timekeeper_job_retries", "Failed or timed-out attempts followed by a retry, by kind.", ("kind",)),
    "jobs_reclaimed": (
        "timekeeper_jobs_reclaimed",
        "Claims taken back (expired lease, worker shutdown), by kind.",
        ("kind",),
    ),
    "fixed_runs": (
        "timekeeper_fixed_runs",
        "Fixed-time runs that ended, by schedule and outcome (succeeded, failed, skipped, missed, ...).",
        ("schedule", "outcome"),
    ),
    "refused_messages": (
        "timekeeper_refused_messages",
        "Broker messages a worker refused because their signature does not check (not sent by defer(), beat "
        "or run now: a forged message, or a worker with another SECRET_KEY), by task.",
        ("task",),
    ),
}

REFUSABLE_TASKS = (tasknames.RUN_DEFERRED, tasknames.RUN_FIXED)  # the tasks whose unsigned messages are refused


def outcome_counters() -> Iterator[Metric]:
    """The ``*_total`` counters, from the table the outcome triggers keep (they survive pruning and restarts)."""
    families = {
        metric: CounterMetricFamily(name, doc, labels=list(labels)) for metric, (name, doc, labels) in COUNTERS.items()
    }
    rows = store.outcome_counters()
    counted = {row.label for row in rows if row.metric == "refused_messages"}
    for task in REFUSABLE_TASKS:  # from 0, so that the first refusal is an increase() too
        if task not in counted:
            families["refused_messages"].add_metric([task], 0)
    for row in rows:
        family = families.get(row.metric)
        if family is None:
            continue
        values = [row.label, row.outcome] if len(COUNTERS[row.metric][2]) == 2 else [row.label]
        family.add_metric(values, row.value)
    yield from families.values()


def recurrence_metrics() -> Iterator[Metric]:
    """Recurrences by state, and the planner's lag (occurrences left pending whose next is not created yet)."""
    by_state = GaugeMetricFamily("timekeeper_recurrences", "Recurrences by state.", labels=["state"])
    counts = store.recurrence_state_counts()
    for state in ("active", "paused", "cancelled", "ended"):
        by_state.add_metric([state], counts.get(state, 0))
    yield by_state
    lag = store.recurrence_planner_lag()
    yield _gauge(
        "timekeeper_recurrence_planner_lag_recurrences",
        "Active recurrences whose occurrence has left pending but whose next occurrence is not created yet.",
        lag.waiting,
    )
    yield _gauge(
        "timekeeper_recurrence_planner_lag_seconds",
        "Age of the oldest of those, since its occurrence instant (0 when none).",
        lag.oldest_seconds,
    )


registry = CollectorRegistry(auto_describe=False)
registry.register(TimekeeperCollector())


def has_metrics_token(request: HttpRequest) -> bool:
    """Whether ``request`` carries the configured metrics token (False when none is configured)."""
    expected = conf.get().metrics_token
    if not expected:
        return False
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {expected}".encode())


def _authorised(request: HttpRequest) -> bool:
    settings = conf.get()
    if settings.metrics_token:
        return has_metrics_token(request)
    return settings.metrics_public or bool(django_settings.DEBUG)


_cache_lock = threading.Lock()
_cached: tuple[float, bytes] | None = None  # (time.monotonic() when computed, exposition text)


def exposition() -> bytes:
    """The exposition text, recomputed at most once per cache period and by one thread at a time."""
    global _cached
    period = conf.get().metrics_cache_seconds
    cached = _cached
    if cached is not None and time.monotonic() - cached[0] < period:
        return cached[1]
    with _cache_lock:
        cached = _cached
        if cached is not None and time.monotonic() - cached[0] < period:
            return cached[1]  # another scrape computed it while this one waited
        text = generate_latest(registry)
        _cached = (time.monotonic(), text)
        return text


def forget_cached() -> None:
    """Drop the cached text (tests, and after a settings change)."""
    global _cached
    _cached = None


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition of ``registry`` (cached for a few seconds)."""
    if not _authorised(request):
        response = HttpResponse(
            "metrics need 'Authorization: Bearer <token>' (SCHEDULING_METRICS_TOKEN); "
            "SCHEDULING_METRICS_PUBLIC=True opens them\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="timekeeper-metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
