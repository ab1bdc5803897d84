"""PostgreSQL advisory locks on dedicated connections.

A session-level advisory lock belongs to the connection that took it. Taking it on Django's
connection would tie it to whatever else that connection does (a ``close_old_connections`` at the
end of a task, a pooler handing the session to someone else) and release it at random. So each
lock gets its own psycopg2 connection, opened here, outside Django's connection handling and any
pool, and held open for as long as the lock is held. If the process dies, the server closes the
connection and releases the lock: nothing is left in ``pg_locks``.

A holder that vanishes without a word (a lost host, a cut network: no FIN, no RST) is noticed by
the *server* within ``VANISHED_CLIENT_BOUND_SECONDS``: every dedicated session asks for it
(``bound_session``: the per-session ``tcp_keepalives_*``, ``tcp_user_timeout``, and
``client_connection_check_interval`` on PostgreSQL 14+), since PostgreSQL otherwise keeps such a
session, and its locks, for the OS keepalive time (2 h by default). libpq's ``keepalives_*`` below
only make the client notice. ``bound_django_session`` gives a leader's own Django connection the
same bounds (docs/fault-tolerance.md, "A host that vanishes").

These sessions (advisory locks, leadership and the control loop's LISTEN, the fixed-time gate's
overlap lock) go to ``SCHEDULING_DIRECT_DATABASE_URL`` when it is set, and to the default database
otherwise. The ORM may go through a transaction pooler (PgBouncer ``pool_mode=transaction``), which
hands each transaction to any server connection: a lock taken there would be held by whichever
server session ran the statement, and released, or not, on another. So the direct URL must point
at PostgreSQL itself (or a pooler in session mode); ``appears_pooled`` is how system check
scheduling.W007 tells.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from types import TracebackType
from typing import Any

import psycopg2
from django.conf import settings

from scheduling.core import conf, exceptions, store

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5
KEEPALIVE_IDLE_SECONDS = 10  # a dead peer is noticed after about idle + interval * count
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
CLIENT_USER_TIMEOUT_MS = 20_000  # the client gives up on data the server never acknowledged

# What the server asks of a dedicated session (bound_session): probes after 5 s of silence, every
# 5 s, 3 unanswered end it (5 + 5 * 3 = 20 s); data unacknowledged for 20 s ends it too. A lock or a
# lead is therefore free within VANISHED_CLIENT_BOUND_SECONDS of a silent loss, wherever it fell.
SERVER_KEEPALIVE_IDLE_SECONDS = 5
SERVER_KEEPALIVE_INTERVAL_SECONDS = 5
SERVER_KEEPALIVE_COUNT = 3
SERVER_USER_TIMEOUT_MS = 20_000
CLIENT_CHECK_INTERVAL_MS = 2_000  # a running statement polls its client's socket (PostgreSQL 14+)
IDLE_IN_TRANSACTION_SECONDS = 10  # a leader's transactions are short: one left open this long ends
VANISHED_CLIENT_BOUND_SECONDS = 25  # the documented bound, with a probe's worth of margin


def lock_key(namespace: str, name: str) -> int:
    """A stable signed 64-bit key for (namespace, name), the same in every process and release."""
    digest = hashlib.blake2b(f"timekeeper:{namespace}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def dedicated_connection(application_name: str = "timekeeper-lock", lock_timeout_ms: int = 0) -> Any:
    """A new autocommit psycopg2 session, not shared with anyone: the direct URL, else the default database.

    ``lock_timeout_ms`` bounds how long one of its statements waits for a lock (0: no limit).
    """
    session: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": CLIENT_USER_TIMEOUT_MS,
        "application_name": application_name,
    }
    direct_url = conf.get().direct_database_url
    if direct_url:
        conn = psycopg2.connect(direct_url, **session)
    else:
        conn = psycopg2.connect(**default_database_parameters(), **session)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            bound_session(cur, conn.server_version, lock_timeout_ms)
    except psycopg2.Error:
        conn.close()
        raise
    return conn


def session_bounds(lock_timeout_ms: int = 0) -> dict[str, str]:
    """The parameters of ``bound_session`` (core/sql/queries.sql): what the server asks of a bounded session."""
    return {
        "idle_s": str(SERVER_KEEPALIVE_IDLE_SECONDS),
        "interval_s": str(SERVER_KEEPALIVE_INTERVAL_SECONDS),
        "count": str(SERVER_KEEPALIVE_COUNT),
        "user_timeout_ms": str(SERVER_USER_TIMEOUT_MS),
        "idle_in_transaction_ms": str(IDLE_IN_TRANSACTION_SECONDS * 1000),
        "lock_timeout_ms": str(lock_timeout_ms),
        "check_ms": str(CLIENT_CHECK_INTERVAL_MS),
    }


def bound_session(cursor: Any, server_version: int, lock_timeout_ms: int = 0) -> None:
    """Ask the server to end this session within the bound once its client vanished (see the module docstring)."""
    params = session_bounds(lock_timeout_ms)
    cursor.execute(store.SQL["bound_session"], params)
    if server_version >= 140000:
        cursor.execute(store.SQL["bound_running_statement"], params)


def bound_django_session(lock_timeout_ms: int = 0) -> None:
    """Give this thread's Django connection the bounds of a dedicated session (once per connection).

    For a leader's own transactions (the control loop's claim and sweep): a leader that vanishes in
    the middle of one leaves row locks that a new leader's statements would wait on. ``lock_timeout_ms``
    bounds how long one of the leader's statements waits for a lock (0: no limit).
    """
    store.bound_session(session_bounds(lock_timeout_ms))


def default_database_parameters(alias: str = "default") -> dict[str, Any]:
    """psycopg2 keyword arguments for Django's database ``alias`` (without its statement timeout)."""
    db = settings.DATABASES[alias]
    options: dict[str, Any] = dict(db.get("OPTIONS") or {})
    options.pop("options", None)  # the statement timeout is for request work, not for holding a lock
    options.pop("connect_timeout", None)
    return {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        **options,
    }


def appears_pooled(connect: Any) -> bool:
    """Whether sessions opened by ``connect()`` look like a transaction pooler's (not PostgreSQL's own).

    Two clients, A and B, each run ``pg_backend_pid()`` in their own transaction, then A again. On
    PostgreSQL itself (or a session pooler) A keeps its server process and B has another one. A
    transaction pooler gives the server back after each transaction: B gets A's server (PgBouncer
    reuses the last one released), or A comes back on another one.
    """
    first, second = connect(), connect()
    try:
        first.autocommit = second.autocommit = True  # each statement its own transaction
        pids = []
        for conn in (first, second, first):
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pids.append(cur.fetchone()[0])
    finally:
        for conn in (first, second):
            with contextlib.suppress(psycopg2.Error):
                conn.close()
    a1, b, a2 = pids
    return a1 == b or a1 != a2


class AdvisoryLock:
    """``pg_try_advisory_lock`` held on its own connection; release in ``finally`` (or use ``with``)."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self.key = lock_key(namespace, name)
        self._conn: Any = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; False at once if another session holds it."""
        if self._conn is not None:
            return True
        conn = dedicated_connection(f"timekeeper-lock:{self.namespace}")
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
                (acquired,) = cur.fetchone()
        except psycopg2.Error:
            conn.close()
            raise
        if not acquired:
            conn.close()
            return False
        self._conn = conn
        return True

    def acquire(self) -> None:
        """Take the lock or raise ``LockNotAcquired``."""
        if not self.try_acquire():
            raise exceptions.LockNotAcquired(f"Advisory lock {self.namespace}:{self.name} is held by another session.")

    def alive(self) -> bool:
        """Whether the connection holding the lock still answers (if not, the lock is gone)."""
        if self._conn is None:
            return False
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except psycopg2.Error:
            self._drop()
            return False

    def backend_pid(self) -> int | None:
        """The server process id of the holding connection (to find it in pg_locks)."""
        return self._conn.get_backend_pid() if self._conn is not None else None

    def release(self) -> None:
        """Unlock and close the connection; closing alone would release it too."""
        if self._conn is None:
            return
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        except psycopg2.Error:
            logger.warning("advisory unlock failed; closing the connection releases it", exc_info=True)
        finally:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        with contextlib.suppress(psycopg2.Error):
            conn.close()

    def __enter__(self) -> AdvisoryLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def is_locked(namespace: str, name: str) -> bool:
    """Whether any session holds the lock (reads pg_locks through ``store``; for health checks and tests)."""
    return store.advisory_lock_held(lock_key(namespace, name))
