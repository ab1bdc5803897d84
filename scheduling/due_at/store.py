"""Every statement of the due_at jobs: the named blocks of ``due_at/sql/*.sql``.

Scheduling (``schedule.sql``), claiming and running (``claim.sql``), aborting (``abort.sql``), sweeping and the status
numbers (``sweep.sql``) and the kind controls the claim reads (``kinds.sql``). Functions take plain
values and return ids, counts, or frozen dataclasses built by column name (``core.db``), with
states as the ``TextChoices`` of ``scheduling.models``. Decisions (what to claim, when to retry)
live in ``claim.py``, ``runner.py``, ``sweep.py`` and ``api.py``; only this module of the package
holds a cursor, and only ``scheduling.due_at`` imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg2
from django.db import DatabaseError, connection, transaction

from scheduling.core import conf, db, registry
from scheduling.core import options as options_
from scheduling.due_at import lifecycle
from scheduling.models import AttemptOutcome, JobAttempt, JobState

SQL = db.Statements(Path(__file__).with_name("sql"))
TRANSACTION_STATUS_INTRANS = 2  # libpq's PQTRANS_INTRANS: in a transaction that takes statements
TRANSACTION_STATUS_INERROR = 3  # libpq's PQTRANS_INERROR: the (sub)transaction failed, statements are refused
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off;\n"


def _claims(claims: Sequence[tuple[int, str]]) -> dict[str, Any]:
    return {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}


# The statements every batch runs, prepared on the worker's connection (``db.run_prepared_here``):
# their parameters' types. Planning them was about half of what PostgreSQL spent on a batch of one
# job (bench flow: start_jobs 0.16 ms, lock_claims 0.10, set_job_states 0.31).
CLAIMS_TYPES = {"ids": "bigint[]", "tokens": "text[]"}
START_TYPES = {**CLAIMS_TYPES, "worker": "text"}
TRANSITION_TYPES = {
    **CLAIMS_TYPES,
    **{name: "text[]" for name in ("from_states", "events", "delays", "errors", "started", "finished", "tracebacks")},
    "plans": "jsonb",  # as text, a generic plan would parse it again for every row
}


def _async_prefix() -> str:
    """What a claim-path statement starts with so that it commits without waiting for the WAL flush.

    The claim, start and heartbeat statements are most of what the claim loop waits for (a flush
    takes milliseconds on a busy disk). A PostgreSQL crash can undo their last fraction of a second:
    those jobs are claimed and run again (at-least-once, as after a worker crash). Outcomes,
    schedule() and cancel() commit synchronously, so nothing a caller was told is committed is lost.
    In autocommit the ``SET LOCAL`` and the statement go as one query string, which PostgreSQL runs
    as one implicit transaction: the setting holds for that transaction, in one round trip (an
    explicit one costs a ``BEGIN`` and a ``COMMIT`` more). Inside a caller's transaction the
    statement joins it, unprefixed. ``SCHEDULING_ASYNC_COMMIT = False``: no prefix.
    """
    return ASYNC_COMMIT if conf.get().async_commit and connection.get_autocommit() else ""


# --- Scheduling ------------------------------------------------------------------------------------


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
class NewJob:
    """A job to insert: its kind, payload and checked options (``core.options.ValidOptions``), whole."""

    kind: str
    payload: Any
    options: options_.ValidOptions

    def params(self) -> dict[str, Any]:
        """The statement parameters of an insert or a keyed upsert (no uniqueness window: ``insert_unique_job``)."""
        params = {"kind": self.kind, "payload": json.dumps(self.payload), **self.options.params()}
        return {**params, "unique_key": None, "unique_states": None}


@dataclasses.dataclass(frozen=True)
class DueJob:
    """A pending row as a write left it: its due time, and how far off that is by the database clock."""

    id: int
    due_at: dt.datetime
    in_seconds: float


@dataclasses.dataclass(frozen=True)
class LiveJob:
    """A key's job for cancel and reschedule by key: its newest pending one, else its newest claimed one."""

    id: int
    state: JobState


def insert_job(job: NewJob, on_conflict: str) -> DueJob | None:
    """Insert (or, with a key, upsert) a job; None when the key's live job was left alone."""
    if job.options.key is None:
        return SQL.fetch_one(DueJob, "insert_job", job.params())
    upserted = upsert_keyed_job(job, on_conflict)
    return None if upserted is None else DueJob(id=upserted.id, due_at=upserted.due_at, in_seconds=upserted.in_seconds)


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
    assert job.options.key is not None
    name = "upsert_job_replace" if on_conflict == "replace" else "upsert_job_keep"
    return SQL.fetch_one(KeyedUpsert, name, job.params())


def snoozes(job_id: int) -> int:
    """How many times the job snoozed (``registry.Snooze``): its attempts recorded as snoozed."""
    return JobAttempt.objects.filter(job_id=job_id, outcome=AttemptOutcome.SNOOZED).count()


@dataclasses.dataclass(frozen=True)
class UniqueHolder:
    """The job holding a unique window: its id and state."""

    id: int
    state: JobState


def unique_key(job: NewJob) -> str:
    """The job's unique key: a hash of kind, owner, window and key (or payload), then the window slot (database clock).

    Without a key the payload counts, as its canonical JSON (sorted keys), so equal payloads meet.
    """
    window = job.options.unique_for_seconds
    assert window is not None
    what = (
        job.options.key
        if job.options.key is not None
        else json.dumps(job.payload, sort_keys=True, separators=(",", ":"))
    )
    identity = json.dumps([job.kind, job.options.owner_id, window, job.options.key is not None, what])
    slot = SQL.fetch_value("unique_slot", {"window": window})
    return f"{hashlib.sha256(identity.encode()).hexdigest()[:40]}:{slot}"


def insert_unique_job(job: NewJob, key: str) -> DueJob | None:
    """Insert a job holding ``key`` in its ``unique_states``; None when a row holds it (or the job's key index)."""
    params = {**job.params(), "unique_key": key, "unique_states": list(job.options.unique_states)}
    return SQL.fetch_one(DueJob, "insert_unique_job", params)


def unique_job_holder(key: str) -> UniqueHolder | None:
    """The job holding ``key`` now (a fresh statement: it sees a holder that committed while we waited)."""
    return SQL.fetch_one(UniqueHolder, "unique_job_holder", {"unique_key": key})


def replace_unique_job(job: NewJob, key: str, job_id: int) -> DueJob | None:
    """Move the holder ``job_id`` of ``key`` to ``job``'s payload and options if it still waits (pending)."""
    return SQL.fetch_one(DueJob, "replace_unique_job", {**job.params(), "unique_key": key, "id": job_id})


def insert_jobs(kind: str, payloads: Sequence[str], options: options_.ValidOptions) -> list[DueJob]:
    """Insert many jobs of one kind (payloads already JSON text), in the payloads' order (no key)."""
    return SQL.fetch_all(DueJob, "insert_jobs", {"kind": kind, "payloads": list(payloads), **options.params()})


def live_job_by_key(key: str, owner_id: int | None = None) -> LiveJob | None:
    """``key``'s job for ``owner_id`` (None: the system's): its newest pending job, else its newest claimed one."""
    return SQL.fetch_one(LiveJob, "live_job_by_key", {"key": key, "owner_id": owner_id})


def job_state(job_id: int) -> JobState | None:
    state = SQL.fetch_value("job_state", {"id": job_id})
    return None if state is None else JobState(state)


def job_states(ids: Sequence[int]) -> dict[int, JobState]:
    """{id: state} of the jobs among ``ids`` that exist."""
    return {row.id: row.state for row in SQL.fetch_all(LiveJob, "job_states", {"ids": list(ids)})}


def cancel_job(job_id: int) -> bool:
    return bool(SQL.fetch_values("cancel_job", {"id": job_id}))


def reschedule_job(job_id: int, due_at: dt.datetime) -> DueJob | None:
    """The moved job, or None when it is not pending."""
    return SQL.fetch_one(DueJob, "reschedule_job", {"id": job_id, "due_at": due_at})


def change_jobs(statement: str, ids: Sequence[int]) -> list[int]:
    """Run bulk statement ``statement`` (schedule.sql: ``%(ids)s`` in, the changed ids out) over ``ids``.

    The store function of every bulk change that takes only ids: a new one is its statement and its
    api call (``api.<verb>_many``), nothing here.
    """
    return SQL.fetch_values(statement, {"ids": list(ids)})


def cancel_jobs(ids: Sequence[int]) -> list[int]:
    return change_jobs("cancel_jobs", ids)


def reschedule_jobs(ids: Sequence[int], due_at: dt.datetime) -> list[DueJob]:
    """Move the pending ones of ``ids``; the others are left as they are (and not returned)."""
    return SQL.fetch_all(DueJob, "reschedule_jobs", {"ids": list(ids), "due_at": due_at})


def run_jobs_now(ids: Sequence[int]) -> list[int]:
    return change_jobs("run_jobs_now", ids)


def retry_dead_jobs(ids: Sequence[int]) -> list[int]:
    return change_jobs("retry_dead_jobs", ids)


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
    batch: int = 0  # the batch the claim cut it into: its rank, 1 the most urgent (claim.batches_for)


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
    rate_partition: str | None = None  # its kind's rate window it starts in (starts.py); None: no rate


@dataclasses.dataclass(frozen=True)
class _StartedRow:
    """A row of ``start_jobs`` as the statement returns it (the overrides flat)."""

    id: int
    token: str
    kind: str
    payload: db.Json
    attempts: int
    max_attempts: int
    due_at: dt.datetime
    db_now: dt.datetime
    timeout_seconds: float | None
    backoff_base_seconds: float | None
    backoff_cap_seconds: float | None
    atomic: bool | None
    rate_partition: str | None

    def started(self) -> StartedJob:
        overrides = Overrides(self.timeout_seconds, self.backoff_base_seconds, self.backoff_cap_seconds, self.atomic)
        return StartedJob(
            id=self.id,
            token=self.token,
            kind=self.kind,
            payload=self.payload,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            due_at=self.due_at,
            db_now=self.db_now,
            overrides=NO_OVERRIDES if overrides == NO_OVERRIDES else overrides,
            rate_partition=self.rate_partition,
        )


# A kind whose rate is partitioned reads up to this many of its due rows per claim and decides
# per partition which to take: a partition is served while its rows are among its kind's most
# urgent PARTITION_SCAN_ROWS (docs/operations.md, "Rate limits").
PARTITION_SCAN_ROWS = 1000
# The claim walks the due rows kind by kind when more than half of the first WALK_HEAD_ROWS due rows
# are of kinds it leaves out (paused, capped, rate-limited, of a closed queue): claim.sql, "head".
WALK_HEAD_ROWS = 64
# A rate-limited kind's claim keeps in step with its handlers' starts, looking as far ahead as the
# control loop's step for its rate: period / limit, within these bounds (control.RATE_STEP_SECONDS
# and control.WAIT_STEP_SECONDS, equal by test; the loop may step faster while a faster kind waits).
# claim.sql, "in step with the handlers' starts".
START_LEAD_MIN_SECONDS = 0.02
START_LEAD_MAX_SECONDS = 0.5


def claim_params(
    limit: int,
    *,
    messages: int | None = None,
    batch_sizes: Mapping[str, int] | None = None,
    kind_queues: Mapping[str, str] | None = None,
    queue_rooms: Mapping[str, int] | None = None,
    rates: bool = True,
) -> dict[str, Any]:
    """The parameters of ``claim_due_jobs``: at most ``messages`` batches (default: ``limit``), cut by kind.

    ``batch_sizes`` maps a kind to its batch size; a kind not in it is cut into batches of one.
    ``kind_queues`` maps a kind to its named queue (default "default"); ``queue_rooms`` a queue to
    the batches it has room for (a queue not in it: ``messages``). The kinds of a queue with no
    room are left out of the claim. ``rates`` false leaves the rate-limited kinds out of it.
    """
    queues = dict(kind_queues or {})
    rooms = dict(queue_rooms or {})
    kinds = sorted(set(batch_sizes or {}) | set(queues))
    sizes = dict(batch_sizes or {})
    return {
        "partition_scan": PARTITION_SCAN_ROWS,
        "walk_head": WALK_HEAD_ROWS,
        "start_lead_min": START_LEAD_MIN_SECONDS,
        "start_lead_max": START_LEAD_MAX_SECONDS,
        "rates": rates,
        "limit": limit,
        "messages": limit if messages is None else messages,
        "kinds": kinds,
        "batch_sizes": [sizes.get(k, 1) for k in kinds],
        "kind_queues": [queues.get(k, "default") for k in kinds],
        "queues": list(rooms),
        "queue_rooms": [max(0, int(r)) for r in rooms.values()],
        "closed_kinds": sorted(k for k in kinds if rooms.get(queues.get(k, "default"), 1) <= 0),
    }


def claim_statement() -> str:
    """The claim as one string: ``lock_capped_kinds`` then ``claim_due_jobs``; the rows are the claim's."""
    return SQL["lock_capped_kinds"] + ";\n" + SQL["claim_due_jobs"]


# The claim reads its rows by index from pages that are cached (pending rows are few and hot): a
# random page costs what a sequential one does (1.0; 1.1 is the usual setting for SSDs), so the planner
# weighs an index by the rows it reads, not by how well its first column follows the heap's order.
# With the default (4), a kind's branch read its rows through the due_at index, passing over every
# other kind's due rows (bench flow: 7,900 a claim), not through the (kind, priority, due_at) index.
# And no plan of the claim reads rows to sort them where an index gives their order (enable_sort and
# enable_incremental_sort off: a sort is still made where nothing else can order the rows, the
# claim's windows and its result). Each priority's branch is written so that only its own index
# gives its order (claim.sql), so it is one descent of that index whatever the table's statistics
# say. With statistics of a quiet table (no pending rows: the planner sees every plan as free) each
# empty priority's branch read all the due rows through the due_at index (a claim of 100 rows of
# 18,000 due: 24-28 ms against 2.7-3.3), and with a spike's statistics the common priority's branch
# read and sorted all of them (10-17 ms). Always with NO_JIT: with sorts off, the sorts nothing else
# can make (the windows, the result) cost the estimate 1e10 each, past every JIT threshold.
CLAIM_PLANNER_SETTINGS = {"random_page_cost": "1.0", "enable_sort": "off", "enable_incremental_sort": "off"}
INDEX_COSTS = "".join(f"SET LOCAL {name} = {value};\n" for name, value in CLAIM_PLANNER_SETTINGS.items())

# claim_params' values as the claim's PREPARE declares them (claim_due_jobs on a session)
CLAIM_PARAM_TYPES = {
    "partition_scan": "int",
    "walk_head": "int",
    "start_lead_min": "float8",
    "start_lead_max": "float8",
    "rates": "boolean",
    "limit": "int",
    "messages": "int",
    "kinds": "text[]",
    "batch_sizes": "int[]",
    "kind_queues": "text[]",
    "queues": "text[]",
    "queue_rooms": "int[]",
    "closed_kinds": "text[]",
}


def claim_due_jobs(
    limit: int,
    *,
    messages: int | None = None,
    batch_sizes: Mapping[str, int] | None = None,
    kind_queues: Mapping[str, str] | None = None,
    queue_rooms: Mapping[str, int] | None = None,
    rates: bool = True,
    session: Any = None,
) -> list[Claim]:
    """Claim due rows: whole batches, at most ``messages`` of them, sorted most urgent first.

    The capped kinds' control rows are locked first, in a statement of its own in the same
    transaction (``lock_capped_kinds``): so the claim's count of a kind's claims sees every claim
    committed before it, and caps hold exactly with any number of claimers. ``rates`` false: the
    rate-limited kinds take nothing in this claim (the control loop claims them on their cadence).

    When it holds no control row (no kind is capped or rate-limited, or another claimer holds them
    all), no such kind has room in this claim, and the claim is ``claim_due_jobs_without_held``: the
    same statement without their branches (claim.sql, ``-- only held``), which plans in 1.0 ms
    instead of 2.7 (measured on 20,000 due rows). Two round trips instead of one; the choice needs
    the lock's answer.

    ``session``: a dedicated psycopg2 session (the control loop's leadership session, direct, never
    pooled) to claim in, in a transaction of its own, instead of Django's connection. There the
    claim is a prepared statement with one generic plan (``db.run_prepared``): planning it each
    time was a third of its cost (bench flow, partitioned: 9.5 of 25 ms a claim).
    """
    params = claim_params(
        limit,
        messages=messages,
        batch_sizes=batch_sizes,
        kind_queues=kind_queues,
        queue_rooms=queue_rooms,
        rates=rates,
    )
    if session is not None:
        return _claim_in_session(session, params)
    if not connection.get_autocommit():
        return _claim_in_callers_transaction(params)
    with transaction.atomic():
        # see _async_prefix
        return _claim(params, prefix=db.NO_JIT + INDEX_COSTS + (ASYNC_COMMIT if conf.get().async_commit else ""))


@contextlib.contextmanager
def _claim_settings_in_callers_transaction() -> Iterator[None]:
    """The settings every claim is planned with (``NO_JIT``, ``INDEX_COSTS``), for statements run in the
    caller's transaction, set back after them: not left to the caller's later statements. A statement
    that failed in the database leaves them to the rollback the caller's transaction (or savepoint)
    needs, which undoes them with the rest."""
    names = ["jit", *CLAIM_PLANNER_SETTINGS]
    restore = "SELECT set_config(name, value, true) FROM unnest(%s::text[], %s::text[]) AS s(name, value)"
    with connection.cursor() as cursor:
        cursor.execute("SELECT ARRAY(SELECT current_setting(name) FROM unnest(%s::text[]) AS name)", [names])
        values = cursor.fetchone()[0]
        cursor.execute(db.NO_JIT + INDEX_COSTS)
        try:
            yield
        except DatabaseError:
            raise
        except BaseException:
            cursor.execute(restore, [names, values])
            raise
        cursor.execute(restore, [names, values])


def _claim_in_callers_transaction(params: dict[str, Any]) -> list[Claim]:
    """The claim in the caller's transaction (which holds the lock until it ends), planned as every claim is."""
    with _claim_settings_in_callers_transaction():
        return _claim(params, prefix="")


def _claim(params: dict[str, Any], prefix: str) -> list[Claim]:
    held = SQL.fetch_values("lock_capped_kinds", params, prefix=prefix)[0]
    name = "claim_due_jobs" if held else "claim_due_jobs_without_held"
    return SQL.fetch_all(Claim, name, params)


# A claim in a dedicated session runs under the bound a claim on Django's connection has (its
# DATABASE_STATEMENT_TIMEOUT_MS, 30 s by default): the dedicated session has no statement timeout.
SESSION_CLAIM_TIMEOUT = "SET LOCAL statement_timeout = '30s';\n"

# The parameters of the control loop's reads in its session, typed for their PREPARE
_READ_PARAM_TYPES = {"horizon": "float8", "limit": "int"}


def _prepared_in_session(
    session: Any, name: str, params: Mapping[str, Any], *, prefix: str = ""
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Read-only statement ``name`` run prepared in ``session`` (autocommit: a transaction of its own)."""
    with session.cursor() as cursor:
        return db.run_prepared(cursor, name, SQL[name], params, _READ_PARAM_TYPES, prefix=prefix, replan_when_slow=True)


def _claim_in_session(session: Any, params: dict[str, Any]) -> list[Claim]:
    """``claim_due_jobs`` in a transaction of ``session``'s own: the lock, then the prepared claim, then commit."""
    prefix = db.NO_JIT + INDEX_COSTS + SESSION_CLAIM_TIMEOUT + (ASYNC_COMMIT if conf.get().async_commit else "")
    with session.cursor() as cursor:
        try:
            # inside the try: a lock wait past the session's lock_timeout must roll back, not leave the
            # lead's session in a failed transaction (its next check of the lead would fail on it)
            cursor.execute("BEGIN;\n" + prefix + SQL["lock_capped_kinds"], params)
            name = "claim_due_jobs" if cursor.fetchone()[0] else "claim_due_jobs_without_held"
            columns, rows = db.run_prepared(cursor, name, SQL[name], params, CLAIM_PARAM_TYPES)
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(psycopg2.Error):  # the session may be gone: its transaction went with it
                cursor.execute("ROLLBACK")
            raise
    return db.rows_as(Claim, columns, rows)


@dataclasses.dataclass(frozen=True)
class DueInstant:
    """An upcoming due time and how far it is by the database clock."""

    at: dt.datetime
    in_seconds: float


def next_due_times(horizon_seconds: float, limit: int, *, session: Any = None) -> list[DueInstant]:
    """Upcoming distinct due times, with their distance by the database clock.

    ``session``: a dedicated session to read them in, prepared there (as the claim, and again every
    ``db.REPLAN_SECONDS``: the control loop reads them on every turn).
    """
    params = {"horizon": horizon_seconds, "limit": limit}
    if session is None:
        return SQL.fetch_all(DueInstant, "next_due_times", params)
    return db.rows_as(DueInstant, *_prepared_in_session(session, "next_due_times", params))


def start_jobs(claims: Sequence[tuple[int, str]], worker: str) -> list[StartedJob]:
    params = {**_claims(claims), "worker": worker}
    rows = SQL.fetch_all(_StartedRow, "start_jobs", params, prefix=_async_prefix(), types=START_TYPES)
    return [row.started() for row in rows]


@dataclasses.dataclass(frozen=True)
class Renewal:
    """A claim still held after a heartbeat, with the abort asked for it (api.abort), if any."""

    id: int
    abort_by: str | None = None
    abort_at: dt.datetime | None = None


def heartbeat_jobs(claims: Sequence[tuple[int, str]]) -> list[Renewal]:
    """Refresh the claims; returns those still held (others were taken back), each with its abort if asked."""
    return SQL.fetch_all(Renewal, "heartbeat_jobs", _claims(claims), prefix=_async_prefix())


# --- Aborts (abort.sql) ------------------------------------------------------------------------------


def request_aborts(ids: Sequence[int], by: str) -> list[int]:
    """Ask the running jobs among ``ids`` to stop (a request row per claim); returns those asked."""
    return SQL.fetch_values("request_aborts", {"ids": list(ids), "by": by[:200]})


def unstarted_claims(ids: Sequence[int]) -> list[tuple[int, str]]:
    """The claims among ``ids`` not started yet, (id, token)."""
    return [(int(i), str(t)) for i, t in SQL.fetch_pairs("unstarted_claims", {"ids": list(ids)}).items()]


@dataclasses.dataclass(frozen=True)
class AbortRequest:
    requested_at: dt.datetime
    requested_by: str
    current_claim: bool  # for the job's current claim (False: an earlier attempt's)


def abortable_job_by_key(key: str, owner_id: int | None = None) -> LiveJob | None:
    """The owner's running or claimed job for ``key`` (else its newest job of that key, whatever its state)."""
    return SQL.fetch_one(LiveJob, "abortable_job_by_key", {"key": key, "owner_id": owner_id})


def job_abort(job_id: int) -> AbortRequest | None:
    return SQL.fetch_one(AbortRequest, "job_abort", {"id": job_id})


def lock_claims(claims: Sequence[tuple[int, str]], *, bound_seconds: float | None = None) -> list[int]:
    """Lock the claims still held under their tokens, in the caller's transaction; returns their ids.

    ``bound_seconds``: ``bound_transaction(bound_seconds)`` first, in the same round trip.
    """
    if not claims:
        return []
    if bound_seconds is None:
        return SQL.fetch_values("lock_claims", _claims(claims), types=CLAIMS_TYPES)
    params = {**_claims(claims), **_bound(bound_seconds)}
    return SQL.fetch_values("lock_claims", params, prefix=SQL["bound_transaction"] + ";\n", types=CLAIMS_TYPES)


def bound_transaction(seconds: float) -> None:
    """Limit the current transaction: idle (waiting on this process) or one statement, ``seconds`` at most.

    PostgreSQL ends the session past either limit, and with it the transaction's row locks: a stopped
    or hung process cannot keep its claims locked for ever. ``SET LOCAL``: the limits end with it.
    """
    SQL.execute("bound_transaction", _bound(seconds))


def _bound(seconds: float) -> dict[str, str]:
    return {"ms": str(max(1, round(seconds * 1000)))}


def transaction_failed() -> bool:
    """Whether the current transaction refuses statements: one failed and the error was caught and ignored.

    The driver's transaction status, without a round trip. (Django's own ``needs_rollback`` flag may
    be set without a failed statement: ``transaction.set_rollback(True)``.)
    """
    raw = connection.connection
    info = getattr(raw, "info", None)
    return info is not None and info.transaction_status == TRANSACTION_STATUS_INERROR


def transaction_usable() -> bool:
    """Whether the session is in a transaction that takes statements (not failed, not gone); no round trip."""
    info = getattr(connection.connection, "info", None)
    return info is not None and info.transaction_status == TRANSACTION_STATUS_INTRANS


def record_callback_failure(job_id: int, token: str, error: str) -> bool:
    """Note on a job's attempt (under ``token``) that one of its on_commit callbacks failed; False if none matched."""
    return bool(SQL.fetch_values("record_callback_failure", {"id": job_id, "token": token, "error": error}))


def unclaim_jobs(claims: Sequence[tuple[int, str]]) -> list[int]:
    """Give back claims that were never sent: pending again, their attempt uncounted; returns their ids."""
    changes = [Change(i, t, lifecycle.Event.UNSENT) for i, t in claims]
    return [moved.id for moved in set_job_states(changes, asynchronous=True)]


def take_start(conn: Any, kind: str, partition: str) -> tuple[dt.datetime, bool, float]:
    """One start permit of ``kind`` in window ``partition`` (``sql/starts.sql``): (at, granted, wait seconds).

    Sent on ``conn``, the worker process's own autocommit psycopg2 connection (``starts.py``), never
    Django's: a batch's open transaction must not hold the window's row. The window's row is written
    first when the claim has not written it yet.
    """
    params = {"kind": kind, "partition": partition}
    with conn.cursor() as cur:
        cur.execute(SQL["take_start"], params)
        row = cur.fetchone()
        if row is None:
            cur.execute(SQL["add_start_window"], params)
            cur.execute(SQL["take_start"], params)
            row = cur.fetchone()
    at, granted, wait_seconds = row
    return at, bool(granted), max(0.0, float(wait_seconds))


def give_back_rate_limited(claims: Sequence[tuple[int, str]], delay_seconds: float, reason: str) -> list[int]:
    """Give back started claims whose start permit had no room: pending after ``delay_seconds``, uncharged."""
    changes = [Change(i, t, lifecycle.Event.RATE_LIMITED, delay_seconds=delay_seconds, error=reason) for i, t in claims]
    return [moved.id for moved in set_job_states(changes)]


def give_back_unknown_kind(claims: Sequence[tuple[int, str]], delay_seconds: float, reason: str) -> list[int]:
    """Give back started claims of a kind this worker does not know: pending after ``delay_seconds``, uncharged."""
    changes = [Change(i, t, lifecycle.Event.UNKNOWN_KIND, delay_seconds=delay_seconds, error=reason) for i, t in claims]
    return [moved.id for moved in set_job_states(changes)]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one job's attempt ended, as the runner saw it."""

    id: int
    token: str
    started_at: dt.datetime
    finished_at: dt.datetime
    outcome: str  # AttemptOutcome value, or lifecycle.Event.RATE_LIMITED's (given back before it started)
    error: str = ""
    retry_delay_seconds: float = 0.0
    traceback: str = ""  # a failure's formatted traceback (bounded by the executor), kept on its attempt


@dataclasses.dataclass(frozen=True)
class Change:
    """One row for ``set_job_states``: a claim (id, token), what happened to it, and what comes with it."""

    id: int
    token: str
    event: lifecycle.Event
    together: bool = False  # CRASHED: it died with other unfinished jobs of its batch or chunk
    delay_seconds: float = 0.0  # a retry is due this long after the statement (its backoff)
    error: str = ""  # the job's last_error and its attempt's error
    started_at: dt.datetime | None = None  # the attempt's start (None: when it was claimed)
    finished_at: dt.datetime | None = None  # the attempt's end (None: now)
    traceback: str = ""

    @property
    def plan_name(self) -> str:
        return f"{self.event.value}:together" if self.together else self.event.value


@dataclasses.dataclass(frozen=True)
class MovedJob:
    """A job an outcome, a release or the sweeper moved: its id, its new state and due time."""

    id: int
    state: JobState
    due_at: dt.datetime | None = None
    refunded: bool = False  # its batch died together: the attempt was not counted
    batch: str = ""  # the sweeper: the batch it was started in ("holder claimed_at")


def set_job_states(changes: Sequence[Change], *, asynchronous: bool = False) -> list[MovedJob]:
    """Write the lifecycle's decisions for claims still held under their tokens: one statement.

    Each row's decision comes from its event's plan (``lifecycle.plan``), looked up by the facts the
    row reads when it is written; rows taken back meanwhile (stale tokens) are left alone and not
    returned. ``asynchronous``: a give-back of the claim path (see ``_async_prefix``).
    """
    if not changes:
        return []
    params = transition_params(changes)
    prefix = _async_prefix() if asynchronous else ""
    # Outcomes commit synchronously: a completion the worker was told about survives a crash (and
    # its flush makes every earlier asynchronous claim and start durable too).
    return SQL.fetch_all(MovedJob, "set_job_states", params, prefix=prefix, types=TRANSITION_TYPES)


def transition_params(changes: Sequence[Change]) -> dict[str, Any]:
    """The parameters of ``set_job_states`` for ``changes``: the rows, and the plans of their events."""
    plans = {c.plan_name: _encoded_plans(c.event, c.together) for c in {c.plan_name: c for c in changes}.values()}
    return {
        "ids": [c.id for c in changes],
        "tokens": [c.token for c in changes],
        "from_states": [",".join(lifecycle.FROM_STATES[c.event]) for c in changes],
        "events": [c.plan_name for c in changes],
        "delays": [c.delay_seconds for c in changes],
        "errors": [c.error for c in changes],
        "started": [c.started_at for c in changes],
        "finished": [c.finished_at for c in changes],
        "tracebacks": [c.traceback for c in changes],
        "plans": json.dumps(plans),
    }


@functools.cache
def _encoded_plans(event: lifecycle.Event, together: bool) -> list[dict[str, object]]:
    """An event's plans as the statement reads them: the same for every call, so made once per process."""
    return lifecycle.encoded(lifecycle.plans(event, together=together))


def _outcome_change(o: Outcome) -> Change:
    event = lifecycle.Event.SUCCEEDED if o.outcome == "succeeded" else lifecycle.Event(o.outcome)
    return Change(
        o.id,
        o.token,
        event,
        together=event == lifecycle.Event.CRASHED,  # the runner's: its writes lost with a sibling's (refunded)
        delay_seconds=o.retry_delay_seconds,
        error=o.error,
        started_at=o.started_at,
        finished_at=o.finished_at,
        traceback=o.traceback,
    )


def complete_jobs(outcomes: Sequence[Outcome]) -> list[int]:
    """Mark succeeded jobs done; returns the ids whose token still matched."""
    return [moved.id for moved in set_job_states([_outcome_change(o) for o in outcomes])]


def fail_jobs(outcomes: Sequence[Outcome]) -> list[MovedJob]:
    """Record failures; returns the jobs whose token still matched (pending again with a due time, or dead)."""
    return set_job_states([_outcome_change(o) for o in outcomes])


def release_jobs(claims: Sequence[tuple[int, str]], reason: str) -> list[MovedJob]:
    """Give claims back (pending, or dead when their attempts are spent); the attempt is recorded as reclaimed.

    Returns (id, state) of the jobs given back (their due time is unchanged: due at once).
    """
    moved = set_job_states([Change(i, t, lifecycle.Event.RELEASED, error=reason) for i, t in claims])
    return [MovedJob(m.id, m.state) for m in moved]


def give_back_stopping(claims: Sequence[tuple[int, str]], running: int | None, reason: str) -> list[MovedJob]:
    """Give back the claims of a batch whose process is stopping, in one statement: pending, due at once.

    The job ``running`` (its handler was running) is charged (``lifecycle.Event.RELEASED``: its
    attempt recorded with ``reason``, dead when it was its last); the others ran nothing that
    committed and are not (``lifecycle.Event.NOT_STARTED``: attempt given back, nothing recorded).
    One statement: billiard gives a pool process 0.1 s between its SIGTERM and its SIGKILL.
    """
    moved = set_job_states(
        [
            Change(i, t, lifecycle.Event.RELEASED, error=reason)
            if i == running
            else Change(i, t, lifecycle.Event.NOT_STARTED)
            for i, t in claims
        ]
    )
    return [MovedJob(m.id, m.state) for m in moved]


def release_lost_chunk(claims: Sequence[tuple[int, str, float]], reason: str) -> list[MovedJob]:
    """Give back the claims (id, token, backoff seconds) of an atomic chunk lost with its transaction.

    A chunk of more than one job died together: its jobs are refunded and run alone next
    (``refunded`` True); a job alone in its chunk, or already running alone, is charged the attempt.
    Due again after the backoff (``lifecycle.Event.CRASHED``).
    """
    together = len(claims) > 1
    return set_job_states(
        [Change(i, t, lifecycle.Event.CRASHED, together=together, delay_seconds=d, error=reason) for i, t, d in claims]
    )


def committed_jobs(claims: Sequence[tuple[int, str]]) -> dict[int, bool]:
    """The claims whose outcome committed under their tokens (a COMMIT whose answer was lost): id -> succeeded."""
    if not claims:
        return {}
    return SQL.fetch_pairs("committed_jobs", _claims(claims))


def open_job_savepoint() -> None:
    """Open the savepoint the next atomic job runs behind (``isolation.sql``): ``tk_job``."""
    SQL.execute("open_job_savepoint")


def check_job_sql(savepoint: str) -> str:
    """The commands that check a job's deferred constraints, then open the next job's ``savepoint``.

    On one line without comments, ending with a semicolon and a new line: sent in front of the next
    statement, in its execute, what follows is a statement of its own whatever it starts with.
    """
    return _check_commands() + f" SAVEPOINT {savepoint};\n"


@functools.cache
def _check_commands() -> str:
    commands = " ".join(line for line in SQL["check_job"].splitlines() if line.strip() and not line.startswith("--"))
    return commands.rstrip(";") + ";"  # the loader drops a statement's last semicolon


def check_job(savepoint: str) -> None:
    """Check the job's deferred constraints (IntegrityError if one fails), then open ``savepoint``; one round trip.

    Every constraint keeps the mode it had (``isolation.sql`` says how). The runner sends it alone
    only when no later statement can carry it (``check_job_sql``): at the chunk's end, and before an
    ``executemany``, a server-side cursor's or a composed statement.
    """
    with connection.cursor() as cursor:
        cursor.execute(check_job_sql(savepoint))


def transaction_settings() -> list[tuple[str, str]]:
    """Every setting a session may change, and the role, as they are now (on the driver's cursor, past the
    runner's execute wrapper): what ``restore_settings`` puts back after a job changed some."""
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        cursor.execute(SQL["transaction_settings"])
        return [(str(name), str(value)) for name, value in cursor.fetchall()]


def restore_settings(settings: Sequence[tuple[str, str]]) -> None:
    """Put back, for the rest of the transaction (``SET LOCAL``), the settings a job changed from ``settings``."""
    values = dict(settings)
    role = values.pop("role", "none")
    SQL.execute("restore_settings", {"role": role, "names": list(values), "values": list(values.values())})


def roll_back_job(savepoint: str) -> None:
    """Roll the current job back to its ``savepoint`` (``tk_job`` or a check's ``tk_job_<n>``), which stays open."""
    with connection.cursor() as cursor:
        cursor.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")


def roll_back_to(savepoint: str) -> bool:
    """``ROLLBACK TO SAVEPOINT``, on the driver's cursor (past Django's execute wrappers); False if it is not open.

    In a failed transaction too: PostgreSQL looks the name up before it changes anything, so a
    savepoint that is not open leaves the transaction as it was.
    """
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:  # Django's errors, as elsewhere
        try:
            cursor.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
        except psycopg2.errors.InvalidSavepointSpecification:
            return False
    return True


def refuse_statements() -> None:
    """Fail the current (sub)transaction on purpose, on the driver's cursor: it refuses statements again.

    After the runner rolled a failed statement back to find out what failed, the job goes on as
    PostgreSQL had left it: its next statement is refused, as without the runner's question.
    """
    refused = contextlib.suppress(psycopg2.errors.InvalidTextRepresentation)  # the failure asked for
    with connection.wrap_database_errors, connection.connection.cursor() as cursor, refused:
        cursor.execute(SQL["refuse_statements"])


# --- Sweeping and status ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExpiredClaim:
    """A claim the sweeper found expired and locked: what the lifecycle needs to decide its fate."""

    id: int
    token: str
    kind: str
    state: JobState  # claimed (never started) or running
    attempts: int
    max_attempts: int
    run_alone: bool
    backoff_base_seconds: float | None
    backoff_cap_seconds: float | None
    batch: str  # "holder claimed_at": the batch it was started in
    batch_rows: int  # rows of its batch still running (itself included)


def lock_expired_claims(
    *,
    heartbeats: bool,
    sweep_after_seconds: float,
    limit: int,
    queued_ids: Collection[int] | None,
    confirmed: Collection[str] = (),
) -> list[ExpiredClaim]:
    """Lock (for the caller's transaction) up to ``limit`` expired claims; see ``sweep.sql``.

    A claim never started is among them only when its token is in ``confirmed`` (its message was
    missing at the previous sweep too: ``unseen_unstarted_claims``) and its id is not in ``queued_ids``.
    """
    params = {
        "heartbeats": heartbeats,
        "sweep_after": sweep_after_seconds,
        "limit": limit,
        "check_unstarted": queued_ids is not None,
        "covered": list(queued_ids or []),
        "confirmed": list(confirmed),
    }
    return SQL.fetch_all(ExpiredClaim, "lock_expired_claims", params)


def unseen_unstarted_claims(queued_ids: Collection[int], limit: int) -> set[str]:
    """Tokens of claims never started within a lease whose id is not in ``queued_ids`` (oldest ``limit``)."""
    return set(SQL.fetch_values("unseen_unstarted_claims", {"covered": list(queued_ids), "limit": limit}))


def sweep_expired_claims(
    *,
    heartbeats: bool,
    sweep_after_seconds: float,
    limit: int,
    queued_ids: Collection[int] | None,
    confirmed: Collection[str] = (),
    backoffs: Mapping[str, tuple[float, float]] | None = None,
    default_backoff: tuple[float, float] = (10.0, 3600.0),
    shared_batches: Collection[str] = (),
) -> list[MovedJob]:
    """Take back expired claims; ``queued_ids`` are claims whose message is still queued (None: unknown).

    A claim never started is taken back only when its message is not queued and its token is in
    ``confirmed`` (missing at the previous sweep too); with ``queued_ids`` None (the broker did not
    answer) claims never started are left alone.
    ``backoffs`` maps a kind to its backoff (base, cap seconds): a started claim taken back is due
    again after it (``default_backoff`` for a kind not in it; the job's own first). Jobs whose batch
    died together are not charged the attempt and are flagged to run alone (``refunded``);
    ``shared_batches`` are the batches an earlier statement of the same sweep found shared
    (``MovedJob.batch`` of refunded jobs). Two statements in one transaction: the expired claims are
    locked and read, the lifecycle decides (``lifecycle.expired``), one transition writes.
    """
    table = dict(backoffs or {})
    shared = set(shared_batches)
    with transaction.atomic():
        expired = lock_expired_claims(
            heartbeats=heartbeats,
            sweep_after_seconds=sweep_after_seconds,
            limit=limit,
            queued_ids=queued_ids,
            confirmed=confirmed,
        )
        changes = []
        for c in expired:
            event, together, error = lifecycle.expired(c.state, c.run_alone, c.batch_rows, c.batch in shared)
            if c.backoff_base_seconds is not None and c.backoff_cap_seconds is not None:
                base, cap = c.backoff_base_seconds, c.backoff_cap_seconds  # the job's own: schedule(backoff=...)
            else:
                base, cap = table.get(c.kind, default_backoff)
            delay = registry.Backoff(base, cap).delay(c.attempts)
            changes.append(Change(c.id, c.token, event, together=together, delay_seconds=delay, error=error))
        moved = set_job_states(changes)
    batches = {c.id: c.batch for c in expired}
    return [dataclasses.replace(m, batch=batches.get(m.id, "")) for m in moved]


def prune_finished_jobs(*, days: int, limit: int) -> int:
    pruned = len(SQL.fetch_values("prune_finished_jobs", {"days": days, "limit": limit}))
    if pruned:
        SQL.execute("prune_aborts")
    return pruned


ESTIMATED_COUNTS = ("backlog", "paused", "rate_limited", "pending", "due_next_24h")


@dataclasses.dataclass(frozen=True)
class BacklogStatus:
    """The numbers operators watch; the counts named in ``estimated`` are planner estimates."""

    backlog: int  # pending and due (kinds neither paused nor rate-limited)
    oldest_overdue_seconds: float
    paused: int  # pending and due, of paused kinds (waiting on purpose: not backlog)
    rate_limited: int  # pending and due, of rate-limited kinds not paused (waiting for their rate: not backlog)
    pending: int
    due_next_24h: int
    claimed: int
    stuck: int  # claimed past their lease, or claimed for longer than the stuck limit
    dead_last_24h: int
    estimated: tuple[str, ...] = ()


def backlog_status(stuck_after_seconds: float, exact_limit: int = 10_000) -> BacklogStatus:
    """The status numbers; pending counts past ``exact_limit`` are planner estimates, named in ``estimated``."""
    params = {"stuck_after": stuck_after_seconds, "exact_limit": exact_limit}
    status = SQL.fetch_all(BacklogStatus, "backlog_status", params)[0]
    estimates: dict[str, Any] = {}
    for name in ESTIMATED_COUNTS:
        if getattr(status, name) > exact_limit:
            plan = SQL.explain_json(f"estimate_{name}")
            estimates[name] = max(exact_limit + 1, int(plan[0]["Plan"]["Plan Rows"]))
    return dataclasses.replace(status, **estimates, estimated=tuple(estimates))


# --- Kind controls ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KindControlRow:
    """A kind's controls and what waits behind them."""

    kind: str
    paused: bool
    options: db.Json  # {name: value} of every option column (core/kind_options.py, and the rate's); None: unset
    due: int = 0  # pending and due
    claimed: int = 0  # claimed: queued or running

    @property
    def max_running(self) -> int | None:
        """The cap: at most this many claimed or running at once (None: no cap)."""
        cap: int | None = self.options.get("max_running")
        return cap

    @property
    def rate_limit(self) -> int | None:
        """At most this many starts per ``rate_period_seconds`` (None: no rate limit)."""
        limit: int | None = self.options.get("rate_limit")
        return limit

    @property
    def rate_period_seconds(self) -> float | None:
        """The rate limit's period, in seconds."""
        period = self.options.get("rate_period_seconds")
        return None if period is None else float(period)

    @property
    def rate_partition_by(self) -> str:
        """A payload field: the rate limit holds per value ("" for the whole kind)."""
        return str(self.options.get("rate_partition_by") or "")


def set_kind_paused(kind: str, paused: bool) -> KindControlRow:
    """Pause or resume ``kind``; returns its controls."""
    return SQL.fetch_all(KindControlRow, "set_kind_paused", {"kind": kind, "paused": paused})[0]


def set_kind_options(kind: str, options: Mapping[str, Any]) -> KindControlRow:
    """Set options of ``kind`` ({name: value}, None unsets; the others keep theirs); returns its controls."""
    return SQL.fetch_all(KindControlRow, "set_kind_options", {"kind": kind, "options": json.dumps(dict(options))})[0]


def set_kind_rate(kind: str, limit: int | None, per_seconds: float | None, partition_by: str) -> KindControlRow:
    """An operator's rate for ``kind`` (``limit`` None: none), kept over the registered one; returns its controls."""
    params = {"kind": kind, "limit": limit, "per_seconds": per_seconds, "partition_by": partition_by}
    return SQL.fetch_all(KindControlRow, "set_kind_rate", params)[0]


def sync_code_rates(rates: Mapping[str, tuple[int, float, str]], registered: Sequence[str]) -> list[str]:
    """Write the registered ``rates`` (kind -> (limit, per_seconds, partition_by)) to the kinds' control rows.

    An operator's rate (``set_kind_rate``) is kept; a ``registered`` kind without a rate loses a
    registered one. Returns the kinds changed (none when the rows already say so).
    """
    params = {
        "kinds": list(rates),
        "limits": [r[0] for r in rates.values()],
        "periods": [r[1] for r in rates.values()],
        "partitions": [r[2] for r in rates.values()],
        "registered": list(registered),
    }
    return [str(k) for k in SQL.fetch_values("sync_code_rates", params)]


def rate_limited_due(*, session: Any = None) -> float | None:
    """Seconds per start of the fastest rate-limited kind (not paused) with a due job; None: none waits.

    ``session``: a dedicated session to read it in, prepared there (again every ``db.REPLAN_SECONDS``;
    its ten probes per kind took 1.5 ms to plan, on most of the control loop's turns while a kind
    waited: bench flow).
    """
    # planned as the claim is (kinds.sql)
    if session is not None:
        value = _prepared_in_session(session, "rate_limited_due", {}, prefix=db.NO_JIT + INDEX_COSTS)[1][0][0]
    elif connection.get_autocommit():
        value = SQL.fetch_values("rate_limited_due", prefix=db.NO_JIT + INDEX_COSTS)[0]  # one implicit transaction
    else:
        with _claim_settings_in_callers_transaction():
            value = SQL.fetch_values("rate_limited_due")[0]
    return None if value is None else float(value)


def kind_controls() -> list[KindControlRow]:
    """Every controlled kind with its due and claimed counts."""
    return SQL.fetch_all(KindControlRow, "kind_controls")


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
    return SQL.fetch_all(KindCounts, "kind_breakdown")
