"""Keeping live claims alive while their jobs run.

One daemon thread per worker process refreshes ``heartbeat_at`` of every claim the process holds,
every ``SCHEDULING_HEARTBEAT_SECONDS``, on its own database connection. The sweeper takes back a
claim whose heartbeat is older than its lease: a crashed worker's job is rescued within about a
lease, while a live job that runs for an hour keeps its claim. This is separate from the job's
own timeout. With heartbeats off (0) the sweeper falls back to a plain ``claimed_at`` age.

A job leaves the set as its outcome is written (``release``), not when its batch ends, so "claim
lost while running" is logged only for a claim that was really taken back. Rows locked by the
process's own atomic chunk cannot be renewed (the statement skips them); the chunk's locks keep
the sweeper away instead, and the chunk's transaction ends if the process stops answering
(``runner.STALL_MARGIN_SECONDS``).

The renewal also reads back the aborts asked for the held claims (``api.abort``) and hands them
to ``core/aborts.py``, which interrupts the handler: an abort reaches its job within about one
heartbeat interval, on whichever host runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence

from django.db import DatabaseError, connection

from scheduling.core import aborts, conf
from scheduling.due_at import store

logger = logging.getLogger(__name__)


class _Beater:
    def __init__(self) -> None:
        self.held: dict[int, str] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._loop, name="timekeeper-heartbeat", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        interval = conf.get().heartbeat_seconds
        try:
            while not self.stopping.is_set():
                self._beat(interval)
        finally:
            connection.close()

    def _beat(self, interval: float) -> None:
        """One turn: wait, renew the held claims, report the ones taken back."""
        self.wake.wait(interval)
        self.wake.clear()
        with self.lock:
            claims = list(self.held.items())
        if not claims or self.stopping.is_set():
            return
        try:
            renewed = store.heartbeat_jobs(claims)
        except DatabaseError:
            logger.warning("heartbeat failed; will retry", exc_info=True)
            connection.close()
            return
        alive = {r.id for r in renewed}
        held = dict(claims)
        for r in renewed:
            if r.abort_by is not None and r.abort_at is not None:
                aborts.request(r.id, held[r.id], aborts.reason(r.abort_by, r.abort_at))
        for job_id, token in claims:
            if job_id in alive:
                continue
            with self.lock:
                # A job whose outcome committed meanwhile left the set first (release): not lost.
                lost = self.held.get(job_id) == token
                if lost:
                    del self.held[job_id]
            if lost:
                logger.warning(
                    "claim lost while running: the job was taken back and may run elsewhere",
                    extra={"job_id": job_id, "action": "claim_lost"},
                )


_beater: _Beater | None = None
_beater_lock = threading.Lock()


def _get() -> _Beater:
    global _beater
    with _beater_lock:
        if _beater is None or _beater.pid != os.getpid():  # threads do not survive a fork
            _beater = _Beater()
        return _beater


def enabled() -> bool:
    return conf.get().heartbeat_seconds > 0


@contextlib.contextmanager
def holding(claims: Sequence[tuple[int, str]]) -> Iterator[None]:
    """Heartbeat ``claims`` (id, token) for as long as the block runs."""
    if not enabled() or not claims:
        yield
        return
    beater = _get()
    with beater.lock:
        beater.held.update(dict(claims))
    try:
        yield
    finally:
        with beater.lock:
            for job_id, _ in claims:
                beater.held.pop(job_id, None)


def release(claims: Sequence[tuple[int, str]]) -> None:
    """Stop heartbeating ``claims`` whose outcome is being written: their claims end, they are not lost.

    Called just before the statement (or the commit) that records them, so the heartbeat never
    mistakes a finished job for one taken back.
    """
    if _beater is None or _beater.pid != os.getpid() or not claims:
        return
    with _beater.lock:
        for job_id, token in claims:
            if _beater.held.get(job_id) == token:
                del _beater.held[job_id]


def stop() -> None:
    """Stop this process's heartbeat thread and close its connection (a new one starts on the next use)."""
    global _beater
    with _beater_lock:
        beater, _beater = _beater, None
    if beater is not None and beater.pid == os.getpid():
        beater.stopping.set()
        beater.wake.set()
        beater.thread.join(5)


def held_claims() -> list[tuple[int, str]]:
    """The claims this process is heartbeating right now (for a graceful shutdown)."""
    if _beater is None or _beater.pid != os.getpid():
        return []
    with _beater.lock:
        return list(_beater.held.items())
