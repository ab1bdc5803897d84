"""Each due_at job's attempt as a Celery task in Flower: task events sent per job, one message per batch.

Workers run jobs in batches (one ``scheduling.run_batch`` Celery task for up to 50 jobs), so
Flower's task list would show batches, all green, whatever their jobs did. When the worker sends
task events (``-E``, or ``CELERY_WORKER_SEND_TASK_EVENTS = True`` as in ``project/settings.py``),
the runner's batch report is turned here into the events Celery itself sends for a task, one set
per job attempt, under a synthetic task id:

- one event per attempt, its outcome: ``task-succeeded`` (no result: a return value may hold
  personal data), ``task-failed`` (the attempt
  failed and the job is dead: ``exception`` is the error's type and the job id, the message and
  traceback stay on the job's page in the admin) or ``task-retried`` (failed, retried later);
- carrying what a ``task-received`` and ``task-started`` would: task id ``job-<id>-<attempt>-<batch>``
  (search Flower for ``job-<id>``), ``name`` = the job's kind, ``args`` = ``[<job id>]`` (never the
  payload, which may hold personal data), ``retries`` = attempts before this one, ``parent_id`` =
  the batch's task id, ``eta`` = the job's due time, ``received`` and ``started`` (the attempt's
  start), ``runtime``. Celery's event state puts every field of an event on the task, so Flower
  shows the task whole from this one event, at half the bytes of three.

All of a batch's events are buffered and published as one ``task.multi`` message when the batch's
outcomes are written (Celery's event receiver and Flower accept a list of events per message), so
the broker sees one extra message per batch, not four per job. Events are best effort: a broker
error drops them (logged), never the batch. ``SCHEDULING_JOB_TASK_EVENTS = False`` turns the jobs'
events off. Which state Flower shows, and the A/B cost: docs/operations.md, "Flower".

The batch itself (``batch:<kind>``) rides in the same message, when it ends: its ``task-received``,
``task-started`` and ``task-succeeded``. Celery's own three events of a batch are not
sent (``run_batch`` has ``send_events = False``): the worker's main process published them from
its event loop, the thread that takes messages and hands them to the pool, a Redis round trip each
(``bench/README.md``, "flow"). ``BatchRequest`` still sends Celery's events of a batch that did
not succeed (failed, its process lost, revoked, rejected, retried), from the main process as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import logging
import os
import time
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis
from celery.events.event import get_exchange
from celery.utils.time import utcoffset
from celery.worker.request import Request
from kombu import Exchange, Producer
from kombu.exceptions import KombuError

from scheduling.core import broker, conf
from scheduling.due_at import lifecycle
from scheduling.models import AttemptOutcome, JobState

if TYPE_CHECKING:
    from scheduling.due_at import store

logger = logging.getLogger(__name__)

RATE_LIMITED = lifecycle.Event.RATE_LIMITED.value  # given back for want of a start permit: no attempt, no event


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """One finished attempt, as the runner recorded it (only outcomes that were kept: token still valid)."""

    job_id: int
    kind: str
    attempt: int  # 1 for the first attempt
    due_at: dt.datetime
    started_at: dt.datetime
    finished_at: dt.datetime
    outcome: str  # AttemptOutcome
    state_after: str  # JobState: done, pending (retried) or dead
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Batch:
    """The ``scheduling.run_batch`` task itself, as Celery's ``task-received`` would have shown it."""

    id: str
    name: str  # the shadow name: batch:<kind>
    args: str  # Celery's argsrepr: the [id, token] pairs
    retries: int = 0
    root_id: str | None = None
    parent_id: str | None = None


class Collector:
    """A batch's finished attempts, gathered from the runner's hooks (``started`` and ``recorded``)."""

    def __init__(self, jobs: bool = True) -> None:
        self.jobs: dict[int, store.StartedJob] = {}
        self.events: list[JobEvent] = []
        self.collects_jobs = jobs  # False: SCHEDULING_JOB_TASK_EVENTS is off, only the batch's own event goes


class BatchRequest(Request):  # type: ignore[misc]
    """The worker's request of a ``run_batch`` task: Celery's events of a batch that did not succeed only.

    ``run_batch`` has ``send_events = False``, so the main process sends no ``task-received``,
    ``task-started`` or ``task-succeeded`` for it (``collecting``'s message carries the batch's
    received, started and succeeded). A batch that raised (``task-failed``), whose process was lost (its
    message rejected and put back: ``task-rejected``, then it runs again), or that was revoked or
    retried is announced here as Celery would, since the pool process could not say so itself; each
    such event carries what ``task-received`` would have (the name ``batch:<kind>``, the args), which
    no earlier event gave Flower.
    """

    QUIET = frozenset({"task-started", "task-succeeded"})

    def send_event(self, type: str, **fields: Any) -> None:
        if type not in self.QUIET and self._eventer and self._eventer.enabled:
            task = {
                "name": self.name,  # the shadow: batch:<kind>
                "args": self.argsrepr,
                "kwargs": self.kwargsrepr,
                "retries": self.request_dict.get("retries", 0),
                "root_id": self.root_id,
                "parent_id": self.parent_id,
            }
            self._eventer.send(type, uuid=self.id, **{**task, **fields})


_collector: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("timekeeper_job_events", default=None)


@contextlib.contextmanager
def collecting(*, batch: Batch | None, hostname: str | None) -> Iterator[Collector]:
    """Around a batch (``scheduling.tasks.run_batch``): gather its jobs' outcomes, then send them as one message.

    The message also carries the batch's own ``task-received``, ``task-started`` and
    ``task-succeeded``, when it succeeded (a failure is Celery's to announce: ``BatchRequest``);
    Flower's worker table counts the first as processed and the last as succeeded, and its
    prefetched-tasks gauge takes the batch off at the second. Nothing is gathered or sent outside a worker
    (no task id or hostname: the task called directly) or when the worker sends no task events.
    """
    if not (batch and batch.id and hostname and worker_sends_events()):
        yield Collector()
        return
    collector = Collector(jobs=enabled())
    token = _collector.set(collector)
    started = time.time()
    succeeded = False
    try:
        yield collector
        succeeded = True
    finally:
        _collector.reset(token)
        send(collector.events, batch=batch, hostname=hostname, ran=(started, time.time()) if succeeded else None)


def started(jobs: Iterable[store.StartedJob]) -> None:
    """Runner hook: the batch's started jobs (kind, attempt, due time by id). Nothing outside ``collecting``."""
    collector = _collector.get()
    if collector is not None and collector.collects_jobs:
        collector.jobs.update((job.id, job) for job in jobs)


def recorded(successes: Iterable[store.Outcome], failures: Iterable[store.Outcome], kept: dict[int, str]) -> None:
    """Runner hook: outcomes written, ``kept`` the ids whose claim still held with the state each left the job in."""
    collector = _collector.get()
    if collector is None:
        return
    for outcome in [*successes, *failures]:
        job = collector.jobs.get(outcome.id)
        if job is None or outcome.id not in kept or outcome.outcome == RATE_LIMITED:
            continue  # a job given back for want of a start permit made no attempt
        collector.events.append(
            JobEvent(
                job_id=job.id,
                kind=job.kind,
                attempt=job.attempts,
                due_at=job.due_at,
                started_at=outcome.started_at,
                finished_at=outcome.finished_at,
                outcome=outcome.outcome,
                state_after=kept[outcome.id],
                error=outcome.error,
            )
        )


def mark() -> int:
    """Where the events collected so far end (``forget_lost``'s argument)."""
    collector = _collector.get()
    return 0 if collector is None else len(collector.events)


def forget_lost(since: int, committed: Container[int]) -> None:
    """Runner hook: an atomic chunk was lost with its transaction after its outcomes were written (a
    COMMIT that failed or whose answer was lost): the events collected since ``since`` are dropped,
    but for the jobs found ``committed`` after all. Flower showed those outcomes (a success among
    them) while the jobs were back to pending."""
    collector = _collector.get()
    if collector is not None:
        collector.events[since:] = [e for e in collector.events[since:] if e.job_id in committed]


def worker_sends_events() -> bool:
    """Whether this worker sends task events (Celery's ``worker_send_task_events``, or ``-E``)."""
    return bool(broker.app().conf.worker_send_task_events)


def enabled() -> bool:
    """Whether this worker sends task events and the jobs' are not turned off (``SCHEDULING_JOB_TASK_EVENTS``)."""
    return bool(conf.get().job_task_events and worker_sends_events())


@dataclasses.dataclass
class _Publisher:
    """This process's producer on Celery's event exchange (a forked pool process makes its own)."""

    pid: int
    producer: Producer
    exchange: Exchange


_publisher: list[_Publisher] = []


def _get() -> _Publisher:
    pid = os.getpid()
    if not _publisher or _publisher[0].pid != pid:
        app = broker.app()
        connection = app.connection_for_write()
        exchange = get_exchange(connection, name=app.conf.event_exchange)
        producer = Producer(connection, exchange=exchange, serializer=app.conf.event_serializer, auto_declare=False)
        _publisher[:] = [_Publisher(pid, producer, exchange)]
    return _publisher[0]


def error_type(error: str) -> str:
    """The exception's type from an attempt's error line ("ValueError: ..." -> "ValueError"), never its message."""
    head = error.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() else "Error"


def fields(event: JobEvent, batch_id: str) -> tuple[str, dict[str, Any]]:
    """The one Celery task event (type, fields) of an attempt: its outcome, carrying what Flower shows of the task.

    Celery's state (which Flower keeps) takes every field of an event onto the task, so the outcome
    event alone gives it its name, args, received and started times, runtime and state; a separate
    ``task-received`` would double the bytes for the same page.
    """
    started, finished = event.started_at.timestamp(), event.finished_at.timestamp()
    values: dict[str, Any] = {
        "uuid": f"job-{event.job_id}-{event.attempt}-{batch_id[:8]}",  # unique per attempt; Flower finds "job-<id>"
        "name": event.kind,
        "args": f"[{event.job_id}]",  # the job id; the payload is withheld (it may hold personal data)
        "retries": event.attempt - 1,
        "eta": event.due_at.isoformat(),
        "parent_id": batch_id,
        "received": started,  # the attempt is received as it starts
        "started": started,
        "runtime": max(finished - started, 0.0),
        "timestamp": finished,
    }
    if event.outcome == AttemptOutcome.SUCCEEDED:
        return "task-succeeded", values
    values["exception"] = f"{error_type(event.error)} (job {event.job_id}, attempt {event.attempt}: {event.outcome})"
    if event.state_after == JobState.DEAD:
        return "task-failed", {**values, "traceback": ""}
    if event.state_after == JobState.CANCELLED:  # the handler cancelled it (registry.Cancel), or its owner is gone
        return "task-revoked", {**values, "terminated": False, "expired": False}
    return "task-retried", values


RECEIVED_FIELDS = ("uuid", "name", "args", "kwargs", "retries", "root_id", "parent_id")  # Celery's task-received


def batch_fields(batch: Batch, started: float, finished: float) -> dict[str, Any]:
    """The batch's own ``task-succeeded``, carrying what Celery's ``task-received`` and ``task-started`` would."""
    return {
        "uuid": batch.id,
        "name": batch.name,
        "args": batch.args,
        "kwargs": "{}",
        "retries": batch.retries,
        "root_id": batch.root_id,
        "parent_id": batch.parent_id,
        "received": started,  # the pool process cannot know when the main process received it
        "started": started,
        "runtime": max(finished - started, 0.0),
        "timestamp": finished,
    }


def send(events: Sequence[JobEvent], *, batch: Batch, hostname: str, ran: tuple[float, float] | None = None) -> int:
    """Publish ``events`` of ``batch``'s jobs (and, when ``ran`` gives its start and end, the batch's own
    success) as one ``task.multi`` message of Celery task events; how many events were sent.

    The events are the dicts Celery's ``EventDispatcher`` would build (type, hostname, utcoffset,
    pid, Lamport clock, timestamp and the fields), built here directly: one publish per batch,
    no lock or buffer per event.
    """
    if not worker_sends_events() or not (events or ran):
        return 0
    app = broker.app()
    base = {"hostname": hostname, "utcoffset": utcoffset(), "pid": os.getpid()}
    body = []
    for event in events:
        event_type, values = fields(event, batch.id)
        body.append({"type": event_type, **base, "clock": app.clock.forward(), **values})
    if ran is not None:
        values = batch_fields(batch, *ran)
        received = {key: values[key] for key in RECEIVED_FIELDS} | {"timestamp": values["received"]}
        # received, started and succeeded: Flower's prefetched-tasks gauge counts a received task up
        # and takes it off only at its task-started
        for event_type, fields_ in (
            ("task-received", received),
            ("task-started", {"uuid": values["uuid"], "timestamp": values["started"]}),
            ("task-succeeded", values),
        ):
            body.append({"type": event_type, **base, "clock": app.clock.forward(), **fields_})
    try:
        publisher = _get()
        publisher.producer.publish(
            body,
            routing_key="task.multi",  # Celery's routing key for a list of task events (EventDispatcher.flush)
            exchange=publisher.exchange.name,
            declare=[publisher.exchange],
            headers={"hostname": hostname},
            delivery_mode=1,  # transient, as Celery's events
            retry=False,
        )
    except (OSError, KombuError, redis.RedisError) as exc:
        _publisher.clear()  # a fresh connection next time
        logger.warning(
            "job task events not sent (Flower will miss them): %s",
            type(exc).__name__,
            extra={"jobs": len(events), "action": "task_events_dropped"},
        )
        return 0
    return len(body)
