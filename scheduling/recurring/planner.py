"""The planner duty: create each recurrence's next occurrence once its latest has left pending.

It runs on the cluster's one leader: the control loop calls ``duty()`` every turn, which wakes the
planner's own thread (``Duty``: the claim never waits for a pass); it plans at most every
``SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS`` unless the last pass was full. One pass, in one
transaction:

1. one statement picks up to ``SCHEDULING_RECURRENCE_PLAN_BATCH_SIZE`` active recurrences with
   no live occurrence (the latest has finished: a claimed one may still come back as a retry, and
   a recurrence has one live occurrence at a time, retries included; ``FOR UPDATE SKIP LOCKED``: an
   API call or a second planner holding a row leaves it to the next pass);
2. access is re-checked: a recurrence whose owner is deactivated, or (made through the JSON API)
   may no longer schedule its kind, is paused with that reason instead of planned (one query for
   the batch's owners; a permission look-up only for kinds whose ``Access`` names one). Only the
   kinds this process knows are picked: a recurrence of a kind it does not know (a leader of the
   old release in a rolling deploy) is left as it is, active, for a leader that knows the kind,
   never paused (docs/operations.md, "Rolling deploys");
3. Python computes each next instant with the recurrence's rule and missed policy, cached per
   (rule, zone, dst_gap, latest instant): a spike of 100,000 occurrences of one zone's 09:00 needs
   one computation;
4. one statement inserts the occurrences and advances the recurrences, only while each still says
   the latest instant that was read, and the unique (recurrence, occurrence_at) index refuses an
   instant that exists: each occurrence is created at most once, even with two racing planners.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any

import psycopg2
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction

from scheduling.core import conf, exceptions, locks, registry, tracing
from scheduling.core import store as core_store
from scheduling.due_at import claim
from scheduling.recurring import rules, store

logger = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = 4  # a pass's statement waits this long for a lock (as control.LOCK_WAIT_SECONDS)
ERROR_PAUSE_SECONDS = 1.0  # after a failed pass, the next waits at least this long
IDLE_SECONDS = 10.0  # the planner's thread closes its connection when no pass was asked for this long
STUCK_PASS_SECONDS = 120.0  # a pass running this long is left to end on its own; a new thread plans


@dataclasses.dataclass(frozen=True)
class PlanReport:
    picked: int  # recurrences whose latest occurrence had left pending
    created: int  # next occurrences created
    ended: int  # recurrences past their end
    computed: int  # distinct next-instant computations (the cache's misses)
    full: bool  # the pick was full: more may be waiting


def occurrence_options(kind: registry.Kind, max_attempts: int | None, priority: int | None) -> store.OccurrenceOptions:
    """An occurrence's job options: the kind's lease, the recurrence's attempts and priority, else the kind's."""
    return store.OccurrenceOptions(
        lease_seconds=kind.lease_seconds,
        max_attempts=max_attempts or kind.max_attempts,
        priority=kind.priority if priority is None else priority,
    )


def kinds_of(rows: list[store.RecurrenceRow]) -> dict[str, registry.Kind | None]:
    """The registered kind of each name among ``rows`` (None: no longer registered)."""
    kinds: dict[str, registry.Kind | None] = {}
    for row in rows:
        if row.kind not in kinds:
            try:
                kinds[row.kind] = registry.get(row.kind)
            except exceptions.UnknownJobKind:
                kinds[row.kind] = None
    return kinds


def refusals(rows: list[store.RecurrenceRow], kinds: dict[str, registry.Kind | None]) -> dict[int, str]:
    """{recurrence id: why it may not plan}: its kind is gone, its owner is deactivated or lost the kind's access.

    The planner pauses these with the reason, and so does a resume (which would plan at once).
    """
    problems = {row.id: f"its kind {row.kind} is not registered" for row in rows if kinds.get(row.kind) is None}
    owner_ids = {row.owner_id for row in rows if row.owner_id is not None}
    if not owner_ids:
        return problems
    owners = {user.pk: user for user in get_user_model()._default_manager.filter(pk__in=owner_ids)}
    verdicts: dict[tuple[int, str], bool] = {}
    for row in rows:
        owner = owners.get(row.owner_id) if row.owner_id is not None else None
        kind = kinds.get(row.kind)
        if owner is None or kind is None:
            continue  # no owner (system work; a deleted owner takes the row with them), or already broken
        if not owner.is_active:
            problems[row.id] = "its owner is deactivated"
        elif row.recheck_access:
            verdict = verdicts.get((owner.pk, row.kind))
            if verdict is None:
                verdict = verdicts[(owner.pk, row.kind)] = kind.usable_by(owner)
            if not verdict:
                problems[row.id] = f"its owner may no longer schedule {row.kind}"
    return problems


def _next(row: store.RecurrenceRow, now: dt.datetime, late: float, cache: dict[tuple[Any, ...], Any]) -> Any:
    key = (
        row.expression,
        row.every_seconds,
        row.timezone,
        row.dst_gap,
        row.anchor_at if row.every_seconds is not None else None,
        row.current_at,
        row.missed,
        row.ends_at,
    )
    if key not in cache:
        schedule = rules.schedule_for(row.expression, row.every_seconds, row.timezone, row.dst_gap, row.anchor_at)
        assert row.current_at is not None
        cache[key] = rules.following(
            schedule, row.current_at, now=now, missed=row.missed, late_seconds=late, ends_at=row.ends_at
        )
    return cache[key]


def plan_once(limit: int | None = None) -> PlanReport:
    """One planner pass (see the module docstring); safe to run from two processes at once."""
    settings = conf.get()
    batch = limit or settings.recurrence_plan_batch_size
    with tracing.span("timekeeper.plan_recurrences") as span, transaction.atomic():
        rows = store.pick_recurrences_to_plan(batch, sorted(registry.all_kinds()))
        if not rows:
            span.set("picked", 0)
            return PlanReport(0, 0, 0, 0, False)
        now = core_store.database_now()
        cache: dict[tuple[Any, ...], Any] = {}
        plans: list[store.PlannedOccurrence] = []
        ends: list[tuple[int, dt.datetime | None]] = []
        # Paused with a reason instead of planned, so they do not clog the pick: a rule that cannot
        # be computed, an owner without access. (A kind unregistered since the pick: left as it is.)
        broken: list[tuple[int, str]] = []
        kinds = kinds_of(rows)
        refused = refusals(rows, kinds)
        for row in rows:
            kind = kinds[row.kind]
            if kind is None:
                continue
            if row.id in refused:
                broken.append((row.id, refused[row.id]))
                continue
            try:
                occurrence = _next(row, now, settings.recurrence_late_seconds, cache)
            except (exceptions.SchedulingError, ArithmeticError, ValueError, StopIteration):
                logger.warning("recurrence rule cannot be computed", extra={"recurrence_id": row.id}, exc_info=True)
                broken.append((row.id, "its rule cannot be computed"))
                continue
            if occurrence is None:
                ends.append((row.id, row.current_at))
                continue
            options = occurrence_options(kind, row.max_attempts, row.priority)
            plans.append(
                store.PlannedOccurrence(
                    recurrence_id=row.id,
                    prev=row.current_at,
                    occurrence_at=occurrence.at,
                    due_at=occurrence.due_at,
                    **dataclasses.asdict(options),
                )
            )
        created = store.plan_occurrences(plans)
        ended = store.end_recurrences(ends)
        if broken:
            paused = store.pause_recurrences_for(broken)
            store.cancel_pending_occurrences(paused)
            for rid, reason in broken:
                logger.warning("recurrence paused: %s", reason, extra={"recurrence_id": rid, "action": "paused"})
        if created and min(c.in_seconds for c in created) <= settings.claim_interval_seconds:
            core_store.notify_due(claim.NOTIFY_CHANNEL)
        report = PlanReport(len(rows), len(created), len(ended), len(cache), len(rows) >= batch)
        for name, value in dataclasses.asdict(report).items():
            span.set(name, value)
        logger.debug("recurrences planned", extra={"action": "planned", **dataclasses.asdict(report)})
        return report


@dataclasses.dataclass
class Counters:
    passes: int = 0
    created: int = 0
    ended: int = 0
    failed: int = 0  # passes that raised (logged; the next is tried after ERROR_PAUSE_SECONDS)
    abandoned: int = 0  # passes still running after STUCK_PASS_SECONDS (a new thread took over)


class Duty:
    """The planner as a control-loop duty, beside the claim: a turn wakes the planner's thread and goes on.

    The leader's turn calls it (``control.EXTRA_DUTIES``) and does not wait for the pass. A pass may
    take a few hundred milliseconds (bench recurring's spike of 100,000 occurrences: a pass a second
    of about 2,300 recurrences, 250-290 ms: the pick's walk over the recurrences whose occurrence
    still runs, then an insert per occurrence); on the turn's thread it held the claim that long
    while the workers emptied the queue's few batches in less. So a pass runs on the duty's own
    thread and Django connection, bounded as the loop's session is (``locks.bound_django_session``:
    a lock wait ends after ``LOCK_WAIT_SECONDS``). A pass begins only when a turn asks (this process
    leads); one still running when the lead moves on ends normally (two planners at once create each
    occurrence once: ``plan_once``). After a full pick the next turn starts the next pass; otherwise
    passes are ``SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS`` apart. A failed pass (PostgreSQL
    unreachable, a bug) is logged and counted, its connection closed, and the next waits at least
    ``ERROR_PAUSE_SECONDS``. A pass still running after ``STUCK_PASS_SECONDS`` (a connection that
    hangs without an error) is left to end on its own: the next turn starts a new thread, which
    plans beside it.
    """

    def __init__(self) -> None:
        self.counters = Counters()
        self._lock = threading.Lock()  # guards the fields below and the counters, shared by the threads
        self._next_at = 0.0  # monotonic: no pass begins before this
        self._began: float | None = None  # when the running pass began (monotonic); None: none runs
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False  # stop() was called: turns wake nothing until start()

    def __call__(self) -> None:
        """The leader's turn: wake the planner's thread if a pass is due and none runs (never waits for it)."""
        now = time.monotonic()
        with self._lock:
            if self._stopped:
                return
            if self._began is not None:
                if now - self._began < STUCK_PASS_SECONDS:
                    return
                logger.error(
                    "recurrence planner pass stuck; a new planner thread takes over",
                    extra={"seconds": round(now - self._began), "action": "plan_stuck"},
                )
                self.counters.abandoned += 1
                self._drop_thread()
            if now < self._next_at:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, args=(self._wake,), name="timekeeper-planner", daemon=True
                )
                self._thread.start()
            self._wake.set()

    def running(self) -> bool:
        """Whether a pass is running now."""
        return self._began is not None

    def start(self) -> None:
        """Let the turns wake the planner again (after ``stop``; a new duty starts so)."""
        with self._lock:
            self._stopped = False

    def stop(self, timeout: float = 2.0) -> None:
        """End the planner's thread (a pass in flight first ends, waited for ``timeout`` seconds at most).

        Turns called after this wake nothing until ``start()``: a control loop still finishing its
        turn while its worker stops starts no new thread.
        """
        with self._lock:
            self._stopped = True
            thread = self._thread
            self._drop_thread()
        if thread is not None:
            thread.join(timeout)

    def _drop_thread(self) -> None:
        """Under the lock: the current thread ends after its pass; a new one starts on the next call."""
        self._wake.set()
        self._thread = None
        self._wake = threading.Event()
        self._began = None

    def _run(self, wake: threading.Event) -> None:
        me = threading.current_thread()
        try:
            while self._thread is me:
                if not wake.wait(IDLE_SECONDS):
                    _close()  # no pass asked for (this process no longer leads): not kept open
                    continue
                wake.clear()
                with self._lock:
                    if self._thread is not me:
                        return
                    if time.monotonic() < self._next_at:
                        continue  # woken twice for one pass
                    began = self._began = time.monotonic()
                report = self._pass()
                with self._lock:
                    self._count(report)
                    if self._thread is me:  # an abandoned pass's end does not pace the thread that took over
                        self._began = None
                        self._next_at = self._after(report, began)
        except Exception:
            logger.exception("recurrence planner thread failed", extra={"action": "plan_failed"})
        finally:
            _close()

    def _pass(self) -> PlanReport | None:
        """One pass on this thread's connection; None if it failed (logged, the connection closed)."""
        try:
            if connection.connection is not None and not connection.is_usable():
                connection.close()  # the server ended it while idle (a restart): a fresh one
            locks.bound_django_session(round(LOCK_WAIT_SECONDS * 1000))
            return plan_once()
        except Exception as exc:
            # A planner bug must not stop the claiming and sweeping of the loop that wakes it.
            if isinstance(exc, (DatabaseError, psycopg2.Error)):
                logger.warning(
                    "recurrence planner pass failed; trying again", exc_info=True, extra={"action": "plan_failed"}
                )
            else:
                logger.exception("recurrence planner pass failed", extra={"action": "plan_failed"})
            _close()  # this thread's: the next pass opens a fresh one
            return None

    @staticmethod
    def _after(report: PlanReport | None, began: float) -> float:
        """When the next pass may begin: at once after a full pick, an interval on, or a pause after a failure."""
        if report is None:
            return time.monotonic() + ERROR_PAUSE_SECONDS
        if report.full:
            return began
        return began + conf.get().recurrence_plan_interval_seconds

    def _count(self, report: PlanReport | None) -> None:
        """Under the lock: a pass's figures."""
        if report is None:
            self.counters.failed += 1
            return
        self.counters.created += report.created
        self.counters.ended += report.ended
        self.counters.passes += 1


def _close() -> None:
    """Close this thread's Django connection; a failure to close is no reason to stop planning."""
    with contextlib.suppress(Exception):
        connection.close()


duty = Duty()
