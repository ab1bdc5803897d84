"""Fixtures for end-to-end tests with real Celery processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from tests.e2e import harness


@pytest.fixture
def broker() -> redis.Redis:
    """The test Redis database, with this run's keys (its prefix) deleted before the test."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    prefix = settings.CELERY_BROKER_KEYPREFIX
    assert prefix, "tests must run with a per-run Redis key prefix (tests/settings.py sets one)"
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    return client


@pytest.fixture
def cluster(request: pytest.FixtureRequest, transactional_db: None, broker: redis.Redis) -> Iterator[harness.Cluster]:
    """Start workers and beats with ``cluster.worker()`` / ``cluster.beat()``; all are stopped afterwards.

    Depends on ``transactional_db`` so rows are committed (the processes see them) and so that the
    processes are stopped before the tables are flushed.
    """
    log_dir = harness.ARTIFACTS / "e2e" / request.node.name.replace("/", "_").replace("[", "_").replace("]", "")
    for old in log_dir.glob("*"):
        old.unlink()
    group = harness.Cluster(log_dir)
    yield group
    group.stop()
