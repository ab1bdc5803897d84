"""What the claim asks Redis: which wake-ups were already planned, and how full the queue is.

Both are optimisations only: if Redis cannot answer, every instant is planned again (a duplicate
wake-up costs one cheap claim that finds nothing) and the queue is taken to be empty.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

KEY_PREFIX = "timekeeper:wake:"  # after the deployment's CELERY_BROKER_KEYPREFIX
REMEMBER_SECONDS = 30


@functools.cache
def client() -> redis.Redis:
    """A Redis client on the broker's server (the broker URL is a redis:// URL)."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis+socket://", "socket://")):
        path = url.split("://", 1)[1].split("?", 1)[0]
        return redis.Redis(unix_socket_path=path, socket_timeout=2)
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def mark_planned(buckets: Sequence[int]) -> list[int]:
    """Of ``buckets`` (wake-up instants in resolution units), those not planned before; marks them."""
    if not buckets:
        return []
    try:
        pipe = client().pipeline(transaction=False)
        for bucket in buckets:
            pipe.set(f"{settings.CELERY_BROKER_KEYPREFIX}{KEY_PREFIX}{bucket}", 1, nx=True, ex=REMEMBER_SECONDS)
        answers = pipe.execute()
    except redis.RedisError:
        logger.warning("wake-up memory unavailable; planning every instant", exc_info=True)
        return list(buckets)
    return [bucket for bucket, fresh in zip(buckets, answers, strict=True) if fresh]


def queued_messages() -> int:
    """Messages waiting in the default queue (not yet taken by a worker); 0 if Redis cannot say."""
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    try:
        return int(client().llen(key))
    except redis.RedisError:
        logger.warning("cannot read the queue length; claiming as if it were empty", exc_info=True)
        return 0
