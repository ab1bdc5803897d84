"""Remembering which wake-up instants were already planned, in Redis, so overlapping ticks send one each.

The memory is an optimisation only: if Redis cannot answer, every instant is planned again
(a duplicate wake-up costs one cheap claim that finds nothing).
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
