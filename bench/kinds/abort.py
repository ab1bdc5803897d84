"""``bench.abort``: the abort scenario's handler: one ORM insert (atomic: it commits with the job), then a long sleep.

An aborted job's row must never commit (``aborted_committed_writes``); a sleep is one blocking call
the abort must interrupt, as a long external request would be.
"""

from __future__ import annotations

import os
import time

from scheduling import registry
from tasks.models import Execution

KIND = "bench.abort"
HOLD_SECONDS = 120.0  # far longer than any abort may take: a handler still running then was never interrupted

registry.handler(KIND, schema={"type": "object"}, timeout=600, lease_seconds=60, max_attempts=1, batch_size=1)(
    lambda job: (
        Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid()),
        time.sleep(HOLD_SECONDS),
    )
)
