"""Fixed-time examples: a nightly settlement, a minutely metrics aggregation and a cache rebuild.

Each handler is registered like any job kind and its schedule is declared beside it; the
platform's start runs ``manage.py timekeeper sync``, which writes them into django-celery-beat's
tables. The handlers only do their work: the gate (``scheduling.fixed``) has already made sure
the tick runs once, applied the overlap policy and set the timeout. They key their side effects
on ``job.idempotency_key`` (``fixed:<schedule>@<tick>``), stable across retries within a tick.
"""

from __future__ import annotations

import logging
import os
import time

from django.db.models import Count, Sum

from scheduling import registry, schedules
from tasks.models import Execution, Payment, PaymentState

logger = logging.getLogger(__name__)

SLEEP_SCHEMA = {
    "type": "object",
    "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 3600}},
    "additionalProperties": False,
}


@registry.handler("reports.settlement", schema={"type": "object"}, timeout=50 * 60, backoff=registry.Backoff(60, 600))
def settlement(job: registry.Job) -> None:
    """Settle the day's payments: total what succeeded, once per tick."""
    succeeded = Payment.objects.filter(state=PaymentState.SUCCEEDED)
    totals = succeeded.aggregate(count=Count("id"), cents=Sum("amount_cents"))
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    tick = job.due_at.isoformat() if job.due_at else None
    logger.info("settlement done", extra={"tick": tick, "payments": totals["count"], "action": "settled"})


@registry.handler("reports.aggregate_metrics", schema=SLEEP_SCHEMA, timeout=300)
def aggregate_metrics(job: registry.Job) -> None:
    """Aggregate the last minute's metrics; can take longer than a minute (payload "seconds")."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    time.sleep(float(job.payload.get("seconds", 0)))


@registry.handler("reports.rebuild_cache", schema=SLEEP_SCHEMA, timeout=240)
def rebuild_cache(job: registry.Job) -> None:
    """Rebuild a cache from scratch; a newer rebuild makes a running one pointless (payload "seconds")."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    time.sleep(float(job.payload.get("seconds", 0)))


# 03:00 on the Lisbon wall clock, across both clock changes; a run outliving 50 minutes is stopped,
# and a tick while yesterday's run still goes is skipped.
schedules.declare(
    name="nightly-settlement",
    kind="reports.settlement",
    cron="0 3 * * *",
    timezone="Europe/Lisbon",
    concurrency_policy="forbid",
    active_deadline_seconds=50 * 60,
    starting_deadline_seconds=2 * 3600,
    backoff_limit=2,
    missed_policy="run_once",
    successful_history_limit=30,
    failed_history_limit=10,
    description="Nightly settlement at 03:00 Lisbon time",
)

# Every minute; a run may take longer than that, and forbid skips the ticks that would overlap it.
schedules.declare(
    name="metrics-aggregation",
    kind="reports.aggregate_metrics",
    cron="* * * * *",
    concurrency_policy="forbid",
    active_deadline_seconds=55,
    payload={"seconds": 1},
    successful_history_limit=10,
    failed_history_limit=10,
    description="Aggregate metrics every minute (overlapping ticks are skipped)",
)

# A newer rebuild replaces a running one: only the latest data matters.
schedules.declare(
    name="cache-rebuild",
    kind="reports.rebuild_cache",
    cron="*/5 * * * *",
    concurrency_policy="replace",
    active_deadline_seconds=240,
    payload={"seconds": 2},
    description="Rebuild the cache every 5 minutes (a new rebuild replaces a running one)",
)
