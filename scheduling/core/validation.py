"""The checks every door makes before anything is stored or sent: payload, delay, due time, key, access.

``scheduling.api`` (Python), the JSON API and the admin all call these, so they refuse the same
input with the same named exceptions, before the database or a lock is touched:

- text (kinds, keys, payload keys and string values at any depth) holding NUL or a lone UTF-16
  surrogate: PostgreSQL cannot store either (text refuses NUL; jsonb refuses ``\u0000`` and
  unpaired surrogates), so they are refused here with a reason instead of failing in the driver;
- due times outside ``EARLIEST_DUE_AT`` .. now + ``MAX_DELAY_SECONDS`` (2000-01-01 to ten years
  ahead): a year-1 job would jump every queue and report an overdue age of two thousand years;
- UTC offsets beyond ±15:59 (PostgreSQL's limit; Python allows up to ±23:59:59.999999) or with
  seconds; accepted times are handed on in UTC.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from scheduling.core import conf, exceptions, registry

MAX_DELAY_SECONDS = registry.MAX_DELAY_SECONDS  # ten years: anything further is a unit mistake
MAX_KEY_LENGTH = 200
MAX_ROW_ID = 2**63 - 1  # bigint: no row has a larger id (asking for one is a database error, not a miss)
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_SECONDS = 86_400.0  # a job's own timeout: one day at most (longer work belongs in smaller jobs)
MAX_BACKOFF_SECONDS = 7 * 86_400.0  # a job's own backoff: its steps (base, cap) are a week at most
EARLIEST_DUE_AT = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)  # a due time before this is a mistake, not a plan
MAX_UTC_OFFSET = dt.timedelta(hours=15, minutes=59)  # PostgreSQL refuses larger offsets in timestamptz input


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str) -> str:
    """Why PostgreSQL could not store ``text`` ("" when it can): a NUL or an unpaired surrogate."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return ""
    return "contains a NUL character" if found.group() == "\x00" else "contains an unpaired UTF-16 surrogate"


def check_text(text: str, what: str) -> None:
    """Raise ``InvalidSchedule`` when ``text`` (a key, a kind, a filter) cannot be stored."""
    problem = text_problem(text)
    if problem:
        raise exceptions.InvalidSchedule(f"{what} {problem}.")


def payload_text_problem(payload: Any) -> str:
    """Where and why a payload holds text PostgreSQL cannot store ("" when none), walked without recursion."""
    stack: list[tuple[Any, str]] = [(payload, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            problem = text_problem(node)
            if problem:
                return f"the value at {where or '(root)'} {problem}"
        elif isinstance(node, dict):
            for name, child in node.items():
                if isinstance(name, str):
                    problem = text_problem(name)
                    if problem:
                        return f"a field name under {where or '(root)'} {problem}"
                stack.append((child, f"{where}/{name}" if isinstance(name, str) and not text_problem(name) else where))
        elif isinstance(node, list | tuple):
            stack.extend((child, f"{where}/{i}") for i, child in enumerate(node))
    return ""


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

    Every door (Python, the API, the admin, the commands, fixed-time declarations and policies) goes
    through here, so they refuse the same payloads: not JSON, nested deeper than the kind's depth
    limit (a worker must be able to decode and validate whatever was stored), over its size limit,
    or failing the kind's schema. The limits are ``kind.limits`` (its own, else the settings').
    """
    limits = kind.limits
    max_depth = limits.max_payload_depth or 0
    if payload_depth(payload) > max_depth:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested deeper than {max_depth} levels.")
    problem = payload_text_problem(payload)
    if problem:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} cannot be stored: {problem}.")
    try:
        # sort_keys: keys of mixed types ({1: "a", "b": 2}) are refused here, not when a deferral is signed
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is not JSON: {exc}") from None
    except RecursionError:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested too deeply.") from None
    limit = limits.max_payload_bytes or 0
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
    elif isinstance(delay, int) and abs(delay) > MAX_DELAY_SECONDS:  # before float(), which a huge int overflows
        sign = "negative" if delay < 0 else "more than ten years"
        raise exceptions.InvalidSchedule(f"delay must be a finite number of seconds >= 0 (this one is {sign}).")
    else:
        seconds = float(delay)
    if not math.isfinite(seconds) or seconds < 0:
        raise exceptions.InvalidSchedule(f"delay must be a finite number of seconds >= 0, got {delay!r}.")
    if seconds > MAX_DELAY_SECONDS:
        raise exceptions.InvalidSchedule(f"delay of {seconds:.0f}s is more than ten years.")
    return seconds


def check_due_at(due_at: Any) -> dt.datetime:
    """``due_at`` in UTC: aware, with an offset PostgreSQL accepts, within the sane window.

    Naive datetimes are refused (which zone would they be in?), and so are offsets beyond ±15:59 or
    with seconds, and instants before ``EARLIEST_DUE_AT`` or more than ``MAX_DELAY_SECONDS`` ahead.
    """
    if not isinstance(due_at, dt.datetime):
        raise exceptions.InvalidSchedule(f"due_at must be a datetime, got {type(due_at).__name__}.")
    offset = due_at.utcoffset() if due_at.tzinfo is not None else None
    if offset is None:
        raise exceptions.InvalidSchedule("due_at must be timezone-aware; a naive datetime has no fixed instant.")
    if abs(offset) > MAX_UTC_OFFSET or offset % dt.timedelta(minutes=1):
        raise exceptions.InvalidSchedule(
            f"due_at has the UTC offset {offset}; use whole minutes within ±15:59 (or UTC)."
        )
    try:
        utc = due_at.astimezone(dt.UTC)
    except OverflowError:
        raise exceptions.InvalidSchedule("due_at is out of range.") from None
    latest = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=MAX_DELAY_SECONDS)
    if not EARLIEST_DUE_AT <= utc <= latest:
        raise exceptions.InvalidSchedule(
            f"due_at must be from {EARLIEST_DUE_AT:%Y-%m-%d} to ten years ahead, got {utc.isoformat()}."
        )
    return utc


def resolve_time(
    due_at: dt.datetime | None, delay: float | int | dt.timedelta | None
) -> tuple[dt.datetime | None, float | None]:
    if (due_at is None) == (delay is None):
        raise exceptions.InvalidSchedule("Give exactly one of due_at and delay.")
    if due_at is not None:
        return check_due_at(due_at), None
    assert delay is not None
    return None, delay_seconds(delay)


def row_id(value: Any, what: str) -> int | None:
    """An id given to the Python API: a whole number (or its ASCII digits, as a URL carries it); None when no
    row can have it (below 1, past bigint).

    ``InvalidSchedule`` for anything else: ``True`` is an int to Python and ``2.9`` would be cut to 2,
    and either would act on a row nobody named.
    """
    digits = value.strip() if isinstance(value, str) else ""
    if digits.isascii() and digits.isdecimal():
        return row_id_text(digits)
    if isinstance(value, bool) or not isinstance(value, int):
        raise exceptions.InvalidSchedule(f"{what} must be a whole number, got {type(value).__name__}.")
    return value if 1 <= value <= MAX_ROW_ID else None


def row_ids(values: Iterable[Any], what: str) -> list[int]:
    """A bulk call's ids (each as ``row_id`` takes it), sorted, once each; ids no row can have are left out."""
    found = (row_id(value, what) for value in values)
    return sorted({value for value in found if value is not None})


def shown_number(value: Any) -> str:
    """``value`` for a message: a number past 64 bits is not written out (past 4,300 digits ``str()`` refuses it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    return repr(value)


def row_id_text(text: str) -> int | None:
    """The id a person typed (a URL, a search box, a form's selection): None unless ASCII digits from 1 to bigint.

    ``str.isdigit()`` is not enough: it takes "\u00b2", which ``int()`` refuses, and 19 digits can
    still be past bigint.
    """
    if not (text.isascii() and text.isdecimal()) or len(text) > len(str(MAX_ROW_ID)):
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ROW_ID else None


def check_key(key: str | None) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not key.strip():
        raise exceptions.InvalidSchedule("key must be a non-empty string.")
    if len(key) > MAX_KEY_LENGTH:
        raise exceptions.InvalidSchedule(f"key is {len(key)} characters; the limit is {MAX_KEY_LENGTH}.")
    check_text(key, "key")


def check_access(kind: registry.Kind, user: Any, payload: Any) -> None:
    """Raise ``KindNotAllowed`` unless ``user`` may schedule ``kind`` with ``payload`` (after the payload checks)."""
    if not kind.allows(user, payload):
        raise exceptions.KindNotAllowed(kind.name)


def check_max_attempts(kind: registry.Kind, max_attempts: int | None) -> int:
    """The attempts a job gets: the kind's default, or ``max_attempts`` if it is a whole number 1-1000."""
    attempts = kind.max_attempts if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise exceptions.InvalidSchedule(
            f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}."
        )
    return attempts


def _positive_seconds(value: Any, what: str, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise exceptions.InvalidSchedule(f"{what} must be a number of seconds above 0, got {value!r}.")
    if value > most:
        raise exceptions.InvalidSchedule(f"{what} of {value:g} s is over the limit of {most:g} s.")
    return float(value)


def check_timeout(timeout: Any) -> float | None:
    """A job's own timeout in seconds (None: its kind's): above 0, at most ``MAX_TIMEOUT_SECONDS``."""
    if timeout is None:
        return None
    if isinstance(timeout, dt.timedelta):
        timeout = timeout.total_seconds()
    return _positive_seconds(timeout, "timeout", MAX_TIMEOUT_SECONDS)


def check_backoff(backoff: Any) -> registry.Backoff | None:
    """A job's own ``registry.Backoff`` (None: its kind's): base and cap above 0, base <= cap, a week at most."""
    if backoff is None:
        return None
    if not isinstance(backoff, registry.Backoff):
        raise exceptions.InvalidSchedule(
            f"backoff must be a scheduling.registry.Backoff(base_seconds, cap_seconds), got {type(backoff).__name__}."
        )
    base = _positive_seconds(backoff.base_seconds, "backoff base_seconds", MAX_BACKOFF_SECONDS)
    cap = _positive_seconds(backoff.cap_seconds, "backoff cap_seconds", MAX_BACKOFF_SECONDS)
    if base > cap:
        raise exceptions.InvalidSchedule(f"backoff base_seconds ({base:g}) must not be over cap_seconds ({cap:g}).")
    return registry.Backoff(base, cap)


def check_atomic(atomic: Any) -> bool | None:
    """A job's own atomicity (None: its kind's): True or False, nothing else."""
    if atomic is None or isinstance(atomic, bool):
        return atomic
    raise exceptions.InvalidSchedule(f"atomic must be True, False or None (the kind's), got {atomic!r}.")


def check_caller_limits(
    kind: registry.Kind,
    user: Any,
    *,
    max_attempts: int | None,
    priority: int | None,
    timeout_seconds: float | None = None,
) -> None:
    """Raise ``OverCallerLimit`` when an outside caller asks more of ``kind`` than its ``Access`` allows them.

    Attempts: at most the kind's caller bound, and never so many that attempts x the timeout
    passes ``SCHEDULING_API_MAX_JOB_SECONDS`` (as the settings stand now). The timeout is the job's
    own (``timeout_seconds``, after ``check_timeout``) when the caller chose one, and never less
    than the kind's: a caller's timeout may lower the job's worst case, never lift the bound (the
    JSON API offers no timeout; a door that does must pass it here, with the attempts the job gets).
    Priority: at most the kind's caller bound, or 9 with ``scheduling.prioritize_job``. Call it
    after the plain checks (``check_max_attempts``, ``check_priority``): it judges whole numbers in
    range only.
    """
    timeout = kind.timeout_seconds
    if timeout_seconds is not None and timeout_seconds > timeout:
        timeout = timeout_seconds
        if max_attempts is None:
            max_attempts = kind.max_attempts  # a longer timeout is judged with the attempts the job gets
    if isinstance(max_attempts, int) and not isinstance(max_attempts, bool):
        bound = kind.caller_max_attempts
        limit = conf.get().api_max_job_seconds
        if limit and timeout:
            bound = min(bound, int(limit // timeout))
        if max_attempts > bound:
            why = f"each attempt may hold a worker for {timeout:g} s"
            if limit:
                why += f", and one job for {registry.MAX_JOB_SECONDS_SETTING} ({limit:g} s) at most"
            raise exceptions.OverCallerLimit(
                f"max_attempts {max_attempts} is over the limit for {kind.name}, {bound}: {why}.",
                field="max_attempts",
                limit=bound,
            )
    if isinstance(priority, int) and not isinstance(priority, bool):
        top = kind.caller_max_priority(user)
        if priority > top:
            raise exceptions.OverCallerLimit(
                f"priority {priority} is over the limit for {kind.name}, {top}; a higher one needs the "
                f"{registry.PRIORITIZE_PERMISSION} permission.",
                field="priority",
                limit=top,
            )


def check_recurrence_interval(user: Any, shortest_seconds: float, *, field: str) -> None:
    """Raise ``RecurrenceTooFrequent`` when an outside caller's recurrence runs closer than the minimum interval.

    ``shortest_seconds`` is the rule's shortest gap (``every``, or a cron's over a year); ``field``
    is the argument it came from (``every`` or ``cron``). Superusers are exempt; 0 turns it off.
    """
    minimum = conf.get().api_min_recurrence_interval_seconds
    if minimum <= 0 or user is None or user.is_superuser or shortest_seconds >= minimum:
        return
    raise exceptions.RecurrenceTooFrequent(
        f"The recurrence runs every {shortest_seconds:g} s at its shortest; the minimum is {minimum:g} s "
        f"({conf.PREFIX}API_MIN_RECURRENCE_INTERVAL_SECONDS).",
        field=field,
        limit=minimum,
    )


def check_priority(kind: registry.Kind, priority: int | None) -> int:
    """A job's priority: the kind's default, or ``priority`` if it is a whole number from 0 to 9."""
    value = kind.priority if priority is None else priority
    if not registry.is_priority(value):
        raise exceptions.InvalidSchedule(
            f"priority must be a whole number from {registry.MIN_PRIORITY} to {registry.MAX_PRIORITY}, "
            f"got {priority!r}."
        )
    return value


# --- Outside callers: the past, the create rate and the pending quota (the API and the admin) -------

MAX_QUOTA_RETRY_AFTER_SECONDS = 3600  # a quota's Retry-After: when the owner's next job is due, at most this


def check_not_past(due_at: dt.datetime, now: dt.datetime | None = None) -> None:
    """Raise ``DueAtInPast`` when an outside caller's ``due_at`` is older than now less the skew tolerance.

    ``now`` is the database clock (read here when not given). A caller's job arrives due, never
    overdue: an old due time would jump the queue (the claim takes the oldest first) and count as
    backlog at once. A delay of 0 asks for "now".
    """
    from scheduling.core import store

    tolerance = conf.get().api_past_due_tolerance_seconds
    earliest = (store.database_now() if now is None else now) - dt.timedelta(seconds=tolerance)
    if due_at < earliest:
        raise exceptions.DueAtInPast(
            f"due_at {due_at.isoformat()} is in the past: the earliest accepted now is {earliest.isoformat()} "
            f"(the database clock less {tolerance:g} s for clock skew). Send a later time, or delay 0 for now.",
            field="due_at",
            limit=earliest.isoformat(),
        )


def take_create_allowance(user: Any) -> None:
    """Raise ``OverCreationLimit`` (``rate_limited``) when ``user`` creates faster than the rate.

    Superusers and system calls (no user) are exempt. Every create request counts, whatever its
    answer: the bucket (``store.take_create_allowance``) is a row per owner in PostgreSQL, shared by
    every web process and timed by the database clock.
    """
    from scheduling.core import store

    settings = conf.get()
    if settings.api_create_rate_per_second <= 0 or user is None or user.is_superuser:
        return
    allowance = store.take_create_allowance(user.pk, settings.api_create_rate_per_second, settings.api_create_burst)
    if not allowance.allowed:
        retry_after = max(1, math.ceil(allowance.retry_after_seconds))
        raise exceptions.OverCreationLimit(
            f"Too many jobs created: at most {settings.api_create_burst} at once and "
            f"{settings.api_create_rate_per_second:g} a second after that (SCHEDULING_API_CREATE_BURST, "
            f"SCHEDULING_API_CREATE_RATE_PER_SECOND). Retry in {retry_after} s.",
            code="rate_limited",
            retry_after=retry_after,
        )


def give_back_create_allowance(user: Any) -> None:
    """Return the creation ``take_create_allowance`` took from ``user``, for a request that created nothing.

    Only for a request that turned out to be a no-op (a resume of a recurrence already active); a
    refused or failed request keeps its charge (every create request counts, whatever its answer).
    """
    from scheduling.core import store

    settings = conf.get()
    if settings.api_create_rate_per_second <= 0 or user is None or user.is_superuser:
        return
    store.give_back_create_allowance(user.pk, settings.api_create_rate_per_second)


def lock_creations(user: Any) -> None:
    """Serialise ``user``'s creations until the transaction ends, when a quota applies to them."""
    from scheduling.core import locks, store

    if conf.get().api_max_pending_jobs > 0 and user is not None and not user.is_superuser:
        store.lock_owner_creations(locks.lock_key("api-creations", str(user.pk)))


def check_quota(user: Any, new_id: int, *, for_another: bool = False) -> None:
    """Raise ``OverCreationLimit`` (``quota_exceeded``) when ``user`` holds more pending jobs than the quota.

    Call it inside the creating transaction, after ``lock_creations`` and the insert (the new job
    counts): raising rolls the new job back. ``for_another``: ``user`` owns the new job but someone
    else asked for it (staff resuming a user's recurrence): the message tells them nothing of the
    owner's jobs but the quota.
    """
    from scheduling.core import store

    quota = conf.get().api_max_pending_jobs
    if quota <= 0 or user is None or user.is_superuser:
        return
    held = store.owner_pending_jobs(user.pk, quota, new_id)
    if held.pending > quota and for_another:
        raise exceptions.OverCreationLimit(
            f"The owner holds {quota} pending jobs, the most SCHEDULING_API_MAX_PENDING_JOBS allows.",
            code="quota_exceeded",
            retry_after=MAX_QUOTA_RETRY_AFTER_SECONDS,
            limit=quota,
        )
    if held.pending > quota:
        retry_after = min(MAX_QUOTA_RETRY_AFTER_SECONDS, max(1, math.ceil(held.next_due_in_seconds)))
        raise exceptions.OverCreationLimit(
            f"You hold {quota} pending jobs, the most SCHEDULING_API_MAX_PENDING_JOBS allows: wait until some "
            f"have run (your next is due in {math.ceil(held.next_due_in_seconds)} s) or cancel some.",
            code="quota_exceeded",
            retry_after=retry_after,
            limit=quota,
        )
