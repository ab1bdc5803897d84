"""A backend for Django's Tasks framework over the due_at engine: ``TimekeeperBackend``.

``TASKS = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend"}}`` makes Django's
``@task`` functions (``django.tasks`` on Django 6.0, the ``django-tasks`` backport on 5.2; the
same code imports whichever is there) run as Timekeeper jobs:

- **A task is a kind.** The first time a task is made (``@task`` at import), its kind is
  registered under the task's ``module_path`` (``shop.tasks.send_welcome``), with one handler that
  runs the function. So pause, cap, priority, rescue, retries with backoff, timeouts, metrics,
  traces and the admin apply to tasks as to any kind. Workers know a task once its module is
  imported: Celery's ``app.autodiscover_tasks()`` imports every installed app's ``tasks.py`` at
  worker start; tasks kept elsewhere go in ``SCHEDULING_HANDLER_PACKAGES``. A worker that does not
  know the kind retries the job a minute later, as for any unknown kind.
- **enqueue** is ``scheduling.api.schedule()``: one row in the caller's transaction (roll back and
  there is no task), ``due_at`` = ``run_after`` (aware datetimes only) or now; the payload is
  ``{"args", "kwargs", "queue_name", "priority"}``. The result id is the job id (as a string):
  ``cancel()`` / ``reschedule()`` here, or ``api.cancel(job_id=int(result.id))``.
- **Priority**: Django's -100..100 onto the claim's 0-9 (higher first): ``p <= 0`` is 0, the
  default of every kind (there is nothing below it in the claim), and ``1..100`` is
  ``ceil(p * 9 / 100)`` (1-11 -> 1, ..., 89-100 -> 9). Order is kept; negative priorities tie
  with the default.
- **Queues**: ``QUEUES`` (default ``["default"]``) lists the names a task may use; any other is
  ``InvalidTask``. The due_at engine has one queue, the table, ordered by priority then due time:
  the name is kept on the job (its payload's ``queue_name``, shown in the admin) and on the
  result, and does not route work to other workers.
- **Running**: the kind's handler sends ``task_started``, calls the function (a coroutine through
  ``async_to_sync``) with a ``TaskContext`` first when ``takes_context``, keeps the JSON return
  value in the job's ``return_value`` (written in the handler's transaction: an atomic task's
  value commits with its ``done``), and sends ``task_finished`` (SUCCESSFUL or FAILED) before the
  outcome is recorded. A failure is retried with the kind's backoff up to ``max_attempts`` (the
  result is READY again meanwhile), then FAILED.
- **Results** are read from the row and its attempts: READY (pending, or claimed and not
  started), RUNNING (started), SUCCESSFUL (done), FAILED (dead or cancelled); ``errors`` holds one
  ``TaskError`` per failed attempt (the exception's class path and its traceback, messages
  withheld as in every attempt; a timeout is ``scheduling.core.executor.JobTimeout``, a claim
  taken back from a dead worker ``scheduling.backends.WorkerLost``); ``worker_ids`` one worker per
  attempt. An id that is not a task's job raises ``TaskResultDoesNotExist``.

Timekeeper's extras: per task with ``@backends.task(..., max_attempts=, timeout=, backoff=,
atomic=, api=)`` (Django's ``@task`` arguments plus these: the kind's contract), per call with
``send_welcome.options(key=, on_conflict=, max_attempts=, owner=, timeout=, backoff=,
atomic=).enqueue(...)``: the call's ``timeout``, ``backoff`` and ``atomic`` are that job's own
(``scheduling.api.schedule(timeout=, backoff=, atomic=)``, kept on its row), used by the worker
in place of the kind's; the kind keeps the task's. ``api=`` (a ``registry.Access``) is per task
only: it is what makes a task schedulable through the JSON API; without it, it is not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.core import checks
from django.utils import timezone
from django.utils.module_loading import import_string

from scheduling import api
from scheduling.core import exceptions, executor, registry
from scheduling.core import options as job_options
from scheduling.due_at import api as due_at_api
from scheduling.due_at.api import ON_CONFLICT_CHOICES
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob

if TYPE_CHECKING:  # one set of names for the type checker; at run time, whichever framework is installed
    from django.tasks import signals
    from django.tasks import task as django_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.utils.json import normalize_json
else:
    try:  # Django 6.0+: the framework is built in
        from django.tasks import signals
        from django.tasks import task as django_task
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2: the django-tasks backport (0.12, whose API is Django 6.0's)
        from django_tasks import signals
        from django_tasks import task as django_task
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.utils import normalize_json

logger = logging.getLogger(__name__)

KIND_NAME_LIMIT = 100  # characters: ScheduledJob.kind's column; a task's module_path is its kind
PAYLOAD_SCHEMA: dict[str, Any] = {  # what a task's row holds; the JSON API checks the same
    "type": "object",
    "properties": {
        "args": {"type": "array"},
        "kwargs": {"type": "object"},
        "queue_name": {"type": "string"},
        "priority": {"type": "integer", "minimum": -100, "maximum": 100},
    },
    "required": ["args", "kwargs"],
    "additionalProperties": False,
}
PER_CALL_OPTIONS = ("key", "on_conflict", "max_attempts", "owner", "timeout", "backoff", "atomic")  # .options(...)
JOB_OVERRIDES = ("timeout", "backoff", "atomic")  # per call, they are the job's own (the kind keeps the task's)


class WorkerLost(exceptions.SchedulingError):
    """The class path of a task's error when its claim was taken back (the worker died or stopped)."""


def job_priority(priority: int) -> int:
    """Django's task priority (-100..100) as a claim priority (0-9): order kept, 0 and below is the default 0."""
    if priority <= 0:
        return registry.MIN_PRIORITY
    return min(registry.MAX_PRIORITY, math.ceil(priority * registry.MAX_PRIORITY / 100))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimekeeperTask(Task):
    """Django's ``Task`` with Timekeeper's extras (the backend's ``task_class``; ``@task`` makes these)."""

    key: str | None = None  # per call: at most one pending or claimed job per (owner, key)
    on_conflict: str = "replace"  # per call: what a second enqueue with a live key does: replace, keep, error
    max_attempts: int | None = None  # per task or per call; None: SCHEDULING_DEFAULT_MAX_ATTEMPTS
    owner: Any = None  # per call: the user the job belongs to (keys are per owner; the API shows it to them)
    timeout: float | None = None  # per task or per call: seconds, the handler is stopped past it
    backoff: registry.Backoff | None = None  # per task or per call: between failed attempts
    atomic: bool = True  # per task or per call: the function's database writes commit with the job's outcome
    api: registry.Access | None = None  # per task: who may enqueue it through the JSON API (None: nobody)
    per_call: bool = dataclasses.field(default=False, repr=False)  # made by options(): the kind is the declared task's
    overridden: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)  # JOB_OVERRIDES options() set

    def options(self, **changes: Any) -> TimekeeperTask:
        """A copy for one call with any of ``PER_CALL_OPTIONS`` changed (``api`` belongs to the task).

        ``timeout``, ``backoff`` and ``atomic`` given here are the job's own (``scheduling.api.schedule``
        checks them at enqueue: ``InvalidSchedule``); the task's kind keeps its declared ones.
        """
        unknown = set(changes) - set(PER_CALL_OPTIONS)
        if unknown:
            raise InvalidTask(
                f"{', '.join(sorted(unknown))}: not a per-call option (those are {', '.join(PER_CALL_OPTIONS)}); "
                "api belongs to the task: set it with @scheduling.backends.task(...)."
            )
        overridden = self.overridden | {name for name in JOB_OVERRIDES if name in changes}
        return dataclasses.replace(self, per_call=True, overridden=overridden, **changes)

    def job_overrides(self) -> dict[str, Any]:
        """The job's own timeout, backoff and atomic for ``scheduling.api.schedule`` (None: the kind's)."""
        return {name: getattr(self, name) if name in self.overridden else None for name in JOB_OVERRIDES}


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = 0,
    queue_name: str = "default",
    backend: str = "default",
    takes_context: bool = False,
    **extras: Any,
) -> Any:
    """Django's ``@task`` plus Timekeeper's per-task extras (max_attempts, timeout, backoff, atomic, api).

    The same on Django 6.0 and on the backport; ``backend`` must be a Timekeeper backend.
    """

    def wrapper(func: Callable[..., Any]) -> TimekeeperTask:
        made = django_task(  # type: ignore[call-overload]  # one call for both takes_context overloads
            priority=priority, queue_name=queue_name, backend=backend, takes_context=takes_context
        )(func)
        if not isinstance(made, TimekeeperTask):
            raise InvalidTask(
                f"TASKS[{backend!r}] is not scheduling.backends.TimekeeperBackend: no Timekeeper options."
            )
        fields = {f.name for f in dataclasses.fields(TimekeeperTask)} - {f.name for f in dataclasses.fields(Task)}
        fields -= {"per_call", "overridden", *PER_CALL_OPTIONS} - {"max_attempts", *JOB_OVERRIDES}
        unknown = set(extras) - fields
        if unknown:
            raise InvalidTask(
                f"Unknown task options: {', '.join(sorted(unknown))} (known: {', '.join(sorted(fields))})."
            )
        return dataclasses.replace(made, **extras) if extras else made

    return wrapper(function) if function is not None else wrapper


# --- Kinds: one per task, registered when the task is made ---------------------------------------

_tasks: dict[str, Task] = {}  # kind name (module_path) -> the task as declared
_handlers: dict[str, Callable[[registry.Job], None]] = {}  # kind name -> its handler (one object per kind)


def _register(task_obj: Task) -> None:
    """Register (again: idempotent) the kind that runs ``task_obj``, with the task's kind-level options.

    A per-call copy (``options()``) registers nothing: its ``max_attempts`` is the call's, not the kind's.
    """
    if getattr(task_obj, "per_call", False):
        return
    name = task_obj.module_path
    _tasks[name] = task_obj  # the latest declaration (or copy of it: the same kind options) wins
    run = _handlers.get(name)
    if run is None:
        run = _handlers[name] = _handler_for(name)
        run.__doc__ = task_obj.func.__doc__ or f"Django task {name}."
    registry.handler(
        name,
        schema=PAYLOAD_SCHEMA,
        timeout=getattr(task_obj, "timeout", None),
        max_attempts=getattr(task_obj, "max_attempts", None),
        backoff=getattr(task_obj, "backoff", None),
        atomic=getattr(task_obj, "atomic", True),
        api=getattr(task_obj, "api", None),
    )(run)


def task_for(kind: str) -> Task | None:
    """The task whose kind is ``kind``, importing its module if this process has not; None if it is no task."""
    known = _tasks.get(kind)
    if known is not None:
        return known
    try:
        found = import_string(kind)
    except ImportError:
        return None
    if isinstance(found, Task):
        return found
    return _tasks.get(kind)  # the import registered it under its function's path


def _handler_for(name: str) -> Callable[[registry.Job], None]:
    def run(job: registry.Job) -> None:
        _run(name, job)

    return run


def _run(name: str, job: registry.Job) -> None:
    """Run one task job on the worker: signals, context, the call, the return value kept with the outcome."""
    declared = _tasks[name]
    backend = declared.get_backend()
    sender = type(backend)
    assert job.id is not None
    row = ScheduledJob.objects.get(pk=job.id)
    running = _result(backend, row, declared, list(row.attempt_set.order_by("number")))
    signals.task_started.send(sender=sender, task_result=running)
    args, kwargs = list(job.payload.get("args", [])), dict(job.payload.get("kwargs", {}))
    try:
        call = running.task.func
        if running.task.takes_context:
            args.insert(0, TaskContext(task_result=running))
        value = async_to_sync(call)(*args, **kwargs) if iscoroutinefunction(call) else call(*args, **kwargs)
        value = normalize_json(value)
        ScheduledJob.objects.filter(pk=job.id, token=job.token).update(return_value=value)
    except (SystemExit, KeyboardInterrupt):  # the worker is stopping: the claim is given back, not failed
        raise
    except BaseException as exc:  # JobTimeout too: the kind's timeout stopped it
        failed = _changed(
            running,
            status=TaskResultStatus.FAILED,
            finished_at=timezone.now(),
            errors=[*running.errors, _error(exc)],
        )
        signals.task_finished.send(sender=sender, task_result=failed)
        raise
    done = _changed(running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(done, "_return_value", value)
    signals.task_finished.send(sender=sender, task_result=done)


def _error(exc: BaseException) -> TaskError:
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback=executor.scrubbed_traceback(exc)[-executor.TRACEBACK_LIMIT :],
    )


def _changed(result: TaskResult, **changes: Any) -> TaskResult:
    copy = dataclasses.replace(result, **changes)
    object.__setattr__(copy, "_return_value", getattr(result, "_return_value", None))
    return copy


# --- Results: read from the job's row and its attempts -------------------------------------------


def _attempt_error(attempt: JobAttempt) -> TaskError:
    """One failed attempt as Django's TaskError: the class path from the traceback's last line."""
    if attempt.outcome == AttemptOutcome.TIMED_OUT:
        path = f"{executor.JobTimeout.__module__}.{executor.JobTimeout.__qualname__}"
    elif attempt.outcome == AttemptOutcome.RECLAIMED:
        path = f"{WorkerLost.__module__}.{WorkerLost.__qualname__}"
    else:
        last = attempt.traceback.rstrip().rsplit("\n", 1)[-1]
        path = last.split(":", 1)[0].strip() if ": (message withheld)" in last else "builtins.Exception"
    return TaskError(exception_class_path=path, traceback=attempt.traceback or attempt.error)


def _status(row: ScheduledJob) -> TaskResultStatus:
    if row.state in (JobState.PENDING, JobState.CLAIMED):
        return TaskResultStatus.READY
    if row.state == JobState.RUNNING:
        return TaskResultStatus.RUNNING
    if row.state == JobState.DONE:
        return TaskResultStatus.SUCCESSFUL
    return TaskResultStatus.FAILED  # dead, or cancelled (Django has no cancelled status)


def _result(backend: BaseTaskBackend, row: ScheduledJob, declared: Task, attempts: list[JobAttempt]) -> TaskResult:
    payload = row.payload if isinstance(row.payload, dict) else {}
    status = _status(row)
    worker_ids = [a.worker for a in attempts]
    starts: list[dt.datetime | None] = [a.started_at for a in attempts if a.started_at is not None]
    last_attempted = starts[-1] if starts else None
    if status == TaskResultStatus.RUNNING:
        worker_ids.append(row.claimed_by)
        last_attempted = row.claimed_at
        starts.append(row.claimed_at)
    shown = declared.using(
        priority=payload.get("priority", declared.priority),
        queue_name=payload.get("queue_name", declared.queue_name),
        run_after=row.due_at,
    )
    result: TaskResult = TaskResult(
        task=shown,
        id=str(row.id),
        status=status,
        enqueued_at=row.created_at,
        started_at=starts[0] if starts else None,
        # the last attempt's end (the runner's clock, like its start); a cancelled task's is the row's
        finished_at=(attempts[-1].finished_at if attempts else row.finished_at) if row.finished_at else None,
        last_attempted_at=last_attempted,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=backend.alias,
        errors=[_attempt_error(a) for a in attempts if a.outcome != AttemptOutcome.SUCCEEDED],
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.return_value)
    return result


def _job_id(result: TaskResult | str | int) -> int:
    raw = result.id if isinstance(result, TaskResult) else result
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise TaskResultDoesNotExist(f"No task result {raw!r}.") from None


def cancel(result: TaskResult | str | int) -> int:
    """Cancel a task that has not started (``scheduling.api.cancel``); ``JobNotCancellable`` otherwise."""
    return api.cancel(job_id=_job_id(result))


def reschedule(result: TaskResult | str | int, run_after: dt.datetime) -> dt.datetime:
    """Move a task that has not started to ``run_after`` (aware); returns the stored due time."""
    return api.reschedule(job_id=_job_id(result), due_at=run_after)


class TimekeeperBackend(BaseTaskBackend):
    """Django Tasks on the due_at engine: durable, cancellable, retried, rescued (module docstring)."""

    task_class = TimekeeperTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        """Django's checks, then Timekeeper's (aware run_after, a kind name that fits); registers the kind."""
        super().validate_task(task)
        if task.run_after is not None and timezone.is_naive(task.run_after):
            raise InvalidTask("run_after must be an aware datetime.")
        if len(task.module_path) > KIND_NAME_LIMIT:
            raise InvalidTask(f"Task path {task.module_path!r} is longer than {KIND_NAME_LIMIT} characters.")
        if getattr(task, "on_conflict", "replace") not in ON_CONFLICT_CHOICES:
            raise InvalidTask(f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}.")
        _register(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """One due_at row in the caller's transaction (``scheduling.api.schedule``), then ``task_enqueued``."""
        self.validate_task(task)
        payload = normalize_json(
            {"args": list(args), "kwargs": dict(kwargs), "queue_name": task.queue_name, "priority": task.priority}
        )
        timing: dict[str, Any] = {"due_at": task.run_after} if task.run_after is not None else {"delay": 0}
        options = job_options.JobOptions(
            key=getattr(task, "key", None),
            on_conflict=getattr(task, "on_conflict", "replace"),
            max_attempts=getattr(task, "max_attempts", None),
            owner=getattr(task, "owner", None),
            priority=job_priority(task.priority),
            **(task.job_overrides() if isinstance(task, TimekeeperTask) else {}),
            **timing,
        )
        job, outcome = due_at_api.schedule_with_options(task.module_path, payload, options)
        result = self._read(job.id, task)
        if outcome != "kept":
            signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result read from its row; ``TaskResultDoesNotExist`` for an unknown id or a job of no task."""
        return self._read(_job_id(result_id), None)

    def _read(self, job_id: int, task: Task | None) -> TaskResult:
        row = ScheduledJob.objects.filter(pk=job_id).first()
        declared = task if task is not None else (task_for(row.kind) if row is not None else None)
        if row is None or declared is None:
            raise TaskResultDoesNotExist(f"No task result {str(job_id)!r}.")
        return _result(self, row, declared, list(JobAttempt.objects.filter(job_id=job_id).order_by("number")))

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``scheduling.E009``: QUEUES must name at least one queue; the backend takes no OPTIONS."""
        problems = []
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            problems.append("QUEUES must list one or more queue names (strings)")
        if self.options:
            problems.append(
                f"OPTIONS {sorted(self.options)} are not read (per-task options go on @scheduling.backends.task)"
            )
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] (Timekeeper's backend): {problem}.",
                hint="See docs/installing.md, 'Django tasks'.",
                id="scheduling.E009",
            )
            for problem in problems
        ]


__all__ = [
    "PAYLOAD_SCHEMA",
    "InvalidTask",
    "TaskContext",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "TimekeeperBackend",
    "TimekeeperTask",
    "WorkerLost",
    "cancel",
    "job_priority",
    "reschedule",
    "task",
    "task_for",
]
