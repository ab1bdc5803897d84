"""Running a batch of claimed jobs on a worker: start, run each handler, record the outcomes.

The batch is started in one statement (only claims still held under their token and not run
before are returned), handlers run one after another under their timeouts while the heartbeat
keeps the claims alive, and outcomes are written back in one statement per kind of outcome,
flushed at least every ``FLUSH_EVERY_SECONDS`` so a long batch does not hold finished jobs.
Times recorded here are the database clock read at the start, advanced by a monotonic clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from scheduling.core import exceptions, executor, leadership, registry, store
from scheduling.jobs import lease
from scheduling.models import AttemptOutcome

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 1.0  # finished jobs are written back at least this often within a batch
HARD_LIMIT_MARGIN_SECONDS = 30  # Celery kills a batch this long after the sum of its timeouts
ERROR_TEXT_LIMIT = 4000  # characters of error text kept per attempt
RECORD_RETRY_SECONDS = 60.0  # a finished job's outcome is retried this long while the database is unreachable
RELEASE_REASON = "released: the worker stopped before the job finished"

T = TypeVar("T")



def hard_time_limit(batch: Sequence[tuple[int, str]], claims: Sequence[store.Claim]) -> float:
    """Celery's hard limit for a batch message: the sum of its jobs' timeouts plus a margin."""
    kinds = {c.id: c.kind for c in claims}
    total = 0.0
    for job_id, _ in batch:
        try:
            total += registry.get(kinds[job_id]).timeout_seconds
        except exceptions.UnknownJobKind:
            total += 1
    return total + HARD_LIMIT_MARGIN_SECONDS


@dataclasses.dataclass
class BatchReport:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    stale: int = 0  # outcomes refused because the claim had been taken back
    skipped: int = 0  # claims no longer ours (or already started) when the batch began


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


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]


def run_batch(claims: Sequence[tuple[int, str]]) -> BatchReport:
    """Run the claimed jobs (id, token) that are still ours; record every outcome."""
    claims = [(int(i), str(t)) for i, t in claims]
    started = store.start_jobs(claims, leadership.process_name())
    report = BatchReport(started=len(started), skipped=len(claims) - len(started))
    if report.skipped:
        logger.info(
            "claims skipped: taken back, or already started by an earlier delivery (the sweeper owns those)",
            extra={"skipped": report.skipped, "action": "skipped"},
        )
    if not started:
        return report
    clock = _DbClock(started[0].db_now)
    successes: list[store.Outcome] = []
    failures: list[store.Outcome] = []
    settled: set[int] = set()  # jobs whose outcome was written (or refused as stale)
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal successes, failures, last_flush
        done = _recording(lambda: store.complete_jobs(successes))
        moved = _recording(lambda: store.fail_jobs(failures))
        stale = (len(successes) - len(done)) + (len(failures) - len(moved))
        if stale:
            kept = set(done) | {m[0] for m in moved}
            for o in successes + failures:
                if o.id not in kept:
                    logger.warning(
                        "outcome refused: the claim token no longer matches (the job was taken back)",
                        extra={"job_id": o.id, "action": "stale_completion"},
                    )
        for job_id, state, _due_at in moved:
            logger.info("job failed", extra={"job_id": job_id, "action": "dead" if state == "dead" else "retry"})
        report.succeeded += len(done)
        report.failed += len(moved)
        report.stale += stale
        settled.update(o.id for o in successes + failures)
        successes, failures = [], []
        last_flush = time.monotonic()

    with lease.holding([(j.id, j.token) for j in started]):
        try:
            for job in started:
                outcome = _run_one(job, clock)
                (successes if outcome.outcome == AttemptOutcome.SUCCEEDED else failures).append(outcome)
                if time.monotonic() - last_flush >= FLUSH_EVERY_SECONDS:
                    flush()
            flush()
        except SystemExit:
            # A shutdown is stopping this process mid-batch (billiard turns the SIGTERM of Celery's
            # cold or soft shutdown into SystemExit): give back what did not finish now, not a lease later.
            _give_back([(j.id, j.token) for j in started if j.id not in settled], successes, failures)
            raise
    return report


def _give_back(
    claims: Sequence[tuple[int, str]], successes: list[store.Outcome], failures: list[store.Outcome]
) -> None:
    """Record the outcomes already known, release the other claims (pending again, attempt counted)."""
    try:
        store.complete_jobs(successes)
        store.fail_jobs(failures)
        finished = {o.id for o in successes + failures}
        released = store.release_jobs([c for c in claims if c[0] not in finished], RELEASE_REASON)
    except DatabaseError:
        logger.warning("could not give claims back while stopping; the sweeper will", exc_info=True)
        return
    for job_id, state in released:
        logger.warning(
            "claim released: the worker is stopping",
            extra={"job_id": job_id, "action": "released" if state == "pending" else state},
        )


def _run_one(job: store.StartedJob, clock: _DbClock) -> store.Outcome:
    started_at = clock.now()
    try:
        kind = registry.get(job.kind)
    except exceptions.UnknownJobKind as exc:
        return store.Outcome(job.id, job.token, started_at, clock.now(), AttemptOutcome.FAILED, str(exc), 60.0)
    payload = job.payload if isinstance(job.payload, dict) else {}
    handed = registry.Job(
        kind=job.kind,
        payload=payload,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        due_at=job.due_at,
        id=job.id,
        token=job.token,
        mechanism="table",
    )
    try:
        with executor.limit(kind.timeout_seconds):
            kind.func(handed)
    except executor.JobTimeout:
        logger.warning("job timed out", extra={"job_id": job.id, "kind": job.kind, "action": "timed_out"})
        error = f"timed out after {kind.timeout_seconds:g}s"
        return store.Outcome(
            job.id,
            job.token,
            started_at,
            clock.now(),
            AttemptOutcome.TIMED_OUT,
            error,
            kind.backoff.delay(job.attempts),
        )
    except Exception as exc:
        logger.warning(
            "job raised %s", type(exc).__name__, extra={"job_id": job.id, "kind": job.kind, "action": "failed"}
        )
        return store.Outcome(
            job.id,
            job.token,
            started_at,
            clock.now(),
            AttemptOutcome.FAILED,
            _error_text(exc),
            kind.backoff.delay(job.attempts),
        )
    return store.Outcome(job.id, job.token, started_at, clock.now(), AttemptOutcome.SUCCEEDED)
