"""Shared fixtures: raw connections to the test database, a clean broker database, and a fast flush."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
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
INTERNAL_FIXTURES = {"run_sql", "raw_connect", "broker"}  # the tables' SQL and Redis: not Django's Tasks API


def misplaced(level: str, markers: set[str], fixtures: set[str]) -> str | None:
    """Why a test at ``tests/<level>/`` with these markers and fixtures is in the wrong place, or None."""
    if level == "unit":
        used = sorted(fixtures & SERVICE_FIXTURES) + (["django_db"] if "django_db" in markers else [])
        if used:
            return f"a unit test touches no service, but it uses {', '.join(used)}: move it to tests/integration"
    if level == "conformance":
        used = sorted(fixtures & INTERNAL_FIXTURES)
        if used:
            return (
                f"a conformance test goes through Django's Tasks API, but it uses {', '.join(used)}: "
                "move it to tests/integration"
            )
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


@pytest.fixture(autouse=True)
def _close_start_permits() -> Iterator[None]:
    """Close this process's start-permit connection after each test (the test database is dropped at the end)."""
    yield
    from scheduling.due_at import starts  # imported here: the unit tests' collection needs no settings

    starts.close()


BLOATED_BYTES = 512 * 1024  # a table file larger than this is truncated after a test, not emptied with DELETE


@pytest.fixture(scope="session", autouse=True)
def _flush_with_delete() -> Iterator[None]:
    """Empty the tables after a transactional test with DELETE, not TRUNCATE: same end state, ~20x faster.

    pytest-django ends every ``transactional_db`` test with Django's ``flush`` (a ``TRUNCATE`` of
    every table, then ``post_migrate``). On a test database's few rows, ``TRUNCATE`` is the slow
    way: it makes a new file for every table and index and syncs them at commit (0.3-1 s a test on
    a busy machine, against 10-30 ms for ``DELETE``). What stays the same: every table is empty
    afterwards and sequences are not reset (``reset_sequences=False``, as before); the ``LOCK
    TABLE`` waits for any straggling session exactly as ``TRUNCATE``'s lock does; ``post_migrate``
    still recreates the content types and permissions; no table has a DELETE trigger (the outcome
    counters count inserts and updates only, migration 0015), and every foreign key is deferred to
    the commit (Django creates them ``DEFERRABLE INITIALLY DEFERRED``), so the order of the
    DELETEs does not matter. A table that has grown past ``BLOATED_BYTES`` (a test of thousands of
    rows, or the dead rows of earlier DELETEs) is truncated instead, so that later tests do not
    walk a bloated table and its indexes. Anything else (sequences reset, CASCADE) keeps Django's SQL.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations, style: Any, tables: Sequence[str], *, reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:  # fmt: skip
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r' AND pg_relation_size(oid) > %s",
                [list(tables), BLOATED_BYTES],
            )
            bloated = {row[0] for row in cursor.fetchall()}
        names = [style.SQL_FIELD(self.quote_name(table)) for table in tables]
        statements = [f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE"]
        if bloated:  # CASCADE: the tables referencing these are emptied too, as every table is
            statements.append(f"TRUNCATE {', '.join(self.quote_name(table) for table in sorted(bloated))} CASCADE")
        statements += [f"DELETE FROM {self.quote_name(table)}" for table in tables if table not in bloated]  # noqa: S608
        return statements

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush)
        yield


LINGER_SECONDS = 30.0  # how long the test database waits, at the end, for other sessions to leave it
LINGER_REPORT = Path(__file__).resolve().parent / "artifacts" / "lingering-sessions.txt"


def _my_client_ports() -> set[int]:
    """The local TCP ports of this process's sockets (from /proc: no third-party package needed here)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, dropped only once no other session uses it.

    A process or thread a test started (a worker's pool process, a live server's thread, a control
    loop told to stop) may still hold its connection when the last test ends; ``DROP DATABASE`` then
    fails ("being accessed by other users") and the run ends with an error no test made. So the end
    waits up to ``LINGER_SECONDS`` for them to leave, then ends the ones left and writes who they
    were (their client port, and whether this process holds it: a thread's connection) to
    ``LINGER_REPORT``. Seen in the lanes of ``dev.py test`` (an idle session with no application
    name, once in four runs): not yet traced to its test.
    """
    yield
    import gc

    gc.collect()  # a connection left by a finished thread may wait in a reference cycle
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        deadline = time.monotonic() + LINGER_SECONDS
        while True:
            cursor.execute(f"SELECT pid, application_name, state, client_port, left(query, 200) {others}")
            left = cursor.fetchall()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if left:
            cursor.execute(f"SELECT pg_terminate_backend(pid) {others}")
            mine = _my_client_ports()
            LINGER_REPORT.parent.mkdir(parents=True, exist_ok=True)
            with LINGER_REPORT.open("a") as report:
                for pid, name, state, port, query in left:
                    owner = f"this pytest process ({os.getpid()})" if port in mine else "another process"
                    report.write(f"{time.ctime()} backend {pid} {name!r} {state} from {owner}: {query!r}\n")
    connection.close()
