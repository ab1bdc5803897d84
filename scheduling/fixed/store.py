"""Every statement of fixed-time work: the named blocks of ``fixed/sql/ledger.sql``.

The run ledger (the exactly-once gate's insert, a run's outcome, the overlap policies' look-ups),
missed ticks, history limits, beat's progress and the safe-edit anchor. Rows come back by column
name (``core.db``); decisions live in ``gate.py``, ``beat.py``, ``ticks.py`` and ``policies.py``.
Only ``scheduling.fixed`` imports this module.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from scheduling.core import broker, db
from scheduling.models import RunState

SQL = db.Statements(Path(__file__).with_name("sql"))


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """What the gate's insert returned: the run row, whether this delivery created it, and how late it is."""

    id: int
    inserted: bool
    tick: dt.datetime
    state: RunState
    late_seconds: float


def insert_schedule_run(
    schedule_id: int,
    tick: dt.datetime | None,
    trigger: str,
    worker: str,
    task_id: str,
    *,
    holds_lock: bool = False,
    deadline_seconds: float | None = None,
) -> LedgerEntry | None:
    """Record (schedule, tick) as running, or count a duplicate; None when the tick was pruned already.

    ``holds_lock`` and ``deadline_seconds``: what the run is admitted under (the orphan duty judges it by them).
    """
    params = {
        "schedule_id": schedule_id,
        "tick": tick,
        "trigger": trigger,
        "worker": worker,
        "task_id": task_id,
        "holds_lock": holds_lock,
        "deadline_seconds": deadline_seconds,
    }
    return SQL.fetch_one(LedgerEntry, "insert_schedule_run", params)


def finish_schedule_run(run_id: int, state: RunState, error: str = "") -> bool:
    """Record a run's outcome; False when it was no longer running (replaced or closed meanwhile)."""
    return bool(SQL.fetch_values("finish_schedule_run", {"id": run_id, "state": state, "error": error}))


def set_schedule_run_attempt(run_id: int, attempt: int) -> bool:
    return bool(SQL.fetch_values("set_schedule_run_attempt", {"id": run_id, "attempt": attempt}))


@dataclasses.dataclass(frozen=True)
class RunningRun:
    """A fixed-time run marked running: where it runs, to stop it (replace)."""

    id: int
    task_id: str  # its Celery task id ('' when unknown)
    worker: str
    tick: dt.datetime
    holds_lock: bool | None = None  # False: admitted under allow, before an edit (it holds no lock)


def running_schedule_runs(schedule_id: int, exclude_id: int) -> list[RunningRun]:
    """The schedule's other runs marked running, oldest tick first."""
    return SQL.fetch_all(RunningRun, "running_schedule_runs", {"schedule_id": schedule_id, "id": exclude_id})


def close_other_running_runs(
    schedule_id: int, exclude_id: int, state: RunState, error: str, *, unlocked_too: bool = False
) -> list[int]:
    """Close the schedule's other running runs that took its lock (and, ``unlocked_too``, those that did not)."""
    params = {
        "schedule_id": schedule_id,
        "id": exclude_id,
        "state": state,
        "error": error,
        "unlocked_too": unlocked_too,
    }
    return SQL.fetch_values("close_other_running_runs", params)


@dataclasses.dataclass(frozen=True)
class RunToCheck:
    """A run marked running, with its schedule's overlap policy, kind, deadline and history limits."""

    id: int
    schedule_id: int
    concurrency_policy: str
    kind: str
    active_deadline_seconds: int | None
    successful_history_limit: int
    failed_history_limit: int
    age_seconds: float  # since the gate admitted it, by the database clock
    holds_lock: bool | None = None  # admitted under forbid or replace (None: unknown, the policy's now)
    deadline_seconds: float | None = None  # its deadline as admitted (None: the policy's and kind's now)


def running_runs_to_check() -> list[RunToCheck]:
    """Every run still marked running (the orphan duty's candidates)."""
    return SQL.fetch_all(RunToCheck, "running_runs_to_check")


def close_orphan_run(run_id: int, error: str) -> bool:
    """Close a run its worker left as failed with ``error``; False when it had an outcome meanwhile."""
    return bool(SQL.fetch_values("close_orphan_run", {"id": run_id, "error": error}))


def record_missed_ticks(schedule_id: int, ticks: Sequence[dt.datetime], error: str) -> list[dt.datetime]:
    """Insert missed rows for ``ticks`` (those without a row yet); returns the ticks recorded."""
    if not ticks:
        return []
    return SQL.fetch_values("record_missed_ticks", {"schedule_id": schedule_id, "ticks": list(ticks), "error": error})


def prune_schedule_runs(schedule_id: int, successful: int, failed: int) -> int:
    """Delete history beyond the limits; returns how many rows went (``ledger.sql`` says which, and why not others)."""
    keep_manual = broker.visibility_timeout_seconds()  # a run-now message may come again until then
    params = {
        "schedule_id": schedule_id,
        "successful": successful,
        "failed": failed,
        "keep_manual_seconds": keep_manual,
    }
    return int(SQL.fetch_value("prune_schedule_runs", params))


def kind_paused(kind: str) -> bool:
    """Whether ``kind`` is paused (``api.pause``): its fixed-time ticks are then skipped at the gate."""
    return bool(SQL.fetch_value("kind_paused", {"kind": kind}))


def advance_last_tick(schedule_id: int, tick: dt.datetime) -> bool:
    return bool(SQL.fetch_values("advance_last_tick", {"schedule_id": schedule_id, "tick": tick}))


def move_anchor_for_timing(schedule_id: int, key: str, at: dt.datetime | None = None) -> dt.datetime | None:
    """Store a new timing fingerprint and move the anchor to ``at`` (default: database now).

    Returns the new anchor, or None when the fingerprint was already ``key`` (nothing changed).
    """
    anchor: dt.datetime | None = SQL.fetch_value(
        "move_anchor_for_timing", {"schedule_id": schedule_id, "key": key, "at": at}
    )
    return anchor


def request_run_abort(run_id: int, by: str) -> bool:
    """Ask the running run ``run_id`` to stop; False when it is not running."""
    return bool(SQL.fetch_values("request_run_abort", {"id": run_id, "by": by[:200]}))


@dataclasses.dataclass(frozen=True)
class RunAbort:
    by: str
    at: dt.datetime


def run_abort(run_id: int) -> RunAbort | None:
    """The abort asked for the running run ``run_id``, or None."""
    return SQL.fetch_one(RunAbort, "run_abort", {"id": run_id})
