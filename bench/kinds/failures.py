"""``bench.failures``: the realistic handler (one ORM insert), with a fate per job chosen by the payload.

- ``raise``: fails on its first attempt (a downstream error), succeeds on the retry;
- ``timeout``: works past the kind's 1 s timeout on its first attempt, succeeds on the retry;
- ``callback``: succeeds, and its ``transaction.on_commit`` callback raises (every attempt);
- otherwise: succeeds, its callback runs.

Every call is counted in Redis (``CALLS``, field ``<job id>:<attempt>``: a direct external effect),
every callback that ran too (``CALLBACKS``, field ``<job id>``), so the benchmark can say how many
handler calls each attempt made and how many callbacks ran, whatever was rolled back.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from django.db import transaction

from scheduling import registry
from tasks.models import Execution

KIND = "bench.failures"
TIMEOUT_SECONDS = 1.0
OVERRUN_SECONDS = 1.5  # how long a "timeout" job works: past the timeout
CALLS = "bench-failures:calls"
CALLBACKS = "bench-failures:callbacks"
_client: Any = None


class DownstreamError(RuntimeError):
    """The failure a ``raise`` job's first attempt meets."""


class CallbackError(RuntimeError):
    """The failure a ``callback`` job's on_commit callback raises."""


def counters() -> Any:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ.get("BENCH_COUNTER_URL", "redis://127.0.0.1:6379/14"))
    return _client


def handle(job: registry.Job) -> None:
    counters().hincrby(CALLS, f"{job.id}:{job.attempt}", 1)
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    fate = job.payload.get("fate", "")
    transaction.on_commit(lambda: _committed(job.id, fate))
    if job.attempt == 1 and fate == "raise":
        raise DownstreamError("the downstream service refused, on purpose")
    if job.attempt == 1 and fate == "timeout":
        time.sleep(OVERRUN_SECONDS)


def _committed(job_id: int | None, fate: str) -> None:
    if fate == "callback":
        raise CallbackError("the on_commit callback fails, on purpose")
    counters().hincrby(CALLBACKS, str(job_id), 1)


registry.handler(
    KIND,
    schema={"type": "object", "properties": {"fate": {"enum": ["", "raise", "timeout", "callback"]}}},
    timeout=TIMEOUT_SECONDS,
    max_attempts=3,
    backoff=registry.Backoff(0.2, 0.4),
)(handle)
