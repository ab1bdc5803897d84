"""Fixtures of the due_at engine's integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings

from scheduling.core import broker


@pytest.fixture
def queue() -> Iterator[str]:
    """The job queue's Redis key for this run, empty before and after the test."""
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    broker.client().delete(key)
    yield key
    broker.client().delete(key)
