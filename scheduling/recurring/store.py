"""Every statement of recurrences: the named blocks of ``recurring/sql/recurrences.sql``.

Recurrences are rows with a rule; each occurrence is a due_at job the planner creates when the
previous one has left pending. Rows come back by column name (``core.db``); decisions live in
``api.py``, ``planner.py`` and ``rules.py``. Only ``scheduling.recurring`` imports this module.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduling.core import db
from scheduling.core import options as options_
from scheduling.models import JobState

SQL = db.Statements(Path(__file__).with_name("sql"))


@dataclasses.dataclass(frozen=True)
class NewRecurrence:
    kind: str
    payload: Any
    expression: str
    every_seconds: float | None
    timezone: str
    dst_gap: str
    missed: str
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    anchor_at: dt.datetime | None
    options: options_.StandingOptions  # key, owner, attempts and priority, whole (core/options.py)
    recheck_access: bool = False  # made by an outside caller: the planner re-checks the owner's access


def _recurrence_params(new: NewRecurrence) -> dict[str, Any]:
    params = {field.name: getattr(new, field.name) for field in dataclasses.fields(new) if field.name != "options"}
    params["payload"] = json.dumps(new.payload)
    return {**params, **new.options.params()}


@dataclasses.dataclass(frozen=True)
class RecurrenceRow:
    """A recurrence as the planner and the API read it (locked)."""

    id: int
    kind: str
    expression: str
    every_seconds: float | None
    timezone: str
    dst_gap: str
    missed: str
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    anchor_at: dt.datetime
    current_at: dt.datetime | None
    priority: int | None
    max_attempts: int | None
    payload: db.Json = None
    key: str = ""
    owner_id: int | None = None
    state: str = "active"
    current_job_id: int | None = None
    current_state: JobState | None = None
    recheck_access: bool = False


def insert_recurrence(new: NewRecurrence) -> int | None:
    """Insert a recurrence; None when its owner already has the key."""
    recurrence_id: int | None = SQL.fetch_value("insert_recurrence", _recurrence_params(new))
    return recurrence_id


@dataclasses.dataclass(frozen=True)
class CreatedRecurrence:
    id: int
    key: str
    owner_id: int | None
    timezone: str


def insert_recurrences(
    new: NewRecurrence,
    payloads: Sequence[str],
    keys: Sequence[str],
    owner_ids: Sequence[int | None],
    zones: Sequence[str],
) -> list[CreatedRecurrence]:
    """Insert many recurrences sharing ``new``'s rule (payloads already JSON); taken keys are skipped."""
    params = _recurrence_params(new)
    params.update(payloads=list(payloads), keys=list(keys), owner_ids=list(owner_ids), timezones=list(zones))
    return SQL.fetch_all(CreatedRecurrence, "insert_recurrences", params)


def lock_recurrence(recurrence_id: int) -> RecurrenceRow | None:
    """The recurrence's row, locked until the transaction ends (None: no such recurrence)."""
    return SQL.fetch_one(RecurrenceRow, "lock_recurrence", {"id": recurrence_id})


def recurrence_id_by_key(key: str, owner_id: int | None) -> int | None:
    recurrence_id: int | None = SQL.fetch_value("recurrence_id_by_key", {"key": key, "owner_id": owner_id})
    return recurrence_id


def update_recurrence_rule(row: RecurrenceRow, options: options_.StandingOptions) -> bool:
    """Write a changed rule, payload and policies, with the job options ``options`` (whole; not its key or owner)."""
    params = dataclasses.asdict(row)
    params["payload"] = json.dumps(row.payload)
    params.update(max_attempts=options.max_attempts, priority=options.priority)
    return bool(SQL.fetch_values("update_recurrence_rule", params))


def last_run_occurrence_at(recurrence_id: int) -> dt.datetime | None:
    last: dt.datetime | None = SQL.fetch_value("last_run_occurrence_at", {"id": recurrence_id})
    return last


@dataclasses.dataclass(frozen=True)
class MovedOccurrence:
    """The job of a recurrence's pending occurrence, moved: its due time and how far off by the database clock."""

    id: int
    due_at: dt.datetime
    in_seconds: float


@dataclasses.dataclass(frozen=True)
class OccurrenceOptions:
    """What an occurrence's job gets from its kind and its recurrence: lease, attempts budget, priority."""

    lease_seconds: int
    max_attempts: int
    priority: int


def move_pending_occurrence(
    recurrence_id: int, occurrence_at: dt.datetime, due_at: dt.datetime, options: OccurrenceOptions
) -> MovedOccurrence | None:
    """Move the recurrence's pending occurrence, with the options of its (maybe new) kind (None: no longer pending)."""
    params = {"id": recurrence_id, "occurrence_at": occurrence_at, "due_at": due_at, **dataclasses.asdict(options)}
    return SQL.fetch_one(MovedOccurrence, "move_pending_occurrence", params)


def set_recurrence_current(recurrence_id: int, current_at: dt.datetime | None) -> bool:
    return bool(SQL.fetch_values("set_recurrence_current", {"id": recurrence_id, "current_at": current_at}))


def set_recurrences_state(ids: Sequence[int], state: str, from_states: Sequence[str]) -> list[int]:
    params = {"ids": list(ids), "state": state, "from_states": list(from_states)}
    return SQL.fetch_values("set_recurrences_state", params)


def cancel_pending_occurrences(recurrence_ids: Sequence[int], reason: str) -> list[int]:
    """Stop each recurrence's occurrences: pending ones (retries too) cancelled with ``reason`` as their last
    error, a claimed or running one left no retry and retired. Returns the jobs cancelled.

    Two statements: the live occurrences are locked first (waiting for a chunk that runs one), so the
    second sees what that chunk left.
    """
    if not recurrence_ids:
        return []
    params = {"ids": list(recurrence_ids), "reason": reason}
    SQL.fetch_values("lock_live_occurrences", params)
    return SQL.fetch_values("cancel_pending_occurrences", params)


def pause_recurrences_for(reasons: Sequence[tuple[int, str]]) -> list[int]:
    """Pause the still active recurrences among (id, reason) pairs, each with its reason; returns those paused."""
    if not reasons:
        return []
    params = {"ids": [r[0] for r in reasons], "reasons": [r[1] for r in reasons]}
    return SQL.fetch_values("pause_recurrences_for", params)


def adopt_live_occurrence(recurrence_id: int) -> int | None:
    """Make the recurrence's live occurrence (one still running) its latest; its job id, or None when it has none."""
    job_id: int | None = SQL.fetch_value("adopt_live_occurrence", {"id": recurrence_id})
    return job_id


def owner_recurrences(owner_id: int, limit: int) -> int:
    """``owner_id``'s active and paused recurrences, counted up to ``limit`` + 1."""
    count: int = SQL.fetch_value("owner_recurrences", {"owner_id": owner_id, "limit": limit})
    return count


def recurrence_states(ids: Sequence[int]) -> dict[int, str]:
    return SQL.fetch_pairs("recurrence_states", {"ids": list(ids)})


def pick_recurrences_to_plan(limit: int, kinds: Sequence[str]) -> list[RecurrenceRow]:
    """Lock up to ``limit`` active recurrences of ``kinds`` whose latest occurrence has left pending (SKIP LOCKED).

    Run in the planner's own transaction (``planner.plan_once``), with JIT off for the rest of it
    (``db.NO_JIT``): its estimate grows with the due recurrences (9,947 at 88,000 due in a spike).
    """
    params = {"limit": limit, "kinds": list(kinds)}
    return SQL.fetch_all(RecurrenceRow, "pick_recurrences_to_plan", params, prefix=db.NO_JIT)


@dataclasses.dataclass(frozen=True)
class PlannedOccurrence:
    """The next occurrence of a recurrence, as the planner or the API computed it."""

    recurrence_id: int
    prev: dt.datetime | None  # the latest occurrence instant the caller read
    occurrence_at: dt.datetime
    due_at: dt.datetime
    lease_seconds: int
    max_attempts: int
    priority: int

    @classmethod
    def of(
        cls,
        recurrence_id: int,
        prev: dt.datetime | None,
        at: dt.datetime,
        due_at: dt.datetime,
        options: OccurrenceOptions,
    ) -> PlannedOccurrence:
        """The occurrence with its job options (field by field: ``dataclasses.asdict`` deep-copies, and the
        planner and ``recur_many`` build one per row: it was half of a 5,000-row planner pass's Python)."""
        return cls(recurrence_id, prev, at, due_at, options.lease_seconds, options.max_attempts, options.priority)


@dataclasses.dataclass(frozen=True)
class CreatedOccurrence:
    recurrence_id: int
    job_id: int
    occurrence_at: dt.datetime
    due_at: dt.datetime
    in_seconds: float


def plan_occurrences(plans: Sequence[PlannedOccurrence]) -> list[CreatedOccurrence]:
    """Create the planned occurrences and advance their recurrences in one statement (at most once each)."""
    if not plans:
        return []
    params = {
        "ids": [p.recurrence_id for p in plans],
        "prevs": [p.prev for p in plans],
        "ats": [p.occurrence_at for p in plans],
        "dues": [p.due_at for p in plans],
        "leases": [p.lease_seconds for p in plans],
        "attempts": [p.max_attempts for p in plans],
        "priorities": [p.priority for p in plans],
    }
    return SQL.fetch_all(CreatedOccurrence, "plan_occurrences", params)


def end_recurrences(ends: Sequence[tuple[int, dt.datetime | None]]) -> list[int]:
    """Mark ended the recurrences (id, latest instant read) with no occurrence left before their end."""
    if not ends:
        return []
    params = {"ids": [e[0] for e in ends], "prevs": [e[1] for e in ends]}
    return SQL.fetch_values("end_recurrences", params)
