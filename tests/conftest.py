"""Shared fixtures: raw connections to the test database, and a clean broker database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
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


# --- Each level holds what it needs ------------------------------------------------------------------

SERVICE_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                    "live_server", "raw_connect", "broker", "cluster"}  # fmt: skip
LEVEL_OF_MARKER = {"e2e": "e2e", "browser": "browser"}  # a test with this marker lives under tests/<level>/


def misplaced(level: str, markers: set[str], fixtures: set[str]) -> str | None:
    """Why a test at ``tests/<level>/`` with these markers and fixtures is in the wrong place, or None."""
    if level == "unit":
        used = sorted(fixtures & SERVICE_FIXTURES) + (["django_db"] if "django_db" in markers else [])
        if used:
            return f"a unit test touches no service, but it uses {', '.join(used)}: move it to tests/integration"
    for marker, home in LEVEL_OF_MARKER.items():
        if marker in markers and level != home:
            return f"a test marked {marker} lives under tests/{home}/, not tests/{level}/"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse the run when a test sits at the wrong level (see ``misplaced``)."""
    tests_dir = Path(__file__).resolve().parent
    problems = []
    for item in items:
        try:
            level = item.path.resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        markers = {mark.name for mark in item.iter_markers()}
        why = misplaced(level, markers, set(getattr(item, "fixturenames", ())))
        if why:
            problems.append(f"{item.nodeid}: {why}")
    if problems:
        raise pytest.UsageError("tests at the wrong level:\n" + "\n".join(problems))
