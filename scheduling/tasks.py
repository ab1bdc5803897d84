"""Timekeeper's Celery tasks and worker hooks: thin wrappers that call the modules holding the decisions.

Found by Celery's standard ``app.autodiscover_tasks()`` (this is the app's ``tasks`` module).

- ``scheduling.run_batch``: run a batch of claimed jobs.
- ``scheduling.claim`` / ``scheduling.sweep``: one claim pass / one sweep, for a person or a script
  (``celery call scheduling.sweep``; a claim never started is taken back only by a sweep that saw its
  message missing at the previous sweep of its process: the control loop's); routinely both run in
  the control loop (``due_at.control``), which every worker starts in its main process when it is
  ready and stops when it shuts down.
- ``scheduling.run_deferred``: run a short broker deferral (``deferrals.countdowns``), retried with countdowns.
- ``scheduling.run_fixed``: one tick of a fixed-time schedule, through the gate (``fixed.gate``).

Claim-type messages expire quickly: a tick that waited in the queue longer than that is useless,
the next one is coming. Run messages never expire; if lost, their rows are swept back.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
from typing import Any

from celery import Task, shared_task, signals
from django import db

from scheduling.core import holdings, reconnect, remote_control, tracing, worker_timers
from scheduling.deferrals import countdowns
from scheduling.due_at import api as jobs_api
from scheduling.due_at import claim as claim_module
from scheduling.due_at import control, liveness, runner, task_events
from scheduling.due_at import sweep as sweep_module
from scheduling.fixed import gate, messages, orphans
from scheduling.models import RunTrigger
from scheduling.recurring import planner

logger = logging.getLogger(__name__)


@shared_task(name="scheduling.claim", ignore_result=True, acks_late=False)
def claim() -> dict[str, Any]:
    """Claim what is due (what the queue has room for) and hand it to workers: one pass."""
    report = claim_module.claim_and_dispatch()
    return {"claimed": report.claimed, "batches": report.batches}


@shared_task(
    name="scheduling.run_batch",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    send_events=False,  # its success rides in its jobs' events message, sent by the pool process (task_events)
    Request="scheduling.due_at.task_events:BatchRequest",
)
def run_batch(self: Task, claims: list[list[Any]]) -> dict[str, Any]:
    """Run a batch of claimed jobs, each given as [id, token]; each job's attempt reaches Flower as a task."""
    request = self.request
    batch = task_events.Batch(
        id=request.id or "",
        name=request.shadow or self.name,
        args=getattr(request, "argsrepr", None) or repr([claims]),
        retries=request.retries or 0,
        root_id=request.root_id,
        parent_id=request.parent_id,
    )
    with task_events.collecting(batch=batch, hostname=request.hostname):
        report = runner.run_batch([(int(c[0]), str(c[1])) for c in claims])
    return {"started": report.started, "succeeded": report.succeeded, "failed": report.failed}


@shared_task(name="scheduling.sweep", ignore_result=True, acks_late=False)
def sweep() -> dict[str, Any]:
    """Take back claims of dead workers and prune finished history."""
    report = sweep_module.sweep()
    return {"reclaimed": report.reclaimed, "killed": report.killed, "pruned": report.pruned}


@shared_task(
    name="scheduling.run_deferred",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,  # attempts are counted in the args against the kind's max_attempts
)
def run_deferred(
    self: Task,
    /,  # a forged "self" keyword lands in ``unknown`` (refused), not in a TypeError
    kind: Any = None,
    payload: Any = None,
    attempt: Any = 0,
    deferral_id: Any = "",
    signature: Any = "",
    *extra: Any,
    **unknown: Any,
) -> dict[str, Any]:
    """Run a broker deferral signed by ``defer()``; retry a failure with a countdown, or record it dead when spent.

    A message whose signature does not check (sent by hand, through Flower or a periodic task) runs
    nothing; nor does one with arguments ``defer()`` never sends. Every parameter has a default and
    extras are taken, so a forged message of any shape is refused and counted here rather than
    failing in Celery with a ``TypeError`` (which logs its arguments, payload included).
    """
    if extra or unknown or not countdowns.authentic(kind, payload, attempt, deferral_id, signature):
        result = countdowns.refuse(kind, attempt, deferral_id)
        return {"outcome": result.outcome, "attempt": result.attempt}
    attempt = int(attempt)
    # Every Celery retry so far was a failure's (the attempt grew) or a snooze's (it did not).
    snoozes = max(0, int(self.request.retries or 0) - (attempt - 1))
    eta = countdowns.parse_eta(self.request.eta)
    result = countdowns.run(kind, payload, attempt, str(deferral_id), eta, snoozes=snoozes)
    if result.outcome in ("retry", "snooze"):
        following = attempt + 1 if result.outcome == "retry" else attempt
        countdown = result.retry_in_seconds
        if countdown > countdowns.ceiling_seconds() or not countdowns.guard_allows(countdown):
            # A handler's Snooze or RetryAfter longer than a countdown may be: the rest waits as a row.
            job = jobs_api.schedule(kind, payload, delay=countdown)
            logger.info(
                "deferral continues as a due_at row",
                extra={"deferral_id": deferral_id, "kind": kind, "job_id": job.id, "action": "deferred_to_table"},
            )
            return {"outcome": result.outcome, "attempt": attempt, "job_id": job.id}
        again = countdowns.message_args(kind, payload, following, str(deferral_id))
        raise self.retry(args=again, countdown=countdown)
    return {"outcome": result.outcome, "attempt": attempt}


@shared_task(name="scheduling.run_fixed", bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_fixed(
    self: Task,
    /,
    schedule: Any = None,
    tick: Any = None,
    trigger: Any = RunTrigger.BEAT,
    signature: Any = "",
    policy: Any = "",
    *extra: Any,
    **unknown: Any,
) -> dict[str, Any]:
    """Run one tick of a fixed-time schedule; a redelivered or repeated tick is refused by the gate's ledger.

    Only a message signed by beat or "run now" (``fixed.messages``) runs: one sent by hand (Flower's
    send-task, ``celery call``, a periodic task sent without a tick) is refused, counted, and runs
    nothing, whatever the shape of its arguments (as ``run_deferred``).
    """
    if extra or unknown or not messages.authentic(schedule, tick, trigger, signature, policy):
        messages.refuse(schedule)
        return {"outcome": messages.REFUSED, "run_id": None, "attempt": 0}
    assert tick is not None  # authentic() holds only for a tick
    task_id = str(self.request.id or "")
    report = gate.run(schedule, dt.datetime.fromisoformat(tick), trigger, task_id=task_id, policy_id=int(policy))
    return {"outcome": report.outcome, "run_id": report.run_id, "attempt": report.attempt}


@signals.task_prerun.connect
@signals.task_postrun.connect
def close_old_connections(sender: Any = None, **kwargs: Any) -> None:
    """Around each of Timekeeper's tasks, treat the database connection as Django treats it around a request.

    ``django.db.close_old_connections``: a connection with errors or a transaction left open is
    closed, one older than ``CONN_MAX_AGE`` too, and with ``CONN_HEALTH_CHECKS`` the next use checks
    that it still answers. This is what keeps a reused connection safe (a handler stopped by its
    timeout mid-query, a database restart). Celery's Django fixup closes every connection around
    every task unless ``CELERY_DB_REUSE_MAX`` is set; with it set, a batch does not pay for a new
    connection (and PostgreSQL for a new backend) each time (docs/installing.md).
    """
    if getattr(sender, "name", "").startswith("scheduling.") and not getattr(sender.request, "is_eager", False):
        db.close_old_connections()


@signals.worker_init.connect
def refuse_unsafe_ceiling(sender: Any = None, **kwargs: Any) -> None:
    """A worker does not start while scheduling.E003 fails: its countdowns would be delivered twice."""
    problem = countdowns.ceiling_problem()
    if problem:
        logger.critical("worker refuses to start: %s", problem, extra={"action": "refused_start"})
        raise SystemExit(f"scheduling.E003: {problem}")  # Celery logs and swallows Exception subclasses


@signals.worker_init.connect
def refuse_non_json(sender: Any = None, **kwargs: Any) -> None:
    """A worker does not start while scheduling.E002 fails: a pickle message from the broker is code execution."""
    from scheduling import checks

    errors = checks.check_json_only()
    if errors:
        logger.critical("worker refuses to start: %s", errors[0].msg, extra={"action": "refused_start"})
        raise SystemExit(f"scheduling.E002: {errors[0].msg}")  # Celery logs and swallows Exception subclasses


@signals.worker_init.connect
def refuse_unsupported_pool(sender: Any = None, **kwargs: Any) -> None:
    """A worker does not start under a pool that cannot keep timeouts and leases (scheduling.E011)."""
    from scheduling import checks

    problem = checks.pool_problem(getattr(sender, "pool_cls", None) or "prefork")
    if problem:
        logger.critical("worker refuses to start: %s", problem, extra={"action": "refused_start"})
        raise SystemExit(f"scheduling.E011: {problem}")  # Celery logs and swallows Exception subclasses


@signals.worker_init.connect
def carry_messages_across_reconnects(sender: Any = None, **kwargs: Any) -> None:
    """A worker acknowledges on its new broker connection, or puts back at once, what it held when the old one reset."""
    reconnect.install(sender.app)


@signals.worker_init.connect
def answer_remote_control_without_settings(sender: Any = None, **kwargs: Any) -> None:
    """``inspect conf``, ``report`` and ``stats`` give a broker-only party no setting (core/remote_control.py)."""
    remote_control.install()


@signals.worker_init.connect
def put_back_what_dead_workers_held(sender: Any = None, **kwargs: Any) -> None:
    """A worker records what it holds and, within a lease of another's death, puts back what that one held."""
    holdings.install(sender.app)


@signals.worker_init.connect
def drop_cancelled_timers(sender: Any = None, **kwargs: Any) -> None:
    """The event loop's timer drops the time limits of finished tasks (core/worker_timers.py)."""
    worker_timers.install(sender.app)


@signals.worker_process_init.connect
def start_tracing(sender: Any = None, **kwargs: Any) -> None:
    """With SCHEDULING_TRACING on, each pool process sets up tracing before its first task (core/tracing.py)."""
    tracing.start_in_worker_process()


@signals.beat_init.connect
def check_beat_scheduler_at_start(sender: Any = None, **kwargs: Any) -> None:
    """A beat whose scheduler (``-S`` or ``beat_scheduler``) is not Timekeeper's says so, loudly, as it starts.

    The system check W002 sees only Celery's configuration; this sees the scheduler beat really runs.
    """
    from scheduling import checks

    problem = checks.beat_scheduler_problem(getattr(sender, "scheduler_cls", None))
    if problem:
        logger.error(problem, extra={"action": "foreign_beat_scheduler"})


@signals.worker_ready.connect
def freeze_what_startup_built(sender: Any = None, **kwargs: Any) -> None:
    """The main process's startup objects (modules, Django, the Celery app) leave the collector's reach.

    They live as long as the worker, yet every full collection walked them: on a worker running
    1,000 jobs/s that was a 130-165 ms pause of the process that claims and dispatches, every few
    minutes, and it showed as the worst second of start lag (``python -m bench soak``). Frozen,
    a full collection walks only what came after (``gc.freeze``; a collection first, so no garbage
    is frozen with them). The price: a startup object that later becomes cyclic garbage (a first
    connection replaced after a reconnect) is never freed, once per process. Pool processes forked
    later inherit the frozen objects, which keeps them shared with the parent's pages.
    """
    gc.collect()
    gc.freeze()
    logger.info("startup objects frozen: %d", gc.get_freeze_count(), extra={"action": "gc_frozen"})


@signals.worker_ready.connect
def start_control_loop(sender: Any = None, **kwargs: Any) -> None:
    """Claiming and sweeping run beside the pool, in this worker's main process (one worker leads)."""
    if planner.duty not in control.EXTRA_DUTIES:
        control.EXTRA_DUTIES.append(planner.duty)  # the leader plans recurrences' next occurrences
    if orphans.duty not in control.EXTRA_DUTIES:
        control.EXTRA_DUTIES.append(orphans.duty)  # and closes fixed-time runs whose worker died
    control.start()


@signals.worker_shutting_down.connect
def stop_control_loop(sender: Any = None, **kwargs: Any) -> None:
    """A stopping worker ends its control loop within two seconds (another worker's loop takes over)."""
    control.stop()


@signals.celeryd_after_setup.connect
def carry_task_events_flag(sender: Any = None, instance: Any = None, conf: Any = None, **kwargs: Any) -> None:
    """``celery worker -E`` reaches the pool processes (forked later) as ``worker_send_task_events``: job events."""
    if getattr(instance, "task_events", False) and conf is not None:
        conf.worker_send_task_events = True


@signals.celeryd_after_setup.connect
def warn_shared_deferral_queue(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """Say so when one worker consumes the deferral queue beside others (it can stall at its ETA limit)."""
    consumed = instance.app.amqp.queues.consume_from if instance is not None else None
    warning = countdowns.worker_queue_warning((consumed or {}).keys())
    if warning:
        logger.warning(warning, extra={"action": "shared_deferral_queue"})


@signals.worker_ready.connect
def start_liveness_watcher(sender: Any = None, **kwargs: Any) -> None:
    """The worker's liveness file (``timekeeper probe worker``), written while its control loop turns."""
    liveness.start()


@signals.worker_shutting_down.connect
def stop_liveness_watcher(sender: Any = None, **kwargs: Any) -> None:
    """A stopping worker stops writing its liveness file."""
    liveness.stop()
