"""Start permits: a rate-limited kind's handlers start within its limit, not only its claims.

The claim decides how many jobs of a rate-limited kind leave pending (``sql/claim.sql``, the rate
windows), exactly, under concurrent claimers. Between a claim and a handler's start lies the queue
and a batch's earlier jobs: a batch that reaches its worker late starts its jobs next to the
following claim's, and a 1 s span of starts could hold more than the limit. So before a
rate-limited job's handler runs, its worker process takes a permit (``sql/starts.sql``,
``take_start``): one statement on the process's own autocommit connection (never inside a batch's
transaction, so the window's row lock is held for that statement only), granted when the window of
starts holds fewer than the limit, the start recorded at the database clock. The handler's attempt
records that instant as its start. A refused permit says when the window has room; the runner waits
that long (at most ``runner.START_WAIT_SECONDS``), or gives the job back uncharged, due when there
is room (``lifecycle.Event.RATE_LIMITED``).

Kinds without a rate take no permit and pay nothing. Should the permit's statement fail (the
database unreachable from this connection), the job starts without one and the claim's limit
alone holds; the connection is opened again for the next permit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
from typing import Any

import psycopg2
import psycopg2.errors

from scheduling.core import locks
from scheduling.due_at import store

logger = logging.getLogger(__name__)

APPLICATION_NAME = "timekeeper-starts"
LOCK_TIMEOUT_MS = 2000  # a permit waits this long at most for the window's row (held for one statement)


@dataclasses.dataclass(frozen=True)
class Permit:
    """A permit's answer: granted at ``at`` (the database clock), or refused for ``wait_seconds``."""

    at: dt.datetime
    granted: bool
    wait_seconds: float


class _Connection:
    """This process's own autocommit connection for permits (opened on first use; a fork opens its own)."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.pid = 0
        self.inherited: list[Any] = []

    def get(self) -> Any:
        if self.conn is None or self.conn.closed or self.pid != os.getpid():
            if self.pid != os.getpid() and self.conn is not None:
                self.inherited.append(self.conn)  # a fork's copy: never closed here (it is the parent's session)
            self.conn = locks.dedicated_connection(APPLICATION_NAME, lock_timeout_ms=LOCK_TIMEOUT_MS)
            self.pid = os.getpid()
        return self.conn

    def close(self) -> None:
        if self.conn is not None and self.pid == os.getpid():
            with contextlib.suppress(psycopg2.Error):
                self.conn.close()
        self.conn = None


_connection = _Connection()


def take(kind: str, partition: str) -> Permit | None:
    """A permit for one start of ``kind`` in its window ``partition``; None when it could not be asked.

    A connection the server dropped while idle is opened again once; a lock held past
    ``LOCK_TIMEOUT`` (another session's open transaction on the window's row) is "could not be asked".
    """
    try:
        try:
            at, granted, wait_seconds = store.take_start(_connection.get(), kind, partition)
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            if isinstance(exc, psycopg2.errors.LockNotAvailable):
                raise
            _connection.close()
            at, granted, wait_seconds = store.take_start(_connection.get(), kind, partition)
    except psycopg2.Error:
        logger.warning(
            "start permit not taken: the job starts on its claim's rate alone",
            extra={"kind": kind, "action": "start_permit_failed"},
            exc_info=True,
        )
        _connection.close()
        return None
    return Permit(at=at, granted=granted, wait_seconds=wait_seconds)


def close() -> None:
    """Close this process's permit connection (tests; a worker's exit closes it anyway)."""
    _connection.close()
