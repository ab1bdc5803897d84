"""A backend for Django's Tasks framework over the due_at engine: ``TimekeeperBackend``.

``TASKS = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend"}}`` makes Django's
``@task`` functions (``django.tasks`` on Django 6.0, the ``django-tasks`` backport on 5.2; the
same code imports whichever is there) run as Timekeeper jobs:

- **A task is a kind.** The first time a task is made (``@task`` at import), its kind is
  registered under the task's ``module_path`` (``shop.tasks.send_welcome``), with one handler that
  runs the function. So pause, cap, priority, rescue, retries with backoff, timeouts, metrics,
  traces and the admin apply to tasks as to any kind. A process that has not imported a task's
  module finds it by that path (a ``registry`` finder, loaded by ``apps.ready``): only a module
  under an installed app or a ``SCHEDULING_HANDLER_PACKAGES`` package is imported, and only a
  ``Task`` of a Timekeeper backend whose ``module_path`` is the kind counts.
- **enqueue** is ``scheduling.api.schedule()``: one row in the caller's transaction (roll back and
  there is no task), ``due_at`` = ``run_after`` (aware datetimes only) or now; the payload is
  ``{"args", "kwargs", "queue_name", "priority"}`` (and ``run_after``). Every refusal stores
  nothing (``USE_TZ = False`` is one). ``result.task`` is the task enqueued. The result id is a
  random UUID in the job's ``task_result_id``, never its sequential id (a task scheduled through
  the JSON API gets ``signed_result_id(job id)`` at its first run); ``cancel()`` /
  ``reschedule()`` / ``abort()`` here take tasks' result ids only (``abort``: a running task's
  handler is interrupted, ``scheduling.api.abort``). ``get_result`` shows any task to whoever has
  its id: a host's "poll my task" view calls ``owned_result(result_id, request.user)``
  (docs/installing.md, "Whose result is it").
- **Priority**: Django's -100..100 onto the claim's 0-9 (higher first): ``p <= 0`` is 0, the
  default of every kind (there is nothing below it in the claim), and ``1..100`` is
  ``ceil(p * 9 / 100)`` (1-11 -> 1, ..., 89-100 -> 9). Order is kept; negative priorities tie
  with the default.
- **Queues**: ``QUEUES`` (default ``["default"]``) lists the names a task may use; any other is
  ``InvalidTask`` (the kind's schema says the same to the JSON API); ``QUEUES = []`` allows any
  name, as on Django's backends. A task's declared
  ``queue_name`` is its kind's queue (``registry.handler(queue=...)``): its batches go to that
  queue and run on the workers that serve it (``-Q``); the claim keeps each queue's room apart.
  The name is also kept on the job (its payload's ``queue_name``) and on the result; a per-call
  ``using(queue_name=...)`` is recorded there but the job runs on its kind's queue.
- **Running**: the kind's handler sends ``task_started``, calls the function (a coroutine through
  ``async_to_sync``) with a ``TimekeeperTaskContext`` (Django's, plus ``owner_id``) first when
  ``takes_context``, keeps the JSON return value in the job's ``return_value`` (written in the
  handler's transaction: an atomic task's value commits with its ``done``; over
  ``SCHEDULING_MAX_RETURN_VALUE_BYTES`` it is ``ReturnValueTooLarge``, the attempt's failure), and
  sends ``task_finished`` (SUCCESSFUL or FAILED) before the outcome is recorded. The task's own
  ``SystemExit`` / ``KeyboardInterrupt`` is its failure, not the worker's shutdown
  (``executor.process_stopping``). A failure is retried with the kind's backoff up to
  ``max_attempts`` (the result is READY meanwhile: Django's "ready to be executed again"), then FAILED.
  A task may choose its outcome as any handler does (``registry.Snooze``: READY again, no error;
  ``RetryAfter``: an error, READY until its attempts are spent; ``Discard`` and ``Cancel``: FAILED,
  the error naming ``scheduling.core.registry.Discard`` / ``Cancel`` with the reason).
- **Results** are read from the row and its attempts: READY (pending, or claimed and not
  started), RUNNING (started), SUCCESSFUL (done), FAILED (dead or cancelled); ``errors`` holds one
  ``TaskError`` per failed attempt (the exception's class path and Django's whole traceback,
  message included; a timeout is ``scheduling.core.executor.JobTimeout``, an abort
  ``scheduling.core.executor.JobAborted`` with who asked and when, a claim taken back from a
  dead worker ``scheduling.backends.WorkerLost``, a claim a stopping worker gave back no error
  while the task will run again); ``worker_ids`` one worker per attempt. Any id that is not a
  task's result id raises ``TaskResultDoesNotExist``; a stored job is never ``InvalidTask``.

Timekeeper's extras: per task with ``@backends.task(..., max_attempts=, timeout=, backoff=,
atomic=, api=, rate=)`` (``rate="10/s"`` or a ``registry.Rate``: the kind's rate limit, the same one
``registry.handler(rate=...)`` sets) (Django's ``@task`` arguments plus these: the kind's contract), per call with
``send_welcome.options(key=, on_conflict=, max_attempts=, owner=, timeout=, backoff=,
atomic=).enqueue(...)``: the call's ``timeout``, ``backoff`` and ``atomic`` are that job's own
(``scheduling.api.schedule(timeout=, backoff=, atomic=)``, kept on its row), used by the worker
in place of the kind's; the kind keeps the task's. ``api=`` (a ``registry.Access``) is per task
only: it is what makes a task schedulable through the JSON API; without it, it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import hashlib
import hmac
import importlib
import json
import logging
import math
import re
import threading
import traceback
import uuid
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import async_to_sync
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.utils import timezone

from scheduling import api
from scheduling.core import aborts, conf, exceptions, executor, registry, validation
from scheduling.core import options as job_options
from scheduling.due_at import api as due_at_api
from scheduling.due_at.api import ON_CONFLICT_CHOICES
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob

if TYPE_CHECKING:  # one set of names for the type checker; at run time, whichever framework is installed
    from django.tasks import signals, task_backends
    from django.tasks import task as django_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.utils.json import normalize_json
else:
    try:  # Django 6.0+: the framework is built in
        from django.tasks import signals, task_backends
        from django.tasks import task as django_task
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2: the django-tasks backport (0.12, whose API is Django 6.0's)
        from django_tasks import signals, task_backends
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
        "run_after": {"type": "string"},  # the task's run_after as enqueued (result.task shows it; due_at is the row's)
    },
    "required": ["args", "kwargs"],
    "additionalProperties": False,
}
PER_CALL_OPTIONS = (  # .options(...)
    "key",
    "on_conflict",
    "max_attempts",
    "owner",
    "timeout",
    "backoff",
    "atomic",
    "unique_for",
    "unique_states",
)
JOB_OVERRIDES = ("timeout", "backoff", "atomic")  # per call, they are the job's own (the kind keeps the task's)


_making_a_using_copy: contextvars.ContextVar[bool] = contextvars.ContextVar("_making_a_using_copy", default=False)


class WorkerLost(exceptions.SchedulingError):
    """The class path of a task's error when its claim was taken back (the worker died or stopped)."""


@dataclasses.dataclass(frozen=TaskContext.__dataclass_params__.frozen, slots=True, kw_only=True)  # type: ignore[literal-required, attr-defined, misc]  # as frozen as Django's (stubs differ by version)
class TimekeeperTaskContext(TaskContext):
    """Django's ``TaskContext`` plus the job's owner: ``owner_id`` (None for the system's tasks)."""

    owner_id: int | None = None


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
    unique_for: float | dt.timedelta | None = None  # per task or per call: a uniqueness window (schedule())
    unique_states: tuple[str, ...] | None = None  # per task or per call: the states that hold the window
    rate: registry.Rate | str | None = None  # per task: at most so many starts per period (the kind's rate limit)
    per_call: bool = dataclasses.field(default=False, repr=False)  # made by options(): the kind is the declared task's
    overridden: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)  # JOB_OVERRIDES options() set
    using_copy: bool = dataclasses.field(default=False, repr=False, compare=False)  # made by using(): not the kind

    def __post_init__(self) -> None:
        if _making_a_using_copy.get():
            object.__setattr__(self, "using_copy", True)  # frozen: set before Django's check registers the kind
        Task.__post_init__(self)  # type: ignore[misc]  # slots dataclass: no zero-argument super()

    def using(self, **changes: Any) -> TimekeeperTask:
        """Django's ``using()``: a copy for one call; marked, so the kind keeps the declared task's queue and priority.

        A declaration made again (the same function decorated with another ``queue_name``) is no copy: it wins.
        """
        token = _making_a_using_copy.set(True)
        try:
            return cast(TimekeeperTask, Task.using(self, **changes))  # whatever Django's using() takes
        finally:
            _making_a_using_copy.reset(token)

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
    """Django's ``@task`` plus Timekeeper's per-task extras (max_attempts, timeout, backoff, atomic, api, rate).

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
    declared = _tasks.get(name)
    if declared is not None and declared.func is task_obj.func and getattr(task_obj, "using_copy", False):
        task_obj = declared  # the kind keeps the declared task's queue and priority (the schema is read again)
    _tasks[name] = task_obj  # the latest declaration wins
    run = _handlers.get(name)
    if run is None:
        run = _handlers[name] = _handler_for(name)
        run.__doc__ = task_obj.func.__doc__ or f"Django task {name}."
    registry.handler(
        name,
        schema=_schema_for(task_obj),
        timeout=getattr(task_obj, "timeout", None),
        max_attempts=getattr(task_obj, "max_attempts", None),
        backoff=getattr(task_obj, "backoff", None),
        atomic=getattr(task_obj, "atomic", True),
        api=getattr(task_obj, "api", None),
        rate=getattr(task_obj, "rate", None),
        queue=task_obj.queue_name,  # Django's queue_name is the kind's queue (workers serve it with -Q)
    )(run)


def _schema_for(task_obj: Task) -> dict[str, Any]:
    """``PAYLOAD_SCHEMA`` with ``queue_name`` one of the task's backend's ``QUEUES`` (every door checks it)."""
    queues = sorted(getattr(task_obj.get_backend(), "queues", ()) or ())
    if not queues:
        return PAYLOAD_SCHEMA
    properties = {**PAYLOAD_SCHEMA["properties"], "queue_name": {"type": "string", "enum": queues}}
    return {**PAYLOAD_SCHEMA, "properties": properties}


def task_for(kind: str) -> Task | None:
    """The task whose kind is ``kind``, found by its module path if this process has not seen it; None if none."""
    known = _tasks.get(kind)
    if known is not None:
        return known
    _find_kind(kind)
    return _tasks.get(kind)


def _allowed_module(module_name: str) -> bool:
    """Whether ``module_name`` may be imported to find a task: under an installed app or a handler package."""
    roots = [app_config.name for app_config in apps.get_app_configs()] + list(conf.get().handler_packages)
    return any(module_name == root or module_name.startswith(f"{root}.") for root in roots)


_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _find_kind(name: str) -> bool:
    """Register the task whose module path is ``name`` (a ``registry`` finder): True if there is one.

    Safely: only a module under an installed app (or a ``SCHEDULING_HANDLER_PACKAGES`` package) is
    imported, and only a ``Task`` of a Timekeeper backend, whose module path is ``name``, counts.
    """
    if name in _tasks:
        _register(_tasks[name])
        return True
    module_name, _, attribute = name.rpartition(".")
    if not _MODULE_PATH.fullmatch(name) or not _allowed_module(module_name):
        return False
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    except Exception:  # a module that fails to import is the kind's problem, logged; the job waits as unknown
        logger.warning("a task's module failed to import", exc_info=True, extra={"kind": name, "action": "unknown"})
        return False
    found = getattr(module, attribute, None)
    if not isinstance(found, Task) or found.module_path != name:
        return False
    try:
        backend = found.get_backend()
    except Exception:  # InvalidTaskBackend: its alias is not in TASKS
        return False
    if not isinstance(backend, TimekeeperBackend):
        return False
    _register(found)
    return True


def _handler_for(name: str) -> Callable[[registry.Job], None]:
    def run(job: registry.Job) -> None:
        _run(name, job)

    return run


def signed_result_id(job_id: int) -> uuid.UUID:
    """The result id of a task job scheduled through another door (the JSON API): signed, stable, not guessable."""
    digest = hmac.new(settings.SECRET_KEY.encode(), f"timekeeper-task-result:{job_id}".encode(), hashlib.sha256)
    return uuid.UUID(bytes=digest.digest()[:16], version=4)


def _run(name: str, job: registry.Job) -> None:
    """Run one task job on the worker: signals, context, the call, the return value kept with the outcome."""
    declared = _tasks[name]
    backend = declared.get_backend()
    sender = type(backend)
    assert job.id is not None
    row = ScheduledJob.objects.defer("return_value").get(pk=job.id)
    if row.task_result_id is None:  # scheduled through the JSON API: its signed id, the same at every attempt
        row.task_result_id = signed_result_id(job.id)
        ScheduledJob.objects.filter(pk=job.id, task_result_id__isnull=True).update(task_result_id=row.task_result_id)
    running = _result(backend, row, declared, list(row.attempt_set.order_by("number")))
    signals.task_started.send(sender=sender, task_result=running)
    args, kwargs = list(job.payload.get("args", [])), dict(job.payload.get("kwargs", {}))
    try:
        call = running.task.func
        if running.task.takes_context:
            args.insert(0, TimekeeperTaskContext(task_result=running, owner_id=row.owner_id))
        value = _call_coroutine(call, args, kwargs) if iscoroutinefunction(call) else call(*args, **kwargs)
        value = normalize_json(value)
        try:
            encoded = json.dumps(value, allow_nan=False)
        except ValueError:  # NaN, Infinity: no JSON PostgreSQL takes (it was a DataError at the write)
            raise exceptions.InvalidPayload(
                f"The return value of {row.kind} is not JSON: it holds NaN or Infinity."
            ) from None
        problem = validation.payload_text_problem(value)
        if problem:
            raise exceptions.InvalidPayload(f"The return value of {row.kind} cannot be stored: {problem}.")
        size, limit = len(encoded.encode()), conf.get().max_return_value_bytes
        if size > limit:
            raise exceptions.ReturnValueTooLarge(size, limit)
        ScheduledJob.objects.filter(pk=job.id, token=job.token).update(return_value=value)
    except BaseException as exc:  # the task's own SystemExit and JobTimeout too (the kind's timeout stopped it)
        if isinstance(exc, (SystemExit, KeyboardInterrupt)) and executor.process_stopping(exc):
            raise  # the worker is stopping: the claim is given back, not failed
        if isinstance(exc, registry.Snooze):  # runs again later, no attempt charged: ready, no error
            signals.task_finished.send(sender=sender, task_result=_changed(running, status=TaskResultStatus.READY))
            raise
        error = _error(exc)
        with contextlib.suppress(AttributeError, TypeError):  # the attempt keeps Django's whole traceback
            setattr(exc, executor.KEPT_TRACEBACK_ATTRIBUTE, error.traceback)
        failed = _changed(
            running,
            status=TaskResultStatus.FAILED,
            finished_at=timezone.now(),
            errors=[*running.errors, error],
        )
        signals.task_finished.send(sender=sender, task_result=failed)
        raise
    done = _changed(running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(done, "_return_value", value)
    signals.task_finished.send(sender=sender, task_result=done)


ASYNC_CANCEL_WAIT_SECONDS = 5.0  # a timed-out coroutine has this long to end once cancelled


def _call_coroutine(call: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Await ``call(*args, **kwargs)`` through ``async_to_sync``; a timeout cancels the coroutine too.

    ``async_to_sync`` runs the coroutine in an event loop on a thread of its own while this thread
    waits: the kind's timeout (``JobTimeout``, raised here by SIGALRM) would leave it running there,
    its effects landing after the attempt was recorded as timed out. So the timeout cancels its task
    (``CancelledError`` at its next ``await``) and waits up to ``ASYNC_CANCEL_WAIT_SECONDS`` for it to end.
    """
    running: dict[str, Any] = {}
    ended = threading.Event()

    async def bounded() -> Any:
        running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
        try:
            return await call(*args, **kwargs)
        finally:
            ended.set()

    try:
        return async_to_sync(bounded)()
    except executor.JobTimeout:
        loop, task = running.get("loop"), running.get("task")
        if loop is not None and task is not None and not ended.is_set():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: it has ended
                loop.call_soon_threadsafe(task.cancel)
            if not ended.wait(ASYNC_CANCEL_WAIT_SECONDS):
                logger.warning("a timed-out coroutine task did not end once cancelled", extra={"action": "timed_out"})
        raise


def _error(exc: BaseException) -> TaskError:
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc))[-executor.TRACEBACK_LIMIT :],
    )


def _changed(result: TaskResult, **changes: Any) -> TaskResult:
    copy = dataclasses.replace(result, **changes)
    object.__setattr__(copy, "_return_value", getattr(result, "_return_value", None))
    return copy


# --- Results: read from the job's row and its attempts -------------------------------------------


_ABORTED_PATH = f"{executor.JobAborted.__module__}.{executor.JobAborted.__qualname__}"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _attempt_error(attempt: JobAttempt) -> TaskError:
    """One failed attempt as Django's TaskError: its class path and the traceback the worker kept.

    A task's traceback is Django's whole text (``traceback.format_exception``: its last line is
    ``ValueError: message``, a builtin without its module); an attempt recorded before that, or of a
    kind that was not a task then, has the scrubbed form (``builtins.ValueError: (message withheld)``).
    """
    if attempt.outcome == AttemptOutcome.TIMED_OUT:
        path = f"{executor.JobTimeout.__module__}.{executor.JobTimeout.__qualname__}"
    elif attempt.outcome == AttemptOutcome.RECLAIMED:
        path = f"{WorkerLost.__module__}.{WorkerLost.__qualname__}"
    elif attempt.outcome == AttemptOutcome.ABORTED:  # its error says who asked and when
        path = _ABORTED_PATH
    else:
        path = _class_path(attempt.traceback, attempt.error.split(":", 1)[0].strip())
    return TaskError(exception_class_path=path, traceback=attempt.traceback or attempt.error)


def _class_path(text: str, name: str) -> str:
    """The exception's class path in a traceback's text, the class named ``name`` (from ``Type: message``)."""
    for line in reversed(text.rstrip().splitlines()):
        match = _EXCEPTION_LINE.match(line)
        if match and match.group(1).rsplit(".", 1)[-1] == name:
            found = match.group(1)
            return found if "." in found else f"builtins.{found}"
    return "builtins.Exception"


def _errors(row: ScheduledJob, attempts: list[JobAttempt]) -> list[TaskError]:
    """The task's errors: its failed attempts', and an abort that cancelled its claim before it started.

    That abort records no attempt (nothing ran), only the row's ``last_error`` ("aborted by ...").
    """
    errors = [_attempt_error(a) for i, a in enumerate(attempts) if _is_error(a, row, i == len(attempts) - 1)]
    if (
        row.state == JobState.CANCELLED
        and row.last_error.startswith(aborts.REASON_PREFIX)
        and not any(a.outcome == AttemptOutcome.ABORTED for a in attempts)
    ):
        errors.append(TaskError(exception_class_path=_ABORTED_PATH, traceback=row.last_error))
    return errors


def _status(row: ScheduledJob) -> TaskResultStatus:
    """Django's status of a job: READY while it waits (a retry too: "ready to be executed again"), then RUNNING."""
    if row.state in (JobState.PENDING, JobState.CLAIMED):
        return TaskResultStatus.READY
    if row.state == JobState.RUNNING:
        return TaskResultStatus.RUNNING
    if row.state == JobState.DONE:
        return TaskResultStatus.SUCCESSFUL
    return TaskResultStatus.FAILED  # dead, or cancelled (Django has no cancelled status)


def _is_error(attempt: JobAttempt, row: ScheduledJob, last: bool) -> bool:
    """Whether an attempt is one of the task's errors: a failure, or a claim lost other than by a shutdown.

    A claim a stopping worker gave back (``runner.RELEASE_REASON``) is no error of the task while it
    will run again; it is one when it was the task's last attempt (the job is dead).
    """
    if attempt.outcome in (AttemptOutcome.SUCCEEDED, AttemptOutcome.SNOOZED):  # a snooze is no failure
        return False
    if attempt.outcome == AttemptOutcome.RECLAIMED and attempt.error.startswith(RELEASED_PREFIX):
        return last and row.state == JobState.DEAD
    return True


RELEASED_PREFIX = "released:"  # the start of scheduling.due_at.runner.RELEASE_REASON


def _parsed_run_after(raw: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _shown_task(declared: Task, payload: dict[str, Any]) -> Task:
    """The task as enqueued: the declared one with the row's priority, queue and run_after.

    Built without validation: a stored job is shown as it is even when the backend would refuse it
    today (a queue since removed from QUEUES); the declared task itself when nothing differs.
    """
    changes = {
        "priority": payload.get("priority", declared.priority),
        "queue_name": payload.get("queue_name", declared.queue_name),
        "run_after": _parsed_run_after(payload.get("run_after")),
    }
    if all(getattr(declared, name) == value for name, value in changes.items()):
        return declared
    copy = object.__new__(type(declared))
    for field in dataclasses.fields(declared):
        object.__setattr__(copy, field.name, changes.get(field.name, getattr(declared, field.name)))
    return copy


def _result(
    backend: BaseTaskBackend,
    row: ScheduledJob,
    declared: Task,
    attempts: list[JobAttempt],
    enqueued: Task | None = None,
) -> TaskResult:
    payload = row.payload if isinstance(row.payload, dict) else {}
    status = _status(row)
    worker_ids = [a.worker for a in attempts]
    starts: list[dt.datetime | None] = [a.started_at for a in attempts if a.started_at is not None]
    last_attempted = starts[-1] if starts else None
    if status == TaskResultStatus.RUNNING:
        worker_ids.append(row.claimed_by)
        last_attempted = row.claimed_at
        starts.append(row.claimed_at)
    result: TaskResult = TaskResult(
        task=enqueued if enqueued is not None else _shown_task(declared, payload),
        id=str(row.task_result_id),
        status=status,
        enqueued_at=row.created_at,
        started_at=starts[0] if starts else None,
        finished_at=_finished_at(row, attempts),
        last_attempted_at=last_attempted,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=backend.alias,
        errors=_errors(row, attempts),
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.return_value)
    return result


def _finished_at(row: ScheduledJob, attempts: list[JobAttempt]) -> dt.datetime | None:
    """When the task ended: the last attempt's end (the runner's clock, like its start), or the row's for a
    task cancelled while it waited (a cancel after a failed attempt ended the task then, not when that
    attempt did; an abort or the handler's Cancel ended it with its attempt)."""
    if row.finished_at is None:
        return None
    if not attempts:
        return row.finished_at
    last = attempts[-1]
    if row.state == JobState.CANCELLED and last.outcome not in (AttemptOutcome.ABORTED, AttemptOutcome.CANCELLED):
        return row.finished_at
    return last.finished_at


def _result_uuid(result: TaskResult | str) -> uuid.UUID:
    """A result id as its UUID; ``TaskResultDoesNotExist`` for any other shape (a job's number included)."""
    raw = result.id if isinstance(result, TaskResult) else result
    try:
        return uuid.UUID(str(raw))
    except (TypeError, ValueError, AttributeError):
        raise TaskResultDoesNotExist(f"No task result {raw!r}.") from None


def task_job(
    result: TaskResult | str, *, owner: Any = None, any_owner: bool = True, with_value: bool = False
) -> ScheduledJob:
    """The job behind a task's result id; ``TaskResultDoesNotExist`` unless it is a task's job (and ``owner``'s).

    ``any_owner=False``: only a job whose owner is ``owner`` (None: the system's tasks) counts, the
    check a host project's "poll my task" view makes (``owned_result``).
    """
    found = ScheduledJob.objects.filter(task_result_id=_result_uuid(result))
    if not any_owner:
        found = found.filter(owner_id=getattr(owner, "pk", owner))
    row = (found if with_value else found.defer("return_value")).first()
    if row is None or task_for(row.kind) is None:
        raise TaskResultDoesNotExist(f"No task result {str(getattr(result, 'id', result))!r}.")
    return row


def cancel(result: TaskResult | str) -> int:
    """Cancel a task that has not started (``scheduling.api.cancel``); ``JobNotCancellable`` otherwise.

    Only a task's result id is taken: any other id (a job's number, another kind's job) is ``TaskResultDoesNotExist``.
    """
    return api.cancel(job_id=task_job(result).pk)


def reschedule(result: TaskResult | str, run_after: dt.datetime) -> dt.datetime:
    """Move a task that has not started to ``run_after`` (aware); returns the stored due time (tasks only)."""
    return api.reschedule(job_id=task_job(result).pk, due_at=run_after)


def abort(result: TaskResult | str, *, by: str | None = None) -> api.Aborted:
    """Abort a claimed or running task (``scheduling.api.abort``): its handler interrupted, its atomic writes undone.

    Returns ``api.Aborted`` (``requested``: running, its worker stops it within about a heartbeat;
    ``cancelled``: claimed, never started). ``by`` names who asked (else the door's operator, else
    "application"). ``JobAlreadyFinished`` when the task had finished first (it stays so),
    ``JobNotAbortable`` when it has not been claimed (``cancel()`` it). Its result is then FAILED
    with a ``scheduling.core.executor.JobAborted`` error saying who asked and when. Only a task's
    result id is taken: any other id is ``TaskResultDoesNotExist``.
    """
    return api.abort(task_job(result).pk, by=by)


def owned_result(result_id: str, owner: Any, *, alias: str = "default") -> TaskResult:
    """The result ``result_id`` if ``owner`` enqueued it (``options(owner=...)``); ``TaskResultDoesNotExist`` if not.

    What a host project's "poll my task" view calls with ``request.user``: a result id is random and
    not guessable, but one leaked (a log, a shared link) must not show another user's args and value.
    """
    backend = _backend(alias)
    row = task_job(result_id, owner=owner, any_owner=False, with_value=True)
    return backend._read_row(row, None)


def _backend(alias: str) -> TimekeeperBackend:
    backend = task_backends[alias]
    if not isinstance(backend, TimekeeperBackend):
        raise InvalidTask(f"TASKS[{alias!r}] is not scheduling.backends.TimekeeperBackend.")
    return backend


class TimekeeperBackend(BaseTaskBackend):
    """Django Tasks on the due_at engine: durable, cancellable, retried, rescued (module docstring)."""

    task_class = TimekeeperTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        """Django's checks, then Timekeeper's (aware run_after, a kind name that fits); registers the kind."""
        if isinstance(task.priority, bool) or not isinstance(task.priority, int):  # True is an int to Django's check
            raise InvalidTask("priority must be a whole number between -100 and 100 (Django's range).")
        super().validate_task(task)
        if task.run_after is not None and timezone.is_naive(task.run_after):
            raise InvalidTask("run_after must be an aware datetime.")
        if len(task.module_path) > KIND_NAME_LIMIT:
            raise InvalidTask(f"Task path {task.module_path!r} is longer than {KIND_NAME_LIMIT} characters.")
        if getattr(task, "on_conflict", "replace") not in ON_CONFLICT_CHOICES:
            raise InvalidTask(f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}.")
        _register(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """One due_at row in the caller's transaction (``scheduling.api.schedule``), then ``task_enqueued``.

        Every refusal comes before anything is written, or rolls back what was: nothing is committed.
        """
        self.validate_task(task)
        if not settings.USE_TZ:
            raise InvalidTask("Timekeeper's backend needs USE_TZ = True (due times are aware datetimes).")
        fields: dict[str, Any] = {
            "args": list(args),
            "kwargs": dict(kwargs),
            "queue_name": task.queue_name,
            "priority": task.priority,
        }
        if task.run_after is not None:
            fields["run_after"] = task.run_after.isoformat()
        payload = normalize_json(fields)  # Django's TypeError for what JSON cannot hold, as every backend raises
        timing: dict[str, Any] = {"due_at": task.run_after} if task.run_after is not None else {"delay": 0}
        options = job_options.JobOptions(
            key=getattr(task, "key", None),
            on_conflict=getattr(task, "on_conflict", "replace"),
            max_attempts=getattr(task, "max_attempts", None),
            owner=getattr(task, "owner", None),
            priority=job_priority(task.priority),
            unique_for=getattr(task, "unique_for", None),
            unique_states=getattr(task, "unique_states", None),
            **(task.job_overrides() if isinstance(task, TimekeeperTask) else {}),
            **timing,
        )
        with transaction.atomic():
            job, outcome = due_at_api.schedule_with_options(task.module_path, payload, options)
            ScheduledJob.objects.filter(pk=job.id, task_result_id__isnull=True).update(task_result_id=uuid.uuid4())
            row = ScheduledJob.objects.defer("return_value").get(pk=job.id)
            fresh = outcome == "created"  # a new row has no attempts to read
            result = self._read_row(row, task if outcome != "kept" else None, attempts=[] if fresh else None)
        if outcome != "kept":
            signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result read from its row; ``TaskResultDoesNotExist`` for any id that is not a task's result id."""
        return self._read_row(task_job(result_id, with_value=True), None)

    def _read_row(
        self, row: ScheduledJob, enqueued: Task | None, *, attempts: list[JobAttempt] | None = None
    ) -> TaskResult:
        declared = enqueued if enqueued is not None else task_for(row.kind)
        if declared is None:
            raise TaskResultDoesNotExist(f"No task result {str(row.task_result_id)!r}.")
        if attempts is None:
            attempts = list(JobAttempt.objects.filter(job_id=row.pk).order_by("number"))
        return _result(self, row, declared, attempts, enqueued)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``scheduling.E009``: QUEUES must hold queue names (``[]`` is Django's "any name"); no OPTIONS."""
        problems = []
        if not all(isinstance(q, str) and q for q in self.queues):
            problems.append("QUEUES must list queue names (strings), or be empty for any name")
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


registry.add_finder(_find_kind)  # a task is found by its module path wherever it is defined (safely)


__all__ = [
    "PAYLOAD_SCHEMA",
    "InvalidTask",
    "TaskContext",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "TimekeeperBackend",
    "TimekeeperTask",
    "TimekeeperTaskContext",
    "WorkerLost",
    "abort",
    "cancel",
    "job_priority",
    "owned_result",
    "reschedule",
    "signed_result_id",
    "task",
    "task_for",
    "task_job",
]
