"""Task functions for the conformance suite (tests/conformance): the shapes Django's and django-tasks' suites use.

Failing tasks try once (``max_attempts=1``), as Django's own backends do, so one run ends them FAILED.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from scheduling import backends
from scheduling.backends import TaskContext

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task
def noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing with any arguments."""


@task
async def noop_async(*args: Any, **kwargs: Any) -> None:
    """Do nothing, as a coroutine."""
    await asyncio.sleep(0)


@task
def meaning_of_life() -> int:
    """Return 42."""
    return 42


@backends.task(max_attempts=1)
def fails_with_value_error() -> None:
    """Raise ValueError with a message."""
    raise ValueError("This task failed due to ValueError")


@backends.task(max_attempts=1)
def fails_with_system_exit() -> None:
    """Raise SystemExit with a message (the task's own exit)."""
    raise SystemExit("This task failed due to SystemExit")


@backends.task(max_attempts=1)
def calls_sys_exit() -> None:
    """Call sys.exit(1): the worker must survive it."""
    sys.exit(1)


@backends.task(max_attempts=1)
def fails_with_nested_exception() -> None:
    """Raise an exception whose argument is an exception (its repr is in the traceback)."""
    raise ValueError(ValueError("This task failed"))


@backends.task(max_attempts=1)
def returns_what_json_cannot_hold() -> Any:
    """Return a value JSON cannot hold."""
    return {"a": object()}


@task(takes_context=True)
def own_result_id(context: TaskContext) -> str:
    """Return the result id the context gives."""
    return context.task_result.id


@task(takes_context=True)
def reads_its_context(context: TaskContext, expected_attempt: int) -> dict[str, Any]:
    """Check the context's attempt and task result, and return what it saw."""
    assert context.attempt == expected_attempt, context.attempt
    assert context.task_result.status == "RUNNING", context.task_result.status
    return {"attempt": context.attempt, "path": context.task_result.task.module_path}
