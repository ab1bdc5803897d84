"""The bare Celery baseline: no Django, no table, the project's Celery settings, its own Redis database.

``celery -A bench.celery_bare worker`` runs ``bare.noop`` (throughput) and ``bare.lag`` (handler start
minus the intended ETA, pushed to a Redis list the benchmark reads).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

BROKER = os.environ.get("BENCH_BARE_BROKER_URL", "redis://127.0.0.1:6379/13")
LAG_KEY = "bench:bare:lag_ms"

app = Celery("bench_bare", broker=BROKER)
app.conf.update(
    # The same delivery settings as the platform's (project/settings.py): JSON, late acks, prefetch 1.
    accept_content=["json"],
    task_serializer="json",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="bare",
)

_redis: redis.Redis | None = None


def connection() -> Any:
    """A broker connection to the bare database with the queue declared (Celery's own setting would
    follow CELERY_BROKER_URL, which points at the platform's database in the benchmark process).
    The Redis transport drops messages sent to a queue nobody has declared yet."""
    conn = app.connection_for_write(BROKER)
    app.amqp.queues["bare"](conn.default_channel).declare()
    return conn


def wait_ready(conn: Any, client: redis.Redis, alive: Any, timeout: float = 60.0) -> None:
    """Send a probe and wait until a worker has taken and acknowledged it (the worker logs at WARNING)."""
    noop.apply_async(connection=conn)
    deadline = time.monotonic() + timeout
    while client.llen("bare") or client.hlen("unacked"):
        if not alive() or time.monotonic() > deadline:
            raise RuntimeError("the bare Celery worker did not start")
        time.sleep(0.05)


def worker_env() -> dict[str, str]:
    """Environment for a bare worker: Celery reads CELERY_BROKER_URL before its own configuration."""
    return {"CELERY_BROKER_URL": BROKER, "BENCH_BARE_BROKER_URL": BROKER}


def _client() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(BROKER)
    return _redis


@app.task(name="bare.noop", ignore_result=True)
def noop() -> None:
    """Do nothing."""


@app.task(name="bare.lag", ignore_result=True)
def lag(eta_epoch: float) -> None:
    """Record how late this handler started relative to the ETA it was sent with."""
    _client().rpush(LAG_KEY, (time.time() - eta_epoch) * 1000)
