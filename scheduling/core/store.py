"""The core's statements on Django's connection: the named blocks of ``sql/queries.sql``.

The mechanisms keep their own statements and stores (``due_at/store.py``, ``fixed/store.py``,
``deferrals/store.py``, ``recurring/store.py``, and the web's readings in ``web/store.py``), all run
through ``scheduling.core.db``, which maps rows by column name into frozen dataclasses. What stays
here is what every layer shares: the database clock, the leaders' heartbeats, whether an advisory
lock is held, the claim loop's wake-up, a job's owner and key (for the registry's checks), the JSON
API's creation limits (``core.validation``), and ``while_unreachable`` for writes that must not be lost.

Only a ``store.py`` (and the runner, ``core/db.py``) holds a cursor on Django's connection. Two other
places run statements, and neither touches a table: ``locks.AdvisoryLock`` takes, checks and releases
a session-level advisory lock on its own psycopg2 connection, and ``leadership.Leadership`` holds a
leader's lock (and the control loop's LISTEN) on its own connection. Plain ORM reads of model rows
(the admin's lists, a policy looked up by name) are Django's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

from scheduling.core import db

SQL = db.Statements(Path(__file__).with_name("sql"))


def database_now() -> dt.datetime:
    """The database clock: what every due-time decision uses (inside a transaction: its start)."""
    now: dt.datetime = SQL.fetch_value("database_now")
    return now


def database_clock() -> dt.datetime:
    """The database clock at this instant, even inside a long transaction: where a delay counts from."""
    now: dt.datetime = SQL.fetch_value("database_clock")
    return now


def bound_session(params: dict[str, str]) -> None:
    """Apply ``bound_session`` (``locks.session_bounds``) to Django's connection, once per server session."""
    connection.ensure_connection()
    raw = connection.connection
    marker = (id(raw), raw.get_backend_pid(), tuple(sorted(params.items())))
    if getattr(connection, "_timekeeper_bounded", None) == marker:
        return
    SQL.execute("bound_session", params)  # session-level: call it outside a transaction
    if raw.server_version >= 140000:
        SQL.execute("bound_running_statement", params)
    connection._timekeeper_bounded = marker  # type: ignore[attr-defined] # a new connection gets them again


def notify_due(channel: str) -> None:
    """NOTIFY the claim loop; delivered when the current transaction commits (never if it rolls back)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel])


@dataclasses.dataclass(frozen=True)
class JobOwner:
    owner_id: int | None  # None: the system's job, or its owner was deleted (then former_owner says who)
    former_owner: str  # "username (#id)" of a deleted owner; "" otherwise


def job_owner(job_id: int) -> JobOwner | None:
    """Who job ``job_id`` belongs to (None: no such job)."""
    return SQL.fetch_one(JobOwner, "job_owner", {"id": job_id})


def count_refused_message(task: str) -> int | None:
    """Count one broker message of ``task`` refused at a worker's door; the new total.

    None when the database did not answer: the message is refused all the same (a refusal never
    depends on the count), and the lost count is logged.
    """
    try:
        total: int = SQL.fetch_value("count_refused_message", {"task": task})
    except (OperationalError, InterfaceError):
        logger.warning("could not count a refused message", extra={"task": task, "action": "count_failed"})
        return None
    return total


def job_key(job_id: int) -> str | None:
    """The business key of job ``job_id`` (None: it has none, or no such job)."""
    key: str | None = SQL.fetch_value("job_key", {"id": job_id})
    return key


# --- Locks and leaders -------------------------------------------------------------------------------


def advisory_lock_held(key: int) -> bool:
    """Whether any session holds the advisory lock ``key`` (reads pg_locks; takes nothing)."""
    return bool(SQL.fetch_value("advisory_lock_held", {"key": key}))


def record_heartbeat(role: str, holder: str, *, new_lead: bool) -> None:
    """Write the leader's heartbeat for ``role`` (database clock); ``new_lead`` restarts "leading since"."""
    SQL.execute("record_heartbeat", {"role": role, "holder": holder, "new_lead": new_lead})


# --- The JSON API's creation limits (core.validation) ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Allowance:
    """Whether an owner may create a job now, and if not, in how many seconds they may."""

    allowed: bool
    retry_after_seconds: float


def take_create_allowance(owner_id: int, rate_per_second: float, burst: int) -> Allowance:
    """Take one creation from ``owner_id``'s bucket (``rate_per_second`` sustained, ``burst`` at once)."""
    emission = 1.0 / rate_per_second
    params = {"owner_id": owner_id, "emission": emission, "window": max(1, burst) * emission}
    return SQL.fetch_all(Allowance, "take_create_allowance", params)[0]


def give_back_create_allowance(owner_id: int, rate_per_second: float) -> None:
    """Return one creation to ``owner_id``'s bucket (taken by a request that then created nothing)."""
    SQL.execute("give_back_create_allowance", {"owner_id": owner_id, "emission": 1.0 / rate_per_second})


def lock_owner_creations(key: int) -> None:
    """Hold the transaction-level advisory lock ``key`` (one owner's creations) until the transaction ends."""
    SQL.execute("lock_owner_creations", {"key": key})


@dataclasses.dataclass(frozen=True)
class OwnerPending:
    """An owner's pending jobs (exact up to the limit asked, then limit + 1) and when the first is due."""

    pending: int
    next_due_in_seconds: float


def owner_pending_jobs(owner_id: int, limit: int, new_id: int) -> OwnerPending:
    """``owner_id``'s pending jobs up to ``limit`` + 1, and when the first but ``new_id`` is due."""
    params = {"owner_id": owner_id, "limit": limit, "new_id": new_id}
    return SQL.fetch_all(OwnerPending, "owner_pending_jobs", params)[0]


# --- Writes that must not be lost to a database blip --------------------------------------------

T = TypeVar("T")
logger = logging.getLogger(__name__)
UNREACHABLE_RETRY_SECONDS = 60.0  # how long a must-keep write is retried while the database is unreachable


def while_unreachable(write: Callable[[], T], *, what: str, seconds: float = UNREACHABLE_RETRY_SECONDS) -> T:
    """Run ``write``, retrying for ``seconds`` while the database is unreachable (a restart, a failover).

    For writes whose loss would lose work already done (a job's outcome after its handler ran, a
    spent deferral's dead row). ``write`` must be safe to repeat: a statement conditional on the
    row's state and token, or an insert that a retry cannot double. The broken connection is closed
    so the next try opens a new one; past ``seconds`` the error propagates.
    """
    deadline = time.monotonic() + seconds
    pause = 0.25
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if time.monotonic() + pause > deadline:
                raise
            logger.warning(f"cannot record {what}: database unreachable; retrying", extra={"action": "record_retry"})
            connection.close()
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
