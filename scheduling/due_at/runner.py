"""Running a batch of claimed jobs on a worker: start, run each handler, record the outcomes.

The batch is started in one statement (only claims still held under their token and not run
before are returned; the lease clock starts here), then the handlers run one after another under
their timeouts (``executor.invoke``) while the heartbeat keeps the claims alive.

An operator's abort (``api.abort``) reaches a running handler through the heartbeat and is raised
inside it like a timeout (``core/aborts.py``); the job's outcome is ``aborted`` (cancelled), its
atomic writes rolled back to its savepoint like any failure's. A job of the batch aborted before
its turn does not start.

A job may carry its own timeout, backoff and atomicity, chosen when it was scheduled
(``schedule(timeout=, backoff=, atomic=)``, kept on its row and returned by ``start_jobs``); each
is used in place of its kind's: a job scheduled ``atomic=False`` of an atomic kind runs in the
committing path below, one scheduled ``atomic=True`` of a committing kind in the atomic path.

Atomic kinds (the default, ``@registry.handler(atomic=True)``) run inside one transaction per
chunk, each job behind a savepoint (``_run_isolated``: no round trip beyond a job's own statements;
a chunk's last writing job pays one). The chunk first locks its claims (so no
sweeper can take them) and writes the outcomes in the same transaction: a job's effect and its
``done`` commit together, with one WAL flush per chunk. A job that fails, times out or leaves its
transaction broken (a database error caught and ignored) is rolled back to its savepoint: its
writes and its ``on_commit`` callbacks go, its siblings' stay, and every handler runs exactly once
per attempt whatever the others do. A handler that returns after ``transaction.set_rollback(True)``
is done with its writes and callbacks discarded (``ROLLED_BACK_NOTE`` on its attempt). A chunk
takes no further job after ``ATOMIC_CHUNK_SECONDS``, ``ATOMIC_CHUNK_JOBS`` jobs, or once its
succeeded jobs leave ``ATOMIC_CHUNK_SAVEPOINTS`` savepoints open (or at the batch's end), so its
locks are short. Each job's ``transaction.on_commit`` callbacks run after that commit, each guarded:
one raising stops no other, and its failure is logged with the job id and kept on the job's attempt.
A job's deferred constraints (Django's foreign keys) are checked inside its savepoint, so a bad
reference fails that job, not the chunk's COMMIT; every constraint keeps its own mode for the next
job (``sql/isolation.sql``). A chunk lost with its transaction (a stall past its idle limit, a
deadlock, a database restart) costs a chunk of several jobs no attempt: they are refunded and run
alone after their backoff (a chunk of one is charged); after a COMMIT whose answer was lost, the
jobs found committed keep their outcomes and their callbacks run. The chunk's transaction may wait
on this process for its jobs' longest (own or kind's) timeout plus ``STALL_MARGIN_SECONDS``
(``store.bound_transaction``): a stopped or hung process loses its locks, the sweeper takes the
claims back after their lease, and what the late process then tries to write is refused by the claim
token.

What holds: a job's database effects commit exactly once; external effects sent from
``on_commit`` happen at least once, repeated only after a crash or a stall (the job then runs
again elsewhere, its callbacks with it).

Other kinds commit as they go; their outcomes are written in one statement per kind of outcome,
flushed at least every ``FLUSH_EVERY_SECONDS``. A job leaves the heartbeat as its outcome is
written (``lease.release``), so only a claim really taken back is reported lost. Times recorded
here are the database clock read at the start, advanced by a monotonic clock.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, connection, transaction

from scheduling.core import aborts, exceptions, executor, leadership, registry, tracing
from scheduling.core import store as core_store
from scheduling.due_at import lease, lifecycle, starts, store, task_events
from scheduling.models import AttemptOutcome, JobState

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 1.0  # non-atomic kinds: finished jobs are written back at least this often
ATOMIC_CHUNK_SECONDS = 0.5  # atomic kinds: a chunk's transaction (and its row locks) ends after this long
# atomic kinds: savepoints a chunk's succeeded jobs leave to its commit (one each that sent statements, and
# those its handler opened: a nested atomic(), get_or_create), below PostgreSQL's 64 cached
# subtransactions; jobs that sent none open none and do not count
ATOMIC_CHUNK_SAVEPOINTS = 50
ATOMIC_CHUNK_JOBS = 200  # atomic kinds: jobs per chunk whatever they send (a lost chunk refunds them all)
STALL_MARGIN_SECONDS = 5.0  # a chunk's transaction idle longer than its longest timeout plus this is ended
RECORD_RETRY_SECONDS = 60.0  # a finished job's outcome is retried this long while the database is unreachable
UNKNOWN_KIND_RETRY_SECONDS = 10.0  # a job of a kind this worker does not know is given back, due this much later
UNKNOWN_KIND_REASON = (
    "not run: a worker that does not know kind {kind} (an older release?) gave it back, uncharged; "
    "due again in {delay:g} s"
)
RELEASE_REASON = "released: the worker stopped before the job finished"
LOST_REASON = "released: the database ended the batch's transaction before the job's outcome committed"
# A rate-limited kind's job takes a start permit before its handler runs (starts.py); with no room
# in its kind's window it waits for room this long at most, then is given back uncharged.
START_WAIT_SECONDS = 2.0
START_WAIT_STEP_SECONDS = 0.001  # past the instant the window has room, so the next ask finds it
RATE_LIMITED = lifecycle.Event.RATE_LIMITED.value  # its outcome (no attempt is recorded)
RATE_LIMITED_REASON = (
    "not run: its kind's rate limit had no room for its start within {wait:g} s (the handlers' starts "
    "ran behind the claims); given back uncharged, due again in {delay:g} s"
)
BROKEN_TRANSACTION_ERROR = (
    "TransactionManagementError: the handler caught a database error and went on, leaving its transaction "
    "broken; its writes were rolled back (wrap the statement that may fail in transaction.atomic())"
)

BYPASS_FAILED = "a statement sent past Django's cursor failed inside its savepoint"
GIVEN_BACK_NOTE = (
    "refunded: its writes were rolled back before its deferred constraints were checked, because {why}; "
    "it runs again, alone"
)

SNOOZED_TOO_OFTEN = (
    "snoozed too often: the job already snoozed {n} times (its kind's max_snoozes, or SCHEDULING_MAX_SNOOZES); "
    "this snooze counts as a failure"
)

ROLLED_BACK_NOTE = (
    "rolled back: the handler returned with its transaction marked for rollback (transaction.set_rollback(True), "
    "or an error caught inside a block Django rolls back); its writes and on_commit callbacks were discarded"
)

T = TypeVar("T")
Kinds = dict[str, registry.Kind | None]

# The job whose handler this batch is running now (None between handlers): when the worker stops,
# it is the one job charged; every other unfinished job of the batch is given back uncharged.
_in_handler: contextvars.ContextVar[int | None] = contextvars.ContextVar("timekeeper_in_handler", default=None)
# Whether this batch takes start permits for rate-limited kinds (not inside a caller's transaction).
_permits: contextvars.ContextVar[bool] = contextvars.ContextVar("timekeeper_start_permits", default=True)


@dataclasses.dataclass
class BatchReport:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    stale: int = 0  # outcomes refused (or jobs not run) because the claim had been taken back
    skipped: int = 0  # claims no longer ours (or already started) when the batch began
    given_back: int = 0  # uncharged: an unknown kind, no start permit, or refunded (writes lost with a sibling)
    chunks: int = 0  # transactions that committed atomic jobs together with their outcomes


class _DbClock:
    """The database clock read once, advanced by the monotonic clock."""

    def __init__(self, db_now: dt.datetime) -> None:
        self.base = db_now
        self.mono = time.monotonic()

    def now(self) -> dt.datetime:
        return self.base + dt.timedelta(seconds=time.monotonic() - self.mono)


def _recording(write: Callable[[], T]) -> T:
    """Run ``write`` (a token-conditional outcome statement), retrying while the database is unreachable.

    The handler has run: giving up would leave the claim to the sweeper and run the job again.
    Retrying is safe because the statement only changes rows still claimed under the token.
    """
    return core_store.while_unreachable(write, what="outcomes", seconds=RECORD_RETRY_SECONDS)


def run_batch(claims: Sequence[tuple[int, str]]) -> BatchReport:
    """Run the claimed jobs (id, token) that are still ours; record every outcome."""
    claims = [(int(i), str(t)) for i, t in claims]
    ids = [i for i, _ in claims]
    with tracing.span("timekeeper.run_batch", job_ids=ids, mechanism=registry.Mechanism.DUE_AT) as span:
        report = _run_batch(claims, span)
        for name, value in dataclasses.asdict(report).items():
            span.set(name, value)
        return report


def _run_batch(claims: list[tuple[int, str]], span: tracing.Handle) -> BatchReport:
    _permits.set(connection.get_autocommit())  # no start permits inside a caller's transaction
    started = store.start_jobs(claims, leadership.process_name())
    task_events.started(started)  # Flower: each job's attempt as a task (nothing unless the worker sends events)
    span.set("kinds", sorted({j.kind for j in started}))
    report = BatchReport(started=len(started), skipped=len(claims) - len(started))
    if report.skipped:
        logger.info(
            "claims skipped: taken back, or already started by an earlier delivery (the sweeper owns those)",
            extra={"skipped": report.skipped, "action": "skipped"},
        )
    if not started:
        return report
    clock = _DbClock(started[0].db_now)
    kinds: Kinds = {}
    for job in started:
        if job.kind not in kinds:
            try:
                kinds[job.kind] = registry.get(job.kind)
            except exceptions.UnknownJobKind:
                kinds[job.kind] = None
    if any(kinds[j.kind] is None for j in started):
        started = _give_back_unknown(started, kinds, report)
        if not started:
            return report
    atomic = [j for j in started if _is_atomic(j, kinds[j.kind])]
    others = [j for j in started if not _is_atomic(j, kinds[j.kind])]
    settled: set[int] = set()  # jobs whose outcome was committed (or that are no longer ours)
    _in_handler.set(None)
    with lease.holding([(j.id, j.token) for j in started]), executor.alarms(), _forgetting_aborts(started):
        try:
            if atomic:
                _run_atomic(atomic, kinds, clock, report, settled)
            if others:
                _run_committing(others, kinds, clock, report, settled)
        except SystemExit:
            # A shutdown is stopping this process mid-batch (billiard turns the SIGTERM of Celery's
            # cold or soft shutdown, or of the hard time limit, into SystemExit): give back what did
            # not finish now, not a lease later. Only the job whose handler was running is charged.
            _give_back([(j.id, j.token) for j in started if j.id not in settled], running=_in_handler.get())
            raise
    return report


def _give_back_unknown(started: list[store.StartedJob], kinds: Kinds, report: BatchReport) -> list[store.StartedJob]:
    """Give back, uncharged, the jobs of kinds this worker does not know; returns the others.

    In a rolling deploy a worker of the old release may be handed a kind only the new release has:
    it is not the job's failure. Due again ``UNKNOWN_KIND_RETRY_SECONDS`` later, for any worker.
    """
    unknown = [j for j in started if kinds[j.kind] is None]
    for kind_name in sorted({j.kind for j in unknown}):
        reason = UNKNOWN_KIND_REASON.format(kind=kind_name, delay=UNKNOWN_KIND_RETRY_SECONDS)
        claims = [(j.id, j.token) for j in unknown if j.kind == kind_name]
        given = _recording(functools.partial(store.give_back_unknown_kind, claims, UNKNOWN_KIND_RETRY_SECONDS, reason))
        logger.warning(
            "jobs of a kind this worker does not know given back, uncharged",
            extra={"kind": kind_name, "job_ids": given, "action": "given_back_unknown_kind"},
        )
        report.given_back += len(given)
        report.stale += len(claims) - len(given)
    report.started -= len(unknown)
    return [j for j in started if kinds[j.kind] is not None]


@contextlib.contextmanager
def _forgetting_aborts(jobs: list[store.StartedJob]) -> Iterator[None]:
    """Drop the aborts this process saw for the batch's claims when it ends (their outcomes are written)."""
    try:
        yield
    finally:
        aborts.forget([(j.id, j.token) for j in jobs])


def _is_atomic(job: store.StartedJob, kind: registry.Kind | None) -> bool:
    """The job's own ``atomic`` (``schedule(atomic=...)``) if it has one, else its kind's; unknown kinds commit."""
    if kind is None:
        return False
    return kind.atomic if job.overrides.atomic is None else job.overrides.atomic


def _timeout(job: store.StartedJob, kind: registry.Kind) -> float:
    """The job's own timeout (``schedule(timeout=...)``) if it has one, else its kind's (0: none)."""
    own = job.overrides.timeout_seconds
    return kind.timeout_seconds if own is None else own


def _backoff(job: store.StartedJob, kind: registry.Kind) -> registry.Backoff:
    """The job's own backoff (``schedule(backoff=...)``) if it has one, else its kind's."""
    own = job.overrides
    if own.backoff_base_seconds is None or own.backoff_cap_seconds is None:
        return kind.backoff
    return registry.Backoff(own.backoff_base_seconds, own.backoff_cap_seconds)


def _job_for(job: store.StartedJob) -> registry.Job:
    return registry.Job(
        kind=job.kind,
        payload=job.payload if isinstance(job.payload, dict) else {},
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        due_at=job.due_at,
        id=job.id,
        token=job.token,
        mechanism=registry.Mechanism.DUE_AT,
    )


def _started_at(job: store.StartedJob, clock: _DbClock) -> dt.datetime | float:
    """When the job's handler starts: now; for a rate-limited kind, when its start permit was granted.

    A rate-limited kind's job waits for room in its kind's window of starts (``starts.py``), at most
    ``START_WAIT_SECONDS``. With no room by then: the seconds until there is (the caller gives the
    job back, uncharged, due then). A batch run inside a caller's transaction (``testing.run_due()``
    in a ``TestCase``) takes no permit: its claim's window row is not committed, and the permit's
    own connection would wait on it for ever.
    """
    if job.rate_partition is None or not _permits.get():
        return clock.now()
    waited = 0.0
    while True:
        if aborts.requested(job.id, job.token) is not None:
            return clock.now()  # aborted while it waited: the executor cancels it without running it
        permit = starts.take(job.kind, job.rate_partition)
        if permit is None:  # could not be asked: the claim's limit alone holds
            return clock.now()
        if permit.granted:
            return permit.at
        if waited + permit.wait_seconds > START_WAIT_SECONDS:
            return permit.wait_seconds
        time.sleep(permit.wait_seconds + START_WAIT_STEP_SECONDS)
        waited += permit.wait_seconds + START_WAIT_STEP_SECONDS


def _rate_limited(job: store.StartedJob, clock: _DbClock, delay: float) -> store.Outcome:
    """The outcome of a job whose start permit found no room within the wait: given back, due in ``delay``."""
    now = clock.now()
    reason = RATE_LIMITED_REASON.format(wait=START_WAIT_SECONDS, delay=round(delay, 3))
    logger.info("start permit refused: job given back", extra={"job_id": job.id, "action": "rate_limited"})
    return store.Outcome(job.id, job.token, now, now, RATE_LIMITED, reason, delay)


def _outcome(job: store.StartedJob, kind: registry.Kind | None, clock: _DbClock) -> store.Outcome:
    """Run one job through the executor and say how it ended (nothing is written here)."""
    started_at = _started_at(job, clock) if kind is not None else clock.now()
    if not isinstance(started_at, dt.datetime):
        return _rate_limited(job, clock, started_at)
    if kind is None:
        error = str(exceptions.UnknownJobKind(job.kind))
        return store.Outcome(
            job.id, job.token, started_at, clock.now(), AttemptOutcome.FAILED, error, UNKNOWN_KIND_RETRY_SECONDS
        )
    _in_handler.set(job.id)
    result = executor.invoke(kind, _job_for(job), _timeout(job, kind))  # a shutdown leaves the mark
    _in_handler.set(None)
    finished_at = max(clock.now(), started_at)  # a permit's instant may lead the estimated clock by its trip
    if result.ok:
        return store.Outcome(job.id, job.token, started_at, finished_at, AttemptOutcome.SUCCEEDED)
    delay = _backoff(job, kind).delay(job.attempts) if result.delay_seconds is None else result.delay_seconds
    return store.Outcome(
        job.id,
        job.token,
        started_at,
        finished_at,
        result.outcome,
        result.error,
        delay,
        traceback="" if result.outcome == AttemptOutcome.SNOOZED else result.traceback,
    )


def _bounded(outcome: store.Outcome, job: store.StartedJob, kind: registry.Kind | None) -> store.Outcome:
    """A snooze past the kind's ``max_snoozes`` is a failure (charged, retried after the backoff, or dead).

    Asked only of a job that snoozes (one indexed count of its snoozed attempts), after its writes
    were rolled back.
    """
    if outcome.outcome != AttemptOutcome.SNOOZED or kind is None:
        return outcome
    if store.snoozes(job.id) < kind.max_snoozes:
        return outcome
    return _failed(outcome, job, kind, SNOOZED_TOO_OFTEN.format(n=kind.max_snoozes))


def _record(report: BatchReport, successes: list[store.Outcome], failures: list[store.Outcome]) -> None:
    """Write outcomes, conditional on the claim tokens; count what was kept and what was stale."""
    done = store.complete_jobs(successes)
    moved = store.fail_jobs(failures)
    kept = set(done) | {m.id for m in moved}
    stale = {o.id for o in successes + failures} - kept
    for job_id in stale:
        logger.warning(
            "outcome refused: the claim token no longer matches (the job was taken back)",
            extra={"job_id": job_id, "action": "stale_completion"},
        )
    limited = {o.id for o in failures if o.outcome == RATE_LIMITED}  # given back before they started
    # given back uncharged: before they started (rate limit), or refunded (their writes lost through a sibling)
    uncharged = {m.id for m in moved if m.id in limited or m.refunded}
    for job in moved:
        if job.id not in uncharged:
            action = "dead" if job.state == JobState.DEAD else "retry"
            logger.info("job failed", extra={"job_id": job.id, "action": action})
    task_events.recorded(successes, failures, {**dict.fromkeys(done, JobState.DONE), **{m.id: m.state for m in moved}})
    given_back = len(uncharged)
    report.succeeded += len(done)
    report.failed += len(moved) - given_back
    report.given_back += given_back
    report.stale += len(stale)


def _run_atomic(
    jobs: list[store.StartedJob], kinds: Kinds, clock: _DbClock, report: BatchReport, settled: set[int]
) -> None:
    """Run atomic jobs in chunks: one transaction each, a savepoint per job, the outcomes written inside it."""
    pending = list(jobs)
    while pending:
        chunk: list[store.StartedJob] = []
        callbacks: list[tuple[int, Callable[[], None]]] = []
        counted = (report.succeeded, report.failed, report.given_back)
        events = task_events.mark()
        try:
            pending = _run_chunk(pending, chunk, kinds, clock, report, settled, callbacks)
        except DatabaseError as exc:
            # The chunk's transaction ended without a known commit: a lost connection, this process
            # stalled past the chunk's idle limit, a deadlock, or a constraint failing at COMMIT. The
            # COMMIT's answer may have been lost after the server committed (an ambiguous commit):
            # the jobs found done under their tokens did commit, and their callbacks run now.
            ambiguous = isinstance(exc, (OperationalError, InterfaceError))
            logger.warning(
                "atomic chunk lost with its transaction: its writes were rolled back (unless its commit went through)",
                extra={"job_ids": [j.id for j in chunk], "action": "chunk_lost"},
                exc_info=True,
            )
            connection.close()
            lost = [(j.id, j.token) for j in chunk]
            lease.release(lost)
            # the chunk's outcomes did not commit (or are counted below)
            report.succeeded, report.failed, report.given_back = counted
            committed = _recording(functools.partial(store.committed_jobs, lost)) if ambiguous else {}
            task_events.forget_lost(events, committed)
            if committed:
                logger.warning(
                    "atomic chunk committed although its COMMIT failed on the client: its outcomes stand",
                    extra={"job_ids": sorted(committed), "action": "chunk_committed"},
                )
                report.succeeded += sum(committed.values())
                report.failed += len(committed) - sum(committed.values())
                report.chunks += 1
                for job_id, callback in callbacks:
                    if committed.get(job_id):
                        callback()
            rest = [j for j in chunk if j.id not in committed]
            _recording(functools.partial(_give_back_lost, rest, kinds, report))
            settled.update(j.id for j in chunk)
            pending = [j for j in pending if j.id not in settled]  # nor the claims lost before they ran


def _run_chunk(
    pending: list[store.StartedJob],
    chunk: list[store.StartedJob],
    kinds: Kinds,
    clock: _DbClock,
    report: BatchReport,
    settled: set[int],
    callbacks: list[tuple[int, Callable[[], None]]],
) -> list[store.StartedJob]:
    """Run the next chunk of ``pending`` in one transaction (filling ``chunk``); returns what is left.

    ``callbacks`` receives the chunk's guarded on_commit callbacks (job id, callback) just before
    the commit: should the COMMIT's answer be lost, the caller runs those of the jobs that committed.

    The chunk's transaction may sit idle (between statements, while a handler works) for at most the
    longest timeout of its kinds plus ``STALL_MARGIN_SECONDS``: past that PostgreSQL ends it and its
    row locks, so a stopped process cannot hold its claims for ever (the sweeper then takes them back
    after their lease). Statements are bounded the same way.
    """
    with transaction.atomic():
        limit = _stall_limit_seconds(pending, kinds)
        held = set(store.lock_claims([(j.id, j.token) for j in pending], bound_seconds=limit))
        for job in pending:
            if job.id not in held:  # taken back before it ran: the sweeper recorded the attempt
                logger.warning("claim lost before the job ran", extra={"job_id": job.id, "action": "lost"})
                lease.release([(job.id, job.token)])
                settled.add(job.id)
                report.stale += 1
        pending = [j for j in pending if j.id in held]
        opened = time.monotonic()
        if pending:
            store.open_job_savepoint()
        statements = _Statements()
        with connection.execute_wrapper(statements):
            while pending and len(chunk) < ATOMIC_CHUNK_JOBS and statements.savepoints() < ATOMIC_CHUNK_SAVEPOINTS:
                if chunk and time.monotonic() - opened >= ATOMIC_CHUNK_SECONDS:
                    break
                job = pending[0]
                chunk.append(job)
                statements.outcomes.append(_run_isolated(job, kinds[job.kind], clock, statements))
                if statements.lost:
                    raise DatabaseError("a job's deferred-constraint check left the chunk's savepoints in doubt")
                pending = pending[1:]
                if statements.settings is not None:
                    break  # its SET LOCAL lasts to the chunk's end: the next jobs run in a transaction of their own
        if statements.settings is not None:
            store.restore_settings(statements.settings)  # the runner's statements below run with the chunk's
        statements.settle()  # the last writing job's check, if no later statement carried it
        successes = [o for o in statements.outcomes if o.outcome == AttemptOutcome.SUCCEEDED]
        failures = [o for o in statements.outcomes if o.outcome != AttemptOutcome.SUCCEEDED]
        if pending:
            # The heartbeat cannot renew rows this transaction locks: renew the batch's jobs still to
            # run here, visible at the commit, so a batch of long chunks keeps their leases.
            store.heartbeat_jobs([(j.id, j.token) for j in pending])
        # The rows are locked by this transaction, so no outcome written here can be stale. They
        # leave the heartbeat now: once this commits, their claims are over, not lost.
        lease.release([(j.id, j.token) for j in chunk])
        _record(report, successes, failures)  # a success's error is its note (ROLLED_BACK_NOTE), on its attempt
        callbacks[:] = [(func.job_id, func) for _, func, _ in _commit_hooks() if isinstance(func, _Guarded)]
    report.chunks += 1
    settled.update(j.id for j in chunk)
    return pending


def _stall_limit_seconds(jobs: Sequence[store.StartedJob], kinds: Kinds) -> float | None:
    """How long a chunk's transaction may wait on this process: its jobs' longest timeout plus the margin.

    Each job's own timeout (``schedule(timeout=...)``) counts where it has one, else its kind's. None
    when a job has no timeout (its kind's is 0): its handler may run for ever, so may the chunk.
    """
    timeouts = [_timeout(j, k) for j, k in ((j, kinds[j.kind]) for j in jobs) if k is not None]
    if not timeouts or not all(timeouts):
        return None
    return max(timeouts) + STALL_MARGIN_SECONDS


@dataclasses.dataclass(frozen=True)
class _Owed:
    """A job of the chunk that sent statements and succeeded: its deferred constraints are still to check."""

    job: store.StartedJob
    kind: registry.Kind | None
    at: int  # its outcome's place in the chunk's outcomes
    hooks: range  # its on_commit callbacks' places in Django's queue


class _Statements:
    """The chunk's execute wrapper (``connection.execute_wrapper``): counts statements and carries the checks.

    It sees every statement of the ORM and of ``connection.cursor()``'s ``execute`` and
    ``executemany`` (a handler's ``atomic()`` blocks included), not what bypasses Django's cursor
    (``callproc``, ``copy_expert``, a driver cursor): such work goes inside ``transaction.atomic()``,
    whose savepoint is seen. Each job starts its ``count`` at zero.

    A job that sent statements and succeeded owes a check of its deferred constraints, and the next
    job needs a savepoint of its own (``savepoint``: ``tk_job``, then ``tk_job_<n>``; ``sql/isolation.sql``).
    Both go in front of the next statement sent, in its execute: no round trip of their own. Should
    that execute fail, the runner asks which savepoint is open (one or two more statements):

    - ``tk_check``: the check failed. With an ``IntegrityError`` the owing job failed; with another
      error (a lock wait, a cancel) it could not be checked and is refunded (``GIVEN_BACK_NOTE``).
      Either way it is rolled back to its savepoint, open and clean again, and the statement is sent
      again behind it: the next job never sees the error;
    - the new savepoint: the check passed and the error is the statement's own. Rolled back to that
      savepoint to ask, the transaction is failed again on purpose (``store.refuse_statements``), as
      PostgreSQL had left it;
    - neither: nothing after the check's start ran (PostgreSQL parses a query string whole, so a
      statement it cannot parse fails it all) and the error took the owing job's savepoint, its
      writes with it. That job is refunded, and the statement's error stands. The same when a
      statement this wrapper does not see broke the transaction first.

    A refunded job runs again alone, after its backoff, uncharged (``lifecycle.Event.CRASHED``, as a
    chunk that died together). A timeout or an abort raised meanwhile waits for the end of that
    bookkeeping (``executor.alarms_deferred``); if a question itself fails, the chunk is given up
    (``lost``). Where a check cannot go in front (``executemany`` repeats its statement, a named
    cursor wraps it in ``DECLARE``, a composed statement is not text), and when the chunk ends
    before another statement, it is sent alone (``settle``).
    """

    def __init__(self) -> None:
        self.count = 0
        self.owed: _Owed | None = None
        self.outcomes: list[store.Outcome] = []  # the chunk's, in its jobs' order
        self.savepoint = "tk_job"  # the one the current job runs behind (store.open_job_savepoint's)
        self.opened = 0  # savepoints opened by checks: the next is tk_job_<opened + 1>
        self.lost = False  # the savepoints are in doubt: the chunk must not commit
        self.settings: list[tuple[str, str]] | None = None  # before a job's first SET: the chunk ends after it
        self.nested = 0  # savepoints the chunk's succeeded handlers opened themselves (Django's savepoint_state)

    def owe(self, job: store.StartedJob, kind: registry.Kind | None, hooks: range) -> None:
        """The job whose outcome is appended next succeeded after sending statements: its check is owed.

        Unless an earlier job's still is: then none of this job's statements reached the server (each
        would have carried that check), and it has nothing to check.
        """
        if self.owed is None:
            self.owed = _Owed(job, kind, len(self.outcomes), hooks)

    def __call__(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        if self.settings is None and isinstance(sql, str) and _changes_settings(sql):
            self.settings = store.transaction_settings()  # as they were before it: put back after the job
        if self.owed is None:
            return execute(sql, params, many, context)
        if store.transaction_failed():
            self._give_back_owed(BYPASS_FAILED)
            return execute(sql, params, many, context)  # refused, as it would have been
        cursor = context["cursor"].cursor
        if many or not isinstance(sql, str) or getattr(cursor, "name", None):
            self.settle()
            return execute(sql, params, many, context)
        savepoint = self._next_savepoint()
        sent_before = getattr(cursor, "query", None)
        with executor.alarms_deferred():
            try:
                result = execute(store.check_job_sql(savepoint) + sql, params, many, context)
            except Exception as exc:
                sent = getattr(cursor, "query", None)
                if not self._after_failure(exc, savepoint, sent is not None and sent is not sent_before):
                    raise
            else:
                self._opened(savepoint)
                return result
        return execute(sql, params, many, context)  # behind the owing job's savepoint, clean again

    def savepoints(self) -> int:
        """Savepoints the chunk's succeeded jobs leave open to its commit (each a subtransaction of PostgreSQL's).

        One per job that sent statements (the savepoint after it, opened or owed), and every one its
        handler opened (Django's, a released one too: its subtransaction stays until the commit). A
        failed job's are rolled back with it.
        """
        return self.opened + (self.owed is not None) + self.nested

    def _next_savepoint(self) -> str:
        return f"tk_job_{self.opened + 1}"

    def _opened(self, savepoint: str) -> None:
        self.owed = None
        self.opened += 1
        self.savepoint = savepoint

    def _after_failure(self, exc: Exception, savepoint: str, sent: bool) -> bool:
        """After the execute carrying the owed check failed: settle the owing job; True to send the statement again."""
        if not store.transaction_failed():
            if sent:
                self._opened(savepoint)  # it all ran; what failed came after (a handler's own execute wrapper)
            return False  # else nothing reached the server (the driver refused the parameters): still owed
        try:
            if store.roll_back_to("tk_check"):
                self._check_failed(exc)
                return True
            if store.roll_back_to(savepoint):
                self._opened(savepoint)  # the check passed: the error is the statement's own
                store.refuse_statements()
                return False
        except Exception:
            self.lost = True  # which savepoint holds what is no longer known
            raise
        self._give_back_owed("the next statement failed before the check ran (PostgreSQL could not parse it)")
        return False

    def roll_back(self) -> None:
        """Roll a failed job back to the savepoint it ran behind (its writes go; the savepoint stays, clean)."""
        if self.owed is not None:
            if store.transaction_usable():
                return  # none of its statements reached the server (each would have carried the check)
            if store.transaction_failed():
                self._give_back_owed(BYPASS_FAILED)
        store.roll_back_job(self.savepoint)  # a session that is gone raises here: the chunk is lost

    def settle(self) -> None:
        """Send the owed check alone, in one round trip (and the next savepoint); a failure fails its job."""
        if self.owed is None:
            return
        savepoint = self._next_savepoint()
        with executor.alarms_deferred():
            owed = self.owed
            self.owed = None  # the statements below pass through this wrapper when it is installed
            try:
                store.check_job(savepoint)
            except Exception as exc:
                self.owed = owed
                if not isinstance(exc, DatabaseError) or not store.transaction_failed():
                    raise  # nothing ran (a handler's own execute wrapper refused it), or the session is gone
                try:
                    self._check_failed(exc)
                except Exception:
                    self.lost = True
                    raise
            else:
                self.owed = owed
                self._opened(savepoint)

    def _check_failed(self, exc: Exception) -> None:
        """The owed check failed: the owing job is rolled back to its savepoint (past ``tk_check``), open and clean.

        A failed constraint (``IntegrityError``) fails it; another error (a lock wait, a cancel) left it
        unchecked: refunded.
        """
        if not store.roll_back_to(self.savepoint):
            raise DatabaseError(f"savepoint {self.savepoint} is not open")
        if not isinstance(exc, IntegrityError):
            self._give_back_owed(f"its deferred constraints could not be checked ({executor.error_text(exc)})")
            return
        owed = self._settled()
        self.outcomes[owed.at] = _failed(self.outcomes[owed.at], owed.job, owed.kind, executor.error_text(exc))

    def _give_back_owed(self, why: str) -> None:
        """The owing job's writes are lost with its savepoint, through no fault of its own: refunded, run alone."""
        owed = self._settled()
        logger.warning("job refunded: its writes were lost", extra={"job_id": owed.job.id, "action": "given_back"})
        self.outcomes[owed.at] = dataclasses.replace(
            self.outcomes[owed.at],
            outcome=lifecycle.Event.CRASHED.value,
            error=GIVEN_BACK_NOTE.format(why=why),
            retry_delay_seconds=_retry(owed.job, owed.kind),
            traceback="",
        )

    def _settled(self) -> _Owed:
        """The owing job, no longer owing; its on_commit callbacks go (the later jobs' keep their places)."""
        owed, self.owed = self.owed, None
        assert owed is not None
        hooks = _commit_hooks()
        for i in owed.hooks:
            hooks[i] = (hooks[i][0], _dropped, hooks[i][2])
        return owed


_SETS = re.compile(r"\s*(?:(?:/\*.*?\*/|--[^\n]*\n)\s*)*(?:SET|RESET)\s+(?!CONSTRAINTS\b)", re.IGNORECASE | re.DOTALL)
_SET_CONFIG = re.compile(r"\bset_config\s*\(", re.IGNORECASE)


def _changes_settings(sql: str) -> bool:
    """Whether a statement may change a setting for the rest of the transaction (``SET LOCAL``, ``set_config``).

    A job's ``SET LOCAL statement_timeout`` or ``search_path`` outlived it: its savepoint is released,
    not rolled back, so later jobs of the chunk failed on its timeout and the runner's own outcome
    statement on its search path (the job then ran again until dead, its handler succeeding each
    time). ``SET CONSTRAINTS`` is the check's business (``sql/isolation.sql``). Leading comments
    (a tracer's ``/* ... */``) are passed over; a ``SET`` inside a function or a ``DO`` block is not seen.
    """
    if "set" not in sql.lower():
        return False  # most statements (an INSERT): one substring search, not a case-blind regex scan
    return bool(_SETS.match(sql) or _SET_CONFIG.search(sql))


def _dropped() -> None:
    """In place of a failed job's on_commit callback, once its check failed after a later job queued its own."""


def _run_isolated(
    job: store.StartedJob, kind: registry.Kind | None, clock: _DbClock, statements: _Statements
) -> store.Outcome:
    """Run one job of a chunk behind the open savepoint: a failure rolls back this job's writes only.

    The chunk keeps one savepoint open (``tk_job``, ``sql/isolation.sql``) and a job starts behind it,
    clean. A job that sends no statement leaves it clean for the next: it costs no round trip. One
    that sends statements and succeeds costs none either: its deferred constraints are checked (a bad
    reference fails this job, not the chunk's COMMIT) and the next savepoint is opened in front of
    the next statement sent, in its ``execute`` (``_Statements``; alone, one round trip, when the
    chunk ends first). One that fails rolls back to the savepoint, which stays open and clean. Savepoints
    are never released (the commit releases them all); a chunk takes no further job once its
    succeeded jobs leave ``ATOMIC_CHUNK_SAVEPOINTS`` open (``_Statements.savepoints``; what one job opens
    itself is not bounded), and jobs that sent nothing open none.

    A handler that returns after ``transaction.set_rollback(True)`` (Django's flag: this block's
    writes must not commit) has its writes and callbacks rolled back and is done: it chose the
    rollback and raised nothing. The note ``ROLLED_BACK_NOTE`` goes on its attempt. One that caught
    a database error and went on (its transaction refuses statements) failed: retried.

    The job's ``on_commit`` callbacks stay queued for the chunk's commit, each guarded so that one
    raising stops no other; a failed or rolled-back job's callbacks are dropped with its writes.
    """
    callbacks_before = len(_commit_hooks())
    statements.count = 0
    savepoints_before = connection.savepoint_state
    outcome = _outcome(job, kind, clock)
    sent = statements.count > 0
    if outcome.outcome == AttemptOutcome.SUCCEEDED:
        if store.transaction_failed():
            # The handler caught a database error and went on: its transaction cannot be used, so its
            # writes are lost. A failure (retried), never a success with half its writes missing.
            outcome = _failed(outcome, job, kind, BROKEN_TRANSACTION_ERROR)
        elif connection.needs_rollback:
            logger.info("job rolled back its own writes", extra={"job_id": job.id, "action": "rolled_back"})
            outcome = dataclasses.replace(outcome, error=ROLLED_BACK_NOTE)
        else:
            if sent:
                # Its deferred constraints (a foreign key to a row a sibling deleted) are checked with
                # the next statement: a failure fails this job, not the chunk's COMMIT with every sibling.
                statements.owe(job, kind, range(callbacks_before, len(_commit_hooks())))
                opened = connection.savepoint_state
                statements.nested += opened - savepoints_before if opened >= savepoints_before else opened
            return _keep_callbacks(outcome, job, callbacks_before)
    transaction.set_rollback(False)  # Django refuses statements while it marks the block broken
    if sent or store.transaction_failed():
        statements.roll_back()
    del _commit_hooks()[callbacks_before:]
    return _bounded(outcome, job, kind)


def _failed(outcome: store.Outcome, job: store.StartedJob, kind: registry.Kind | None, error: str) -> store.Outcome:
    return dataclasses.replace(
        outcome, outcome=AttemptOutcome.FAILED, error=error, retry_delay_seconds=_retry(job, kind)
    )


def _keep_callbacks(outcome: store.Outcome, job: store.StartedJob, callbacks_before: int) -> store.Outcome:
    """The job succeeded: its on_commit callbacks stay queued for the chunk's commit, each guarded."""
    hooks = _commit_hooks()
    if len(hooks) > callbacks_before:
        hooks[callbacks_before:] = [
            (sids, _guarded(func, job), robust) for sids, func, robust in hooks[callbacks_before:]
        ]
    return outcome


def _commit_hooks() -> list[Any]:
    """Django's queue of on_commit callbacks for this connection: (savepoint ids, callback, robust)."""
    return connection.run_on_commit


def _retry(job: store.StartedJob, kind: registry.Kind | None) -> float:
    return _backoff(job, kind).delay(job.attempts) if kind is not None else UNKNOWN_KIND_RETRY_SECONDS


class _Guarded:
    """An on_commit callback that cannot stop the others: a failure is logged and kept on the attempt."""

    def __init__(self, func: Callable[[], Any], job: store.StartedJob) -> None:
        self.func = func
        self.job_id = job.id
        self.token = job.token

    def __call__(self) -> None:
        try:
            self.func()
        except BaseException as exc:  # a BaseException too (GeneratorExit, CancelledError): not the others' end
            if isinstance(exc, (SystemExit, KeyboardInterrupt)) and executor.process_stopping(exc):
                raise
            logger.exception(
                "an on_commit callback failed after its job committed",
                extra={"job_id": self.job_id, "action": "on_commit_failed"},
            )
            try:
                store.record_callback_failure(self.job_id, self.token, "on_commit failed: " + executor.error_text(exc))
            except DatabaseError:
                logger.warning("could not record the on_commit failure", extra={"job_id": self.job_id}, exc_info=True)


def _guarded(func: Callable[[], Any], job: store.StartedJob) -> Callable[[], None]:
    """``func`` as an on_commit callback that cannot stop the others (see ``_Guarded``)."""
    return _Guarded(func, job)


def _give_back_lost(jobs: list[store.StartedJob], kinds: Kinds, report: BatchReport) -> None:
    """After a lost chunk: give back the claims still ours; the others were taken back, refused.

    As for a batch that died together: a chunk of several jobs is refunded and its jobs run alone
    next, after their backoff; a job alone in its chunk is charged (``store.release_lost_chunk``).
    """
    claims = [(j.id, j.token, _retry(j, kinds[j.kind])) for j in jobs]
    released = {job.id for job in store.release_lost_chunk(claims, LOST_REASON)}
    for job_id, _, _ in claims:
        if job_id not in released:
            logger.warning(
                "outcome refused: the claim token no longer matches (the job was taken back)",
                extra={"job_id": job_id, "action": "stale_completion"},
            )
            report.stale += 1


def _run_committing(
    jobs: list[store.StartedJob], kinds: Kinds, clock: _DbClock, report: BatchReport, settled: set[int]
) -> None:
    """Run jobs that commit as they go; write outcomes at least every ``FLUSH_EVERY_SECONDS``."""
    successes: list[store.Outcome] = []
    failures: list[store.Outcome] = []
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal successes, failures, last_flush
        finished_ok, finished_failed = successes, failures
        lease.release([(o.id, o.token) for o in finished_ok + finished_failed])  # their claims end now, not lost
        _recording(lambda: _record(report, finished_ok, finished_failed))
        settled.update(o.id for o in finished_ok + finished_failed)
        successes, failures = [], []
        last_flush = time.monotonic()

    try:
        for job in jobs:
            outcome = _bounded(_outcome(job, kinds[job.kind], clock), job, kinds[job.kind])
            (successes if outcome.outcome == AttemptOutcome.SUCCEEDED else failures).append(outcome)
            if time.monotonic() - last_flush >= FLUSH_EVERY_SECONDS:
                flush()
        flush()
    except SystemExit:
        _write_known(successes, failures, settled)
        raise


def _write_known(successes: list[store.Outcome], failures: list[store.Outcome], settled: set[int]) -> None:
    """While stopping: record the outcomes already known (those jobs ran and committed their work)."""
    try:
        store.complete_jobs(successes)
        store.fail_jobs(failures)
    except DatabaseError:
        logger.warning("could not record outcomes while stopping; the sweeper will", exc_info=True)
        return
    settled.update(o.id for o in successes + failures)


def _give_back(claims: Sequence[tuple[int, str]], running: int | None) -> None:
    """Give back the claims that did not finish: pending again now (docs/fault-tolerance.md, "Deploys").

    The job whose handler was running (``running``) is charged the attempt (dead when it was its
    last). Every other one is not: its handler never began, or it ran in an atomic chunk whose
    transaction the stop rolled back, so nothing of it committed. A deploy costs no job that was
    only waiting in a batch an attempt (``store.give_back_stopping``, one statement).
    """
    try:
        moved = store.give_back_stopping(claims, running, RELEASE_REASON)
    except DatabaseError:
        logger.warning("could not give claims back while stopping; the sweeper will", exc_info=True)
        return
    for job in moved:
        charged = job.id == running
        logger.warning(
            "claim released: the worker is stopping"
            if charged
            else "claim given back uncharged: the worker is stopping",
            extra={
                "job_id": job.id,
                "action": job.state if job.state != JobState.PENDING else "released" if charged else "returned",
            },
        )
