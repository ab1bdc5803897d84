"""Timekeeper's tunables: each a Django setting with a default here, its unit in its name."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # due_at engine
    "SCHEDULING_CLAIM_BATCH_SIZE": 500,  # rows: the most one claim statement takes
    "SCHEDULING_DEFAULT_BATCH_SIZE": 50,  # jobs: per run_batch message unless the kind says otherwise
    "SCHEDULING_CLAIM_INTERVAL_SECONDS": 1.0,  # beat fires the claim this often
    "SCHEDULING_CLAIM_LOOP_SECONDS": 30.0,  # the claim loop hands over (recycling its process) this often
    "SCHEDULING_MAX_QUEUED_BATCHES": 20,  # messages: no claim while the queue holds this many
    "SCHEDULING_HEARTBEAT_SECONDS": 10.0,  # 0 turns heartbeats off (then the claimed_at rule applies)
    "SCHEDULING_LEASE_SECONDS": 60,  # a claim whose heartbeat is older than this is dead
    "SCHEDULING_SWEEP_AFTER_SECONDS": 900,  # claimed_at rule used when heartbeats are off
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": 60,
    "SCHEDULING_RETENTION_DAYS": 14,  # finished jobs and attempts older than this are pruned
    "SCHEDULING_PRUNE_BATCH_SIZE": 200,  # rows per prune statement: ~10-20 ms each, far under 100 ms (bench sweep)
    "SCHEDULING_DEFAULT_MAX_ATTEMPTS": 5,
    "SCHEDULING_DEFAULT_TIMEOUT_SECONDS": 300,
    "SCHEDULING_MAX_PAYLOAD_BYTES": 64 * 1024,
    "SCHEDULING_MAX_PAYLOAD_DEPTH": 32,  # levels of nested lists/objects a payload may have
    "SCHEDULING_STUCK_AFTER_SECONDS": 300,  # claimed longer than this counts as stuck in status
    "SCHEDULING_STATUS_EXACT_LIMIT": 10_000,  # rows: pending counts above this are planner estimates in status
    "SCHEDULING_ASYNC_COMMIT": True,  # claim-path commits skip the WAL flush wait (store._fetchall_async_commit)
    # broker path
    "SCHEDULING_BROKER_DELAY_MAX_SECONDS": 900,  # like SQS DelaySeconds; must stay below the visibility timeout
    "SCHEDULING_VISIBILITY_MARGIN_SECONDS": 300,  # the ceiling must sit this far below the visibility timeout
    "SCHEDULING_HANDLER_PACKAGES": ["tasks"],
    # fixed-time schedules
    "SCHEDULING_FIXED_LATE_SECONDS": 60,  # beat still sends a tick it notices this late; older ones are missed
    "SCHEDULING_FIXED_MAX_CATCH_UP": 100,  # ticks: the most catch-up runs one planning step sends (run_all)
    "SCHEDULING_FIXED_RECHECK_SECONDS": 60,  # beat re-reads a fixed-time schedule at least this often
    "SCHEDULING_FIXED_REPLACE_WAIT_SECONDS": 10,  # replace: how long a new run waits for the stopped one's lock
    "SCHEDULING_FIXED_CLOCK_SYNC_SECONDS": 30,  # beat re-measures its offset to the database clock this often
}


def get(name: str) -> Any:
    """A tunable's value: the Django setting if defined, else the default above."""
    if name not in DEFAULTS:
        raise KeyError(f"{name} is not a Timekeeper setting")
    return getattr(settings, name, DEFAULTS[name])
