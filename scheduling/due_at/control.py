"""The control loop: claiming and sweeping, apart from the work, led by one process in the cluster.

Claiming and sweeping are small, frequent and urgent; jobs are many and may be slow. So they
never share a queue and control never holds a seat a handler could use: every Celery worker
starts this loop in a thread of its main process (``scheduling.tasks`` connects it to the worker's
``worker_ready`` and ``worker_shutting_down`` signals), beside the pool, and one of them leads
(``leadership.Leadership``, on a dedicated connection that is also its LISTEN session). The
others stand by and take over within ``STANDBY_RETRY_SECONDS`` of the leader's death, or within
``LEAD_SILENCE_SECONDS`` if it freezes (PostgreSQL ends its idle lock session).

A turn of the leading loop: sweep when the sweep interval has passed (expired claims back to
pending; history pruned every minute, one statement a turn while more is left), claim what is
due and what the queue has room for (``claim.claim_and_dispatch``), then sleep until the next due
time, a NOTIFY that a near row was committed, or ``WAIT_STEP_SECONDS`` (so a stop is noticed
within it). A burst therefore cannot delay a sweep: the sweep runs on its clock in the same loop.

The leader claims, and reads its next due time, in its lock session (where the claim is prepared,
and prepared again every ``db.REPLAN_SECONDS``: ``store.claim_due_jobs``); its sweeps and
give-backs run on its own Django session.

Across hosts (docs/fault-tolerance.md, "A host that vanishes"): the loop's own Django session is
bounded like its lock session (``locks.bound_django_session``), so a leader that vanishes in the
middle of a claim or a sweep leaves no row lock for longer than ``locks.VANISHED_CLIENT_BOUND_SECONDS``;
a statement of the loop, in either session, waits at most ``LOCK_WAIT_SECONDS`` for a lock, then the turn is tried again
after a check of the lead, so waiting on a vanished session's locks never costs a new leader its
lead (its lock session would otherwise sit idle past ``LEAD_SILENCE_SECONDS``). A leader whose
sends fail ``BROKER_FAILURES_TO_STEP_DOWN`` turns in a row (Redis unreachable from this host while
PostgreSQL is not) steps down and stays a standby for ``STEP_DOWN_HOLD_SECONDS``, so a host that
can reach the broker takes the lead (if none does, it leads again after the hold).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import select
import threading
import time
from collections.abc import Callable

import kombu.exceptions
import psycopg2
from django.db import DatabaseError, connection

from scheduling.core import conf, leadership, locks
from scheduling.due_at import claim, store, sweep

logger = logging.getLogger(__name__)

ROLE = "control"  # the leadership role (advisory lock) of the control loop
LEAD_SILENCE_SECONDS = 10  # PostgreSQL ends a frozen leader's lock session after this long idle
STANDBY_RETRY_SECONDS = 1.0  # a standby tries to take the lead this often
WAIT_STEP_SECONDS = 0.5  # the longest single sleep: a stop is noticed within this
BACKPRESSURE_PAUSE_SECONDS = 0.02  # pause while the queue is full
# While a rate-limited kind has due jobs, the rate-limited kinds are in a claim at most this often;
# the turns in between (other kinds' due times) claim the other kinds only. Coarser costs rate: a
# window's room is taken up to this late (bench flow, the worst 5/s partition: claims 200 ms and
# 50 ms apart lost 2.0-2.3% of its rate, 20 ms 1.0%).
RATE_STEP_SECONDS = 0.02
ERROR_PAUSE_SECONDS = 1.0  # pause after PostgreSQL or the broker failed a turn
PRUNE_EVERY_SECONDS = 60.0  # history is pruned this often when the last slice left nothing behind
PRUNE_AGAIN_SECONDS = 0.1  # while more is left, the next slice this soon: up to ~2,000 rows/s of history
PRUNE_SLICE_SECONDS = 0.015  # a turn prunes about this long (one statement of ~10-20 ms, sometimes two)
STOP_JOIN_SECONDS = 2.0  # how long a stopping worker waits for the loop
RESTART_JOIN_SECONDS = 10.0  # a start after a stop that timed out waits this long for the old threads
LOCK_WAIT_SECONDS = 4  # a statement of the loop waits this long for a lock (well under LEAD_SILENCE_SECONDS)
BROKER_FAILURES_TO_STEP_DOWN = 2  # turns in a row whose sends the broker refused: the leader steps down
# A stepped-down leader lets a standby (retrying every STANDBY_RETRY_SECONDS) take the lead first; if
# none does (a single worker, or none can reach Redis either), it leads again after this.
STEP_DOWN_HOLD_SECONDS = 3.0

# Duties a higher layer adds to the leader (scheduling.tasks adds the recurrence planner and the
# fixed-time orphan pass): each is called on the loop's duties thread while this process leads,
# every DUTY_STEP_SECONDS, and paces itself. They never run in a turn: a planner pass of a
# 100,000-recurrence spike (a pick of ~50 ms and inserts of ~150 ms, every second) held every
# claim behind it, and the workers ran dry meanwhile (its spike: 48.7 s with the duties in the
# turn, 41-44 s beside it, 35.6 s with no planning at all; bench/README.md).
EXTRA_DUTIES: list[Callable[[], object]] = []
DUTY_STEP_SECONDS = 0.1  # the duties thread offers each duty a pass this often


@dataclasses.dataclass
class Counters:
    """What the loop has done since it started (read by tests, logs and the status command)."""

    turns: int = 0
    claimed: int = 0
    batches: int = 0
    given_back: int = 0
    sweeps: int = 0
    reclaimed: int = 0
    pruned: int = 0
    prune_slices: int = 0
    led_turns: int = 0
    rate_claims: int = 0  # claims that took rate-limited kinds too (the others left them out: their cadence)
    step_downs: int = 0  # the lead given up because the broker could not be reached from here
    duty_rounds: int = 0  # rounds of the duties thread while leading (each duty offered a pass; failed ones too)


class ControlLoop:
    """Claim and sweep on a thread; only the cluster's leader does work."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.leadership = leadership.Leadership(
            ROLE, silence_seconds=LEAD_SILENCE_SECONDS, lock_timeout_ms=LOCK_WAIT_SECONDS * 1000
        )
        self.counters = Counters()
        self.thread: threading.Thread | None = None
        self.duties_thread: threading.Thread | None = None
        self._listening = False
        self._next_sweep = 0.0
        self._next_prune = 0.0
        self._last_rate_claim = -math.inf  # the last claim that took rate-limited kinds (monotonic)
        self._rate_waiting = False  # a rate-limited kind had due jobs waiting for its window at the last look
        self._refill: float | None = None  # what the last look at the rate-limited kinds read (_rate_refill)
        self._pruning = 0  # rows pruned by the slices of the current run (logged when it ends)
        self._broker_failures = 0  # turns in a row whose sends failed
        self._hold_until = 0.0  # after a step-down: no try for the lead before this (monotonic)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the loop's threads (daemons: they never keep a process alive on their own); True if they run.

        After a ``stop()`` that timed out, the old threads are waited for (``RESTART_JOIN_SECONDS``)
        before new ones start: two loop threads would share one leadership session, and the old one
        resigns the lead as it ends. If they are still running then, nothing starts (False).
        """
        threads = [t for t in (self.thread, self.duties_thread) if t is not None and t.is_alive()]
        if len(threads) == 2 and not self.stopping.is_set():
            return True  # running
        self.stopping.set()  # one of the two ended (or a stop is under way): both start anew
        deadline = time.monotonic() + RESTART_JOIN_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            logger.error("control loop not restarted: its stopping threads still run", extra={"action": "not_started"})
            return False
        self.stopping.clear()
        self.thread = threading.Thread(target=self.run, name="timekeeper-control", daemon=True)
        self.duties_thread = threading.Thread(target=self.run_duties, name="timekeeper-duties", daemon=True)
        self.thread.start()
        self.duties_thread.start()
        logger.info("control loop started", extra={"action": "control_started"})
        return True

    def stop(self, timeout: float = STOP_JOIN_SECONDS) -> bool:
        """Ask the loop to stop and wait up to ``timeout`` seconds; True if it has stopped."""
        self.stopping.set()
        threads = [t for t in (self.thread, self.duties_thread) if t is not None]
        if not threads:
            return True
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stopped = not any(thread.is_alive() for thread in threads)
        logger.info("control loop stopped" if stopped else "control loop still stopping", extra={"action": "stopped"})
        return stopped

    def run(self) -> None:
        """The thread's body: lead or stand by until stopped; resign and close connections at the end."""
        try:
            while not self.stopping.is_set():
                was_leading = self.leadership.leading
                if not was_leading and time.monotonic() < self._hold_until:
                    self.stopping.wait(STANDBY_RETRY_SECONDS)
                    continue
                if not self.leadership.lead():
                    self._listening = False
                    self.stopping.wait(STANDBY_RETRY_SECONDS)
                    continue
                if not was_leading:
                    claim.sync_rates(force=True)
                    self._refill = None  # read afresh: the rates may have changed while another led
                    logger.info("control loop leads here: claiming and sweeping", extra={"action": "control_leads"})
                try:
                    self.turn()
                except (DatabaseError, psycopg2.Error, kombu.exceptions.OperationalError):
                    logger.warning("control turn failed; trying again", exc_info=True)
                    connection.close()
                    self.stopping.wait(ERROR_PAUSE_SECONDS)
        finally:
            self.leadership.resign()
            connection.close()  # this thread's Django connection

    def run_duties(self) -> None:
        """The duties thread's body: while this process leads, offer each extra duty a pass, on its own session.

        A duty may take a while (a planner pass plans thousands of occurrences); the claim goes on
        meanwhile on the loop's thread. Its statements are bounded like the loop's (a leader that
        vanishes mid-pass leaves no row lock for long). A duty that lost the lead mid-pass finishes
        it: the planner and the orphan pass are safe with two processes at once. No error ends the
        thread (a leader whose duties stopped would keep the lead and plan nothing), and one duty's
        failure skips no other. Each round counts (``duty_rounds``), failed or not: the liveness
        watcher fails a leader whose rounds stopped (a duty stuck, the thread gone), not one whose
        duty keeps failing (a restart would not mend that; the log says it).
        """
        try:
            while not self.stopping.is_set():
                if not self.leadership.leading:
                    connection.close()  # a standby holds no duties session (a no-op when none is open)
                    self.stopping.wait(STANDBY_RETRY_SECONDS)
                    continue
                self.counters.duty_rounds += 1
                failed = False
                for extra_duty in EXTRA_DUTIES:
                    if self.stopping.is_set():
                        break
                    try:
                        locks.bound_django_session(LOCK_WAIT_SECONDS * 1000)
                        extra_duty()
                    except Exception as exc:
                        failed = True
                        database = isinstance(exc, (DatabaseError, psycopg2.Error))
                        logger.log(
                            logging.WARNING if database else logging.ERROR,
                            "leader duty failed; trying again",
                            extra={
                                "action": "duty_failed",
                                "duty": getattr(extra_duty, "__module__", ""),
                            },
                            exc_info=True,
                        )
                        connection.close()
                self.stopping.wait(ERROR_PAUSE_SECONDS if failed else DUTY_STEP_SECONDS)
        except BaseException:
            logger.critical("the control loop's duties thread ended", exc_info=True, extra={"action": "duties_ended"})
            raise
        finally:
            connection.close()  # this thread's Django connection

    # --- one turn ------------------------------------------------------------------------------------

    def turn(self) -> None:
        """Sweep if due, claim, then wait for the next due time (leader only)."""
        self.counters.turns += 1
        self.counters.led_turns += 1
        locks.bound_django_session(LOCK_WAIT_SECONDS * 1000)
        self._listen()
        now = time.monotonic()
        settings = conf.get()
        if now >= self._next_sweep:
            reclaimed, killed = sweep.reclaim_expired()
            self.counters.sweeps += 1
            self.counters.reclaimed += reclaimed + killed
            logger.debug("sweep ran", extra={"reclaimed": reclaimed + killed, "action": "swept"})
            self._next_sweep = now + settings.sweep_interval_seconds
        if now >= self._next_prune:
            # A slice, not the whole backlog: a job due meanwhile waits for one slice at most.
            pruned, more = sweep.prune_slice(PRUNE_SLICE_SECONDS)
            self.counters.pruned += pruned
            self.counters.prune_slices += 1
            self._pruning += pruned
            if not more and self._pruning:
                logger.info("pruned finished jobs", extra={"pruned": self._pruning, "action": "pruned"})
                self._pruning = 0
            self._next_prune = now + (PRUNE_AGAIN_SECONDS if more else PRUNE_EVERY_SECONDS)
        # The rate-limited kinds are claimed at most every RATE_STEP_SECONDS, not on every turn another
        # kind's due time wakes the loop: reading their backlog and windows is most of a claim's cost (a
        # partitioned rate reads up to 1,000 rows), and within 20 ms a window frees little room.
        rates = now >= self._last_rate_claim + RATE_STEP_SECONDS
        # While a rate-limited kind waits for its window, its turns take any room the queue has, not
        # only a refill's worth: a start its window frees and the claim leaves for later is rate lost
        # for good (the next second's starts come that much later). Those turns are paced by the step.
        min_room = 1 if rates and self._rate_waiting else claim.refill_room()
        # claimed in the lead's own session (direct, never pooled): there the claim is prepared, not planned per claim
        report = claim.claim_and_dispatch(min_room=min_room, rates=rates, session=self.leadership.connection)
        if rates:
            self.counters.rate_claims += 1
            self._last_rate_claim = now
            self._refill = None  # this claim changed what waits: read again before it is kept (_rate_refill)
        self.counters.claimed += report.claimed
        self.counters.batches += report.batches
        self.counters.given_back += report.given_back
        if self._broker_unreachable(report.send_failed):
            return
        if report.queue_full:
            self._wait(BACKPRESSURE_PAUSE_SECONDS)
        elif report.more_due and report.claimed:
            return  # a backlog: claim the next rows at once
        elif (refill := self._rate_refill()) is not None:
            self._rate_waiting = True
            # a rate-limited kind waits for its window: claim as it frees room (smooth, not in bursts),
            # once per start's worth of its window (50/s: every 20 ms; 5/s per partition: every 200 ms)
            # (counted from the last claim of the rate-limited kinds, not from the end of this turn: the
            # turn's own time would otherwise be lost from every step, and with it some of the rate)
            step = min(max(RATE_STEP_SECONDS, refill), WAIT_STEP_SECONDS)
            until_step = max(0.0, self._last_rate_claim + step - time.monotonic())
            self._wait(min(until_step, self._until_next_due(settings.claim_interval_seconds)))
        else:
            self._rate_waiting = False
            self._last_rate_claim = -math.inf  # no rate-limited kind waits: one that comes due is claimed at once
            self._wait(self._until_next_due(settings.claim_interval_seconds))

    def _rate_refill(self) -> float | None:
        """Seconds per start of the fastest rate-limited kind with due jobs waiting (None: none waits).

        Read on the turns that claim the rate-limited kinds (``store.rate_limited_due``). The turns in
        between, other kinds' due times within a step, claimed no rate-limited job and keep the last
        reading while it says one waits: the step it sets ends at the next turn that claims them, which
        reads again (bench flow: a read of ten probes per kind, on most turns, for a value that only
        those turns change). A reading that none waits is not kept: it is read again on the next turn;
        nor is one older than the last such claim (a turn that returned before reading) or the lead.
        """
        if self._refill is None:  # a turn that claims them drops the last reading first (turn)
            self._refill = store.rate_limited_due(session=self.leadership.connection)
        return self._refill

    def _broker_unreachable(self, send_failed: bool) -> bool:
        """Count failed sends; after ``BROKER_FAILURES_TO_STEP_DOWN`` in a row, step down (True)."""
        if not send_failed:
            self._broker_failures = 0
            return False
        self._broker_failures += 1
        if self._broker_failures < BROKER_FAILURES_TO_STEP_DOWN:
            self.stopping.wait(ERROR_PAUSE_SECONDS)
            return False
        self._broker_failures = 0
        self.counters.step_downs += 1
        self._hold_until = time.monotonic() + STEP_DOWN_HOLD_SECONDS
        self.leadership.resign()
        self._listening = False
        logger.error(
            "control loop stepped down: the broker cannot be reached from this process; another may lead",
            extra={
                "role": ROLE,
                "failed_turns": BROKER_FAILURES_TO_STEP_DOWN,
                "hold_seconds": STEP_DOWN_HOLD_SECONDS,
                "action": "stepped_down",
            },
        )
        return True

    def _until_next_due(self, interval: float) -> float:
        """Seconds to the next due row within ``interval`` (re-read at least that often), capped by a step."""
        now = time.monotonic()
        horizon = min(interval, WAIT_STEP_SECONDS, max(0.0, self._next_sweep - now), max(0.0, self._next_prune - now))
        upcoming = store.next_due_times(horizon, 1, session=self.leadership.connection)
        return horizon if not upcoming else min(horizon, max(0.0, upcoming[0].in_seconds))

    def _listen(self) -> None:
        if self._listening:
            return
        self.leadership.listen(claim.NOTIFY_CHANNEL)
        self._listening = True

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early on a NOTIFY or a stop."""
        if seconds <= 0 or self.stopping.is_set():
            return
        conn = self.leadership.connection
        if conn is None:
            self.stopping.wait(min(seconds, WAIT_STEP_SECONDS))
            return
        try:
            if conn.notifies:
                conn.notifies.clear()
                return
            ready, _, _ = select.select([conn], [], [], min(seconds, WAIT_STEP_SECONDS))
            if ready:
                conn.poll()
                conn.notifies.clear()
        except (OSError, psycopg2.Error):
            logger.warning("control loop lost the lead: its lock session died; standing by", exc_info=True)
            self.leadership.resign()
            self._listening = False


_loop: ControlLoop | None = None
_loop_lock = threading.Lock()


def start() -> ControlLoop | None:
    """Start this process's control loop (once); None when ``SCHEDULING_CONTROL_IN_WORKERS`` is off."""
    global _loop
    if not conf.get().control_in_workers:
        logger.info("control loop off in this worker (SCHEDULING_CONTROL_IN_WORKERS)", extra={"action": "off"})
        return None
    with _loop_lock:
        if _loop is None:
            _loop = ControlLoop()
        _loop.start()
        return _loop


def stop() -> None:
    """Stop this process's control loop, if it runs (within ``STOP_JOIN_SECONDS``)."""
    with _loop_lock:
        if _loop is not None:
            _loop.stop()


def current() -> ControlLoop | None:
    """This process's control loop, if started."""
    return _loop
