"""``chaos.external``: an atomic job whose external effect (a line in a file) is sent from ``on_commit``.

The line is appended to ``$CHAOS_EFFECTS_FILE`` (one ``write`` of a short line with ``O_APPEND``:
whole lines, whatever the processes), after the job's database effect and its ``done`` commit.
A duplicate line is a duplicate external effect.
"""

from __future__ import annotations

import os

from django.db import transaction

from scheduling import registry
from tasks.models import Execution


def _append(line: str) -> None:
    path = os.environ.get("CHAOS_EFFECTS_FILE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@registry.handler("chaos.external", schema={"type": "object"}, timeout=30, max_attempts=5)
def external(job: registry.Job) -> None:
    """Record the run in the database, and the external effect once the transaction commits."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    key = job.idempotency_key
    transaction.on_commit(lambda: _append(key))
