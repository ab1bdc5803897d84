"""Who this process is, and leadership: one process in the cluster leads a duty at a time.

A leader holds a session-level advisory lock on a dedicated connection (``locks``); if it dies,
PostgreSQL closes the connection and the lock goes with it, and a standby takes over on its next
try. Beat's scheduler and the worker's control loop (claim and sweep) both lead through
``Leadership``; nothing else takes a leader lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any

import psycopg2
import psycopg2.errors

from scheduling.core import locks

logger = logging.getLogger(__name__)


def process_name() -> str:
    """``host:pid``: how this process is named in claims, run records and heartbeats."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    """Leadership of ``role``: ``pg_try_advisory_lock`` held on a dedicated connection.

    ``lead()`` is called by the would-be leader on every turn of its loop: it takes the lock when
    free, and while held checks at most every ``check_seconds`` that the session is alive (a
    ``SELECT 1``, which also resets the session's idle clock). With ``silence_seconds`` PostgreSQL
    ends the session of a leader that stops without dying (SIGSTOP, a frozen VM) once it has been
    idle that long, which frees the lock for a standby (PostgreSQL 14+; older servers: no bound).
    The connection is exposed so that a leader can LISTEN on it, and run its own transactions there
    (the control loop claims in it: ``lock_timeout_ms`` bounds their lock waits).
    """

    def __init__(
        self,
        role: str,
        *,
        silence_seconds: float | None = None,
        check_seconds: float = 1.0,
        lock_timeout_ms: int = 0,
    ) -> None:
        self.role = role
        self.lock_timeout_ms = lock_timeout_ms  # a statement of the session waits this long for a lock (0: no limit)
        self.key = locks.lock_key(role, "leader")
        self.silence_seconds = silence_seconds
        self.check_seconds = check_seconds
        self.connection: Any = None
        self._leading = False
        self._checked = 0.0

    @property
    def leading(self) -> bool:
        return self._leading

    def lead(self) -> bool:
        """Whether this process leads now: keep the lead (checking the session), or try to take it."""
        now = time.monotonic()
        if self._leading:
            if now - self._checked < self.check_seconds:
                return True
            try:
                with self.connection.cursor() as cur:
                    cur.execute("SELECT 1")
                self._checked = now
                return True
            except psycopg2.Error:
                logger.error("lost the lead: its lock session died", extra={"role": self.role, "action": "leader_lost"})
                self._drop()
                return False
        try:
            if self.connection is None or self.connection.closed:
                self.connection = locks.dedicated_connection(f"timekeeper-leader:{self.role}", self.lock_timeout_ms)
            with self.connection.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
                if not cur.fetchone()[0]:
                    return False
                if self.silence_seconds:
                    with contextlib.suppress(psycopg2.errors.UndefinedObject):
                        cur.execute(
                            "SELECT set_config('idle_session_timeout', %s, false)", [f"{self.silence_seconds:g}s"]
                        )
        except psycopg2.Error:
            logger.warning("cannot reach PostgreSQL to take the lead", extra={"role": self.role}, exc_info=True)
            self._drop()
            return False
        self._leading = True
        self._checked = now
        logger.info("this process leads now", extra={"role": self.role, "holder": process_name(), "action": "leads"})
        return True

    def listen(self, channel: str) -> None:
        """LISTEN on the lock session (the leader's wake-ups: ``connection.notifies``)."""
        with self.connection.cursor() as cur:
            cur.execute(f"LISTEN {channel}")

    def resign(self) -> None:
        """Give the lead up (closing the session releases the lock too)."""
        if self._leading and self.connection is not None:
            with contextlib.suppress(psycopg2.Error), self.connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        self._drop()

    def _drop(self) -> None:
        self._leading = False
        conn, self.connection = self.connection, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()
