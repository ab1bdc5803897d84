"""The only module that holds a cursor: runs the named statements of ``sql/queries.sql``.

Functions take and return plain values; decisions (what to claim, when to retry) live in
``api``, ``claim``, ``runner`` and ``sweep``. Statements run on Django's connection for the
current thread, so they join the caller's transaction when there is one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import connection

SQL_FILE = Path(__file__).with_name("sql") / "queries.sql"
_NAME = re.compile(r"^--\s*name:\s*(?P<name>\w+)\s*$")


def parse_queries(text: str) -> dict[str, str]:
    """Split a file of ``-- name: x`` blocks into {name: statement}; comments stay in the text."""
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            name = match["name"]
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice in {SQL_FILE.name}")
            current = queries[name] = []
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip().rstrip(";") for name, lines in queries.items()}


@functools.cache
def queries() -> dict[str, str]:
    """Every named statement, loaded once."""
    return parse_queries(SQL_FILE.read_text())


def _fetchall(name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(queries()[name], params)
        return cursor.fetchall()


# --- Scheduling ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NewJob:
    kind: str
    payload: Any
    due_at: dt.datetime | None
    delay_seconds: float | None
    lease_seconds: int
    max_attempts: int
    key: str | None
    owner_id: int | None


def insert_job(job: NewJob, on_conflict: str) -> tuple[int, dt.datetime, float] | None:
    """Insert (or, with a key, upsert) a job: (id, due_at, seconds until due by the database clock).

    None when the key's live job was left alone.
    """
    params = {
        "kind": job.kind,
        "payload": json.dumps(job.payload),
        "due_at": job.due_at,
        "delay": job.delay_seconds or 0.0,
        "lease_seconds": job.lease_seconds,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "owner_id": job.owner_id,
    }
    name = "insert_job" if job.key is None else "upsert_job_replace" if on_conflict == "replace" else "upsert_job_keep"
    rows = _fetchall(name, params)
    return (rows[0][0], rows[0][1], rows[0][2]) if rows else None


def live_job_by_key(key: str) -> tuple[int, str] | None:
    """(id, state) of the pending or claimed job holding ``key``."""
    rows = _fetchall("live_job_by_key", {"key": key})
    return (rows[0][0], rows[0][1]) if rows else None


def job_state(job_id: int) -> str | None:
    rows = _fetchall("job_state", {"id": job_id})
    return rows[0][0] if rows else None


def cancel_job(job_id: int) -> bool:
    return bool(_fetchall("cancel_job", {"id": job_id}))


def reschedule_job(job_id: int, due_at: dt.datetime) -> tuple[dt.datetime, float] | None:
    """(new due_at, seconds until due) or None when the job is not pending."""
    rows = _fetchall("reschedule_job", {"id": job_id, "due_at": due_at})
    return (rows[0][1], rows[0][2]) if rows else None


def cancel_jobs(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("cancel_jobs", {"ids": list(ids)})]


def reschedule_jobs(ids: Sequence[int], due_at: dt.datetime) -> list[int]:
    return [row[0] for row in _fetchall("reschedule_jobs", {"ids": list(ids), "due_at": due_at})]


def run_jobs_now(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("run_jobs_now", {"ids": list(ids)})]


def retry_dead_jobs(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("retry_dead_jobs", {"ids": list(ids)})]


# --- Claiming and running --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claim:
    """A row just claimed: enough to route it; the payload is read when it starts."""

    id: int
    token: str
    kind: str


@dataclasses.dataclass(frozen=True)
class StartedJob:
    id: int
    token: str
    kind: str
    payload: Any
    attempts: int
    max_attempts: int
    due_at: dt.datetime
    db_now: dt.datetime


def claim_due_jobs(limit: int) -> list[Claim]:
    return [Claim(*row) for row in _fetchall("claim_due_jobs", {"limit": limit})]


def next_due_times(horizon_seconds: float, limit: int) -> list[tuple[dt.datetime, float]]:
    """(instant, seconds from now by the database clock) of upcoming distinct due times."""
    return [(row[0], row[1]) for row in _fetchall("next_due_times", {"horizon": horizon_seconds, "limit": limit})]


def start_jobs(claims: Sequence[tuple[int, str]], worker: str) -> list[StartedJob]:
    ids = [c[0] for c in claims]
    tokens = [c[1] for c in claims]
    rows = _fetchall("start_jobs", {"ids": ids, "tokens": tokens, "worker": worker})
    return [StartedJob(*row) for row in rows]


def heartbeat_jobs(claims: Sequence[tuple[int, str]]) -> list[int]:
    """Refresh the claims; returns the ids still held (others were taken back)."""
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    return [row[0] for row in _fetchall("heartbeat_jobs", params)]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one job's attempt ended, as the runner saw it."""

    id: int
    token: str
    started_at: dt.datetime
    finished_at: dt.datetime
    outcome: str  # AttemptOutcome value
    error: str = ""
    retry_delay_seconds: float = 0.0


def complete_jobs(outcomes: Sequence[Outcome]) -> list[int]:
    """Mark succeeded jobs done; returns the ids whose token still matched."""
    if not outcomes:
        return []
    params = {
        "ids": [o.id for o in outcomes],
        "tokens": [o.token for o in outcomes],
        "started": [o.started_at for o in outcomes],
        "finished": [o.finished_at for o in outcomes],
    }
    return [row[0] for row in _fetchall("complete_jobs", params)]


def fail_jobs(outcomes: Sequence[Outcome]) -> list[tuple[int, str, dt.datetime]]:
    """Record failures; returns (id, new state, new due_at) for the jobs whose token still matched."""
    if not outcomes:
        return []
    params = {
        "ids": [o.id for o in outcomes],
        "tokens": [o.token for o in outcomes],
        "started": [o.started_at for o in outcomes],
        "finished": [o.finished_at for o in outcomes],
        "outcomes": [o.outcome for o in outcomes],
        "errors": [o.error for o in outcomes],
        "delays": [o.retry_delay_seconds for o in outcomes],
    }
    return [(row[0], row[1], row[2]) for row in _fetchall("fail_jobs", params)]


def release_jobs(claims: Sequence[tuple[int, str]], reason: str) -> list[tuple[int, str]]:
    if not claims:
        return []
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims], "reason": reason}
    return [(row[0], row[1]) for row in _fetchall("release_jobs", params)]


# --- Sweeping and status ---------------------------------------------------------------------------


def sweep_expired_claims(*, heartbeats: bool, sweep_after_seconds: float, limit: int) -> list[tuple[int, str]]:
    params = {"heartbeats": heartbeats, "sweep_after": sweep_after_seconds, "limit": limit}
    return [(row[0], row[1]) for row in _fetchall("sweep_expired_claims", params)]


def prune_finished_jobs(*, days: int, limit: int) -> int:
    return len(_fetchall("prune_finished_jobs", {"days": days, "limit": limit}))


def backlog_status(stuck_after_seconds: float) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(queries()["backlog_status"], {"stuck_after": stuck_after_seconds})
        names = [col[0] for col in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def database_now() -> dt.datetime:
    """The database clock: what every due-time decision uses."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]
