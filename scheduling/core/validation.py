"""The checks every door makes before anything is stored or sent: payload, delay, due time, key.

``scheduling.api`` (Python), the JSON API and the admin all call these, so they refuse the same
input with the same named exceptions.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from scheduling.core import conf, exceptions, registry

MAX_DELAY_SECONDS = 10 * 366 * 86_400  # ten years: anything further is a unit mistake
MAX_KEY_LENGTH = 200
MAX_ATTEMPTS_LIMIT = 1000


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
    max_depth = conf.get().max_payload_depth
    if payload_depth(payload) > max_depth:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested deeper than {max_depth} levels.")
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is not JSON: {exc}") from None
    except RecursionError:
        raise exceptions.InvalidPayload(f"Payload for {kind.name} is nested too deeply.") from None
    limit = conf.get().max_payload_bytes
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


def resolve_time(
    due_at: dt.datetime | None, delay: float | int | dt.timedelta | None
) -> tuple[dt.datetime | None, float | None]:
    if (due_at is None) == (delay is None):
        raise exceptions.InvalidSchedule("Give exactly one of due_at and delay.")
    if due_at is not None:
        return check_due_at(due_at), None
    assert delay is not None
    return None, delay_seconds(delay)


def check_key(key: str | None) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not key.strip():
        raise exceptions.InvalidSchedule("key must be a non-empty string.")
    if len(key) > MAX_KEY_LENGTH:
        raise exceptions.InvalidSchedule(f"key is {len(key)} characters; the limit is {MAX_KEY_LENGTH}.")


def check_max_attempts(kind: registry.Kind, max_attempts: int | None) -> int:
    """The attempts a job gets: the kind's default, or ``max_attempts`` if it is a whole number 1-1000."""
    attempts = kind.max_attempts if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise exceptions.InvalidSchedule(
            f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}."
        )
    return attempts
