"""What Timekeeper asks of the broker: send a task message by name, how full a queue is, and the
visibility timeout that bounds every countdown.

Messages are sent by task name (``tasknames``) through Celery's current app, so no mechanism
imports the module that defines the Celery tasks (``scheduling.tasks``, which sits above them).
Queue lengths are an optimisation (back-pressure): if Redis cannot answer, a queue counts as empty.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
from celery import current_app
from django.conf import settings

logger = logging.getLogger(__name__)

REDIS_VISIBILITY_TIMEOUT_DEFAULT_SECONDS = 3600  # kombu's Redis transport default


def send(task_name: str, *, args: list[Any] | None = None, **options: Any) -> Any:
    """Publish one message for ``task_name`` with Celery's options (``eta``, ``time_limit``, ``shadow``...)."""
    return current_app.send_task(task_name, args=args or [], **options)


def visibility_timeout_seconds() -> float:
    """The broker's visibility timeout as Celery will use it."""
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    return float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_DEFAULT_SECONDS))


@functools.cache
def client() -> redis.Redis:
    """A Redis client on the broker's server (the broker URL is a redis:// URL)."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis+socket://", "socket://")):
        path = url.split("://", 1)[1].split("?", 1)[0]
        return redis.Redis(unix_socket_path=path, socket_timeout=2)
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def queued_messages(queue: str | None = None) -> int:
    """Messages waiting in ``queue`` (default: the default queue), not yet taken by a worker; 0 if Redis cannot say."""
    name = queue or settings.CELERY_TASK_DEFAULT_QUEUE
    key = f"{getattr(settings, 'CELERY_BROKER_KEYPREFIX', '')}{name}"
    try:
        return int(client().llen(key))
    except redis.RedisError:
        logger.warning("cannot read the queue length; claiming as if it were empty", exc_info=True)
        return 0
