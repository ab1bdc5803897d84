"""The database clock, and recording measured recovery times for the fault table in docs/fault-tolerance.md.

Every time here is PostgreSQL's (``clock_timestamp()``): the clock that decides what is due, and
the one the platform writes into ``claimed_at``, ``JobAttempt.started_at`` and ``finished_at``, so
a fault injected "now" and the recovery it causes are measured on one clock.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
from typing import Any

from django.db import connection

from tests.e2e import harness

RESULTS = harness.ARTIFACTS / "faults.json"


def db_now() -> dt.datetime:
    """PostgreSQL's clock at this instant (not the transaction start)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def seconds(later: dt.datetime, earlier: dt.datetime) -> float:
    return round((later - earlier).total_seconds(), 2)


def record(fault: str, holds: str, **measured: Any) -> None:
    """Print a fault's measurements and merge them into ``tests/artifacts/faults.json`` under ``fault``."""
    print(f"\n[fault] {fault}: {holds}; " + ", ".join(f"{k}={v}" for k, v in measured.items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        data[fault] = {"holds": holds, **measured}
        RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
