"""``/healthz``: is this deployment able to do its work? 200 when every part is, 503 naming the parts that are not.

Parts checked, each with a bounded wait:

- ``database``: a round trip to PostgreSQL (``connect_timeout`` and ``statement_timeout`` bound it).
- ``broker``: a Redis ``PING`` with a 2 s socket timeout (other brokers: a kombu connection).
- ``beat``: the leading beat's heartbeat is younger than ``SCHEDULING_HEALTH_BEAT_MAX_AGE_SECONDS``
  (the leader writes it every 5 s, so 30 s means several missed beats, not one slow one), or no
  periodic task is enabled (then no beat is needed: ``ok`` with ``"needed": false``).
- ``backlog``: pending jobs past their due time are at most ``SCHEDULING_HEALTH_MAX_BACKLOG``,
  counting only what the operator asked for: the system's own jobs (no owner: scheduled by code)
  and every job of a kind registered with ``critical=True``. Other owners' jobs of other kinds are
  not counted, so no API caller can flip ``/healthz`` (``status()`` and ``/metrics`` count all).

Database failures are caught as ``django.db.Error``: a connection closed under the process raises
``InterfaceError``, which is not a ``DatabaseError``. ``beat`` and ``backlog`` read the database;
when it is down they are reported ``skipped``, and only ``database`` is named as failing. The body
never holds payloads or personal data. Anonymous callers (load balancers) get the status of each
part only; the details (errors naming hosts, ports and databases, latencies, counts) need the
metrics token or a user with ``scheduling.view_scheduledjob``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import kombu
import redis
from django import db
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from django_celery_beat.models import PeriodicTask
from kombu import exceptions as kombu_exceptions

from scheduling.core import broker, conf, registry
from scheduling.core import store as core_store
from scheduling.web import store

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_SECONDS = 2.0

OK, FAILING, SKIPPED = "ok", "failing", "skipped"


def beat_max_age_seconds() -> float:
    return conf.get().health_beat_max_age_seconds


def max_backlog() -> int:
    return conf.get().health_max_backlog


@dataclasses.dataclass
class Part:
    status: str
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, **self.detail}


def check_database() -> Part:
    started = time.monotonic()
    try:
        core_store.database_now()
    except db.Error as exc:
        logger.warning("health: database unreachable", extra={"part": "database", "error": type(exc).__name__})
        return Part(FAILING, {"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"})
    return Part(OK, {"latency_ms": round((time.monotonic() - started) * 1000, 1)})


def ping_broker(url: str, timeout: float = BROKER_TIMEOUT_SECONDS) -> None:
    """Raise unless the broker at ``url`` answers within ``timeout`` seconds."""
    if url.startswith(("redis://", "rediss://", "unix://", broker.SENTINEL_SCHEME)):
        if url.startswith(broker.SENTINEL_SCHEME):
            client = broker.sentinel_client(url, str(broker.transport_options().get("master_name") or ""), timeout)
        else:
            client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
        return
    with kombu.Connection(url, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)


def check_broker() -> Part:
    started = time.monotonic()
    try:
        ping_broker(broker.broker_url())
    except (redis.RedisError, OSError, kombu_exceptions.OperationalError) as exc:
        logger.warning("health: broker unreachable", extra={"part": "broker", "error": type(exc).__name__})
        return Part(FAILING, {"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"})
    return Part(OK, {"latency_ms": round((time.monotonic() - started) * 1000, 1)})


def beat_needed() -> bool:
    """Beat has work only when a periodic task is enabled (fixed-time schedules or plain beat entries).

    due_at jobs and deferrals need no beat: a deployment without schedules runs none, and its
    health does not depend on one.
    """
    return PeriodicTask.objects.filter(enabled=True).exists()


def check_beat() -> Part:
    limit = beat_max_age_seconds()
    beat = store.beat_heartbeat("beat")
    detail: dict[str, Any] = {"max_age_seconds": limit}
    if beat is not None:
        detail["heartbeat_age_seconds"] = round(beat.age_seconds, 1)
    if beat is not None and beat.age_seconds <= limit:
        return Part(OK, detail)
    if not beat_needed():
        return Part(OK, {**detail, "needed": False, "note": "no periodic task is enabled: no beat is needed"})
    if beat is None:
        return Part(FAILING, {**detail, "error": "no beat process has ever led"})
    return Part(FAILING, {**detail, "error": f"the beat leader's heartbeat is {beat.age_seconds:.0f}s old"})


def critical_kinds() -> list[str]:
    """The kinds registered with ``critical=True``: their overdue jobs count whoever owns them."""
    return sorted(name for name, kind in registry.all_kinds().items() if kind.critical)


def check_backlog() -> Part:
    limit = max_backlog()
    critical = critical_kinds()
    counted = store.health_backlog(critical, limit)  # exact up to limit + 1: enough to judge
    shown = f"more than {limit}" if counted.backlog > limit else str(counted.backlog)
    detail = {
        "backlog": counted.backlog,
        "threshold": limit,
        "oldest_overdue_seconds": round(float(counted.oldest_overdue_seconds), 1),
        "counts": "the system's jobs and these critical kinds' jobs",
        "critical_kinds": critical,
    }
    if counted.backlog > limit:
        return Part(FAILING, {**detail, "error": f"{shown} jobs are overdue (threshold {limit})"})
    return Part(OK, detail)


def report() -> tuple[bool, dict[str, Any]]:
    """(healthy, JSON body) for every part."""
    parts: dict[str, Part] = {"database": check_database(), "broker": check_broker()}
    for name, check in (("beat", check_beat), ("backlog", check_backlog)):
        if parts["database"].status != OK:
            parts[name] = Part(SKIPPED, {"error": "not checked: the database is unavailable"})
            continue
        try:
            parts[name] = check()
        except db.Error as exc:
            parts[name] = Part(FAILING, {"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"})
    failing = [name for name, part in parts.items() if part.status == FAILING]
    body = {
        "status": FAILING if failing else OK,
        "failing": failing,
        "checks": {name: part.as_json() for name, part in parts.items()},
    }
    return not failing, body


def may_see_details(request: HttpRequest) -> bool:
    """The metrics token, or a signed-in user allowed to view jobs."""
    from scheduling.web import metrics

    if metrics.has_metrics_token(request):
        return True
    try:  # the session's user is read from the database, which may be the part that is down
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_active and user.has_perm("scheduling.view_scheduledjob"))
    except db.Error:
        return False


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when database, broker, beat and backlog are fine; 503 naming the failing parts otherwise."""
    healthy, body = report()
    if not may_see_details(request):
        body = {**body, "checks": {name: {"status": part["status"]} for name, part in body["checks"].items()}}
    return JsonResponse(body, status=200 if healthy else 503)
