"""Recurrences: create, change, pause, resume and cancel recurring per-entity work.

``recur()`` writes the recurrence and its first occurrence (a pending due_at job of its kind) in
the caller's transaction. Every later write of a recurrence's occurrences (here and in the
planner) first locks the recurrence's row, so they happen one after the other; the unique
(recurrence, occurrence_at) index makes each occurrence at most once whatever races, and the
one-live-occurrence index keeps one occurrence waiting or running at a time, its retries
included. A change of rule, payload or kind moves the pending occurrence (with the kind's
options); pause and cancel cancel it, retry or not (a running one finishes its attempt and is not
retried); resume plans the next one with the missed policy, or waits for one still running.

An outside caller (the JSON API passes ``caller=``, the user) meets the jobs API's bounds at
create and at every change: the kind's caller limits on attempts and priority, a minimum interval
(``SCHEDULING_API_MIN_RECURRENCE_INTERVAL_SECONDS``), and at create a quota of recurrences
(``SCHEDULING_API_MAX_RECURRENCES``) and the pending-jobs quota counting the first occurrence;
superusers are exempt from the interval and the quotas, as for jobs. Code passes no caller.

The bulk changes (``pause_recurrences``, ``resume_recurrences``, ``cancel_recurrences``) are one
statement each over a selection of ids and return a ``BulkResult``. Application code imports all
of them through ``scheduling.api``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from scheduling.core import audit, conf, exceptions, locks, registry, tracing, validation
from scheduling.core import options as options_
from scheduling.core import store as core_store
from scheduling.due_at import claim
from scheduling.models import Recurrence, RecurrenceState
from scheduling.recurring import planner, rules, store

logger = logging.getLogger(__name__)

ON_CONFLICT_CHOICES = ("replace", "keep", "error")
DST_GAP_CHOICES = ("shift", "skip")
MAX_PREVIEW = 100  # next_occurrences(n): the most instants one call computes


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # "leave as it is" for change_recurrence()'s arguments


@dataclasses.dataclass(frozen=True)
class BulkResult:
    """What a bulk change did to a selection of recurrence ids."""

    changed: tuple[int, ...]
    untouched: Mapping[int, str]  # the others, with the state that kept them out
    missing: tuple[int, ...] = ()
    refused: Mapping[int, str] = dataclasses.field(default_factory=dict)  # resume: kept paused, and why


@dataclasses.dataclass(frozen=True)
class NewEntry:
    """One recurrence of ``recur_many()``: its key, payload, owner and zone (the rule is shared)."""

    key: str
    payload: Any
    owner: Any = None
    timezone: str = "UTC"


@dataclasses.dataclass(frozen=True)
class Rule:
    """When a recurrence runs, as a door was asked; in a change, ``UNSET`` leaves a part as it is."""

    cron: Any = None  # str | None
    every: Any = None  # seconds (float, int, timedelta) | None
    timezone: Any = "UTC"
    starts_at: Any = None  # aware datetime | None
    ends_at: Any = None
    dst_gap: Any = "shift"
    missed: Any = "skip"


def _owner_id(owner: Any) -> int | None:
    return getattr(owner, "pk", owner)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise exceptions.InvalidPolicy(f"{name} must be one of {', '.join(choices)}, not {value!r}.")


def _plan(
    row: store.RecurrenceRow, occurrence: rules.Occurrence, prev: dt.datetime | None
) -> store.CreatedOccurrence | None:
    """Create the occurrence (None: the indexes refused it, an instant taken or a live one; the planner goes on)."""
    options = planner.occurrence_options(registry.get(row.kind), row.max_attempts, row.priority)
    planned = store.PlannedOccurrence.of(row.id, prev, occurrence.at, occurrence.due_at, options)
    created = store.plan_occurrences([planned])
    if not created:
        logger.warning("occurrence not created", extra={"recurrence_id": row.id, "action": "plan_refused"})
        return None
    claim.wake_on_commit(created[0].in_seconds)
    return created[0]


def _check_caller(
    caller: Any,
    kind: registry.Kind,
    options: options_.StandingOptions,
    *,
    schedule: rules.Schedule | None,
    rule_field: str,
) -> None:
    """An outside caller's bounds: the kind's caller limits, and the minimum interval for a rule they give."""
    if caller is None:
        return
    validation.check_caller_limits(kind, caller, max_attempts=options.max_attempts, priority=options.priority)
    if schedule is not None:
        validation.check_recurrence_interval(caller, rules.shortest_gap_seconds(schedule), field=rule_field)


def _exempt(caller: Any) -> bool:
    return caller is None or bool(getattr(caller, "is_superuser", False))


def _lock_owner_creations(caller: Any) -> None:
    """Serialise an outside caller's creations (jobs, recurrences) until the transaction ends, when a quota applies."""
    settings = conf.get()
    if not _exempt(caller) and (settings.api_max_recurrences > 0 or settings.api_max_pending_jobs > 0):
        core_store.lock_owner_creations(locks.lock_key("api-creations", str(caller.pk)))


def _check_quotas(caller: Any, first_job_id: int | None) -> None:
    """Raise ``OverCreationLimit`` when the caller's new recurrence, or its first occurrence, is over a quota.

    Called after both are written, under ``_lock_owner_creations``: raising rolls them back.
    """
    if _exempt(caller):
        return
    quota = conf.get().api_max_recurrences
    if quota > 0 and store.owner_recurrences(caller.pk, quota) > quota:
        raise exceptions.OverCreationLimit(
            f"You hold {quota} recurrences, the most SCHEDULING_API_MAX_RECURRENCES allows: cancel one first.",
            code="recurrence_quota_exceeded",
            retry_after=validation.MAX_QUOTA_RETRY_AFTER_SECONDS,
            limit=quota,
        )
    if first_job_id is not None:
        validation.check_quota(caller, first_job_id)


def _check_within_window(occurrence: rules.Occurrence) -> None:
    """A first (or moved) occurrence a rule puts more than ten years ahead is refused, as a job's due_at is."""
    try:
        validation.check_due_at(occurrence.due_at)
    except exceptions.InvalidSchedule:
        raise exceptions.InvalidRecurrence(
            f"The rule's first occurrence, {occurrence.due_at.isoformat()}, is more than ten years ahead "
            "(the limit of a job's due time): start it later, or check the rule."
        ) from None


def _quota_owners(ids: Sequence[int], caller: Any) -> dict[int, Any]:
    """{owner id: user} of the recurrences ``ids``: whose pending-jobs quota their new occurrences count in.

    Read before their rows are locked (an owner never changes); the caller stands for themselves.
    """
    owner_ids = {o for o in Recurrence.objects.filter(pk__in=ids).values_list("owner_id", flat=True) if o is not None}
    users = {user.pk: user for user in get_user_model()._default_manager.filter(pk__in=owner_ids - {caller.pk})}
    return {**users, **({caller.pk: caller} if caller.pk in owner_ids else {})}


def _schedule(row: store.RecurrenceRow) -> rules.Schedule:
    return rules.schedule_for(row.expression, row.every_seconds, row.timezone, row.dst_gap, row.anchor_at)


def recur(
    kind: str,
    payload: Any,
    *,
    key: str,
    cron: str | None = None,
    every: float | int | dt.timedelta | None = None,
    timezone: str = "UTC",
    owner: Any = None,
    starts_at: dt.datetime | None = None,
    ends_at: dt.datetime | None = None,
    dst_gap: str = "shift",
    missed: str = "skip",
    on_conflict: str = "replace",
    priority: int | None = None,
    max_attempts: int | None = None,
    caller: Any = None,
) -> Recurrence:
    """Run ``kind`` with ``payload`` on ``cron`` (in ``timezone``) or ``every`` seconds, as the owner's ``key``.

    The recurrence and its first occurrence (the first instant at or after ``starts_at``, after
    now) are written in the caller's transaction. The key is unique per owner: a second
    ``recur()`` with it changes the existing recurrence (``replace``, its pending occurrence
    moves), returns it unchanged (``keep``) or raises ``RecurrenceKeyConflict`` (``error``).
    Bad input raises before anything is stored: ``InvalidCronExpression``, ``UnknownTimeZone``,
    ``InvalidSchedule`` (naive datetimes), ``InvalidRecurrence`` (no rule, both, ends before starts),
    ``InvalidPolicy`` (``dst_gap``/``missed``), ``InvalidPayload``, ``UnknownJobKind``. With an
    outside ``caller`` (see the module docstring) also ``OverCallerLimit``, ``RecurrenceTooFrequent``
    and ``OverCreationLimit``; the recurrence is marked for the planner's access re-check.
    """
    rule = Rule(
        cron=cron, every=every, timezone=timezone, starts_at=starts_at, ends_at=ends_at, dst_gap=dst_gap, missed=missed
    )
    options = options_.JobOptions(
        key=key, on_conflict=on_conflict, owner=owner, priority=priority, max_attempts=max_attempts
    )
    return recur_with_options(kind, payload, rule, options, caller=caller)


def recur_with_options(
    kind: str, payload: Any, rule: Rule, options: options_.JobOptions, *, caller: Any = None
) -> Recurrence:
    """``recur()`` with its rule and its job options each whole (``recur`` builds them from its keywords)."""
    key, on_conflict = options.key, options.on_conflict
    cron, every, timezone = rule.cron, rule.every, rule.timezone
    starts_at, ends_at, dst_gap, missed = rule.starts_at, rule.ends_at, rule.dst_gap, rule.missed
    with tracing.span("timekeeper.recur", kind=kind) as span:
        job_kind = registry.get(kind)
        validation.encode_payload(job_kind, payload)
        if key is None:
            raise exceptions.InvalidSchedule("A recurrence needs a key (unique per owner), e.g. digest:42.")
        validation.check_key(key)
        _check_choice("on_conflict", on_conflict, ON_CONFLICT_CHOICES)
        _check_choice("dst_gap", dst_gap, DST_GAP_CHOICES)
        expression, every_seconds = rules.check_rule(cron, every, starts_at, ends_at, missed)
        standing = options.standing(job_kind)
        now = core_store.database_now()
        anchor = starts_at or now
        schedule = rules.schedule_for(expression, every_seconds, timezone, dst_gap, anchor)
        _check_caller(
            caller,
            job_kind,
            standing,
            schedule=schedule,
            rule_field="every" if every_seconds is not None else "cron",
        )
        owner_id = standing.owner_id
        new = store.NewRecurrence(
            kind=kind,
            payload=payload,
            expression=expression,
            every_seconds=every_seconds,
            timezone=timezone,
            dst_gap=dst_gap,
            missed=missed,
            starts_at=starts_at,
            ends_at=ends_at,
            anchor_at=anchor,
            options=standing,
            recheck_access=caller is not None,
        )
        with transaction.atomic():
            _lock_owner_creations(caller)
            recurrence_id = store.insert_recurrence(new)
            if recurrence_id is None:
                existing = store.recurrence_id_by_key(key, owner_id)
                assert existing is not None
                span.set("recurrence_id", existing)
                if on_conflict == "error":
                    raise exceptions.RecurrenceKeyConflict(key, existing)
                if on_conflict == "keep":
                    span.set("outcome", "kept")
                    return Recurrence.objects.get(pk=existing)
                span.set("outcome", "replaced")
                return change_with_options(existing, kind, payload, rule, options, caller=caller)
            row = store.lock_recurrence(recurrence_id)
            assert row is not None
            occurrence = rules.first(schedule, now=now, starts_at=starts_at, ends_at=ends_at)
            first = None
            if occurrence is not None:
                _check_within_window(occurrence)
            if occurrence is None:
                store.set_recurrences_state([recurrence_id], RecurrenceState.ENDED, [RecurrenceState.ACTIVE])
            else:
                first = _plan(row, occurrence, None)
            _check_quotas(caller, first.job_id if first is not None else None)
        logger.info("recurrence created", extra={"recurrence_id": recurrence_id, "kind": kind, "action": "recur"})
        span.set("recurrence_id", recurrence_id)
        span.set("outcome", "created")
        return Recurrence.objects.get(pk=recurrence_id)


def recur_many(
    kind: str,
    entries: Sequence[NewEntry],
    *,
    cron: str | None = None,
    every: float | int | dt.timedelta | None = None,
    starts_at: dt.datetime | None = None,
    ends_at: dt.datetime | None = None,
    dst_gap: str = "shift",
    missed: str = "skip",
    priority: int | None = None,
    max_attempts: int | None = None,
) -> list[int]:
    """Create one recurrence per entry (its own key, payload, owner and zone), one rule for all; returns the new ids.

    For bulk loads ("a 09:00-local digest for every user"): the same checks as ``recur()``, every
    entry validated before anything is stored, the recurrences in one statement and their first
    occurrences in another (one computation per zone). Keys their owner already has are left as
    they are (``keep``) and their ids are not returned.
    """
    job_kind = registry.get(kind)
    _check_choice("dst_gap", dst_gap, DST_GAP_CHOICES)
    expression, every_seconds = rules.check_rule(cron, every, starts_at, ends_at, missed)
    payloads = [validation.encode_payload(job_kind, entry.payload) for entry in entries]
    for entry in entries:
        validation.check_key(entry.key)
    standing = options_.JobOptions(max_attempts=max_attempts, priority=priority).standing(job_kind)
    now = core_store.database_now()
    anchor = starts_at or now
    firsts: dict[str, rules.Occurrence | None] = {}
    for zone in {entry.timezone for entry in entries}:
        schedule = rules.schedule_for(expression, every_seconds, zone, dst_gap, anchor)
        first = firsts[zone] = rules.first(schedule, now=now, starts_at=starts_at, ends_at=ends_at)
        if first is not None:
            _check_within_window(first)  # before anything is stored
    if not entries:
        return []
    new = store.NewRecurrence(
        kind=kind,
        payload=None,
        expression=expression,
        every_seconds=every_seconds,
        timezone="UTC",
        dst_gap=dst_gap,
        missed=missed,
        starts_at=starts_at,
        ends_at=ends_at,
        anchor_at=anchor,
        options=standing,  # each entry's key and owner go with it
    )
    options = planner.occurrence_options(job_kind, standing.max_attempts, standing.priority)
    with transaction.atomic():
        created = store.insert_recurrences(
            new,
            payloads,
            [entry.key for entry in entries],
            [_owner_id(entry.owner) for entry in entries],
            [entry.timezone for entry in entries],
        )
        plans = []
        ended = []
        for row in created:
            occurrence = firsts[row.timezone]
            if occurrence is None:
                ended.append(row.id)
                continue
            plans.append(store.PlannedOccurrence.of(row.id, None, occurrence.at, occurrence.due_at, options))
        store.plan_occurrences(plans)
        if ended:
            store.set_recurrences_state(ended, RecurrenceState.ENDED, [RecurrenceState.ACTIVE])
    logger.info("recurrences created", extra={"kind": kind, "count": len(created), "action": "recur_many"})
    return [row.id for row in created]


def _find(recurrence_id: int | None, key: str | None, owner: Any) -> int:
    if (recurrence_id is None) == (key is None):
        raise exceptions.InvalidSchedule("Give exactly one of recurrence_id and key.")
    if recurrence_id is not None:
        found = validation.row_id(recurrence_id, "recurrence_id")
        if found is None:
            raise exceptions.RecurrenceNotFound(f"No recurrence {validation.shown_number(recurrence_id)}.")
        return found
    assert key is not None
    validation.check_key(key)
    found = store.recurrence_id_by_key(key, _owner_id(owner))
    if found is None:
        raise exceptions.RecurrenceNotFound(f"No recurrence has key {key!r}.")
    return found


def _locked(recurrence_id: int) -> store.RecurrenceRow:
    row = store.lock_recurrence(recurrence_id)
    if row is None:
        raise exceptions.RecurrenceNotFound(f"No recurrence {recurrence_id}.")
    return row


def get_recurrence(recurrence_id: int | None = None, *, key: str | None = None, owner: Any = None) -> Recurrence:
    """The recurrence by id, or by the owner's key; ``RecurrenceNotFound`` otherwise."""
    target = _find(recurrence_id, key, owner)
    try:
        return Recurrence.objects.get(pk=target)
    except Recurrence.DoesNotExist:
        raise exceptions.RecurrenceNotFound(f"No recurrence {target}.") from None


def change_recurrence(
    recurrence_id: int | None = None,
    *,
    key: str | None = None,
    owner: Any = None,
    kind: Any = UNSET,
    payload: Any = UNSET,
    cron: Any = UNSET,
    every: Any = UNSET,
    timezone: Any = UNSET,
    starts_at: Any = UNSET,
    ends_at: Any = UNSET,
    dst_gap: Any = UNSET,
    missed: Any = UNSET,
    priority: Any = UNSET,
    max_attempts: Any = UNSET,
    caller: Any = None,
) -> Recurrence:
    """Change a recurrence's rule, zone, payload or policies; the pending occurrence moves to the new rule.

    Only the arguments given change (``cron=`` replaces an ``every=`` rule and the other way round).
    The pending occurrence moves to the new rule's first instant after now (and after the latest
    occurrence that ran) and takes the new payload; a claimed one runs on as it is and the planner
    plans the next by the new rule. A cancelled or ended recurrence cannot change:
    ``RecurrenceStateConflict``. The moved occurrence takes the (new) kind's lease, attempts and
    priority. An outside ``caller`` meets the caller limits on what the recurrence will be, and the
    minimum interval when they give a rule.
    """
    target = _find(recurrence_id, key, owner)
    rule = Rule(
        cron=cron, every=every, timezone=timezone, starts_at=starts_at, ends_at=ends_at, dst_gap=dst_gap, missed=missed
    )
    options = options_.JobOptions(owner=owner, priority=priority, max_attempts=max_attempts)
    return change_with_options(target, kind, payload, rule, options, caller=caller)


def change_with_options(
    target: int, kind: Any, payload: Any, rule: Rule, options: options_.JobOptions, *, caller: Any = None
) -> Recurrence:
    """``change_recurrence()`` of recurrence ``target`` with its rule and job options each whole (``UNSET``: keep).

    Of the job options a change takes the attempts and the priority (``UNSET``: the recurrence's).
    """
    cron, every, timezone = rule.cron, rule.every, rule.timezone
    starts_at, ends_at, dst_gap, missed = rule.starts_at, rule.ends_at, rule.dst_gap, rule.missed
    with transaction.atomic():
        row = _locked(target)
        if row.state in (RecurrenceState.CANCELLED, RecurrenceState.ENDED):
            raise exceptions.RecurrenceStateConflict(row.id, row.state, "change")
        new_kind = row.kind if kind is UNSET else kind
        job_kind = registry.get(new_kind)
        new_payload = row.payload if payload is UNSET else payload
        validation.encode_payload(job_kind, new_payload)
        if cron is UNSET and every is UNSET:
            cron_value, every_value = (row.expression or None), row.every_seconds
        else:
            cron_value = None if cron is UNSET else cron
            every_value = None if every is UNSET else every
        new_starts = row.starts_at if starts_at is UNSET else starts_at
        new_ends = row.ends_at if ends_at is UNSET else ends_at
        new_missed = row.missed if missed is UNSET else missed
        new_gap = row.dst_gap if dst_gap is UNSET else dst_gap
        _check_choice("dst_gap", new_gap, DST_GAP_CHOICES)
        # The window and every='s maximum apply to what the caller passes, not to stored values (kept
        # from before those limits, they must not block a payload-only change).
        given = {"starts_at": starts_at, "ends_at": ends_at, "every": every}
        bounded = {name for name, value in given.items() if value is not UNSET}
        expression, every_seconds = rules.check_rule(
            cron_value, every_value, new_starts, new_ends, new_missed, bounded=bounded
        )
        standing = options.using(
            key=None,  # the recurrence keeps its key and owner: a change writes neither
            owner=None,
            on_conflict="replace",
            priority=row.priority if options.priority is UNSET else options.priority,
            max_attempts=row.max_attempts if options.max_attempts is UNSET else options.max_attempts,
        ).standing(job_kind)
        new_zone = row.timezone if timezone is UNSET else timezone
        anchor = row.anchor_at if starts_at is UNSET or starts_at is None else starts_at
        changed = dataclasses.replace(
            row,
            kind=new_kind,
            payload=new_payload,
            expression=expression,
            every_seconds=every_seconds,
            timezone=new_zone,
            dst_gap=new_gap,
            missed=new_missed,
            starts_at=new_starts,
            ends_at=new_ends,
            anchor_at=anchor,
            priority=standing.priority,
            max_attempts=standing.max_attempts,
        )
        schedule = _schedule(changed)  # validates the expression and the zone
        _check_caller(
            caller,
            job_kind,
            standing,
            schedule=schedule if (cron is not UNSET or every is not UNSET) else None,
            rule_field="every" if every_seconds is not None else "cron",
        )
        # A rule given (not a payload-only change): its first occurrence must fall within ten years, whatever the
        # state (a paused recurrence plans it when resumed).
        rule_given = any(value is not UNSET for value in (cron, every, timezone, starts_at))
        if rule_given:
            first = rules.first(schedule, now=core_store.database_now(), starts_at=new_starts, ends_at=new_ends)
            if first is not None:
                _check_within_window(first)
        store.update_recurrence_rule(changed, standing)
        if row.state == RecurrenceState.ACTIVE and row.current_state == "pending":
            now = core_store.database_now()
            last_run = store.last_run_occurrence_at(row.id)
            base = now if last_run is None else max(now, last_run)
            occurrence = rules.first(schedule, now=base, starts_at=new_starts, ends_at=new_ends)
            if occurrence is not None and rule_given:
                _check_within_window(occurrence)
            if occurrence is None:
                store.cancel_pending_occurrences([row.id], "cancelled: its recurrence's change left no occurrence")
                store.set_recurrences_state([row.id], RecurrenceState.ENDED, [RecurrenceState.ACTIVE])
            else:
                occurrence_options = planner.occurrence_options(job_kind, standing.max_attempts, standing.priority)
                moved = store.move_pending_occurrence(row.id, occurrence.at, occurrence.due_at, occurrence_options)
                if moved is not None:
                    store.set_recurrence_current(row.id, occurrence.at)
                    claim.wake_on_commit(moved.in_seconds)
        logger.info("recurrence changed", extra={"recurrence_id": row.id, "action": "changed"})
    return Recurrence.objects.get(pk=target)


def pause_recurrence(recurrence_id: int | None = None, *, key: str | None = None, owner: Any = None) -> int:
    """Pause an active recurrence: its pending occurrence (a retry too) is cancelled, none is planned until resumed.

    An occurrence already running finishes its attempt and is not retried.
    """
    target = _find(recurrence_id, key, owner)
    _one(pause_recurrences, target, "be paused", RecurrenceState.PAUSED)
    return target


def resume_recurrence(
    recurrence_id: int | None = None, *, key: str | None = None, owner: Any = None, caller: Any = None
) -> int:
    """Resume a paused recurrence: the next occurrence is planned now, with its missed policy.

    With an outside ``caller`` (the JSON API), the occurrence is a new job of theirs: it counts
    against their pending-jobs quota as a create does (``OverCreationLimit``; it stays paused).
    """
    target = _find(recurrence_id, key, owner)
    _one(lambda ids: resume_recurrences(ids, caller=caller), target, "resume", RecurrenceState.ACTIVE)
    return target


def resume_recurrence_planning(recurrence_id: int, *, caller: Any = None) -> bool:
    """``resume_recurrence``, telling whether it changed the recurrence (True: resumed, whether it
    planned an occurrence, adopted one still running or ended for want of one) or found it already
    active (False: nothing changed, nothing was created)."""
    return _one(lambda ids: resume_recurrences(ids, caller=caller), recurrence_id, "resume", RecurrenceState.ACTIVE)


def cancel_recurrence(recurrence_id: int | None = None, *, key: str | None = None, owner: Any = None) -> int:
    """Cancel a recurrence: its pending occurrence (a retry too) is cancelled and no further one is planned.

    An occurrence already running finishes its attempt and is not retried.
    """
    target = _find(recurrence_id, key, owner)
    _one(cancel_recurrences, target, "be cancelled", RecurrenceState.CANCELLED)
    return target


def _one(bulk: Callable[[list[int]], BulkResult], target: int, action: str, done_state: str) -> bool:
    """``bulk`` on one recurrence: True when it changed, False when it was already ``done_state``
    (idempotent); a named error otherwise."""
    result = bulk([target])
    if not result.changed:
        _refuse(target, result, action, allowed=(done_state,))
    return bool(result.changed)


def _refuse(target: int, result: BulkResult, action: str, *, allowed: Sequence[str]) -> None:
    if target in result.missing:
        raise exceptions.RecurrenceNotFound(f"No recurrence {target}.")
    if target in result.refused:
        raise exceptions.RecurrenceStateConflict(target, RecurrenceState.PAUSED, f"{action}: {result.refused[target]}")
    state = result.untouched.get(target, "")
    if state in allowed:
        return  # already so: the call is idempotent
    raise exceptions.RecurrenceStateConflict(target, state, action)


def _selection(ids: Iterable[int]) -> list[int]:
    return validation.row_ids(ids, "recurrence_id")


def _audit(action: str, selected: list[int], result: BulkResult, job_ids: Sequence[int] = ()) -> None:
    """The operator's bulk change in the audit trail (nothing outside a door: ``audit.record``); ``job_ids``:
    the occurrences it cancelled, so each one's history names who stopped it."""
    shown = ", ".join(f"#{i}" for i in selected[: audit.TARGET_IDS_SHOWN])
    more = " …" if len(selected) > audit.TARGET_IDS_SHOWN else ""
    audit.record(
        action,
        changed=len(result.changed),
        job_ids=job_ids,
        selected=len(selected),
        target=f"recurrence{'s' if len(selected) != 1 else ''} {shown}{more}",
        details={"recurrence_ids": selected[:1000]},
    )


def _bulk_result(selected: list[int], changed: Iterable[int]) -> BulkResult:
    done = sorted(set(changed))
    others = sorted(set(selected) - set(done))
    states = store.recurrence_states(others) if others else {}
    return BulkResult(
        changed=tuple(done),
        untouched={rid: states[rid] for rid in others if rid in states},
        missing=tuple(rid for rid in others if rid not in states),
    )


def pause_recurrences(ids: Iterable[int]) -> BulkResult:
    """Pause the active recurrences among ``ids`` and cancel their pending occurrences (two statements)."""
    selected = _selection(ids)
    with transaction.atomic():
        changed = store.set_recurrences_state(selected, RecurrenceState.PAUSED, [RecurrenceState.ACTIVE])
        stopped = store.cancel_pending_occurrences(changed, "cancelled: its recurrence was paused")
        result = _bulk_result(selected, changed)
        _audit("recurrence_pause", selected, result, stopped)
    logger.info("recurrences paused", extra={"count": len(changed), "action": "paused"})
    return result


def cancel_recurrences(ids: Iterable[int]) -> BulkResult:
    """Cancel the active, paused or ended recurrences among ``ids`` and their pending occurrences."""
    selected = _selection(ids)
    with transaction.atomic():
        changed = store.set_recurrences_state(
            selected,
            RecurrenceState.CANCELLED,
            [RecurrenceState.ACTIVE, RecurrenceState.PAUSED, RecurrenceState.ENDED],
        )
        stopped = store.cancel_pending_occurrences(changed, "cancelled: its recurrence was cancelled")
        result = _bulk_result(selected, changed)
        _audit("recurrence_cancel", selected, result, stopped)
    logger.info("recurrences cancelled", extra={"count": len(changed), "action": "cancelled"})
    return result


def resume_recurrences(ids: Iterable[int], *, caller: Any = None) -> BulkResult:
    """Resume the paused recurrences among ``ids``, planning each one's next occurrence (missed policy).

    One the planner would refuse (its kind gone, its owner deactivated or without the kind's
    access) stays paused with that reason and is reported untouched. With an outside ``caller``
    (the JSON API), each planned occurrence is a new job of the recurrence's owner and counts
    against their pending-jobs quota, as a create does (``OverCreationLimit`` rolls the call back).
    """
    selected = _selection(ids)
    settings = conf.get()
    with transaction.atomic():
        # The owners' creation locks before the rows' (recur() takes them in that order too: no deadlock).
        owners = {} if _exempt(caller) else _quota_owners(selected, caller)
        for owner_id in sorted(owners):
            _lock_owner_creations(owners[owner_id])
        resumed = store.set_recurrences_state(selected, RecurrenceState.ACTIVE, [RecurrenceState.PAUSED])
        rows = [_locked(rid) for rid in resumed]
        refused = planner.refusals(rows, planner.kinds_of(rows))
        store.pause_recurrences_for(list(refused.items()))
        changed = [rid for rid in resumed if rid not in refused]
        now = core_store.database_now()
        for row in rows:
            rid = row.id
            if rid in refused:
                continue
            if store.adopt_live_occurrence(rid) is not None:
                continue  # its occurrence still runs (claimed before the pause): the planner plans after it
            last_run = store.last_run_occurrence_at(rid)
            schedule = _schedule(row)
            # Paused before any occurrence ran: its missed policy counts from the first one planned (the
            # pause cancelled it), as it counts from the last one run otherwise.
            since, inclusive = (last_run, False) if last_run is not None else (row.current_at, True)
            if since is None or (last_run is None and row.missed != rules.MISSED_RUN_ONCE):
                occurrence = rules.first(schedule, now=now, starts_at=row.starts_at, ends_at=row.ends_at)
            else:
                occurrence = rules.following(
                    schedule,
                    since,
                    now=now,
                    missed=row.missed,
                    late_seconds=settings.recurrence_late_seconds,
                    ends_at=row.ends_at,
                    starts_at=row.starts_at,
                    inclusive=inclusive,
                )
            store.set_recurrence_current(rid, last_run)
            if occurrence is None:
                store.set_recurrences_state([rid], RecurrenceState.ENDED, [RecurrenceState.ACTIVE])
                continue
            planned = _plan(row, occurrence, last_run)
            owner = owners.get(row.owner_id) if row.owner_id is not None else None
            if planned is not None and owner is not None:
                validation.check_quota(owner, planned.job_id, for_another=owner is not caller)
        result = dataclasses.replace(_bulk_result(selected, changed), refused=refused)
        _audit("recurrence_resume", selected, result)
    logger.info("recurrences resumed", extra={"count": len(changed), "action": "resumed"})
    return result


def next_occurrences(
    recurrence_id: int | None = None, *, key: str | None = None, owner: Any = None, n: int = 5
) -> list[dt.datetime]:
    """The next ``n`` occurrence instants (UTC) from the pending one on; empty when paused, cancelled or ended."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PREVIEW:
        raise exceptions.InvalidSchedule(f"n must be a whole number from 1 to {MAX_PREVIEW}, got {n!r}.")
    recurrence = get_recurrence(recurrence_id, key=key, owner=owner)
    return preview(recurrence, n)


def preview(recurrence: Recurrence, n: int) -> list[dt.datetime]:
    """``next_occurrences()`` of a recurrence already read (the admin's list column)."""
    if recurrence.state != RecurrenceState.ACTIVE:
        return []
    schedule = rules.schedule_for(
        recurrence.expression,
        recurrence.every_seconds,
        recurrence.timezone,
        recurrence.dst_gap,
        recurrence.anchor_at,
    )
    start = recurrence.current_at
    if start is None:
        start = dt.datetime.now(dt.UTC)
    return rules.upcoming(schedule, start, n, ends_at=recurrence.ends_at)


def on_recurrence_deleted(sender: Any, instance: Recurrence, **kwargs: Any) -> None:
    """``pre_delete`` of a recurrence (its owner deleted, CASCADE): its pending occurrence is cancelled."""
    store.cancel_pending_occurrences([instance.pk], "cancelled: its recurrence was deleted with its owner")


__all__ = [
    "NewEntry",
    "cancel_recurrence",
    "cancel_recurrences",
    "change_recurrence",
    "get_recurrence",
    "next_occurrences",
    "pause_recurrence",
    "pause_recurrences",
    "recur",
    "recur_many",
    "resume_recurrence",
    "resume_recurrences",
]
