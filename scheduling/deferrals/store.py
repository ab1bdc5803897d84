"""The one statement of broker deferrals: the named block of ``deferrals/sql/deferrals.sql``.

A deferral lives in the broker; the table sees it only when its attempts are spent and it becomes
a dead row a person can see and retry. Only ``scheduling.deferrals`` imports this module.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from scheduling.core import db

SQL = db.Statements(Path(__file__).with_name("sql"))


def record_dead_deferral(
    *,
    kind: str,
    payload: Any,
    due_at: dt.datetime | None,
    attempts: int,
    error: str,
    key: str,
    lease_seconds: int,
) -> int | None:
    """Record a spent broker deferral as a dead row; its id, or None if that key is already recorded dead."""
    params = {
        "kind": kind,
        "payload": json.dumps(payload),
        "due_at": due_at,
        "attempts": max(1, attempts),
        "error": error,
        "key": key,
        "lease_seconds": max(1, lease_seconds),
    }
    job_id: int | None = SQL.fetch_value("record_dead_deferral", params)
    return job_id
