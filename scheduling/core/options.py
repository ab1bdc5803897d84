"""How one job is to run, as a door was asked: one frozen value passed whole down to the store.

``JobOptions`` holds what a caller may say about a job besides its kind and payload (when, key and
conflict mode, attempts, owner, priority, and its own timeout, backoff and atomicity); ``using()``
returns a changed copy, as Django's ``Task.using()`` does. ``validated(kind)`` checks it against
the kind with the doors' shared checks (``core/validation.py``, ``InvalidSchedule`` and friends)
and returns ``ValidOptions``, the resolved values the store writes. A new option is a field here
and in ``ValidOptions``, not a keyword copied through every function between a door and the store.
A recurrence (``scheduling.recurring``) keeps its job options standing: ``standing(kind)`` checks the
ones it takes (key, attempts, priority) and returns ``StandingOptions``, None kept as "the kind's,
read at each occurrence".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from scheduling.core import exceptions, registry, validation

ON_CONFLICT_CHOICES = ("replace", "keep", "error")
# Uniqueness windows (schedule(unique_for=...)): the states in which a job holds its window. The
# waiting and running states always do (a job there is "the same job" by any reading); done,
# dead and cancelled may be added or left out. The default counts a job that ran (done) but not
# one that failed for good or was cancelled (River's default, for its states).
UNIQUE_STATES_ALWAYS = ("pending", "claimed", "running")
UNIQUE_STATES_CHOICES = (*UNIQUE_STATES_ALWAYS, "done", "dead", "cancelled")
DEFAULT_UNIQUE_STATES = (*UNIQUE_STATES_ALWAYS, "done")
MAX_UNIQUE_FOR_SECONDS = 366 * 24 * 3600  # a year and a day: the longest window


@dataclasses.dataclass(frozen=True)
class ValidOptions:
    """A job's options checked against its kind: what the store writes (None overrides: the kind's)."""

    due_at: dt.datetime | None  # an aware due time, or None: ``delay_seconds`` from now
    delay_seconds: float | None
    key: str | None
    on_conflict: str
    max_attempts: int
    owner_id: int | None
    priority: int
    lease_seconds: int  # the kind's
    timeout_seconds: float | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None
    atomic: bool | None = None
    unique_for_seconds: float | None = None  # the window's length (its slots); None: not unique
    unique_states: tuple[str, ...] = DEFAULT_UNIQUE_STATES

    def params(self) -> dict[str, Any]:
        """The columns' statement parameters (``due_at/sql/schedule.sql``): every insert takes them whole."""
        return {
            "due_at": self.due_at,
            "delay": self.delay_seconds or 0.0,
            "lease_seconds": self.lease_seconds,
            "max_attempts": self.max_attempts,
            "key": self.key,
            "owner_id": self.owner_id,
            "priority": self.priority,
            "timeout_seconds": self.timeout_seconds,
            "backoff_base_seconds": self.backoff_base_seconds,
            "backoff_cap_seconds": self.backoff_cap_seconds,
            "atomic": self.atomic,
        }


@dataclasses.dataclass(frozen=True)
class StandingOptions:
    """A recurrence's job options checked against its kind: what its store writes (None: the kind's, at each plan)."""

    key: str | None
    owner_id: int | None
    max_attempts: int | None
    priority: int | None

    def params(self) -> dict[str, Any]:
        """The recurrence's columns (``recurring/sql/recurrences.sql``): its inserts and updates take them whole."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What a door was asked for one job (or every job of a ``schedule_many``); unchecked until ``validated``."""

    due_at: dt.datetime | None = None
    delay: float | int | dt.timedelta | None = None
    key: str | None = None
    on_conflict: str = "replace"
    max_attempts: int | None = None
    owner: Any = None  # a user, a user id, or None (the system's)
    priority: int | None = None
    timeout: float | dt.timedelta | None = None
    backoff: registry.Backoff | None = None
    atomic: bool | None = None
    unique_for: float | dt.timedelta | None = None  # seconds or a timedelta; 0: not unique; None: the kind's
    unique_states: Sequence[str] | None = None  # None: the kind's, else DEFAULT_UNIQUE_STATES; kept as a tuple

    def __post_init__(self) -> None:
        states = self.unique_states
        if isinstance(states, Sequence) and not isinstance(states, (str, tuple)):  # a list would not hash
            object.__setattr__(self, "unique_states", tuple(states))  # anything else: validated() says what is wrong

    def using(self, **changes: Any) -> JobOptions:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def validated(self, kind: registry.Kind) -> ValidOptions:
        """Check every option against ``kind`` (the doors' shared checks, in the order they always ran)."""
        due_at, delay = validation.resolve_time(self.due_at, self.delay)
        validation.check_key(self.key)
        if self.on_conflict not in ON_CONFLICT_CHOICES:
            raise exceptions.InvalidSchedule(
                f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}, got {self.on_conflict!r}."
            )
        max_attempts = validation.check_max_attempts(kind, self.max_attempts)
        priority = validation.check_priority(kind, self.priority)
        backoff = validation.check_backoff(self.backoff)
        return ValidOptions(
            due_at=due_at,
            delay_seconds=delay,
            key=self.key,
            on_conflict=self.on_conflict,
            max_attempts=max_attempts,
            owner_id=getattr(self.owner, "pk", self.owner),
            priority=priority,
            lease_seconds=kind.lease_seconds,
            timeout_seconds=validation.check_timeout(self.timeout),
            backoff_base_seconds=backoff.base_seconds if backoff else None,
            backoff_cap_seconds=backoff.cap_seconds if backoff else None,
            atomic=validation.check_atomic(self.atomic),
            unique_for_seconds=_unique_for(kind, self.unique_for),
            unique_states=_unique_states(kind, self.unique_states),
        )

    def standing(self, kind: registry.Kind) -> StandingOptions:
        """Check what a recurrence keeps for its occurrences (key, attempts, priority) against ``kind``, None kept.

        A recurrence's occurrences have no time, timeout, backoff or atomicity of their own: those stay unset.
        """
        if (self.due_at, self.delay, self.timeout, self.backoff, self.atomic) != (None, None, None, None, None):
            raise exceptions.InvalidSchedule("A recurrence's occurrences take no due time, timeout, backoff or atomic.")
        validation.check_key(self.key)
        if self.max_attempts is not None:
            validation.check_max_attempts(kind, self.max_attempts)
        if self.priority is not None:
            validation.check_priority(kind, self.priority)
        return StandingOptions(
            key=self.key,
            owner_id=getattr(self.owner, "pk", self.owner),
            max_attempts=self.max_attempts,
            priority=self.priority,
        )


def _unique_for(kind: registry.Kind, value: float | dt.timedelta | None) -> float | None:
    """The window in seconds (the job's, else its kind's), None when not unique; ``InvalidSchedule`` if bad."""
    return kind.unique_for_seconds if value is None else check_unique_for(value)


def check_unique_for(value: Any) -> float | None:
    """A window (seconds or a timedelta) in seconds, None for 0 (not unique); ``InvalidSchedule`` unless valid."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_UNIQUE_FOR_SECONDS:
        raise exceptions.InvalidSchedule(
            f"unique_for must be seconds (or a timedelta) from 0 to {MAX_UNIQUE_FOR_SECONDS}, got {value!r}."
        )
    if seconds == 0:
        return None
    if seconds < 1:
        raise exceptions.InvalidSchedule(f"unique_for must be at least 1 second (or 0: not unique), got {value!r}.")
    return float(seconds)


def _unique_states(kind: registry.Kind, value: Sequence[str] | None) -> tuple[str, ...]:
    """The states that hold a window (the job's, else its kind's); ``InvalidSchedule`` unless valid."""
    return check_unique_states(kind.unique_states if value is None else value)


def check_unique_states(value: Any) -> tuple[str, ...]:
    """``value`` as a tuple of job states holding a window, in a fixed order; ``InvalidSchedule`` unless valid."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise exceptions.InvalidSchedule(f"unique_states must be a list of job states, got {value!r}.")
    unknown = sorted(set(value) - set(UNIQUE_STATES_CHOICES))
    if unknown:
        raise exceptions.InvalidSchedule(
            f"unique_states may hold {', '.join(UNIQUE_STATES_CHOICES)}; not {', '.join(unknown)}."
        )
    missing = [s for s in UNIQUE_STATES_ALWAYS if s not in value]
    if missing:
        raise exceptions.InvalidSchedule(
            f"unique_states must include {', '.join(UNIQUE_STATES_ALWAYS)} (a waiting or running job always "
            f"holds its window); missing {', '.join(missing)}."
        )
    return tuple(s for s in UNIQUE_STATES_CHOICES if s in value)
