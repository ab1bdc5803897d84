"""Readable task names in Flower and worker logs: the job's kind, not Timekeeper's plumbing.

Timekeeper's Celery tasks are generic (``scheduling.run_batch`` runs any kind, ``scheduling.run_fixed``
any schedule), so Flower would show every job under four names. Celery's ``shadow`` header
replaces the name shown in monitoring and logs without changing which task runs:

- ``scheduling.run_batch`` -> ``batch:<kind>``, e.g. ``batch:reminders.trial_ending`` (``claim``
  passes it: a batch holds one kind, and the message carries only ids and tokens). The kind's own
  name is left to its jobs: each job's attempt reaches Flower as a task of that name with its true
  state (``scheduling.due_at.task_events``), so a batch that ran a failing job is not shown as
  that job succeeding;
- ``scheduling.run_deferred`` -> the deferral's kind (its first argument);
- ``scheduling.run_fixed`` -> ``fixed:<schedule name>`` (its ``schedule`` keyword argument).

The last two are named by ``name_message``, a ``before_task_publish`` receiver connected when this
module is imported (``claim`` imports it, so every process that sends these messages has it),
which fills in the header only when the sender did not set one.
"""

from __future__ import annotations

from typing import Any

from celery import signals

CLAIM = "scheduling.claim"
SWEEP = "scheduling.sweep"
RUN_BATCH = "scheduling.run_batch"
RUN_DEFERRED = "scheduling.run_deferred"
RUN_FIXED = "scheduling.run_fixed"
MAX_NAME_LENGTH = 200


def batch(kind: str) -> str:
    """The name a batch of ``kind`` jobs shows under (its jobs show under ``kind``)."""
    return f"batch:{kind}"[:MAX_NAME_LENGTH]


def deferral(kind: str) -> str:
    """The name a broker deferral of ``kind`` shows under."""
    return kind[:MAX_NAME_LENGTH]


def fixed(schedule: str) -> str:
    """The name a run of the fixed-time schedule ``schedule`` shows under."""
    return f"fixed:{schedule}"[:MAX_NAME_LENGTH]


def shadow_for(task_name: str, args: Any, kwargs: Any) -> str | None:
    """The readable name of a message of ``task_name`` with these arguments (None: keep the task's name)."""
    if task_name == RUN_DEFERRED:
        kind = (kwargs or {}).get("kind") or (args[0] if args else None)
        return deferral(kind) if isinstance(kind, str) and kind else None
    if task_name == RUN_FIXED:
        schedule = (kwargs or {}).get("schedule") or (args[0] if args else None)
        return fixed(schedule) if isinstance(schedule, str) and schedule else None
    return None


@signals.before_task_publish.connect(dispatch_uid="timekeeper-readable-task-names")
def name_message(sender: str | None = None, body: Any = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Set the ``shadow`` header of a deferral or fixed-time message that has none (protocol 2 bodies)."""
    if headers is None or headers.get("shadow") or sender not in {RUN_DEFERRED, RUN_FIXED}:
        return
    try:
        args, kwargs = body[0], body[1]
    except (TypeError, IndexError, KeyError):
        return
    name = shadow_for(sender, args, kwargs)
    if name:
        headers["shadow"] = name
