"""Claiming due rows and handing them to workers.

A claim takes up to ``SCHEDULING_CLAIM_BATCH_SIZE`` due rows in one statement (``store``), groups
them by kind and fans them out as ``scheduling.run_batch`` messages of the kind's batch size: a
message per batch instead of per job is what lets a table outrun a message-per-job queue, and a
small batch size (1 for slow kinds) keeps a long job from holding up short ones.

Beat fires ``tick()`` every second. A tick is a short loop, not a single claim: it claims what is
due, then sleeps until the next due time (read from the database), claims again at that instant,
and so on until the tick's window ends, just before the next tick. A row committed with a due
time inside the window sends a NOTIFY that cuts the sleep short. So a job waits milliseconds past
its due time, not up to a tick, without a broker message per due instant. The row stays the
truth: a missed notification only means the loop wakes at its next known due time or the next
tick. The loop occupies one worker process while it runs (ticks overlap only briefly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import time
from collections import defaultdict
from collections.abc import Sequence

import psycopg2

from scheduling.core import broker, conf, exceptions, locks, registry, store, tasknames
from scheduling.jobs import runner

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "timekeeper_due"
LOOP_WINDOW_FRACTION = 0.95  # without LISTEN, a tick's polling loop ends this far into the interval
LOOP_LOCK_KEY = locks.lock_key("claim", "loop")
BACKPRESSURE_PAUSE_SECONDS = 0.05  # pause while the queue is full
FALLBACK_POLL_SECONDS = 0.05  # sleep step when no LISTEN connection is available
INLINE_MAX_TIMEOUT_SECONDS = 10  # only kinds with a timeout this short may run inside the claim loop
INLINE_CLAIM_ROWS = 100  # rows the loop claims for itself to run while the queue is full
LEAD_SILENCE_SECONDS = 10  # PostgreSQL ends the leading loop's lock session once it is silent this long
TOUCH_EVERY_SECONDS = 1.0  # the leading loop shows its lock session it is alive this often


@dataclasses.dataclass(frozen=True)
class ClaimReport:
    claimed: int
    batches: int
    ran_inline: int
    more_due: bool


def batches_for(claims: Sequence[store.Claim]) -> list[list[tuple[int, str]]]:
    """Group claims by kind and cut each group into the kind's batch size."""
    by_kind: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for c in claims:
        by_kind[c.kind].append((c.id, c.token))
    out: list[list[tuple[int, str]]] = []
    for kind_name, items in by_kind.items():
        try:
            size = registry.get(kind_name).batch_size
        except exceptions.UnknownJobKind:
            size = 1  # the run records the failure per job
        out.extend(items[i : i + size] for i in range(0, len(items), size))
    return out


def _short(kind_name: str) -> bool:
    """A kind whose timeout is short enough to run inside the claim loop."""
    try:
        return registry.get(kind_name).timeout_seconds <= INLINE_MAX_TIMEOUT_SECONDS
    except exceptions.UnknownJobKind:
        return False


def claim_and_dispatch(*, run_first_inline: bool, limit: int | None = None, backpressure: bool = True) -> ClaimReport:
    """Claim due rows and send them to workers; optionally run the first batch here.

    ``backpressure=False`` claims even while the queue is full: for a claim the caller runs itself.
    """
    size = int(limit or conf.get().claim_batch_size)
    queued = broker.queued_messages() if backpressure else 0
    if queued >= conf.get().max_queued_batches:
        # Back-pressure: workers have enough waiting. Claiming more would only age claims in the
        # broker (their heartbeat starts when they run) until the sweeper takes them back.
        logger.debug("claim deferred: the queue is full", extra={"queued": queued, "action": "claim_deferred"})
        return ClaimReport(0, 0, 0, True)
    claims = store.claim_due_jobs(size)
    batches = batches_for(claims)
    kind_of = {c.id: c.kind for c in claims}
    inline: list[tuple[int, str]] = []
    if run_first_inline:
        for i, batch in enumerate(batches):
            if _short(kind_of[batch[0][0]]):
                inline = batches.pop(i)
                break
    for batch in batches:
        broker.send(
            tasknames.RUN_BATCH,
            args=[batch],
            time_limit=runner.hard_time_limit(batch, claims),
            shadow=tasknames.batch(kind_of[batch[0][0]]),  # Flower shows the kind (a batch holds one)
        )
    more_due = len(claims) >= size
    if claims:
        logger.debug("claimed due jobs", extra={"claimed": len(claims), "batches": len(batches) + bool(inline)})
    if inline:
        runner.run_batch(inline)
    return ClaimReport(len(claims), len(batches) + (1 if inline else 0), len(inline), more_due)


def tick() -> ClaimReport:
    """Beat's claim: run the claim loop unless another process in the cluster already runs it.

    The loop claims what is due, then sleeps until the next due time it knows of (read from the
    database) or until a NOTIFY says a row due sooner was committed, and claims again at that
    instant. While a full claim says more rows are due, it claims again at once (subject to
    back-pressure). One loop runs at a time, cluster-wide: it holds an advisory lock on its
    LISTEN connection; beat's ticks that find the lock taken return at once. After
    ``SCHEDULING_CLAIM_LOOP_SECONDS`` the loop hands over (sends the next claim, releases the
    lock) so its worker process is recycled; if it dies, the lock dies with its connection and the
    next beat tick, within a second, starts a new loop.
    """
    listener = _listener()
    if listener is None:
        # No LISTEN connection (PostgreSQL trouble): one short polling loop per tick.
        return _loop(None, conf.get().claim_interval_seconds * LOOP_WINDOW_FRACTION)
    if not listener.try_lead():
        return ClaimReport(0, 0, 0, False)
    try:
        report = _loop(listener, conf.get().claim_loop_seconds)
    finally:
        listener.release_lead()
    _hand_over()
    return report


def _hand_over() -> None:
    try:
        broker.send(tasknames.CLAIM, expires=5)
    except Exception:  # the broker may be down: beat's next tick starts a loop anyway
        logger.warning("could not hand the claim loop over; beat's next tick will start one", exc_info=True)


def _loop(listener: Listener | None, seconds: float) -> ClaimReport:
    deadline = time.monotonic() + seconds
    claimed = batches = inline = 0
    more_due = False
    while True:
        if listener is not None and not listener.touch():
            break  # the lock went with its session (we were silent too long): another loop leads now
        # The loop runs one batch of a short kind itself (the rest go to workers): for a job due
        # now the hop through the broker and a second process costs more than the job. If the loop
        # falls behind, its next claim simply takes everything due by then.
        report = claim_and_dispatch(run_first_inline=True)
        claimed += report.claimed
        batches += report.batches
        inline += report.ran_inline
        more_due = report.more_due
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if more_due and report.claimed:
            continue  # a backlog: claim the next rows now
        if more_due:
            # The queue is full: rather than idle (it holds one of the workers' processes), the loop
            # claims a batch for itself and runs it; it waits only if there was nothing short to run.
            own = claim_and_dispatch(run_first_inline=True, limit=INLINE_CLAIM_ROWS, backpressure=False)
            claimed += own.claimed
            batches += own.batches
            inline += own.ran_inline
            if not own.ran_inline:
                _wait(listener, min(remaining, BACKPRESSURE_PAUSE_SECONDS))
            continue
        # Sleep to the next due time, but re-read it at least every claim interval: wake_on_commit
        # only NOTIFYs rows due within one interval, so a row committed due further out than that
        # (while the loop sleeps with nothing upcoming) is found by the next re-read, before it is due.
        horizon = min(remaining, conf.get().claim_interval_seconds)
        upcoming = store.next_due_times(horizon, 1)
        timeout = horizon if not upcoming else min(horizon, max(0.0, upcoming[0][1]))
        _wait(listener, timeout)
    return ClaimReport(claimed, batches, inline, more_due)


def _wait(listener: Listener | None, seconds: float) -> None:
    if seconds <= 0:
        return
    if listener is None or not listener.wait(seconds):
        # Without a listener (or if it broke) sleep in short steps, so a new near row waits little.
        time.sleep(min(seconds, FALLBACK_POLL_SECONDS))


class Listener:
    """LISTEN on a dedicated connection: ``wait`` returns early when a near-due row is committed."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.conn = locks.dedicated_connection("timekeeper-claim-listener")
        self.touched = time.monotonic()
        with self.conn.cursor() as cur:
            cur.execute(f"LISTEN {NOTIFY_CHANNEL}")

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` or until a notification; False if the connection broke."""
        try:
            if self.conn.notifies:  # arrived while ``touch`` ran a statement
                self.conn.notifies.clear()
                return True
            ready, _, _ = select.select([self.conn], [], [], seconds)
            if ready:
                self.conn.poll()
                self.conn.notifies.clear()
            return True
        except (OSError, psycopg2.Error):
            logger.warning("claim listener connection lost; polling until it is back", exc_info=True)
            self.close()
            return False

    def try_lead(self) -> bool:
        """Take the cluster-wide claim-loop lock on this connection; False if another process has it."""
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", [LOOP_LOCK_KEY])
                if not cur.fetchone()[0]:
                    return False
                # A leader that stops without dying (SIGSTOP, a frozen VM) would hold the lock, and with
                # it every claim, until it resumed: PostgreSQL ends this session once it has been idle
                # that long, which releases the lock to the next tick. (PostgreSQL 14+; older: no bound.)
                with contextlib.suppress(psycopg2.errors.UndefinedObject):
                    cur.execute("SELECT set_config('idle_session_timeout', %s, false)", [f"{LEAD_SILENCE_SECONDS}s"])
                self.touched = time.monotonic()
                return True
        except psycopg2.Error:
            logger.warning("claim listener connection lost", exc_info=True)
            self.close()
            return False

    def release_lead(self) -> None:
        with contextlib.suppress(psycopg2.Error), self.conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", [LOOP_LOCK_KEY])
            cur.execute("SELECT set_config('idle_session_timeout', '0', false)")

    def touch(self) -> bool:
        """Reset the lock session's idle clock (at most once a second); False if the session is gone."""
        if time.monotonic() - self.touched < TOUCH_EVERY_SECONDS:
            return True
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT 1")
        except psycopg2.Error:
            logger.warning("claim loop lost its lock session; another loop takes over", exc_info=True)
            self.close()
            return False
        self.touched = time.monotonic()
        return True

    def close(self) -> None:
        with contextlib.suppress(psycopg2.Error):
            self.conn.close()


_listener_instance: Listener | None = None


def _listener() -> Listener | None:
    """This process's listener (a connection does not survive a fork; one is made per process)."""
    global _listener_instance
    current = _listener_instance
    if current is not None and current.pid == os.getpid() and not current.conn.closed:
        return current
    try:
        _listener_instance = Listener()
    except psycopg2.Error:
        logger.warning("cannot LISTEN for near-due rows; the claim loop polls instead", exc_info=True)
        _listener_instance = None
    return _listener_instance


def wake_on_commit(in_seconds: float, asked_at: float) -> None:
    """Tell the claim loop, when the caller's transaction commits, that a row is due within the tick.

    NOTIFY is transactional: sent only if the transaction commits, so a rolled-back job wakes no one.
    Rows due later need no signal: the loop reads the next due time each time it goes to sleep.
    """
    if in_seconds > conf.get().claim_interval_seconds:
        return
    store.notify_due(NOTIFY_CHANNEL)
