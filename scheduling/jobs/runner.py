"""Running a batch of claimed jobs on a worker: start, run each handler, record the outcomes.

The batch is started in one statement (only claims still held under their token and not run
before are returned; the lease clock starts here), then the handlers run one after another under
their timeouts (``executor.invoke``) while the heartbeat keeps the claims alive.

Atomic kinds (the default, ``@registry.handler(atomic=True)``) run inside one transaction per
chunk. The chunk first locks its claims (so no sweeper can take them) and writes the outcomes in
the same transaction: a job's effect and its ``done`` commit together, with one WAL flush per
chunk. A failing job rolls the chunk back (its writes with the others') and the chunk runs again
with that failure recorded and the job not re-run (``_run_atomic``). A chunk closes after
``ATOMIC_CHUNK_SECONDS`` (or at the batch's end), so its locks are short. A handler's
``transaction.on_commit`` callbacks run after that commit.

Other kinds commit as they go; their outcomes are written in one statement per kind of outcome,
flushed at least every ``FLUSH_EVERY_SECONDS``. Times recorded here are the database clock read
at the start, advanced by a monotonic clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from scheduling.core import exceptions, executor, leadership, registry, store, tracing
from scheduling.jobs import lease
from scheduling.models import AttemptOutcome, JobState

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 1.0  # non-atomic kinds: finished jobs are written back at least this often
ATOMIC_CHUNK_SECONDS = 0.5  # atomic kinds: a chunk's transaction (and its row locks) ends after this long
RECORD_RETRY_SECONDS = 60.0  # a finished job's outcome is retried this long while the database is unreachable
UNKNOWN_KIND_RETRY_SECONDS = 60.0  # a job of a kind this worker does not know is retried this much later
RELEASE_REASON = "released: the worker stopped before the job finished"

T = TypeVar("T")
Kinds = dict[str, registry.Kind | None]


@dataclasses.dataclass
class BatchReport:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    stale: int = 0  # outcomes refused (or jobs not run) because the claim had been taken back
    skipped: int = 0  # claims no longer ours (or already started) when the batch began
    chunks: int = 0  # transactions that committed atomic jobs together with their outcomes
    reruns: int = 0  # chunks rolled back by a failing job and run again without it


class _DbClock:
    """The database clock read once, advanced by the monotonic clock."""

    def __init__(self, db_now: dt.datetime) -> None:
        self.base = db_now
        self.mono = time.monotonic()

    def now(self) -> dt.datetime:
        return self.base + dt.timedelta(seconds=time.monotonic() - self.mono)


class _RolledBack(Exception):
    """A job of an atomic chunk failed: the chunk's transaction rolls back; carries the job's outcome."""

    def __init__(self, outcome: store.Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def _recording(write: Callable[[], T]) -> T:
    """Run ``write`` (a token-conditional outcome statement), retrying while the database is unreachable.

    The handler has run: giving up would leave the claim to the sweeper and run the job again.
    Retrying is safe because the statement only changes rows still claimed under the token.
    """
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    pause = 0.25
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if time.monotonic() + pause > deadline:
                raise
            logger.warning("cannot record outcomes: database unreachable; retrying", extra={"action": "record_retry"})
            connection.close()  # a broken connection is not reused; the next try opens a new one
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def run_batch(claims: Sequence[tuple[int, str]]) -> BatchReport:
    """Run the claimed jobs (id, token) that are still ours; record every outcome."""
    claims = [(int(i), str(t)) for i, t in claims]
    with tracing.span("timekeeper.run_batch", job_ids=[i for i, _ in claims], mechanism="table") as span:
        report = _run_batch(claims, span)
        for name, value in dataclasses.asdict(report).items():
            span.set(name, value)
        return report


def _run_batch(claims: list[tuple[int, str]], span: tracing.Handle) -> BatchReport:
    started = store.start_jobs(claims, leadership.process_name())
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
    atomic = [j for j in started if _is_atomic(kinds[j.kind])]
    others = [j for j in started if not _is_atomic(kinds[j.kind])]
    settled: set[int] = set()  # jobs whose outcome was committed (or that are no longer ours)
    with lease.holding([(j.id, j.token) for j in started]):
        try:
            if atomic:
                _run_atomic(atomic, kinds, clock, report, settled)
            if others:
                _run_committing(others, kinds, clock, report, settled)
        except SystemExit:
            # A shutdown is stopping this process mid-batch (billiard turns the SIGTERM of Celery's
            # cold or soft shutdown into SystemExit): give back what did not finish now, not a lease later.
            _give_back([(j.id, j.token) for j in started if j.id not in settled])
            raise
    return report


def _is_atomic(kind: registry.Kind | None) -> bool:
    return kind is not None and kind.atomic


def _job_for(job: store.StartedJob) -> registry.Job:
    return registry.Job(
        kind=job.kind,
        payload=job.payload if isinstance(job.payload, dict) else {},
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        due_at=job.due_at,
        id=job.id,
        token=job.token,
        mechanism="table",
    )


def _outcome(job: store.StartedJob, kind: registry.Kind | None, clock: _DbClock) -> store.Outcome:
    """Run one job through the executor and say how it ended (nothing is written here)."""
    started_at = clock.now()
    if kind is None:
        error = str(exceptions.UnknownJobKind(job.kind))
        return store.Outcome(
            job.id, job.token, started_at, clock.now(), AttemptOutcome.FAILED, error, UNKNOWN_KIND_RETRY_SECONDS
        )
    result = executor.invoke(kind, _job_for(job), kind.timeout_seconds)
    if result.ok:
        return store.Outcome(job.id, job.token, started_at, clock.now(), AttemptOutcome.SUCCEEDED)
    return store.Outcome(
        job.id,
        job.token,
        started_at,
        clock.now(),
        result.outcome,
        result.error,
        kind.backoff.delay(job.attempts),
        traceback=result.traceback,
    )


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
    for job in moved:
        logger.info("job failed", extra={"job_id": job.id, "action": "dead" if job.state == JobState.DEAD else "retry"})
    report.succeeded += len(done)
    report.failed += len(moved)
    report.stale += len(stale)


def _run_atomic(
    jobs: list[store.StartedJob], kinds: Kinds, clock: _DbClock, report: BatchReport, settled: set[int]
) -> None:
    """Run atomic jobs in chunks: one transaction each, the outcomes written inside it.

    A chunk runs without a savepoint per job (two round trips a job saved). When a job fails, the
    chunk's transaction is rolled back, undoing that job's writes with the others', and the chunk
    runs again with the failure recorded, not re-run: the jobs that succeeded run again and commit.
    A handler's database work is undone with the rollback and its on_commit callbacks dropped, so the
    committed effect is still exactly one; external effects belong in ``transaction.on_commit``.
    """
    pending = list(jobs)
    known_failures: dict[int, store.Outcome] = {}  # failed in a rolled-back pass: recorded, not re-run
    while pending:
        committed = False

        def mark_committed() -> None:
            nonlocal committed
            committed = True

        chunk: list[store.StartedJob] = []
        try:
            with transaction.atomic():
                transaction.on_commit(mark_committed)  # the first of this chunk's callbacks, after COMMIT
                held = set(store.lock_claims([(j.id, j.token) for j in pending]))
                for job in pending:
                    if job.id not in held:  # taken back before it ran: the sweeper recorded the attempt
                        logger.warning("claim lost before the job ran", extra={"job_id": job.id, "action": "lost"})
                        settled.add(job.id)
                        report.stale += 1
                pending = [j for j in pending if j.id in held]
                successes: list[store.Outcome] = []
                failures: list[store.Outcome] = []
                opened = time.monotonic()
                while pending and (not chunk or time.monotonic() - opened < ATOMIC_CHUNK_SECONDS):
                    job = pending.pop(0)
                    chunk.append(job)
                    if job.id in known_failures:
                        failures.append(known_failures.pop(job.id))
                        continue
                    outcome = _outcome(job, kinds[job.kind], clock)
                    if outcome.outcome != AttemptOutcome.SUCCEEDED:
                        raise _RolledBack(outcome)
                    successes.append(outcome)
                # The rows are locked by this transaction, so no outcome written here can be stale.
                _record(report, successes, failures)
            report.chunks += 1
        except _RolledBack as rolled_back:
            known_failures[rolled_back.outcome.id] = rolled_back.outcome
            pending = chunk + pending
            report.reruns += 1
            continue
        except Exception:
            if not committed:
                raise
            # The chunk is committed; one of its handlers' on_commit callbacks raised afterwards.
            logger.exception(
                "an on_commit callback failed after its job committed", extra={"action": "on_commit_failed"}
            )
        settled.update(j.id for j in chunk)


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
        _recording(lambda: _record(report, finished_ok, finished_failed))
        settled.update(o.id for o in finished_ok + finished_failed)
        successes, failures = [], []
        last_flush = time.monotonic()

    try:
        for job in jobs:
            outcome = _outcome(job, kinds[job.kind], clock)
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


def _give_back(claims: Sequence[tuple[int, str]]) -> None:
    """Release the claims that did not finish: pending again now, the attempt counted."""
    try:
        released = store.release_jobs(claims, RELEASE_REASON)
    except DatabaseError:
        logger.warning("could not give claims back while stopping; the sweeper will", exc_info=True)
        return
    for job in released:
        logger.warning(
            "claim released: the worker is stopping",
            extra={"job_id": job.id, "action": "released" if job.state == JobState.PENDING else job.state},
        )
