"""Celery Beat with django-celery-beat's database scheduler, one leader among replicas.

Any number of ``celery -A project beat`` processes may run. Each tick, a process that does not
lead tries ``pg_try_advisory_lock`` on a dedicated connection (``locks``); the one holding it
leads and sends messages, the others send nothing and retry every ``STANDBY_RETRY_SECONDS``. The
lock dies with the leader's connection, so a standby takes over within seconds of a crash. The
leader records a heartbeat row that health checks and the admin read.

Leadership only avoids duplicate sends in the normal case; exactly-once per tick is the run
ledger's job (``fixed``), which also covers a handover in the middle of a tick.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import psycopg2
from django.db import DatabaseError, close_old_connections
from django_celery_beat.schedulers import DatabaseScheduler

from scheduling import locks
from scheduling.models import SchedulerHeartbeat

logger = logging.getLogger(__name__)

LEADER_LOCK = ("beat", "leader")
STANDBY_RETRY_SECONDS = 1.0  # how often a standby tries to take the lead
LEADER_CHECK_SECONDS = 2.0  # how often the leader checks its lock connection is alive
HEARTBEAT_SECONDS = 5.0  # how often the leader writes its heartbeat row


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderDatabaseScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler that only sends while it holds the leader lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._leader_lock = locks.AdvisoryLock(*LEADER_LOCK)
        self._last_check = 0.0
        self._last_heartbeat = 0.0
        self._acquired_at: Any = None
        super().__init__(*args, **kwargs)

    @property
    def is_leader(self) -> bool:
        return self._leader_lock.held

    def _ensure_leader(self) -> bool:
        now = time.monotonic()
        if self._leader_lock.held:
            if now - self._last_check >= LEADER_CHECK_SECONDS:
                self._last_check = now
                if not self._leader_lock.alive():
                    logger.error("lost the beat leader lock (its connection died); standing by")
            if self._leader_lock.held:
                return True
        try:
            acquired = self._leader_lock.try_acquire()
        except psycopg2.Error:
            logger.warning("cannot reach PostgreSQL to take the beat lead; sending nothing", exc_info=True)
            return False
        if acquired:
            self._last_check = now
            self._last_heartbeat = 0.0
            self._acquired_at = None
            logger.info("this beat leads now", extra={"holder": holder_name(), "action": "leader_acquired"})
            # Re-read the schedule: the previous leader may have advanced it.
            self._initial_read = True
            self._heap = None
        return acquired

    def _write_heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = now
        try:
            close_old_connections()
            from django.db.models.functions import Now

            row, created = SchedulerHeartbeat.objects.update_or_create(
                role="beat",
                defaults={"holder": holder_name(), "heartbeat_at": Now()},
                create_defaults={"holder": holder_name(), "heartbeat_at": Now(), "acquired_at": Now()},
            )
            if self._acquired_at is None:
                # A new leadership starts its "leading since" now, even if the row existed.
                SchedulerHeartbeat.objects.filter(pk=row.pk).update(acquired_at=Now())
                self._acquired_at = True
        except DatabaseError:
            logger.warning("could not record the beat heartbeat", exc_info=True)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._ensure_leader():
            return STANDBY_RETRY_SECONDS
        self._write_heartbeat()
        return min(super().tick(*args, **kwargs), LEADER_CHECK_SECONDS)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._leader_lock.release()
