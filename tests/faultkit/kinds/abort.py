"""Job kinds for the abort tests: write a row, then hold the worker in one blocking sleep until aborted.

``faults.abort_atomic`` runs in its chunk's transaction (its row must never commit once aborted);
``faults.abort_committing`` commits its row at once (it stays: committing jobs keep what they wrote).
"""

from __future__ import annotations

import os
import time

from scheduling import registry
from tasks.models import Execution

SCHEMA = {
    "type": "object",
    "properties": {"hold": {"type": "number", "minimum": 0, "maximum": 300}},
    "additionalProperties": False,
}
HOLD_SECONDS = 120.0  # how long a handler holds its worker unless aborted


def hold(job: registry.Job) -> None:
    """Record the execution, then sleep ``hold`` seconds in one blocking call."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    time.sleep(float(job.payload.get("hold", HOLD_SECONDS)))


registry.handler("faults.abort_atomic", schema=SCHEMA, timeout=300, lease_seconds=30, max_attempts=1)(hold)
registry.handler("faults.abort_committing", schema=SCHEMA, timeout=300, lease_seconds=30, max_attempts=1, atomic=False)(
    hold
)
