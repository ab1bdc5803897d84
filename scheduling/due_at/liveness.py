"""The worker's sign of life: a watcher thread that writes the liveness file while the control loop turns.

A worker is alive when its control loop thread runs and, while it leads, its turns advance (a
leader stuck in a turn holds up every claim in the cluster: restarting it hands the lead to a
standby) and so does its duties thread (the recurrence planner, the orphan pass: a leader whose
duties died or hang would keep the lead and plan nothing). A standby's loop only sleeps and
tries the lock, so its thread being alive is enough.
A worker started with ``SCHEDULING_CONTROL_IN_WORKERS=False`` has no loop: its watcher running in
the main process is the sign of life.

While the loop leads and advances, the watcher also records the ``control`` heartbeat row
(database clock), which ``/metrics`` exports as ``timekeeper_control_heartbeat_age_seconds`` for
the "no control leader" alert. The watcher is observation only: it never touches the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import DatabaseError, close_old_connections

from scheduling.core import leadership, liveness, store
from scheduling.due_at import control

logger = logging.getLogger(__name__)

ROLE = "worker"
HEARTBEAT_ROLE = "control"  # the heartbeat row of the leading control loop (metrics, alerts)
WATCH_EVERY_SECONDS = 5.0  # the watcher looks at the loop (and writes the file) this often


class Watcher:
    """Looks at this process's control loop every ``WATCH_EVERY_SECONDS`` and writes the liveness file."""

    def __init__(
        self, every: float = WATCH_EVERY_SECONDS, loop: Callable[[], control.ControlLoop | None] = control.current
    ) -> None:
        self.every = every
        self.loop = loop
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self._last_turns: int | None = None
        self._last_duty_rounds: int | None = None
        self._was_leading = False
        self._heartbeat_leading = False  # whether this leadership's first heartbeat is written

    def start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.stopping.clear()
        self.thread = threading.Thread(target=self.run, name="timekeeper-liveness", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.observe()
                self.stopping.wait(self.every)
        finally:
            close_old_connections()

    def observe(self) -> bool:
        """One look: write the file (and the leader's heartbeat) when the loop is healthy; whether it was."""
        loop = self.loop()
        if loop is None:
            liveness.write(ROLE, control_loop=False)
            return True
        if loop.thread is None or not loop.thread.is_alive():
            logger.error("liveness: the control loop thread is not running", extra={"action": "control_dead"})
            return False
        duties = loop.duties_thread
        if duties is not None and not duties.is_alive():
            # the planner and the orphan pass: a leader without them keeps the lead and plans nothing
            logger.error("liveness: the control loop's duties thread is not running", extra={"action": "duties_dead"})
            return False
        leading = loop.leadership.leading
        turns, duty_rounds = loop.counters.turns, loop.counters.duty_rounds
        first = not self._was_leading  # the first look after taking the lead counts as progress
        advanced = self._last_turns is None or turns != self._last_turns or first
        duties_advanced = self._last_duty_rounds is None or duty_rounds != self._last_duty_rounds or first
        self._last_turns, self._last_duty_rounds, self._was_leading = turns, duty_rounds, leading
        if leading and not advanced:
            logger.warning(
                "liveness: the leading control loop has not finished a turn since the last look",
                extra={"action": "control_stalled", "turns": turns},
            )
            return False
        if leading and duties is not None and not duties_advanced:
            # a duty stuck (a pass blocked in a query): the leader would keep the lead and plan nothing
            logger.warning(
                "liveness: the leading control loop's duties thread began no round since the last look",
                extra={"action": "duties_stalled", "duty_rounds": duty_rounds},
            )
            return False
        liveness.write(ROLE, control_loop=True, leading=leading, turns=turns)
        if leading:
            self._heartbeat()
        else:
            self._heartbeat_leading = False
        return True

    def _heartbeat(self) -> None:
        try:
            store.record_heartbeat(HEARTBEAT_ROLE, leadership.process_name(), new_lead=not self._heartbeat_leading)
            self._heartbeat_leading = True
        except DatabaseError:
            logger.warning("could not record the control loop's heartbeat", exc_info=True)
            close_old_connections()


_watcher: Watcher | None = None
_lock = threading.Lock()


def start() -> Watcher:
    """Start this process's watcher (once)."""
    global _watcher
    with _lock:
        if _watcher is None:
            _watcher = Watcher()
        _watcher.start()
        return _watcher


def stop() -> None:
    with _lock:
        if _watcher is not None:
            _watcher.stop()
