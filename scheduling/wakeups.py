"""What the claim asks Redis: how full the queue is (back-pressure), through one shared client.

An optimisation only: if Redis cannot answer, the queue is taken to be empty.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings

logger = logging.getLogger(__name__)


@functools.cache
def client() -> redis.Redis:
    """A Redis client on the broker's server (the broker URL is a redis:// URL)."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis+socket://", "socket://")):
        path = url.split("://", 1)[1].split("?", 1)[0]
        return redis.Redis(unix_socket_path=path, socket_timeout=2)
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def queued_messages() -> int:
    """Messages waiting in the default queue (not yet taken by a worker); 0 if Redis cannot say."""
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    try:
        return int(client().llen(key))
    except redis.RedisError:
        logger.warning("cannot read the queue length; claiming as if it were empty", exc_info=True)
        return 0
