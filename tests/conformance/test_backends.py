"""Conformance: Timekeeper's Tasks backend does what Django's and django-tasks' backend suites expect.

What a backend must do was read from Django's ``tests/tasks/`` (the Tasks API on the dummy and
immediate backends) and from the database backend's suite (django-tasks / django-tasks-db
``tests/``); these tests are the project's own, written against Django's public API only (``@task``,
``enqueue``, ``get_result``, ``TaskResult``, the signals and the ``django.tasks`` log lines), with
``scheduling.testing.run_due`` as the worker (the real claim and runner, in this process). The same
behaviours on a real ``celery worker``: ``tests/e2e/backends/test_backends_worker.py``
(``test_the_worker_meets_the_peers_run_contract``; e2e tests must live under tests/e2e). Runs on
Django 5.2 (the backport) and 6.0 (``DJANGO60_TESTS`` in dev.py).

Behaviours of the peers' suites that do not apply to a durable, retrying backend, and why:

- **Running at enqueue** (the immediate backend: SUCCESSFUL when ``enqueue`` returns, in the
  caller's transaction): tasks here are rows a worker runs later; ``enqueue`` answers READY.
- **No ``run_after``, no ``get_result``** (immediate, dummy): both are supported here.
- **The dummy backend's ``results`` list and ``clear()``**: results are rows; there is no list
  (nor a listed result to write into and see ``refresh()`` pick up).
- **A sync ``refresh()`` / ``get_result()`` inside an event loop** (an ``async def`` test calling
  them): the dummy backend answers from memory; a database-backed backend cannot query in an async
  context (Django's ``SynchronousOnlyOperation``); ``arefresh()`` / ``aget_result()`` are the calls.
- **The peer's own rows and app** (django-tasks-db's ``DBTaskResult`` read or written by its tests,
  its admin, its migrations, its check for its app): the rows here are ``ScheduledJob`` and
  ``JobAttempt``, read through ``get_result``.
- **A failure is FAILED after one run**: a task is retried with backoff up to its ``max_attempts``
  (``SCHEDULING_DEFAULT_MAX_ATTEMPTS``, 5); between attempts it reads READY (Django's "ready to be
  executed again") with one ``TaskError`` per failed attempt, and FAILED after the last. The
  failing tasks here declare ``max_attempts=1``, as Django's backends try once.
- **``KeyboardInterrupt`` escapes** (the immediate backend re-raises it in the caller): here a
  task runs in a worker's pool process, which ignores SIGINT, so a ``KeyboardInterrupt`` is the
  task's own: its failure, like ``SystemExit`` (as django-tasks-db's worker records an exiting task).
- **Queues route work** (``db_worker --queue-name``, ``*``): the table is one queue ordered by
  priority and due time; ``queue_name`` is checked against ``QUEUES`` and kept, not routed.
- **Several backends share a worker selectively** (``db_worker --backend``): every Timekeeper
  alias writes the same table and any worker runs any task.
- **Query counts** (one query per ``enqueue``, eight per run): not a contract here; an enqueue
  writes its row and its result id and reads them back, in one transaction.
- **``OPTIONS`` such as ``id_function``**: the backend reads no ``OPTIONS`` (``scheduling.E009``);
  result ids are always random UUIDs (version 4).
- **``USE_TZ = False``**: refused at ``enqueue`` (due times are aware), before anything is stored.
- **A row whose path is not a task** (``subprocess.check_output``, a missing module) is FAILED by
  the database worker: here no door stores one (``UnknownJobKind``), a task is looked up only under
  installed apps and handler packages, and a row written by hand is an unknown kind that the worker
  retries later (the code may be deployed meanwhile) until it is dead.
- **Exact priority order**: Django's -100..100 is mapped onto the claim's ten levels (0-9); tasks
  whose priorities share a level (2 and 10) run in due order, and negative priorities tie with 0.
- **The database worker's command line** (interval, max tasks, worker id, batch mode) and its row
  locks (``get_locked``): Celery's worker options and Timekeeper's claim, tested in their own
  suites (tests/integration/due_at/test_claim.py).
- **``prune_db_task_results``**: finished tasks go with ``SCHEDULING_RETENTION_DAYS`` (the sweeper).
- **Which class the backend is** (``isinstance(backend, ImmediateBackend)``, the sender of
  ``task_enqueued`` being the peer's class): run from outside, those name the peer's classes.
- **TaskResult's own equality, hashing and ordering** in newer Django: framework code, not the
  backend's; this suite checks only that a read result equals the enqueued one. Pickling a task
  and its result is checked only where the framework's ``Task`` pickles (``Task._reconstruct``).

Run against this backend from outside (``tests/conformance/run_peers.py``, which fetches and copies
nothing: it takes a checkout of the peer's tests, points the backends they configure at
Timekeeper's, with ``testing.run_due()`` after each ``enqueue`` where they expect the immediate
backend, and tries a task once as the peers' backends do; commands in docs/development.md): Django
6.0.10's ``tests/tasks`` (immediate, dummy, tasks) 60 of 71 pass; django-tasks 0.12.0's
(immediate, dummy, tasks, on 5.2) 61 of 73; django-tasks-db 0.12.0's 26 of 87 (6 skipped by
their own conditions). ``QUEUES = []`` (Django's "any queue name") failed three of them until
this backend took it. Every failure left is one of the behaviours above: the immediate backend's
missing ``run_after`` / ``get_result``, its re-raised ``KeyboardInterrupt``, the dummy's list, a sync
``refresh()`` in an async test, the class checks; and for django-tasks-db its ``DBTaskResult``
rows, admin and app check, its ``db_worker`` command and processes, ``get_locked``,
``prune_db_task_results``, ``id_function``, query counts, ``USE_TZ = False`` and exact priority
order. Its worker tests' behaviours (a failing task, context, run_after, an unknown task path) are
this suite's, run by ``run_due``.
"""

from __future__ import annotations

import datetime as dt
import pickle
import uuid
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from scheduling import backends, testing
from tests.taskkit import conformance as t

try:
    from django.tasks import TaskResultStatus, default_task_backend, signals, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, default_task_backend, signals, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

pytestmark = pytest.mark.django_db(transaction=True)

TASKS_LOGGER = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TWO_QUEUES = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default", "queue-1"]}}


@pytest.fixture
def enqueued():
    """The (sender, result) of every task_enqueued signal during the test."""
    seen: list[tuple[Any, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result))

    signals.task_enqueued.connect(receiver, dispatch_uid="conformance-enqueued", weak=False)
    yield seen
    signals.task_enqueued.disconnect(receiver, dispatch_uid="conformance-enqueued")


def _run() -> None:
    """The worker's turn: run every due task in this process."""
    testing.run_due()


# --- The backend and enqueue ---------------------------------------------------------------------


def test_the_default_backend_is_timekeepers_with_no_options_and_no_check_errors():
    """default_task_backend is TASKS["default"], a TimekeeperBackend with empty options and a clean check()."""
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], backends.TimekeeperBackend)
    assert (default_task_backend.alias, default_task_backend.options) == ("default", {})
    assert list(default_task_backend.check()) == []


@pytest.mark.parametrize("task", [t.noop, t.noop_async], ids=["sync", "async"])
def test_enqueue_answers_a_ready_result_and_sends_task_enqueued(task, enqueued):
    """enqueue: READY, unfinished, no times, UUID4 id, the task itself, its arguments, 0 attempts; the signal sent."""
    result = task.enqueue(1, two=3)
    assert uuid.UUID(result.id).version == 4
    assert (result.status, result.is_finished) == (TaskResultStatus.READY, False)
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    assert result.task == task
    assert (result.args, result.kwargs, result.attempts) == ([1], {"two": 3}, 0)
    assert enqueued == [(backends.TimekeeperBackend, result)]


def test_aenqueue_answers_the_same_as_enqueue(enqueued):
    """aenqueue: a READY result of the task with its arguments, and task_enqueued sent."""
    result = async_to_sync(t.noop.aenqueue)()
    assert (result.status, result.task, result.args, result.kwargs) == (TaskResultStatus.READY, t.noop, [], {})
    assert enqueued == [(backends.TimekeeperBackend, result)]


def test_enqueue_logs_the_result_id():
    """The framework's debug line "Task id=... enqueued" names the result."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(TASKS_LOGGER)
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        result = t.noop.enqueue()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    (line,) = [r.getMessage() for r in records]
    assert "enqueued" in line
    assert result.id in line


def test_arguments_json_cannot_hold_are_refused_at_enqueue():
    """A datetime argument is a TypeError "Unsupported type" at enqueue, and nothing is stored."""
    with pytest.raises(TypeError, match="Unsupported type"):
        t.noop.enqueue(dt.datetime.now())
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(t.noop.aenqueue)(dt.datetime.now())
    assert testing.run_due(include_future=True).started == 0


def test_an_enqueued_task_is_seen_by_other_connections_only_after_commit():
    """Inside the caller's transaction the result reads here; another thread (connection) finds it after the commit."""
    import threading

    def found_elsewhere(result_id: str) -> bool:
        answer: list[bool] = []

        def read() -> None:
            try:
                default_task_backend.get_result(result_id)
                answer.append(True)
            except TaskResultDoesNotExist:
                answer.append(False)
            finally:
                connections.close_all()

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
        return answer[0]

    with transaction.atomic():
        result = t.noop.enqueue()
        assert default_task_backend.get_result(result.id).id == result.id
        assert found_elsewhere(result.id) is False
    assert found_elsewhere(result.id) is True


# --- Validation ----------------------------------------------------------------------------------


def test_a_queue_outside_queues_is_invalid_at_enqueue_and_aenqueue():
    """A task made for a queue the backend no longer lists: InvalidTask "Queue ... is not valid for backend"."""
    with override_settings(TASKS=TWO_QUEUES):
        other_queue = t.noop.using(queue_name="queue-1")
    for call in (other_queue.enqueue, async_to_sync(other_queue.aenqueue)):
        with pytest.raises(InvalidTask, match="Queue 'queue-1' is not valid for backend"):
            call()
    with override_settings(TASKS=TWO_QUEUES):
        assert t.noop.using(queue_name="queue-1").enqueue().task.queue_name == "queue-1"


def test_an_empty_queues_list_allows_any_queue_name():
    """QUEUES = [] is Django's "any queue name": the check passes and a task of any queue is enqueued and run."""
    any_queue = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": []}}
    with override_settings(TASKS=any_queue):
        assert list(default_task_backend.check()) == []
        result = t.meaning_of_life.using(queue_name="reports").enqueue()
        assert result.task.queue_name == "reports"
        testing.run_due()
        assert result.task.get_result(result.id).return_value == 42


def test_priority_and_run_after_are_validated():
    """Priority outside -100..100 or not whole, and a naive run_after: InvalidTask; the bounds themselves are fine."""
    for bad in (-101, 101, 3.1):
        with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
            t.noop.using(priority=bad)
    for good in (-100, 0, 100):
        assert t.noop.using(priority=good).priority == good
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        t.noop.using(run_after=dt.datetime.now())


def test_using_copies_and_keeps_the_original():
    """using() returns an equal new Task for no change, and chained using() keeps earlier changes."""
    now = timezone.now()
    assert t.noop.using() == t.noop
    assert t.noop.using() is not t.noop
    chained = t.noop.using(run_after=now).using(priority=10)
    assert (chained.run_after, chained.priority, t.noop.priority, t.noop.run_after) == (now, 10, 0, None)


# --- Results -------------------------------------------------------------------------------------


def test_get_result_reads_what_enqueue_answered():
    """get_result and aget_result of a fresh task equal the result enqueue gave; task.get_result too."""
    result = default_task_backend.enqueue(t.noop, [], {})
    assert default_task_backend.get_result(result.id) == result
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result
    assert t.noop.get_result(result.id) == result


def test_a_missing_or_malformed_id_is_task_result_does_not_exist():
    """An unknown UUID and "123": TaskResultDoesNotExist, sync and async, from the backend and from a task."""
    for missing in (str(uuid.uuid4()), "123"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(missing)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(default_task_backend.aget_result)(missing)
        with pytest.raises(TaskResultDoesNotExist):
            t.noop.get_result(missing)


def test_another_tasks_result_is_a_mismatch():
    """task.get_result(id of another task's result): TaskResultMismatch "Task does not match"."""
    result = t.noop_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        t.noop.get_result(result.id)


def test_refresh_reads_the_run():
    """After the worker ran it, refresh() and arefresh() show SUCCESSFUL, ordered times, the value, 1 attempt."""
    result = t.meaning_of_life.enqueue()
    other = t.meaning_of_life.enqueue()
    _run()
    assert result.status == TaskResultStatus.READY  # a result is a snapshot until refreshed
    result.refresh()
    async_to_sync(other.arefresh)()
    for done in (result, other):
        assert (done.status, done.is_finished, done.return_value, done.attempts) == (
            TaskResultStatus.SUCCESSFUL,
            True,
            42,
            1,
        )
        assert done.enqueued_at <= done.started_at <= done.finished_at
        assert done.last_attempted_at is not None
        assert len(done.worker_ids) == 1


@pytest.mark.skipif(
    not hasattr(backends.TimekeeperTask, "_reconstruct"), reason="this Django's Task does not pickle (framework code)"
)
def test_results_and_tasks_survive_pickling():
    """A task and a result pickle and unpickle to equal objects."""
    result = t.noop.enqueue()
    assert pickle.loads(pickle.dumps(t.noop)) == t.noop  # noqa: S301 - our own bytes, just made
    assert pickle.loads(pickle.dumps(result)) == result  # noqa: S301 - our own bytes, just made


# --- Running -------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", [t.noop, t.noop_async], ids=["sync", "async"])
def test_a_task_runs_once_and_succeeds(task):
    """The worker runs a sync or async task once: SUCCESSFUL, value None, its task and arguments kept."""
    result = task.enqueue(1, two=3)
    _run()
    done = task.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (TaskResultStatus.SUCCESSFUL, None, 1)
    assert (done.task, done.args, done.kwargs) == (task, [1], {"two": 3})


def test_the_run_sends_started_and_finished_and_logs_them(caplog):
    """task_started (RUNNING) then task_finished (SUCCESSFUL or FAILED), each logged with the result id."""
    seen: list[tuple[str, str, str]] = []

    def on(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, str(task_result.status), task_result.id))

        return receiver

    started, finished = on("started"), on("finished")
    signals.task_started.connect(started, weak=False)
    signals.task_finished.connect(finished, weak=False)
    try:
        with caplog.at_level("INFO", logger=TASKS_LOGGER):
            ok = t.noop.enqueue()
            _run()
            failed = t.fails_with_value_error.enqueue()
            _run()
    finally:
        signals.task_started.disconnect(started)
        signals.task_finished.disconnect(finished)
    assert seen == [
        ("started", "RUNNING", ok.id),
        ("finished", "SUCCESSFUL", ok.id),
        ("started", "RUNNING", failed.id),
        ("finished", "FAILED", failed.id),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == TASKS_LOGGER]
    assert [("state=RUNNING" in line, "state=FAILED" in line) for line in lines if failed.id in line] == [
        (True, False),
        (False, True),
    ]
    assert all("NoneType" not in line for line in lines)


@pytest.mark.parametrize(
    ("task", "exception", "message"),
    [
        (t.fails_with_value_error, ValueError, "This task failed due to ValueError"),
        (t.fails_with_system_exit, SystemExit, "This task failed due to SystemExit"),
    ],
    ids=["ValueError", "SystemExit"],
)
def test_a_failing_task_is_failed_with_its_exception_and_whole_traceback(task, exception, message):
    """FAILED: return_value raises "Task failed", times set, the exception's class, its message ending the traceback."""
    result = task.enqueue()
    _run()
    failed = task.get_result(result.id)
    assert (failed.status, failed.is_finished) == (TaskResultStatus.FAILED, True)
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    assert failed.enqueued_at <= failed.started_at <= failed.finished_at
    assert failed.last_attempted_at is not None
    assert failed.errors[0].exception_class is exception
    assert failed.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert (failed.task, failed.args, failed.kwargs) == (task, [], {})


def test_a_nested_exception_shows_in_the_traceback():
    """An exception raised with an exception argument: ValueError, its repr in the traceback."""
    result = t.fails_with_nested_exception.enqueue()
    _run()
    (error,) = t.fails_with_nested_exception.get_result(result.id).errors
    assert error.exception_class is ValueError
    assert "ValueError(ValueError('This task failed'))" in error.traceback or (
        'ValueError(ValueError("This task failed"))' in error.traceback
    )


def test_a_return_value_json_cannot_hold_fails_the_task():
    """A return value JSON cannot hold: FAILED with TypeError, "Unsupported type" in the traceback, no value."""
    result = t.returns_what_json_cannot_hold.enqueue()
    _run()
    failed = t.returns_what_json_cannot_hold.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is TypeError
    assert "Unsupported type" in failed.errors[0].traceback
    assert failed._return_value is None


def test_a_task_calling_sys_exit_does_not_stop_the_worker():
    """sys.exit() in a task: the worker's turn returns, the task is FAILED, the next task runs."""
    exiting, after = t.calls_sys_exit.enqueue(), t.meaning_of_life.enqueue()
    _run()
    assert t.calls_sys_exit.get_result(exiting.id).status == TaskResultStatus.FAILED
    assert t.meaning_of_life.get_result(after.id).return_value == 42


def test_a_task_taking_context_sees_its_result_and_attempt():
    """takes_context: context.task_result.id is the result id; context.attempt is 1; the status RUNNING."""
    own = t.own_result_id.enqueue()
    read = t.reads_its_context.enqueue(1)
    _run()
    assert t.own_result_id.get_result(own.id).return_value == own.id
    assert t.reads_its_context.get_result(read.id).return_value == {
        "attempt": 1,
        "path": "tests.taskkit.conformance.reads_its_context",
    }


def test_run_after_holds_a_task_until_its_time():
    """A task for ten hours from now is not run; once its time is now (run_after passed), it runs."""
    later = t.noop.using(run_after=timezone.now() + dt.timedelta(hours=10)).enqueue()
    past = t.noop.using(run_after=timezone.now() - dt.timedelta(hours=2)).enqueue()
    _run()
    assert t.noop.get_result(later.id).status == TaskResultStatus.READY
    assert t.noop.get_result(past.id).status == TaskResultStatus.SUCCESSFUL
    backends.reschedule(later, timezone.now())
    _run()
    assert t.noop.get_result(later.id).status == TaskResultStatus.SUCCESSFUL


def test_higher_priority_runs_first_and_older_first_within_a_priority():
    """Due tasks are claimed by priority (high first), then by run_after (older first)."""
    from scheduling.due_at import claim

    now = timezone.now()
    old = t.noop.using(priority=20, run_after=now - dt.timedelta(hours=2)).enqueue()
    very_old = t.noop.using(priority=20, run_after=now - dt.timedelta(hours=10)).enqueue()
    low = t.noop.using(priority=-2).enqueue()
    high = t.noop.using(priority=100).enqueue()
    by_job = {backends.task_job(r).pk: r.id for r in (old, very_old, low, high)}
    taken = [by_job[c.id] for _ in range(4) for c in claim.claim_here(1)]
    assert taken == [high.id, very_old.id, old.id, low.id]
