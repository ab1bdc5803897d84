"""Every statement Timekeeper runs on Django's connection: the named blocks of ``sql/queries.sql``.

This is the only module that holds a cursor on Timekeeper's tables. Functions take plain values
and return ids, counts, or typed rows: frozen dataclasses built field by field from the columns'
names, with states as the ``TextChoices`` of ``scheduling.models``. Decisions (what to claim, when
to retry, who leads) live in ``jobs``, ``fixed`` and ``deferrals``. Statements run on Django's
connection for the current thread, so they join the caller's transaction when there is one.

Two other places run statements, and neither touches a table: ``locks.AdvisoryLock`` takes,
checks and releases a session-level advisory lock on its own psycopg2 connection, and
``leadership.Leadership`` holds a leader's lock (and the control loop's LISTEN) on its own
connection. Those are lock and LISTEN sessions whose life is the lock's, so they stay with the
code that owns the session. Plain ORM reads of model rows (the admin's lists, a policy looked up by name) are Django's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connection, transaction

from scheduling.core import conf
from scheduling.models import AttemptOutcome, JobState, RunState

TRANSACTION_STATUS_INERROR = 3  # libpq's PQTRANS_INERROR: the (sub)transaction failed, statements are refused
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
    return _fetchall_sql(queries()[name], params)


def _fetchall_sql(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` (named blocks joined, the rows are the last statement's) and return its rows."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _records(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a named statement as {column: value}, for building typed rows by field."""
    with connection.cursor() as cursor:
        cursor.execute(queries()[name], params)
        columns = [column[0] for column in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def _fetchall_async_commit(name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a claim-path statement in its own transaction that commits without waiting for the WAL flush.

    The claim, start and heartbeat statements are most of what the claim loop waits for: on a busy
    disk each commit's flush takes milliseconds, and a job due meanwhile waits too. With
    ``synchronous_commit = off`` a PostgreSQL crash can undo the last fraction of a second of them:
    those jobs are claimed and run again (at-least-once, as after a worker crash). Outcomes
    (complete, fail), schedule() and cancel() always commit synchronously, so nothing a caller or a
    worker was told is committed is lost. Inside a caller's transaction the statement simply joins
    it. ``SCHEDULING_ASYNC_COMMIT = False`` turns this off.
    """
    if not conf.get().async_commit or not connection.get_autocommit():
        return _fetchall(name, params)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off;\n" + queries()[name], params)
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
    priority: int = 0
    overrides: Overrides | None = None  # the call's timeout, backoff, atomic (None: the kind's)


@dataclasses.dataclass(frozen=True)
class Overrides:
    """A job's own timeout, backoff and atomicity, set when it was scheduled; None fields are the kind's."""

    timeout_seconds: float | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None
    atomic: bool | None = None

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


NO_OVERRIDES = Overrides()


@dataclasses.dataclass(frozen=True)
class DueJob:
    """A pending row as a write left it: its due time, and how far off that is by the database clock."""

    id: int
    due_at: dt.datetime
    in_seconds: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DueJob:
        return cls(id=row["id"], due_at=row["due_at"], in_seconds=row["in_seconds"])


@dataclasses.dataclass(frozen=True)
class LiveJob:
    """A key's job for cancel and reschedule by key: its newest pending one, else its newest claimed one."""

    id: int
    state: JobState


def insert_job(job: NewJob, on_conflict: str) -> DueJob | None:
    """Insert (or, with a key, upsert) a job; None when the key's live job was left alone."""
    params = {
        "kind": job.kind,
        "payload": json.dumps(job.payload),
        "due_at": job.due_at,
        "delay": job.delay_seconds or 0.0,
        "lease_seconds": job.lease_seconds,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "owner_id": job.owner_id,
        "priority": job.priority,
        **(job.overrides or NO_OVERRIDES).params(),
    }
    name = "insert_job" if job.key is None else "upsert_job_replace" if on_conflict == "replace" else "upsert_job_keep"
    rows = _records(name, params)
    return DueJob.from_row(rows[0]) if rows else None


@dataclasses.dataclass(frozen=True)
class KeyedUpsert:
    """What one keyed upsert did: the row it returned, and whether it was a new row."""

    id: int
    due_at: dt.datetime
    in_seconds: float  # until due, by the database clock
    inserted: bool  # False: the (owner, key)'s waiting job was moved or kept
    state: str


def upsert_keyed_job(job: NewJob, on_conflict: str) -> KeyedUpsert | None:
    """Insert a keyed job, or meet the owner's waiting job for the key: one statement, never waiting on a running job.

    The key's waiting job is pending (or claimed and not yet started); a running job (started) is
    left alone and a new row becomes its successor. ``replace`` moves the waiting job (a claim not
    yet started is taken back); ``keep`` and ``error`` return it unchanged (``inserted`` False).
    None only if the statement returned nothing (not expected: every branch returns its row).
    """
    assert job.key is not None
    params = {
        "kind": job.kind,
        "payload": json.dumps(job.payload),
        "due_at": job.due_at,
        "delay": job.delay_seconds or 0.0,
        "lease_seconds": job.lease_seconds,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "owner_id": job.owner_id,
        "priority": job.priority,
        **(job.overrides or NO_OVERRIDES).params(),
    }
    rows = _fetchall("upsert_job_replace" if on_conflict == "replace" else "upsert_job_keep", params)
    if not rows:
        return None
    row = rows[0]
    return KeyedUpsert(id=row[0], due_at=row[1], in_seconds=row[2], inserted=bool(row[3]), state=row[4])


def job_owner_id(job_id: int) -> int | None:
    """The owner of job ``job_id`` (None: the system's, or no such job)."""
    rows = _fetchall("job_owner_id", {"id": job_id})
    return rows[0][0] if rows else None


def job_key(job_id: int) -> str | None:
    """The business key of job ``job_id`` (None: it has none, or no such job)."""
    rows = _fetchall("job_key", {"id": job_id})
    return rows[0][0] if rows else None


def insert_jobs(
    kind: str,
    payloads: Sequence[str],
    *,
    due_at: dt.datetime | None,
    delay_seconds: float | None,
    lease_seconds: int,
    max_attempts: int,
    owner_id: int | None,
    priority: int = 0,
    overrides: Overrides | None = None,
) -> list[DueJob]:
    """Insert many jobs of one kind (payloads already JSON text), in the payloads' order."""
    params = {
        "kind": kind,
        "payloads": list(payloads),
        "due_at": due_at,
        "delay": delay_seconds or 0.0,
        "lease_seconds": lease_seconds,
        "max_attempts": max_attempts,
        "owner_id": owner_id,
        "priority": priority,
        **(overrides or NO_OVERRIDES).params(),
    }
    return [DueJob.from_row(row) for row in _records("insert_jobs", params)]


def notify_due(channel: str) -> None:
    """NOTIFY the claim loop; delivered when the current transaction commits (never if it rolls back)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel])


def live_job_by_key(key: str, owner_id: int | None = None) -> LiveJob | None:
    """``key``'s job for ``owner_id`` (None: the system's): its newest pending job, else its newest claimed one."""
    rows = _records("live_job_by_key", {"key": key, "owner_id": owner_id})
    return LiveJob(id=rows[0]["id"], state=JobState(rows[0]["state"])) if rows else None


def job_state(job_id: int) -> JobState | None:
    rows = _fetchall("job_state", {"id": job_id})
    return JobState(rows[0][0]) if rows else None


def job_states(ids: Sequence[int]) -> dict[int, JobState]:
    """{id: state} of the jobs among ``ids`` that exist."""
    return {row["id"]: JobState(row["state"]) for row in _records("job_states", {"ids": list(ids)})}


def cancel_job(job_id: int) -> bool:
    return bool(_fetchall("cancel_job", {"id": job_id}))


def reschedule_job(job_id: int, due_at: dt.datetime) -> DueJob | None:
    """The moved job, or None when it is not pending."""
    rows = _records("reschedule_job", {"id": job_id, "due_at": due_at})
    return DueJob.from_row(rows[0]) if rows else None


def cancel_jobs(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("cancel_jobs", {"ids": list(ids)})]


def reschedule_jobs(ids: Sequence[int], due_at: dt.datetime) -> list[DueJob]:
    """Move the pending ones of ``ids``; the others are left as they are (and not returned)."""
    return [DueJob.from_row(row) for row in _records("reschedule_jobs", {"ids": list(ids), "due_at": due_at})]


def run_jobs_now(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("run_jobs_now", {"ids": list(ids)})]


def retry_dead_jobs(ids: Sequence[int]) -> list[int]:
    return [row[0] for row in _fetchall("retry_dead_jobs", {"ids": list(ids)})]


# --- Claiming and running --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claim:
    """A row just claimed: enough to route and order it; the payload is read when it starts."""

    id: int
    token: str
    kind: str
    priority: int = 0
    due_at: dt.datetime | None = None
    run_alone: bool = False  # its batch died with its process once: it is sent in a batch of its own
    timeout_seconds: float | None = None  # its own timeout (schedule(timeout=...)); None: the kind's


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
    overrides: Overrides = NO_OVERRIDES  # the job's own timeout, backoff and atomicity (None fields: the kind's)


def claim_params(
    limit: int, *, messages: int | None = None, batch_sizes: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The parameters of ``claim_due_jobs``: at most ``messages`` batches (default: ``limit``), cut by kind.

    ``batch_sizes`` maps a kind to its batch size; a kind not in it is cut into batches of one.
    """
    sizes = dict(batch_sizes or {})
    return {
        "limit": limit,
        "messages": limit if messages is None else messages,
        "kinds": list(sizes),
        "batch_sizes": list(sizes.values()),
    }


def claim_statement() -> str:
    """The claim as one string: ``lock_capped_kinds`` then ``claim_due_jobs``; the rows are the claim's."""
    return queries()["lock_capped_kinds"] + ";\n" + queries()["claim_due_jobs"]


def claim_due_jobs(
    limit: int, *, messages: int | None = None, batch_sizes: Mapping[str, int] | None = None
) -> list[Claim]:
    """Claim due rows: whole batches, at most ``messages`` of them, sorted most urgent first.

    The capped kinds' control rows are locked first, in a statement of its own in the same
    transaction (``lock_capped_kinds``): so the claim's count of a kind's claims sees every claim
    committed before it, and caps hold exactly with any number of claimers.
    """
    sql = claim_statement()
    params = claim_params(limit, messages=messages, batch_sizes=batch_sizes)
    if not connection.get_autocommit():
        rows = _fetchall_sql(sql, params)  # the caller's transaction holds the lock until it ends
    else:
        with transaction.atomic():
            prefix = "SET LOCAL synchronous_commit = off;\n" if conf.get().async_commit else ""
            rows = _fetchall_sql(prefix + sql, params)  # see _fetchall_async_commit
    return [
        Claim(
            id=row[0],
            token=row[1],
            kind=row[2],
            priority=row[3],
            due_at=row[4],
            run_alone=row[5],
            timeout_seconds=row[6],
        )
        for row in rows
    ]


@dataclasses.dataclass(frozen=True)
class DueInstant:
    """An upcoming due time and how far it is by the database clock."""

    at: dt.datetime
    in_seconds: float


def next_due_times(horizon_seconds: float, limit: int) -> list[DueInstant]:
    """Upcoming distinct due times, with their distance by the database clock."""
    rows = _fetchall("next_due_times", {"horizon": horizon_seconds, "limit": limit})
    return [DueInstant(row[0], row[1]) for row in rows]


def start_jobs(claims: Sequence[tuple[int, str]], worker: str) -> list[StartedJob]:
    ids = [c[0] for c in claims]
    tokens = [c[1] for c in claims]
    rows = _fetchall_async_commit("start_jobs", {"ids": ids, "tokens": tokens, "worker": worker})
    # Django's psycopg2 connections hand jsonb back as text (its JSONField decodes it): decode here.
    return [
        StartedJob(
            id=row[0],
            token=row[1],
            kind=row[2],
            payload=json.loads(row[3]) if isinstance(row[3], str) else row[3],
            attempts=row[4],
            max_attempts=row[5],
            due_at=row[6],
            db_now=row[7],
            overrides=Overrides(*row[8:12]) if any(v is not None for v in row[8:12]) else NO_OVERRIDES,
        )
        for row in rows
    ]


def heartbeat_jobs(claims: Sequence[tuple[int, str]]) -> list[int]:
    """Refresh the claims; returns the ids still held (others were taken back)."""
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    return [row[0] for row in _fetchall_async_commit("heartbeat_jobs", params)]


def lock_claims(claims: Sequence[tuple[int, str]]) -> list[int]:
    """Lock the claims still held under their tokens, in the caller's transaction; returns their ids."""
    if not claims:
        return []
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    return [row[0] for row in _fetchall("lock_claims", params)]


def bound_transaction(seconds: float) -> None:
    """Limit the current transaction: idle (waiting on this process) or one statement, ``seconds`` at most.

    PostgreSQL ends the session past either limit, and with it the transaction's row locks: a stopped
    or hung process cannot keep its claims locked for ever. ``SET LOCAL``: the limits end with it.
    """
    _fetchall("bound_transaction", {"ms": str(max(1, round(seconds * 1000)))})


def transaction_broken() -> bool:
    """Whether the current transaction can take no more statements (a database error was caught and ignored).

    Django's own flag (set when an ORM call failed inside ``atomic``), or the driver's transaction
    status (a raw statement failed): neither costs a round trip.
    """
    if connection.needs_rollback:
        return True
    raw = connection.connection
    info = getattr(raw, "info", None)
    return info is not None and info.transaction_status == TRANSACTION_STATUS_INERROR


def record_callback_failure(job_id: int, token: str, error: str) -> bool:
    """Note on a job's attempt (under ``token``) that one of its on_commit callbacks failed; False if none matched."""
    return bool(_fetchall("record_callback_failure", {"id": job_id, "token": token, "error": error}))


def unclaim_jobs(claims: Sequence[tuple[int, str]]) -> list[int]:
    """Give back claims that were never sent: pending again, their attempt uncounted; returns their ids."""
    if not claims:
        return []
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    return [row[0] for row in _fetchall_async_commit("unclaim_jobs", params)]


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
    traceback: str = ""  # a failure's formatted traceback (bounded by the executor), kept on its attempt


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
    # Outcomes commit synchronously: a completion the worker was told about survives a crash (and
    # its flush makes every earlier asynchronous claim and start durable too).
    return [row[0] for row in _fetchall("complete_jobs", params)]


@dataclasses.dataclass(frozen=True)
class MovedJob:
    """A job an outcome, a release or the sweeper moved: its id, its new state and due time."""

    id: int
    state: JobState
    due_at: dt.datetime | None = None
    refunded: bool = False  # the sweeper: its batch died together, the attempt was not counted
    batch: str = ""  # the sweeper: the batch it was started in ("holder claimed_at")


def fail_jobs(outcomes: Sequence[Outcome]) -> list[MovedJob]:
    """Record failures; returns the jobs whose token still matched (pending again with a due time, or dead)."""
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
        "tracebacks": [o.traceback for o in outcomes],
    }
    return [MovedJob(row[0], JobState(row[1]), row[2]) for row in _fetchall("fail_jobs", params)]


def release_jobs(claims: Sequence[tuple[int, str]], reason: str) -> list[MovedJob]:
    """Give claims back (pending, or dead when their attempts are spent); the attempt is recorded as reclaimed."""
    if not claims:
        return []
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims], "reason": reason}
    return [MovedJob(row[0], JobState(row[1])) for row in _fetchall("release_jobs", params)]


def release_lost_chunk(claims: Sequence[tuple[int, str, float]], reason: str) -> list[MovedJob]:
    """Give back the claims (id, token, backoff seconds) of an atomic chunk lost with its transaction.

    A chunk of more than one job is refunded and its jobs run alone next (``refunded`` True); a job
    alone in its chunk, or already running alone, is charged the attempt. Due again after the backoff.
    """
    if not claims:
        return []
    params = {
        "ids": [c[0] for c in claims],
        "tokens": [c[1] for c in claims],
        "delays": [c[2] for c in claims],
        "shared": len(claims) > 1,
        "reason": reason,
    }
    rows = _fetchall("release_lost_chunk", params)
    return [MovedJob(row[0], JobState(row[1]), row[2], refunded=row[3]) for row in rows]


def committed_jobs(claims: Sequence[tuple[int, str]]) -> dict[int, bool]:
    """The claims whose outcome committed under their tokens (a COMMIT whose answer was lost): id -> succeeded."""
    if not claims:
        return {}
    params = {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    return {row[0]: row[1] for row in _fetchall("committed_jobs", params)}


def defer_constraints() -> None:
    """Defer the current transaction's deferrable constraints again (after a failed check)."""
    with connection.cursor() as cursor:
        cursor.execute(queries()["defer_constraints"])


def check_deferred_constraints() -> None:
    """Check the current transaction's deferred constraints now (IntegrityError if one fails), then defer again."""
    with connection.cursor() as cursor:
        cursor.execute(queries()["check_deferred_constraints"])


# --- Sweeping and status ---------------------------------------------------------------------------


def sweep_expired_claims(
    *,
    heartbeats: bool,
    sweep_after_seconds: float,
    limit: int,
    queued_ids: Collection[int] | None,
    backoffs: Mapping[str, tuple[float, float]] | None = None,
    default_backoff: tuple[float, float] = (10.0, 3600.0),
    shared_batches: Collection[str] = (),
) -> list[MovedJob]:
    """Take back expired claims; ``queued_ids`` are claims whose message is still queued (None: unknown).

    With ``queued_ids`` None (the broker did not answer) claims never started are left alone.
    ``backoffs`` maps a kind to its backoff (base, cap seconds): a started claim taken back is due
    again after it (``default_backoff`` for a kind not in it). Jobs whose batch died together are
    not charged the attempt and are flagged to run alone (``refunded``); ``shared_batches`` are the
    batches an earlier statement of the same sweep found shared (``MovedJob.batch`` of refunded jobs).
    """
    table = dict(backoffs or {})
    params = {
        "heartbeats": heartbeats,
        "sweep_after": sweep_after_seconds,
        "limit": limit,
        "check_unstarted": queued_ids is not None,
        "covered": list(queued_ids or []),
        "kinds": list(table),
        "backoff_base": [base for base, _ in table.values()],
        "backoff_cap": [cap for _, cap in table.values()],
        "default_backoff_base": default_backoff[0],
        "default_backoff_cap": default_backoff[1],
        "shared_batches": list(shared_batches),
    }
    rows = _fetchall("sweep_expired_claims", params)
    return [MovedJob(row[0], JobState(row[1]), row[2], refunded=row[3], batch=row[4] or "") for row in rows]


def prune_finished_jobs(*, days: int, limit: int) -> int:
    return len(_fetchall("prune_finished_jobs", {"days": days, "limit": limit}))


ESTIMATED_COUNTS = ("backlog", "paused", "pending", "due_next_24h")


@dataclasses.dataclass(frozen=True)
class BacklogStatus:
    """The numbers operators watch; the counts named in ``estimated`` are planner estimates."""

    backlog: int  # pending and due (kinds not paused)
    oldest_overdue_seconds: float
    paused: int  # pending and due, of paused kinds (waiting on purpose: not backlog)
    pending: int
    due_next_24h: int
    claimed: int
    stuck: int  # claimed past their lease, or claimed for longer than the stuck limit
    dead_last_24h: int
    estimated: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class KindControlRow:
    """A kind's controls and what waits behind them."""

    kind: str
    paused: bool
    max_running: int | None
    due: int = 0  # pending and due
    claimed: int = 0  # claimed: queued or running


def set_kind_paused(kind: str, paused: bool) -> KindControlRow:
    """Pause or resume ``kind``; returns its controls."""
    row = _records("set_kind_paused", {"kind": kind, "paused": paused})[0]
    return KindControlRow(kind=row["kind"], paused=row["paused"], max_running=row["max_running"])


def set_kind_max_running(kind: str, max_running: int | None) -> KindControlRow:
    """Cap (None: uncap) how many jobs of ``kind`` may be claimed or running at once; returns its controls."""
    row = _records("set_kind_max_running", {"kind": kind, "max_running": max_running})[0]
    return KindControlRow(kind=row["kind"], paused=row["paused"], max_running=row["max_running"])


def kind_controls() -> list[KindControlRow]:
    """Every controlled kind with its due and claimed counts."""
    return [
        KindControlRow(
            kind=r["kind"], paused=r["paused"], max_running=r["max_running"], due=r["due"], claimed=r["claimed"]
        )
        for r in _records("kind_controls", {})
    ]


@dataclasses.dataclass(frozen=True)
class KindCounts:
    """What one kind has waiting, in flight and dead."""

    kind: str
    due: int  # pending, due time passed
    claimed: int  # claimed, not started (waiting for a worker)
    running: int  # claimed and started
    dead_24h: int  # dead within the last 24 hours


def kind_breakdown() -> list[KindCounts]:
    """Per kind with anything due, in flight or recently dead: the counts (kinds with nothing are absent)."""
    return [
        KindCounts(kind=r["kind"], due=r["due"], claimed=r["claimed"], running=r["running"], dead_24h=r["dead_24h"])
        for r in _records("kind_breakdown", {})
    ]


def backlog_status(stuck_after_seconds: float, exact_limit: int = 10_000) -> BacklogStatus:
    """The status numbers; pending counts past ``exact_limit`` are planner estimates, named in ``estimated``."""
    row = _records("backlog_status", {"stuck_after": stuck_after_seconds, "exact_limit": exact_limit})[0]
    estimated: list[str] = []
    for name in ESTIMATED_COUNTS:
        if row[name] > exact_limit:
            plan = _fetchall_explained(f"estimate_{name}")
            row[name] = max(exact_limit + 1, int(plan[0]["Plan"]["Plan Rows"]))
            estimated.append(name)
    return BacklogStatus(
        backlog=row["backlog"],
        oldest_overdue_seconds=row["oldest_overdue_seconds"],
        paused=row["paused"],
        pending=row["pending"],
        due_next_24h=row["due_next_24h"],
        claimed=row["claimed"],
        stuck=row["stuck"],
        dead_last_24h=row["dead_last_24h"],
        estimated=tuple(estimated),
    )


def _fetchall_explained(name: str) -> Any:
    """The planner's JSON plan of a named statement (EXPLAIN only: the statement does not run)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + queries()[name])
        plan = cursor.fetchone()[0]
    return json.loads(plan) if isinstance(plan, str) else plan


def database_now() -> dt.datetime:
    """The database clock: what every due-time decision uses (inside a transaction: its start)."""
    now: dt.datetime = _fetchall("database_now", {})[0][0]
    return now


def database_clock() -> dt.datetime:
    """The database clock at this instant, even inside a long transaction: where a delay counts from."""
    now: dt.datetime = _fetchall("database_clock", {})[0][0]
    return now


# --- Locks and leaders -------------------------------------------------------------------------------


def advisory_lock_held(key: int) -> bool:
    """Whether any session holds the advisory lock ``key`` (reads pg_locks; takes nothing)."""
    return bool(_fetchall("advisory_lock_held", {"key": key})[0][0])


def record_heartbeat(role: str, holder: str, *, new_lead: bool) -> None:
    """Write the leader's heartbeat for ``role`` (database clock); ``new_lead`` restarts "leading since"."""
    _fetchall("record_heartbeat", {"role": role, "holder": holder, "new_lead": new_lead})


# --- Fixed-time schedules ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """What the gate's insert returned: the run row, whether this delivery created it, and how late it is."""

    id: int
    inserted: bool
    tick: dt.datetime
    state: RunState
    late_seconds: float


def insert_schedule_run(
    schedule_id: int, tick: dt.datetime | None, trigger: str, worker: str, task_id: str
) -> LedgerEntry | None:
    """Record (schedule, tick) as running, or count a duplicate; None when the tick was pruned already."""
    params = {"schedule_id": schedule_id, "tick": tick, "trigger": trigger, "worker": worker, "task_id": task_id}
    rows = _records("insert_schedule_run", params)
    if not rows:
        return None
    row = rows[0]
    return LedgerEntry(
        id=row["id"],
        inserted=row["inserted"],
        tick=row["tick"],
        state=RunState(row["state"]),
        late_seconds=row["late_seconds"],
    )


def finish_schedule_run(run_id: int, state: RunState, error: str = "") -> bool:
    """Record a run's outcome; False when it was no longer running (replaced or closed meanwhile)."""
    return bool(_fetchall("finish_schedule_run", {"id": run_id, "state": state, "error": error}))


def set_schedule_run_attempt(run_id: int, attempt: int) -> bool:
    return bool(_fetchall("set_schedule_run_attempt", {"id": run_id, "attempt": attempt}))


@dataclasses.dataclass(frozen=True)
class RunningRun:
    """A fixed-time run marked running: where it runs, to stop it (replace)."""

    id: int
    task_id: str  # its Celery task id ('' when unknown)
    worker: str
    tick: dt.datetime


def running_schedule_runs(schedule_id: int, exclude_id: int) -> list[RunningRun]:
    """The schedule's other runs marked running, oldest tick first."""
    rows = _records("running_schedule_runs", {"schedule_id": schedule_id, "id": exclude_id})
    return [RunningRun(id=row["id"], task_id=row["task_id"], worker=row["worker"], tick=row["tick"]) for row in rows]


def close_other_running_runs(schedule_id: int, exclude_id: int, state: RunState, error: str) -> list[int]:
    params = {"schedule_id": schedule_id, "id": exclude_id, "state": state, "error": error}
    return [row[0] for row in _fetchall("close_other_running_runs", params)]


def record_missed_ticks(schedule_id: int, ticks: Sequence[dt.datetime], error: str) -> list[dt.datetime]:
    """Insert missed rows for ``ticks`` (those without a row yet); returns the ticks recorded."""
    if not ticks:
        return []
    rows = _fetchall("record_missed_ticks", {"schedule_id": schedule_id, "ticks": list(ticks), "error": error})
    return [row[0] for row in rows]


def prune_schedule_runs(schedule_id: int, successful: int, failed: int) -> int:
    """Delete history beyond the limits; returns how many rows went."""
    params = {"schedule_id": schedule_id, "successful": successful, "failed": failed}
    return int(_fetchall("prune_schedule_runs", params)[0][0])


def advance_last_tick(schedule_id: int, tick: dt.datetime) -> bool:
    return bool(_fetchall("advance_last_tick", {"schedule_id": schedule_id, "tick": tick}))


def move_anchor_for_timing(schedule_id: int, key: str, at: dt.datetime | None = None) -> dt.datetime | None:
    """Store a new timing fingerprint and move the anchor to ``at`` (default: database now).

    Returns the new anchor, or None when the fingerprint was already ``key`` (nothing changed).
    """
    rows = _fetchall("move_anchor_for_timing", {"schedule_id": schedule_id, "key": key, "at": at})
    return rows[0][0] if rows else None


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


# --- Broker deferrals ------------------------------------------------------------------------------


def record_dead_deferral(
    *,
    kind: str,
    payload: Any,
    due_at: dt.datetime | None,
    attempts: int,
    error: str,
    key: str,
    lease_seconds: int,
) -> int | None:
    """Record a spent broker deferral as a dead row; its id, or None if that key is already recorded dead."""
    params = {
        "kind": kind,
        "payload": json.dumps(payload),
        "due_at": due_at,
        "attempts": max(1, attempts),
        "error": error,
        "key": key,
        "lease_seconds": max(1, lease_seconds),
    }
    rows = _fetchall("record_dead_deferral", params)
    return rows[0][0] if rows else None


# --- Dashboard, /metrics and /healthz (read-only) ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    holder: str
    acquired_at: dt.datetime
    heartbeat_at: dt.datetime
    age_seconds: float


def beat_heartbeat(role: str = "beat") -> Heartbeat | None:
    """The leading process's heartbeat for ``role`` with its age by the database clock."""
    rows = _records("beat_heartbeat", {"role": role})
    if not rows:
        return None
    row = rows[0]
    return Heartbeat(
        holder=row["holder"],
        acquired_at=row["acquired_at"],
        heartbeat_at=row["heartbeat_at"],
        age_seconds=row["age_seconds"],
    )


@dataclasses.dataclass(frozen=True)
class LagMinute:
    minute: dt.datetime
    attempts: int
    p50: float
    p95: float
    max: float


def attempt_lag_by_minute(window_seconds: float) -> list[LagMinute]:
    """Due-to-start lag per minute of the attempts that started within the window."""
    return [
        LagMinute(minute=row["minute"], attempts=row["attempts"], p50=row["p50"], p95=row["p95"], max=row["max"])
        for row in _records("attempt_lag_by_minute", {"window": window_seconds})
    ]


@dataclasses.dataclass(frozen=True)
class LagBucket:
    """One bucket of the lag histogram: bucket i holds lags in [bounds[i-1], bounds[i]) (0: below bounds[0])."""

    bucket: int
    count: int
    total_seconds: float  # the sum of the bucket's lags


def attempt_lag_histogram(window_seconds: float, bounds: Sequence[float]) -> list[LagBucket]:
    """The window's attempts' due-to-start lags per bucket (buckets without attempts are left out)."""
    rows = _records("attempt_lag_histogram", {"window": window_seconds, "bounds": list(bounds)})
    return [LagBucket(bucket=row["bucket"], count=row["n"], total_seconds=row["total"]) for row in rows]


@dataclasses.dataclass(frozen=True)
class BacklogPoint:
    at: dt.datetime
    backlog: int


def backlog_history(window_seconds: float, points: int) -> list[BacklogPoint]:
    """The backlog at ``points`` + 1 evenly spaced instants of the window, rebuilt from row timestamps."""
    rows = _records("backlog_history", {"window": window_seconds, "points": points})
    return [BacklogPoint(at=row["at"], backlog=row["backlog"]) for row in rows]


@dataclasses.dataclass(frozen=True)
class LagBucketStats:
    """Due-to-start lag of the attempts that started within one bucket (``at`` None: the whole window)."""

    at: dt.datetime | None
    attempts: int
    p50: float
    p99: float
    max: float


def attempt_lag_buckets(
    window_seconds: float, bucket_seconds: float
) -> tuple[LagBucketStats | None, list[LagBucketStats]]:
    """The window's lag percentiles overall (None without attempts) and per bucket, oldest first."""
    rows = [
        LagBucketStats(at=r["bucket"], attempts=r["attempts"], p50=r["p50"], p99=r["p99"], max=r["max"])
        for r in _records("attempt_lag_buckets", {"window": window_seconds, "bucket": bucket_seconds})
        if r["attempts"]  # the whole-window row comes back (with NULLs) even when nothing started
    ]
    overall = next((r for r in rows if r.at is None), None)
    return overall, [r for r in rows if r.at is not None]


@dataclasses.dataclass(frozen=True)
class WaitingPoint:
    at: dt.datetime
    waiting: int  # due and not started: pending, or claimed and not yet started
    paused: int  # due and pending, of a paused kind


def waiting_history(window_seconds: float, points: int) -> list[WaitingPoint]:
    """Waiting and paused work at ``points`` + 1 evenly spaced instants of the window, rebuilt from timestamps."""
    rows = _records("waiting_history", {"window": window_seconds, "points": points})
    return [WaitingPoint(at=r["at"], waiting=r["waiting"], paused=r["paused"]) for r in rows]


@dataclasses.dataclass(frozen=True)
class UpcomingJobs:
    """Pending jobs of one kind due within one hour of the horizon."""

    kind: str
    hour: int  # hours from now: 0 is the next hour
    count: int
    first_due: dt.datetime


def upcoming_jobs(horizon_seconds: float) -> list[UpcomingJobs]:
    """The pending jobs due within the horizon, per kind and hour from now."""
    return [
        UpcomingJobs(kind=row["kind"], hour=row["hour"], count=row["n"], first_due=row["first_due"])
        for row in _records("upcoming_jobs", {"horizon": horizon_seconds})
    ]


@dataclasses.dataclass(frozen=True)
class OutcomeCount:
    kind: str
    outcome: AttemptOutcome
    count: int


def attempt_outcomes(window_seconds: float) -> list[OutcomeCount]:
    """The attempts that ended within the window, per kind and outcome."""
    return [
        OutcomeCount(kind=row["kind"], outcome=AttemptOutcome(row["outcome"]), count=row["n"])
        for row in _records("attempt_outcomes", {"window": window_seconds})
    ]


@dataclasses.dataclass(frozen=True)
class RunStateCount:
    """A fixed-time schedule's runs in one state, with its latest success."""

    schedule: str
    state: RunState
    count: int  # runs started within the window
    last_success: dt.datetime | None  # kept by the history limits, so possibly older than the window


def schedule_run_states(window_seconds: float) -> list[RunStateCount]:
    """The fixed-time runs per schedule and state."""
    return [
        RunStateCount(
            schedule=row["name"], state=RunState(row["state"]), count=row["n"], last_success=row["last_success"]
        )
        for row in _records("schedule_run_states", {"window": window_seconds})
    ]


# --- Web doors: the JSON API's limits and the health backlog -----------------------------------------


@dataclasses.dataclass(frozen=True)
class Allowance:
    """Whether an owner may create a job now, and if not, in how many seconds they may."""

    allowed: bool
    retry_after_seconds: float


def take_create_allowance(owner_id: int, rate_per_second: float, burst: int) -> Allowance:
    """Take one creation from ``owner_id``'s bucket (``rate_per_second`` sustained, ``burst`` at once)."""
    emission = 1.0 / rate_per_second
    row = _records(
        "take_create_allowance",
        {"owner_id": owner_id, "emission": emission, "window": max(1, burst) * emission},
    )[0]
    return Allowance(allowed=row["allowed"], retry_after_seconds=row["retry_after_seconds"])


def lock_owner_creations(key: int) -> None:
    """Hold the transaction-level advisory lock ``key`` (one owner's creations) until the transaction ends."""
    _fetchall("lock_owner_creations", {"key": key})


@dataclasses.dataclass(frozen=True)
class OwnerPending:
    """An owner's pending jobs (exact up to the limit asked, then limit + 1) and when the first is due."""

    pending: int
    next_due_in_seconds: float


def owner_pending_jobs(owner_id: int, limit: int, new_id: int) -> OwnerPending:
    """``owner_id``'s pending jobs up to ``limit`` + 1, and when the first but ``new_id`` is due."""
    row = _records("owner_pending_jobs", {"owner_id": owner_id, "limit": limit, "new_id": new_id})[0]
    return OwnerPending(pending=row["pending"], next_due_in_seconds=row["next_due_in_seconds"])


@dataclasses.dataclass(frozen=True)
class HealthBacklog:
    """The overdue jobs /healthz judges (the system's and critical kinds'), exact up to the limit asked."""

    backlog: int
    oldest_overdue_seconds: float


def health_backlog(critical_kinds: Collection[str], limit: int) -> HealthBacklog:
    row = _records("health_backlog", {"critical": sorted(critical_kinds), "limit": limit})[0]
    return HealthBacklog(backlog=row["backlog"], oldest_overdue_seconds=row["oldest_overdue_seconds"])


@dataclasses.dataclass(frozen=True)
class CounterValue:
    metric: str  # job_attempts, jobs_finished, job_retries, jobs_reclaimed, fixed_runs
    label: str  # the kind, or the fixed-time schedule's name
    outcome: str
    value: int


def outcome_counters() -> list[CounterValue]:
    """Every monotonic outcome counter (kept by database triggers; never lowered by pruning)."""
    return [CounterValue(**row) for row in _records("outcome_counters", {})]


# --- Recurrences (scheduling.recurring) ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NewRecurrence:
    kind: str
    payload: Any
    key: str
    owner_id: int | None
    expression: str
    every_seconds: float | None
    timezone: str
    dst_gap: str
    missed: str
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    anchor_at: dt.datetime | None
    priority: int | None
    max_attempts: int | None


def _recurrence_params(new: NewRecurrence) -> dict[str, Any]:
    params = dataclasses.asdict(new)
    params["payload"] = json.dumps(new.payload)
    return params


@dataclasses.dataclass(frozen=True)
class RecurrenceRow:
    """A recurrence as the planner and the API read it (locked)."""

    id: int
    kind: str
    expression: str
    every_seconds: float | None
    timezone: str
    dst_gap: str
    missed: str
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    anchor_at: dt.datetime
    current_at: dt.datetime | None
    priority: int | None
    max_attempts: int | None
    payload: Any = None
    key: str = ""
    owner_id: int | None = None
    state: str = "active"
    current_job_id: int | None = None
    current_state: JobState | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RecurrenceRow:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {name: value for name, value in row.items() if name in names}
        if isinstance(values.get("payload"), str):  # jsonb comes back as text on a raw cursor
            values["payload"] = json.loads(values["payload"])
        if values.get("current_state") is not None:
            values["current_state"] = JobState(values["current_state"])
        return cls(**values)


def insert_recurrence(new: NewRecurrence) -> int | None:
    """Insert a recurrence; None when its owner already has the key."""
    rows = _fetchall("insert_recurrence", _recurrence_params(new))
    return rows[0][0] if rows else None


@dataclasses.dataclass(frozen=True)
class CreatedRecurrence:
    id: int
    key: str
    owner_id: int | None
    timezone: str


def insert_recurrences(
    new: NewRecurrence,
    payloads: Sequence[str],
    keys: Sequence[str],
    owner_ids: Sequence[int | None],
    zones: Sequence[str],
) -> list[CreatedRecurrence]:
    """Insert many recurrences sharing ``new``'s rule (payloads already JSON); taken keys are skipped."""
    params = _recurrence_params(new)
    params.update(payloads=list(payloads), keys=list(keys), owner_ids=list(owner_ids), timezones=list(zones))
    return [
        CreatedRecurrence(id=row["id"], key=row["key"], owner_id=row["owner_id"], timezone=row["timezone"])
        for row in _records("insert_recurrences", params)
    ]


def lock_recurrence(recurrence_id: int) -> RecurrenceRow | None:
    """The recurrence's row, locked until the transaction ends (None: no such recurrence)."""
    rows = _records("lock_recurrence", {"id": recurrence_id})
    return RecurrenceRow.from_row(rows[0]) if rows else None


def recurrence_id_by_key(key: str, owner_id: int | None) -> int | None:
    rows = _fetchall("recurrence_id_by_key", {"key": key, "owner_id": owner_id})
    return rows[0][0] if rows else None


def update_recurrence_rule(row: RecurrenceRow) -> bool:
    params = dataclasses.asdict(row)
    params["payload"] = json.dumps(row.payload)
    return bool(_fetchall("update_recurrence_rule", params))


def last_run_occurrence_at(recurrence_id: int) -> dt.datetime | None:
    return _fetchall("last_run_occurrence_at", {"id": recurrence_id})[0][0]


def move_pending_occurrence(recurrence_id: int, occurrence_at: dt.datetime, due_at: dt.datetime) -> DueJob | None:
    """Move the recurrence's pending occurrence (None: it is no longer pending)."""
    rows = _records("move_pending_occurrence", {"id": recurrence_id, "occurrence_at": occurrence_at, "due_at": due_at})
    return DueJob.from_row(rows[0]) if rows else None


def set_recurrence_current(recurrence_id: int, current_at: dt.datetime | None) -> bool:
    return bool(_fetchall("set_recurrence_current", {"id": recurrence_id, "current_at": current_at}))


def set_recurrences_state(ids: Sequence[int], state: str, from_states: Sequence[str]) -> list[int]:
    rows = _fetchall("set_recurrences_state", {"ids": list(ids), "state": state, "from_states": list(from_states)})
    return [row[0] for row in rows]


def cancel_pending_occurrences(recurrence_ids: Sequence[int]) -> list[int]:
    """Cancel the pending occurrence of each recurrence; returns the jobs cancelled."""
    return [row[0] for row in _fetchall("cancel_pending_occurrences", {"ids": list(recurrence_ids)})]


def recurrence_states(ids: Sequence[int]) -> dict[int, str]:
    return {row[0]: row[1] for row in _fetchall("recurrence_states", {"ids": list(ids)})}


def pick_recurrences_to_plan(limit: int) -> list[RecurrenceRow]:
    """Lock up to ``limit`` active recurrences whose latest occurrence has left pending (SKIP LOCKED)."""
    return [RecurrenceRow.from_row(row) for row in _records("pick_recurrences_to_plan", {"limit": limit})]


@dataclasses.dataclass(frozen=True)
class PlannedOccurrence:
    """The next occurrence of a recurrence, as the planner or the API computed it."""

    recurrence_id: int
    prev: dt.datetime | None  # the latest occurrence instant the caller read
    occurrence_at: dt.datetime
    due_at: dt.datetime
    lease_seconds: int
    max_attempts: int
    priority: int


@dataclasses.dataclass(frozen=True)
class CreatedOccurrence:
    recurrence_id: int
    job_id: int
    occurrence_at: dt.datetime
    due_at: dt.datetime
    in_seconds: float


def plan_occurrences(plans: Sequence[PlannedOccurrence]) -> list[CreatedOccurrence]:
    """Create the planned occurrences and advance their recurrences in one statement (at most once each)."""
    if not plans:
        return []
    params = {
        "ids": [p.recurrence_id for p in plans],
        "prevs": [p.prev for p in plans],
        "ats": [p.occurrence_at for p in plans],
        "dues": [p.due_at for p in plans],
        "leases": [p.lease_seconds for p in plans],
        "attempts": [p.max_attempts for p in plans],
        "priorities": [p.priority for p in plans],
    }
    return [
        CreatedOccurrence(
            recurrence_id=row["recurrence_id"],
            job_id=row["job_id"],
            occurrence_at=row["occurrence_at"],
            due_at=row["due_at"],
            in_seconds=row["in_seconds"],
        )
        for row in _records("plan_occurrences", params)
    ]


def end_recurrences(ends: Sequence[tuple[int, dt.datetime | None]]) -> list[int]:
    """Mark ended the recurrences (id, latest instant read) with no occurrence left before their end."""
    if not ends:
        return []
    params = {"ids": [e[0] for e in ends], "prevs": [e[1] for e in ends]}
    return [row[0] for row in _fetchall("end_recurrences", params)]


def recurrence_state_counts() -> dict[str, int]:
    return {row[0]: row[1] for row in _fetchall("recurrence_state_counts", {})}


@dataclasses.dataclass(frozen=True)
class PlannerLag:
    waiting: int  # active recurrences whose occurrence left pending, next not created yet
    oldest_seconds: float  # since the oldest one's occurrence instant


def recurrence_planner_lag() -> PlannerLag:
    row = _records("recurrence_planner_lag", {})[0]
    return PlannerLag(waiting=row["n"], oldest_seconds=row["oldest_seconds"] if row["n"] else 0.0)


@dataclasses.dataclass(frozen=True)
class UpcomingOccurrences:
    kind: str
    count: int
    first_due: dt.datetime


def upcoming_occurrences(horizon_seconds: float) -> list[UpcomingOccurrences]:
    """Pending recurrence occurrences due within the horizon, per kind."""
    return [
        UpcomingOccurrences(kind=row["kind"], count=row["n"], first_due=row["first_due"])
        for row in _records("upcoming_occurrences", {"horizon": horizon_seconds})
    ]


# --- Refused messages and deleted owners (#22) --------------------------------------------------


def count_refused_message(task: str) -> int | None:
    """Count one broker message of ``task`` refused at a worker's door; the new total.

    None when the database did not answer: the message is refused all the same (a refusal never
    depends on the count), and the lost count is logged.
    """
    try:
        return int(_fetchall("count_refused_message", {"task": task})[0][0])
    except (OperationalError, InterfaceError):
        logger.warning("could not count a refused message", extra={"task": task, "action": "count_failed"})
        return None


@dataclasses.dataclass(frozen=True)
class JobOwner:
    owner_id: int | None  # None: the system's job, or its owner was deleted (then former_owner says who)
    former_owner: str  # "username (#id)" of a deleted owner; "" otherwise


def job_owner(job_id: int) -> JobOwner | None:
    """Who job ``job_id`` belongs to (None: no such job)."""
    rows = _fetchall("job_owner", {"id": job_id})
    return JobOwner(owner_id=rows[0][0], former_owner=rows[0][1]) if rows else None
