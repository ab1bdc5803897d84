"""Timekeeper's public contract: schedule, cancel and reschedule per-entity future work.

``schedule()`` writes a row in the caller's transaction: roll back and there is no job. Every
check (kind, payload, due time) happens here, at schedule time, never at run time. Changes are
conditional on the job being pending; any other state raises a named ``JobStateConflict``.

``defer()`` is for short delays (a retry in thirty seconds): up to the broker ceiling and without a
key it is a Celery countdown message and no row (``scheduling.deferral``); otherwise it is
``schedule()``. Its handle says which mechanism was used and the id to find the work again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from scheduling import claim, conf, deferral, exceptions, registry, store
from scheduling.models import ScheduledJob

logger = logging.getLogger(__name__)

ON_CONFLICT_CHOICES = ("replace", "keep", "error")
MAX_DELAY_SECONDS = 10 * 366 * 86_400  # ten years: anything further is a unit mistake
MAX_KEY_LENGTH = 200


def payload_depth(payload: Any) -> int:
    """How deeply ``payload`` nests lists and objects (a scalar is 0), walked without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(payload, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def encode_payload(kind: registry.Kind, payload: Any) -> str:
    """Validate ``payload`` for ``kind`` and return its JSON text; raises ``InvalidPayload``.

    Every door (Python, the API, the admin) goes through here, so they refuse the same payloads:
    not JSON, nested deeper than ``SCHEDULING_MAX_PAYLOAD_DEPTH`` (a worker must be able to decode
    and validate whatever was stored), over the size limit, or failing the kind's schema.
    """
    max_depth = int(conf.get("SCHEDULING_MAX_PAYLOAD_DEPTH"))
    if payload_depth(payload) > max_depth:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested deeper than {max_depth} levels.")
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is not JSON: {exc}") from None
    except RecursionError:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested too deeply.") from None
    limit = int(conf.get("SCHEDULING_MAX_PAYLOAD_BYTES"))
    size = len(encoded.encode())
    if size > limit:
        raise exceptions.PayloadTooLarge(size, limit)
    kind.validate(payload)
    return encoded


def delay_seconds(delay: float | int | dt.timedelta) -> float:
    """A delay as seconds; raises ``InvalidSchedule`` for negatives, NaN, booleans or absurd sizes."""
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, bool) or not isinstance(delay, int | float):
        raise exceptions.InvalidSchedule(f"delay must be seconds or a timedelta, got {type(delay).__name__}.")
    else:
        seconds = float(delay)
    if not math.isfinite(seconds) or seconds < 0:
        raise exceptions.InvalidSchedule(f"delay must be a finite number of seconds >= 0, got {delay!r}.")
    if seconds > MAX_DELAY_SECONDS:
        raise exceptions.InvalidSchedule(f"delay of {seconds:.0f}s is more than ten years.")
    return seconds


def check_due_at(due_at: Any) -> dt.datetime:
    """An aware datetime; naive ones are refused (which zone would they be in?)."""
    if not isinstance(due_at, dt.datetime):
        raise exceptions.InvalidSchedule(f"due_at must be a datetime, got {type(due_at).__name__}.")
    if due_at.tzinfo is None or due_at.utcoffset() is None:
        raise exceptions.InvalidSchedule("due_at must be timezone-aware; a naive datetime has no fixed instant.")
    return due_at


def _resolve_time(
    due_at: dt.datetime | None, delay: float | int | dt.timedelta | None
) -> tuple[dt.datetime | None, float | None]:
    if (due_at is None) == (delay is None):
        raise exceptions.InvalidSchedule("Give exactly one of due_at and delay.")
    if due_at is not None:
        return check_due_at(due_at), None
    assert delay is not None
    return None, delay_seconds(delay)


def _check_key(key: str | None) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not key.strip():
        raise exceptions.InvalidSchedule("key must be a non-empty string.")
    if len(key) > MAX_KEY_LENGTH:
        raise exceptions.InvalidSchedule(f"key is {len(key)} characters; the limit is {MAX_KEY_LENGTH}.")


def schedule(
    kind: str,
    payload: Any,
    *,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
    key: str | None = None,
    on_conflict: str = "replace",
    max_attempts: int | None = None,
    owner: Any = None,
) -> ScheduledJob:
    """Schedule ``kind`` with ``payload`` at ``due_at`` (aware) or after ``delay`` (by the database clock).

    With a ``key``, a second job for a key whose job is still pending either moves that job
    (``replace``), leaves it (``keep``: the existing job is returned) or raises ``KeyConflict``
    (``error``). A key whose job is running (claimed) cannot be replaced: ``JobNotReschedulable``.
    """
    job_kind = registry.get(kind)
    encode_payload(job_kind, payload)
    resolved_due_at, resolved_delay = _resolve_time(due_at, delay)
    _check_key(key)
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise exceptions.InvalidSchedule(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}, got {on_conflict!r}."
        )
    attempts = job_kind.max_attempts if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
        raise exceptions.InvalidSchedule(f"max_attempts must be a whole number from 1 to 1000, got {max_attempts!r}.")
    owner_id = getattr(owner, "pk", owner)

    new = store.NewJob(
        kind=kind,
        payload=payload,
        due_at=resolved_due_at,
        delay_seconds=resolved_delay,
        lease_seconds=job_kind.lease_seconds,
        max_attempts=attempts,
        key=key,
        owner_id=owner_id,
    )
    asked_at = time.monotonic()
    row = store.insert_job(new, on_conflict)
    if row is None:
        assert key is not None
        live = store.live_job_by_key(key)
        if live is None:  # the live job finished between the two statements: try once more
            row = store.insert_job(new, on_conflict)
            if row is None:
                raise exceptions.KeyConflict(key, -1)
        else:
            live_id, live_state = live
            if on_conflict == "error":
                raise exceptions.KeyConflict(key, live_id)
            if on_conflict == "replace":
                raise exceptions.JobNotReschedulable(live_id, live_state)
            logger.info("schedule kept the live job for the key", extra={"job_id": live_id, "action": "kept"})
            return ScheduledJob.objects.get(pk=live_id)
    job_id, stored_due_at, in_seconds = row
    claim.wake_on_commit(in_seconds, asked_at)
    logger.info("job scheduled", extra={"job_id": job_id, "kind": kind, "action": "scheduled"})
    job = ScheduledJob(
        id=job_id,
        kind=kind,
        payload=payload,
        due_at=stored_due_at,
        state="pending",
        lease_seconds=job_kind.lease_seconds,
        attempts=0,
        max_attempts=attempts,
        key=key,
        owner_id=owner_id,
    )
    job._state.adding = False
    return job


def schedule_many(
    kind: str,
    payloads: Sequence[Any],
    *,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
    max_attempts: int | None = None,
    owner: Any = None,
) -> list[int]:
    """Schedule one job of ``kind`` per payload, all at ``due_at`` or after ``delay``; returns their ids.

    The same checks as ``schedule()`` (every payload is validated before anything is stored) and
    the same transaction rules, in one statement: for bulk loads, where a row-per-call insert
    dominates. No keys: a keyed job needs ``schedule()``'s conflict handling.
    """
    job_kind = registry.get(kind)
    encoded = [encode_payload(job_kind, payload) for payload in payloads]
    resolved_due_at, resolved_delay = _resolve_time(due_at, delay)
    attempts = job_kind.max_attempts if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
        raise exceptions.InvalidSchedule(f"max_attempts must be a whole number from 1 to 1000, got {max_attempts!r}.")
    if not encoded:
        return []
    asked_at = time.monotonic()
    rows = store.insert_jobs(
        kind,
        encoded,
        due_at=resolved_due_at,
        delay_seconds=resolved_delay,
        lease_seconds=job_kind.lease_seconds,
        max_attempts=attempts,
        owner_id=getattr(owner, "pk", owner),
    )
    claim.wake_on_commit(min(row[2] for row in rows), asked_at)  # one wake-up: all rows share the due time
    logger.info("jobs scheduled", extra={"kind": kind, "count": len(rows), "action": "scheduled"})
    return [row[0] for row in rows]


def _find(job_id: int | None, key: str | None) -> int:
    if (job_id is None) == (key is None):
        raise exceptions.InvalidSchedule("Give exactly one of job_id and key.")
    if job_id is not None:
        return job_id
    assert key is not None
    live = store.live_job_by_key(key)
    if live is None:
        raise exceptions.JobNotFound(f"No pending or claimed job has key {key!r}.")
    return live[0]


def cancel(job_id: int | None = None, *, key: str | None = None) -> int:
    """Cancel a pending job; returns its id. ``JobNotCancellable`` says which state it is in otherwise."""
    target = _find(job_id, key)
    if store.cancel_job(target):
        logger.info("job cancelled", extra={"job_id": target, "action": "cancelled"})
        return target
    state = store.job_state(target)
    if state is None:
        raise exceptions.JobNotFound(f"No job {target}.")
    raise exceptions.JobNotCancellable(target, state)


def reschedule(
    job_id: int | None = None,
    *,
    key: str | None = None,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
) -> dt.datetime:
    """Move a pending job to ``due_at`` (or ``delay`` from now); returns the stored due time."""
    resolved_due_at, resolved_delay = _resolve_time(due_at, delay)
    target = _find(job_id, key)
    if resolved_due_at is None:
        assert resolved_delay is not None
        resolved_due_at = store.database_now() + dt.timedelta(seconds=resolved_delay)
    asked_at = time.monotonic()
    row = store.reschedule_job(target, resolved_due_at)
    if row is not None:
        stored_due_at, in_seconds = row
        claim.wake_on_commit(in_seconds, asked_at)
        logger.info("job rescheduled", extra={"job_id": target, "action": "rescheduled"})
        return stored_due_at
    state = store.job_state(target)
    if state is None:
        raise exceptions.JobNotFound(f"No job {target}.")
    raise exceptions.JobNotReschedulable(target, state)


def defer(
    kind: str, payload: Any, delay: float | int | dt.timedelta, *, key: str | None = None
) -> deferral.Deferral:
    """Run ``kind`` with ``payload`` after ``delay``: a broker countdown when short and keyless, else a row.

    Up to ``SCHEDULING_BROKER_DELAY_MAX_SECONDS`` (900 s) and with no ``key``: a Celery message,
    sent when the caller's transaction commits, that cannot be listed or cancelled. Longer, or with
    a ``key`` (to find, move or cancel it): ``schedule(kind, payload, delay=delay, key=key)``.
    Validates like ``schedule()``; ``DelayTooLong`` if the broker's visibility-timeout guard would
    break. Returns ``Deferral(mechanism="broker" | "table", id, due_at)``.
    """
    return deferral.defer(kind, payload, delay, key=key)


def status(*, include_broker: bool = True) -> dict[str, Any]:
    """The numbers operators watch: backlog (pending and overdue), oldest overdue age, claimed, stuck.

    ``broker`` holds the broker's counts (``deferral.broker_counts()``: visible, delayed, in flight,
    unacked), or None when Redis does not answer; ``include_broker=False`` skips reading Redis
    (which reads every queued message to sort them by ETA) when only the table matters.
    """
    numbers = store.backlog_status(
        float(conf.get("SCHEDULING_STUCK_AFTER_SECONDS")), int(conf.get("SCHEDULING_STATUS_EXACT_LIMIT"))
    )
    if include_broker:
        numbers["broker"] = deferral.broker_counts()
    return numbers


__all__ = ["cancel", "defer", "reschedule", "schedule", "schedule_many", "status"]
