"""Task functions for the Tasks backend's tests: each leaves a trace the tests can read."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.db import transaction

from scheduling import backends, registry
from scheduling.backends import TaskContext
from tasks.models import Execution

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    """Add two numbers (the return value is kept)."""
    return a + b


@task(priority=50, queue_name="default")
def record(label: str) -> dict[str, Any]:
    """Record an Execution row labelled ``label`` (an atomic task's effect) and return it."""
    row = Execution.objects.create(idempotency_key=label, kind="tests.taskkit.record", pid=os.getpid())
    return {"label": label, "execution": row.id, "pid": row.pid}


@task(takes_context=True)
def flaky(context: TaskContext, fail_until: int) -> dict[str, Any]:
    """Fail on attempts below ``fail_until``, then return what the context said."""
    if context.attempt < fail_until:
        raise ValueError(f"attempt {context.attempt} fails on purpose")
    return {"attempt": context.attempt, "id": context.task_result.id, "status": str(context.task_result.status)}


@task
async def async_double(n: int) -> int:
    """A coroutine task: run on the worker through async_to_sync."""
    await asyncio.sleep(0)
    return n * 2


@task
def not_json() -> object:
    """Return something JSON cannot hold (the task fails)."""
    return object()


@backends.task(max_attempts=1, timeout=1, atomic=False)
def sleepy(seconds: float) -> None:
    """Sleep past the one-second timeout of its kind."""
    import time

    time.sleep(seconds)


@backends.task(max_attempts=1, timeout=1, atomic=False)
async def async_sleepy(label: str, seconds: float) -> None:
    """Await ``seconds`` past the one-second timeout of its kind, then record an Execution labelled ``label``."""
    from asgiref.sync import sync_to_async

    await asyncio.sleep(seconds)
    await sync_to_async(_record_execution, thread_sensitive=False)(label)


def _record_execution(label: str, kind: str = "tests.taskkit.async_sleepy") -> None:
    """Record (and commit, on a connection of this thread) an Execution row labelled ``label``."""
    from django.db import connection

    try:
        Execution.objects.create(idempotency_key=label, kind=kind, pid=os.getpid())
    finally:
        connection.close()


@backends.task(max_attempts=2, api=registry.Access())
def open_to_users(note: str) -> str:
    """A task any authenticated user may enqueue through the JSON API."""
    transaction.on_commit(lambda: None)
    return note


@backends.task(rate="2/h")
def rated(n: int) -> int:
    """A task whose kind starts at most twice an hour (the Tasks backend's rate option)."""
    return n


@backends.task(takes_context=True, atomic=False, backoff=registry.Backoff(0.05, 0.1))
def exits(context: TaskContext, label: str, code: int = 3) -> None:
    """Record an Execution (committed: not atomic) with this process's pid, then call sys.exit(code)."""
    import sys

    Execution.objects.create(idempotency_key=f"{label}:{context.attempt}", kind="exits", pid=os.getpid())
    sys.exit(code)


@task
def interrupted() -> None:
    """Raise KeyboardInterrupt (a pool process ignores SIGINT: this is the task's own)."""
    raise KeyboardInterrupt("the task's own interrupt")


@task
def text_of(size: int) -> str:
    """Return ``size`` characters (a return value as large as asked)."""
    return "x" * size


@task
def unstorable(which: str) -> Any:
    """Return what JSON takes but PostgreSQL does not: NaN, a NUL, a lone surrogate."""
    return {"nan": [float("nan")], "nul": "a\x00b", "surrogate": "\ud800"}[which]


@task(takes_context=True)
def whose(context: TaskContext) -> dict[str, Any]:
    """Return the owner and result id the context gives."""
    return {"owner_id": context.owner_id, "id": context.task_result.id}


@backends.task(atomic=False, timeout=60, takes_context=True)
def holds(context: TaskContext, label: str, seconds: float) -> str:
    """Record an Execution (committed: not atomic) for this attempt, then hold the worker ``seconds``."""
    import time

    Execution.objects.create(idempotency_key=f"{label}:{context.attempt}", kind="holds", pid=os.getpid())
    time.sleep(seconds)
    return label


ABORTABLE_HOLD_SECONDS = 120.0  # how long ``abortable`` holds its worker unless aborted


@backends.task(max_attempts=1, timeout=300)
def abortable(label: str) -> str:
    """Write an Execution ``label`` (atomic: it commits with the task), say so, then hold the worker in one sleep.

    "Say so" is a row ``label:started`` committed at once on another connection (a thread's), so a test
    knows the atomic row was written before it aborts; ``label:woke`` likewise if the sleep ran to its end.
    """
    import time

    Execution.objects.create(idempotency_key=label, kind="tests.taskkit.abortable", pid=os.getpid())
    _committed_now(f"{label}:started")
    time.sleep(ABORTABLE_HOLD_SECONDS)
    _committed_now(f"{label}:woke")
    return label


def _committed_now(label: str) -> None:
    """Record an Execution ``label`` committed at once, outside the running task's transaction (a thread's)."""
    import threading

    marker = threading.Thread(target=_record_execution, args=(label, "tests.taskkit.abortable"))
    marker.start()
    marker.join()


@task
def chooses(outcome: str) -> None:
    """Raise the handler-chosen outcome named (``snooze``, ``discard`` or ``cancel``)."""
    if outcome == "snooze":
        raise registry.Snooze(60)
    if outcome == "discard":
        raise registry.Discard("the invoice was already paid")
    raise registry.Cancel("the customer left")
