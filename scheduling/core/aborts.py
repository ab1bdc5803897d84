"""This process's aborts: which of its running jobs an operator asked to stop, and the handler to interrupt.

``api.abort`` writes a request row (``JobAbort``); the worker process that runs the job reads it back
with its heartbeat (``due_at/lease.py``, no extra round trip) and calls ``request`` from the heartbeat
thread. If that job's handler is running on the main thread now (``running``), the main thread gets
a SIGALRM (``signal.pthread_kill``: aimed at it, so a blocking call there returns early, as for a
timeout) and the executor's alarm handler raises ``executor.JobAborted`` inside the handler. A job
of the batch that has not started yet is not run; a committing handler may poll
``registry.Job.abort_requested()``. Why and how: docs/architecture.md, "Aborting a running job".

No lock is taken in the signal handler's path (it runs between two bytecodes of the main thread,
which may hold any lock): the state is two plain values whose reads and writes are atomic in CPython.
``poke_lock`` orders a poke against the executor removing its SIGALRM handler (``executor.alarms``).
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
from collections.abc import Sequence

# (job id, claim token) -> the reason recorded on its attempt ("aborted by alice at ...")
_requested: dict[tuple[int, str], str] = {}
# The claim whose handler runs on the main thread now, while the executor's SIGALRM handler is installed.
_current: tuple[int, str] | None = None
poke_lock = threading.Lock()


def asker(by: str | None) -> str:
    """Who asks for an abort: ``by``, else the operator acting through a door (as the audit trail names them)."""
    if by:
        return by
    from scheduling.core import audit  # audit imports the models: not at this module's import (the executor's)

    actor = audit.current()
    return actor.resolve()[2] if actor is not None else "application"


REASON_PREFIX = "aborted by "  # how every abort's text begins (an error's text is "Type: message", never this)


def reason(by: str, at: dt.datetime) -> str:
    """The text an aborted job records (its attempt's error, its last error): who asked and when (UTC)."""
    return f"{REASON_PREFIX}{by} at {at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def request(job_id: int, token: str, reason: str) -> bool:
    """Ask this process to stop the claim (``job_id``, ``token``); True when its handler was interrupted now."""
    claim = (job_id, token)
    if claim in _requested:
        return False
    _requested[claim] = reason
    with poke_lock:
        if _current != claim:
            return False
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)
        return True


def requested(job_id: int | None, token: str | None) -> str | None:
    """The reason an abort of this claim was asked for, or None (none seen by this process's heartbeat)."""
    if job_id is None or token is None:
        return None
    return _requested.get((job_id, token))


def current() -> str | None:
    """The abort asked for the handler running on the main thread now (the alarm handler's question)."""
    claim = _current
    return None if claim is None else _requested.get(claim)


def running(job_id: int | None, token: str | None) -> _Running:
    """Mark this claim's handler as the one a poke interrupts while the block runs (main thread only)."""
    return _Running(None if job_id is None or token is None else (job_id, token))


class _Running:
    """``running()``'s block: a plain context manager (entered for every job: a generator's costs more)."""

    __slots__ = ("claim",)

    def __init__(self, claim: tuple[int, str] | None) -> None:
        self.claim = claim

    def __enter__(self) -> None:
        global _current
        if self.claim is None or threading.current_thread() is not threading.main_thread():
            self.claim = None
            return
        _current = self.claim

    def __exit__(self, *exc_info: object) -> None:
        global _current
        if self.claim is not None:
            _current = None


def forget(claims: Sequence[tuple[int, str]]) -> None:
    """Drop the requests of claims whose batch ended (their outcome is written)."""
    for claim in claims:
        _requested.pop((int(claim[0]), str(claim[1])), None)
