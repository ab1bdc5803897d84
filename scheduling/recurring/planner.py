"""The planner duty: create each recurrence's next occurrence once its latest has left pending.

It runs on the cluster's one leader (the control loop's duties thread calls ``duty()``, beside
the claims, which never wait for a pass). It plans every ``SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS``,
at once after a full pass, and less often while its picks are slow (``pace_seconds``). One pass,
in one transaction:

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

import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import DatabaseError, transaction

from scheduling.core import conf, exceptions, registry, tracing
from scheduling.core import store as core_store
from scheduling.due_at import claim
from scheduling.recurring import rules, store

logger = logging.getLogger(__name__)

PICK_SHARE = 0.02  # a pick that leaves its batch short costs at most this share of the planner's time
PACE_MAX_SECONDS = 5.0  # the longest wait between passes that a slow pick adds


@dataclasses.dataclass(frozen=True)
class PlanReport:
    picked: int  # recurrences whose latest occurrence had left pending
    created: int  # next occurrences created
    ended: int  # recurrences past their end
    computed: int  # distinct next-instant computations (the cache's misses)
    full: bool  # the pick was full: more may be waiting
    pick_seconds: float = 0.0  # how long the pick took (it probes every due recurrence until its batch is full)


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
        row.starts_at,
    )
    if key not in cache:
        schedule = rules.schedule_for(row.expression, row.every_seconds, row.timezone, row.dst_gap, row.anchor_at)
        assert row.current_at is not None
        cache[key] = rules.following(
            schedule,
            row.current_at,
            now=now,
            missed=row.missed,
            late_seconds=late,
            ends_at=row.ends_at,
            starts_at=row.starts_at,
        )
    return cache[key]


def plan_once(limit: int | None = None) -> PlanReport:
    """One planner pass (see the module docstring); safe to run from two processes at once."""
    settings = conf.get()
    batch = limit or settings.recurrence_plan_batch_size
    with tracing.span("timekeeper.plan_recurrences") as span, transaction.atomic():
        started = time.monotonic()
        rows = store.pick_recurrences_to_plan(batch, sorted(registry.all_kinds()))
        pick_seconds = time.monotonic() - started
        if not rows:
            span.set("picked", 0)
            return PlanReport(0, 0, 0, 0, False, pick_seconds)
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
            plans.append(store.PlannedOccurrence.of(row.id, row.current_at, occurrence.at, occurrence.due_at, options))
        created = store.plan_occurrences(plans)
        ended = store.end_recurrences(ends)
        if broken:
            paused = store.pause_recurrences_for(broken)
            store.cancel_pending_occurrences(paused, "cancelled: the planner paused its recurrence (see its reason)")
            for rid, reason in broken:
                logger.warning("recurrence paused: %s", reason, extra={"recurrence_id": rid, "action": "paused"})
        if created and min(c.in_seconds for c in created) <= settings.claim_interval_seconds:
            core_store.notify_due(claim.NOTIFY_CHANNEL)
        report = PlanReport(len(rows), len(created), len(ended), len(cache), len(rows) >= batch, pick_seconds)
        for name, value in dataclasses.asdict(report).items():
            span.set(name, value)
        logger.debug("recurrences planned", extra={"action": "planned", **dataclasses.asdict(report)})
        return report


def pace_seconds(pick_seconds: float) -> float:
    """How long the planner waits after a pass that was not full: its interval, longer while picks are slow.

    A pick that does not fill its batch probes every due recurrence whose occurrence still runs
    (``NOT EXISTS`` on the one-live-occurrence index): in a spike of 100,000 recurrences due at
    once, ~50 ms a pick whatever it finds. The next pass waits until that cost is at most
    ``PICK_SHARE`` of the time (and at least the interval), so a spike pays a few such picks, not
    one a second; never longer than ``PACE_MAX_SECONDS`` nor a quarter of
    ``SCHEDULING_RECURRENCE_LATE_SECONDS`` (an occurrence planned later than that counts as missed).
    """
    settings = conf.get()
    slow = min(pick_seconds / PICK_SHARE, PACE_MAX_SECONDS, settings.recurrence_late_seconds / 4)
    return max(settings.recurrence_plan_interval_seconds, slow)


@dataclasses.dataclass
class Counters:
    passes: int = 0
    created: int = 0
    ended: int = 0


class Duty:
    """The planner as a control-loop duty: ``__call__`` plans when its interval has passed (or more waits)."""

    def __init__(self) -> None:
        self.counters = Counters()
        self._next_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next_at or not self._lock.acquire(blocking=False):
            return
        try:
            report = plan_once()
        except DatabaseError:
            raise  # the duties thread resets its connection and tries again
        except Exception:
            # A planner bug must not stop the other duties (claims and sweeps run on the loop's own thread).
            logger.exception("recurrence planner pass failed", extra={"action": "plan_failed"})
            self._next_at = now + conf.get().recurrence_plan_interval_seconds
            return
        finally:
            self._lock.release()
        self.counters.passes += 1
        self.counters.created += report.created
        self.counters.ended += report.ended
        self._next_at = now if report.full else now + pace_seconds(report.pick_seconds)


duty = Duty()
