"""Running one handler: the one place that calls a kind's function, for all three mechanisms.

``invoke(kind, job, timeout)`` runs ``kind.func(job)`` under a timeout and says how it ended
(``Result``: succeeded, failed with the error text and traceback, or timed out). The due_at
runner, the broker deferral task and the fixed-time gate all call it; what they do with the
result (retry, dead, ledger) is theirs.

A handler's own ``SystemExit`` or ``KeyboardInterrupt`` (``sys.exit()`` in a job) is that job's
failure, like any exception: the pool process lives on. Only the process's real shutdown goes up:
billiard's terminate handler has fired in this process (a pool child's SIGTERM of a cold shutdown),
or Celery's own ``WorkerShutdown`` / ``WorkerTerminate``. A prefork child ignores SIGINT, so a
``KeyboardInterrupt`` there is always the job's own.

Timeouts: Celery's prefork children (and the solo pool) run tasks on their main thread, so a
real-time interval timer (SIGALRM) can interrupt the handler wherever it is, even in a blocking
call (PEP 475 retries the call only after the signal handler ran, and ours raises). Not inside a
database statement: libpq retries its own wait on EINTR, so the signal would land only when the
statement returns. A watchdog thread covers that: ``CANCEL_GRACE_SECONDS`` after a deadline that is
still running, it cancels the statements of this thread's database connections (the driver's
cancel request, no round trip on the job's connection), the statement ends with an error, and the
pending SIGALRM raises ``JobTimeout`` as it returns. Off the main thread there is no signal to use:
the pools that run tasks there (threads, gevent, eventlet) are refused at worker start
(``scheduling.E011``, ``scheduling.checks``).

Aborts (``api.abort``) use the same signal: the heartbeat thread that learns of an abort sends
SIGALRM to the main thread (``core/aborts.py``) and the alarm handler raises ``JobAborted`` there,
ending as ``ABORTED``. A SIGALRM that is neither (a poke for a job that finished meanwhile) is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

from scheduling.core import aborts, db, registry, tracing

logger = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 4000  # characters of "Type: message" kept per failure
TRACEBACK_LIMIT = 16_000  # characters of traceback kept per failure (its last part: where it broke)
CANCEL_GRACE_SECONDS = 0.2  # a deadline still running this long after it expired: its statements are cancelled

SUCCEEDED, FAILED, TIMED_OUT, ABORTED = "succeeded", "failed", "timed_out", "aborted"  # AttemptOutcome values


class JobTimeout(BaseException):
    """Raised inside a handler when its timeout expires.

    A BaseException so that a handler's own ``except Exception`` cannot swallow it.
    """


class JobAborted(BaseException):
    """Raised inside a handler when an operator aborted its job (``api.abort``); its text says who and when.

    A BaseException, like ``JobTimeout``, so that a handler's own ``except Exception`` cannot swallow it.
    """


@dataclasses.dataclass(frozen=True)
class Result:
    """How one call of a handler ended."""

    outcome: str  # SUCCEEDED, FAILED, TIMED_OUT, ABORTED, or a handler's choice (registry.HandlerOutcome.outcome)
    error: str = ""  # "Type: message" (bounded), or the timeout said in words
    traceback: str = ""  # a failure's traceback (bounded; frames and exception types, no messages, no locals)
    delay_seconds: float | None = None  # Snooze, RetryAfter: when the job runs again (instead of the backoff)

    @property
    def ok(self) -> bool:
        return self.outcome == SUCCEEDED


SUCCESS = Result(SUCCEEDED)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _deferring[0]:
        _deferring[1] = True  # raised when the block that defers it ends (``alarms_deferred``)
        return
    reason = aborts.current()
    if reason is not None:
        raise JobAborted(reason)
    if _armed[0] == 0 or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return  # no deadline expired: an abort's poke for a handler that finished meanwhile
    raise JobTimeout()


_armed = [0]  # deadlines whose timer is armed now (main thread only)
# [blocks deferring an alarm's raise, whether an alarm came meanwhile] (main thread only)
_deferring: list[Any] = [0, False]
# .depth: how many ``alarms()`` blocks keep the handler installed; .wrappers: Django's connection wrappers
# of the thread, every alias, read once by the outermost block for its deadlines (main thread only)
_held = threading.local()


def alarms() -> _Alarms:
    """Keep ``deadline``'s SIGALRM handler installed through the block (a batch of jobs).

    Each ``deadline`` inside then only arms and disarms its timer: installing and restoring a
    handler per job was most of the executor's own time in a worker's profile (bench/README.md).
    Off the main thread, nothing to do (no deadline is enforced there).
    """
    return _Alarms()


class _Alarms:
    """``alarms()``'s block: a plain context manager (entered for every job: a generator's costs more)."""

    __slots__ = ("depth", "main", "previous")

    def __enter__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()
        if not self.main:
            return
        self.depth = getattr(_held, "depth", 0)
        if self.depth == 0:
            # every alias, not only those connected yet: a job that opens one is covered (a wrapper
            # connects lazily, so this opens nothing); read per job it cost more than arming the timer
            _held.wrappers = db.thread_connections(every_alias=True)
        self.previous = signal.signal(signal.SIGALRM, _on_alarm) if self.depth == 0 else None
        _held.depth = self.depth + 1

    def __exit__(self, *exc_info: object) -> None:
        if not self.main:
            return
        _held.depth = self.depth
        if self.depth == 0:
            with aborts.poke_lock:  # no abort's poke can arrive once the handler is gone
                signal.signal(signal.SIGALRM, self.previous)


class alarms_deferred:  # a lower-case name: used as a function, ``with executor.alarms_deferred():``
    """Hold a timeout's or an abort's raise until the block ends: no such raise lands between its steps.

    For the runner's own bookkeeping inside a handler's statement (``runner._Statements``): a
    ``JobTimeout`` raised between two of its steps would leave a sibling's savepoint half handled.
    A statement holds a signal until it returns anyway (libpq retries its wait), and the watchdog
    still cancels one that runs past its deadline; the raise only moves to the block's end.
    """

    __slots__ = ("main",)

    def __enter__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()  # elsewhere no alarm is raised
        if not self.main:
            return
        if _deferring[0] == 0:
            _deferring[1] = False
        _deferring[0] += 1

    def __exit__(self, *exc_info: object) -> None:
        if not self.main:
            return
        _deferring[0] -= 1  # first: an alarm from here on raises at once
        if _deferring[0] == 0 and _deferring[1]:
            _deferring[1] = False
            _on_alarm(signal.SIGALRM, None)


class _Watchdog:
    """One thread per process that cancels the database statements of a deadline still running past its end.

    Arming and disarming take a lock and nothing else (no thread, no round trip per job); the thread
    sleeps until the armed time. It is woken only by a deadline earlier than the time it will look
    again: the next job's deadline (as long as the last one's, or longer) is seen at that look, so
    a batch does not switch threads once a job. The connections are given when the deadline is
    armed (Django's wrappers of the main thread, every alias's inside ``alarms()``: their
    ``connection`` is read when the watchdog fires, so one opened during the job is seen too).
    Disarmed under the same lock before the deadline's block ends, it never cancels a statement sent
    after the block.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: tuple[float, int, list[Any]] | None = None  # (monotonic time, generation, connections)
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._looks_at = math.inf  # when the thread looks at the armed deadline again (monotonic)

    def arm(self, seconds: float, wrappers: list[Any]) -> int:
        with self._lock:
            self._generation += 1
            at = time.monotonic() + seconds + CANCEL_GRACE_SECONDS
            self._armed = (at, self._generation, wrappers)
            if self._thread is None or not self._thread.is_alive():
                self._looks_at = math.inf
                self._thread = threading.Thread(target=self._run, name="timekeeper-statement-watchdog", daemon=True)
                self._thread.start()
            elif at < self._looks_at:
                self._lock.notify()
            return self._generation

    def disarm(self, generation: int) -> None:
        with self._lock:
            if self._armed is not None and self._armed[1] == generation:
                self._armed = None

    def _run(self) -> None:
        with self._lock:
            while True:
                if self._armed is None:
                    self._looks_at = math.inf
                    self._lock.wait()
                    continue
                at, _, wrappers = self._armed
                left = at - time.monotonic()
                if left > 0:
                    self._looks_at = at
                    self._lock.wait(left)
                    continue
                self._armed = None
                logger.warning(
                    "handler stuck past its timeout: its database statements are cancelled",
                    extra={"action": "statement_cancelled"},
                )
                db.cancel_statements(wrappers)  # under the lock: the deadline cannot end while it is sent


_watchdog = _Watchdog()


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[bool]:
    """Raise ``JobTimeout`` in the block after ``seconds``; yields whether the limit is enforced here.

    A block still inside a database statement at its end has the statement cancelled (``_Watchdog``).
    """
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield False
        return
    held = getattr(_held, "depth", 0) > 0
    previous = None if held else signal.signal(signal.SIGALRM, _on_alarm)
    generation = _watchdog.arm(seconds, _held.wrappers if held else db.thread_connections())
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _armed[0] += 1
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _watchdog.disarm(generation)
        _armed[0] -= 1
        if not held:
            signal.signal(signal.SIGALRM, previous)


def scrubbed_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` and of its causes: frames and exception types, none of their messages.

    A message may quote a payload (``ValueError(f"bad email {payload['email']}")``); where it broke
    is in the frames. The message itself is kept once, bounded, in the attempt's error text.
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = f"{type(current).__module__}.{type(current).__qualname__}"
        frames = "".join(traceback.format_tb(current.__traceback__))
        parts.append(f"Traceback (most recent call last):\n{frames}{name}: (message withheld)")
        current = current.__cause__ or current.__context__
    return "\n\nwhile handling or caused by:\n".join(reversed(parts))


KEPT_TRACEBACK_ATTRIBUTE = "timekeeper_traceback"  # a handler's own traceback text for its exception


def kept_traceback(exc: BaseException) -> str:
    """The traceback kept for a failure: scrubbed (``scrubbed_traceback``), unless the handler gave its own.

    A handler that owns its failures' text (a Django task: ``scheduling.backends`` keeps Django's
    whole traceback, as Django's backends do) sets it on the exception as ``KEPT_TRACEBACK_ATTRIBUTE``.
    """
    own = getattr(exc, KEPT_TRACEBACK_ATTRIBUTE, None)
    return own if isinstance(own, str) else scrubbed_traceback(exc)


def process_stopping(exc: BaseException) -> bool:
    """Whether a ``SystemExit`` / ``KeyboardInterrupt`` is this process's shutdown, not a handler's own exit."""
    from billiard import common
    from celery import exceptions as celery_exceptions

    if isinstance(exc, (celery_exceptions.WorkerShutdown, celery_exceptions.WorkerTerminate)):
        return True
    fired = getattr(common, "terminate_handler_fired", None)
    return bool(fired()) if fired is not None else bool(common._should_have_exited[0])


def error_text(exc: BaseException) -> str:
    """``Type: message``, bounded: what a person reads first about a failure."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]


def invoke(kind: registry.Kind, job: registry.Job, timeout: float | None) -> Result:
    """Run ``kind``'s handler on ``job`` under ``timeout`` seconds (None or 0: no limit of its own).

    A ``JobTimeout`` from a deadline set by the caller around several calls propagates; one from
    this call's own timeout becomes ``TIMED_OUT``.
    """
    with tracing.span(
        "timekeeper.run_job",
        job_id=job.id,
        ref=job.ref or None,
        kind=kind.name,
        attempt=job.attempt,
        mechanism=job.mechanism,
    ) as span:
        result = _call(kind, job, timeout)
        span.set("outcome", result.outcome)
        return result


def _call(kind: registry.Kind, job: registry.Job, timeout: float | None) -> Result:
    owns_deadline = False
    try:
        with alarms(), deadline(timeout) as owns_deadline, aborts.running(job.id, job.token):
            # Aborted while it waited in its batch, or just before running() marked it (no poke came
            # then): asked once it is marked, so a request read at any moment stops it. It does not start.
            asked = aborts.requested(job.id, job.token)
            if asked is not None:
                raise JobAborted(asked)
            kind.func(job)
    except JobAborted as exc:
        logger.warning("job aborted", extra={**_log(kind, job), "action": "aborted"})
        return Result(ABORTED, str(exc))
    except JobTimeout:
        if not owns_deadline:
            raise
        logger.warning("job timed out", extra={**_log(kind, job), "action": "timed_out", "timeout_seconds": timeout})
        return Result(TIMED_OUT, f"timed out after {timeout:g}s")
    except (SystemExit, KeyboardInterrupt) as exc:
        if process_stopping(exc):
            raise
        logger.warning("job raised %s", type(exc).__name__, extra={**_log(kind, job), "action": "failed"})
        return Result(FAILED, error_text(exc), kept_traceback(exc)[-TRACEBACK_LIMIT:])
    except registry.HandlerOutcome as exc:
        logger.info("job chose %s", exc.outcome, extra={**_log(kind, job), "action": exc.outcome})
        delay = getattr(exc, "seconds", None)
        return Result(exc.outcome, error_text(exc), kept_traceback(exc)[-TRACEBACK_LIMIT:], delay)
    except BaseException as exc:  # GeneratorExit, asyncio.CancelledError, a library's own: this job's failure too
        logger.warning("job raised %s", type(exc).__name__, extra={**_log(kind, job), "action": "failed"})
        return Result(FAILED, error_text(exc), kept_traceback(exc)[-TRACEBACK_LIMIT:])
    return SUCCESS


def _log(kind: registry.Kind, job: registry.Job) -> dict[str, object]:
    return {"kind": kind.name, "job_id": job.id, "ref": job.ref, "attempt": job.attempt}
