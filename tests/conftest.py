"""Shared fixtures: raw connections to the test database, and a clean broker database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
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
