"""Liveness files: a process's own loop says "I still turn", and a probe in the same pod reads it.

A Kubernetes liveness probe must fail only when restarting the process would help: a worker whose
control loop is stuck, a beat whose scheduler loop no longer ticks. It must not fail because
PostgreSQL or Redis is away (that is readiness: a restart cannot bring them back, and restarting
every pod at once during an outage makes it worse). So the sign of life is local: the loop writes
a small JSON file (``<SCHEDULING_LIVENESS_DIR>/timekeeper-<role>.alive``) while it turns, and
``manage.py timekeeper probe <role>`` exits 0 when the file is younger than
``SCHEDULING_LIVENESS_MAX_AGE_SECONDS``, 1 otherwise (missing, stale or unreadable).

Writers: the worker's watcher (``scheduling.due_at.liveness``: the control loop's threads are
alive and, when it leads, its turns and its duties thread's rounds advance) and beat's scheduler
(``scheduling.fixed.beat``: every tick, leader or standby). A file is replaced atomically
(written beside, then renamed), so a probe never reads half of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from scheduling.core import conf

logger = logging.getLogger(__name__)

ROLES = ("worker", "beat")
WRITE_EVERY_SECONDS = 5.0  # a loop rewrites its file at most this often


def directory() -> Path:
    """Where liveness files go: ``SCHEDULING_LIVENESS_DIR``, else the system's temporary directory."""
    return Path(conf.get().liveness_dir or tempfile.gettempdir())


def path(role: str) -> Path:
    return directory() / f"timekeeper-{role}.alive"


def write(role: str, **detail: Any) -> None:
    """Record that ``role``'s loop turned just now (wall clock: the probe runs in another process)."""
    target = path(role)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = {"role": role, "pid": os.getpid(), "alive_at": time.time(), **detail}
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Throttled:
    """``write`` at most every ``WRITE_EVERY_SECONDS`` (a loop calls it on every turn)."""

    def __init__(self, role: str, every: float = WRITE_EVERY_SECONDS) -> None:
        self.role = role
        self.every = every
        self._last = 0.0

    def __call__(self, **detail: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        try:
            write(self.role, **detail)
        except OSError:  # a full or read-only disk: the probe will say so by the file's age
            logger.warning("cannot write the liveness file", exc_info=True)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a probe concluded: alive or not, and a sentence saying why."""

    alive: bool
    reason: str
    age_seconds: float | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def check(role: str, max_age_seconds: float | None = None) -> Verdict:
    """Whether ``role``'s liveness file is fresh (younger than the limit)."""
    limit = conf.get().liveness_max_age_seconds if max_age_seconds is None else max_age_seconds
    target = path(role)
    try:
        body = json.loads(target.read_text())
        alive_at = float(body["alive_at"])
    except FileNotFoundError:
        return Verdict(False, f"{target} does not exist: no {role} loop has turned in this pod yet")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Verdict(False, f"{target} cannot be read ({type(exc).__name__}: {exc})")
    age = max(0.0, time.time() - alive_at)
    detail = {k: v for k, v in body.items() if k != "alive_at"}
    if age > limit:
        return Verdict(False, f"the {role} loop last turned {age:.0f}s ago (limit {limit:g}s)", age, detail)
    return Verdict(True, f"the {role} loop turned {age:.1f}s ago", age, detail)
