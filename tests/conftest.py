"""Shared fixtures: raw connections to the test database, and a clean broker database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
import redis
from django.conf import settings
from django.db import connection


@pytest.fixture
def raw_connect(transactional_db: None) -> Iterator[Callable[..., Any]]:
    """Open extra psycopg2 connections to the test database (closed at the end of the test)."""
    opened: list[Any] = []

    def connect(autocommit: bool = False) -> Any:
        s = connection.settings_dict
        conn = psycopg2.connect(
            dbname=s["NAME"],
            user=s["USER"] or None,
            password=s["PASSWORD"] or None,
            host=s["HOST"] or None,
            port=s["PORT"] or None,
        )
        conn.autocommit = autocommit
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


@pytest.fixture
def run_sql() -> Callable[..., list[tuple[Any, ...]]]:
    """Run a statement on Django's connection and return its rows (empty when it returns none)."""

    def run(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    return run


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """The broker's Redis, with this test run's keys (its per-run key prefix) removed before and after."""
    prefix = getattr(settings, "CELERY_BROKER_KEYPREFIX", "")
    assert prefix, "tests run with a per-run Redis key prefix (tests/settings.py)"
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)

    def clean() -> None:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)

    clean()
    yield client
    clean()
    client.close()
