"""Per-entity future work: schedule, cancel and reschedule rows with a ``due_at``.

``schedule()`` writes a row in the caller's transaction: roll back and there is no job. Every
check (kind, payload, due time) happens here, at schedule time, never at run time. Changes are
conditional on the job being pending; any other state raises a named ``JobStateConflict``.

The bulk changes (``cancel_many``, ``reschedule_many``, ``run_now_many``, ``retry_dead_many``) are
one conditional UPDATE each over a selection of ids: the jobs in the state the change is for
(pending; dead for a retry) change, the others are reported in a ``BulkResult`` with the state
that kept them out, never raised about. A job that becomes due within the claim interval wakes the
claim loop when the transaction commits. The admin's bulk actions call these.
Application code imports all of them through ``scheduling.api``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import redis

from scheduling.core import aborts, audit, conf, exceptions, holdings, kind_options, registry, tracing, validation
from scheduling.core import options as options_
from scheduling.core import store as core_store
from scheduling.due_at import claim, lifecycle, store
from scheduling.models import JobState, ScheduledJob

logger = logging.getLogger(__name__)

ON_CONFLICT_CHOICES = options_.ON_CONFLICT_CHOICES
P = ParamSpec("P")
R = TypeVar("R")


def schedule(
    kind: str,
    payload: Any,
    *,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
    key: str | None = None,
    on_conflict: str = "replace",
    max_attempts: int | None = None,
    owner: Any = None,
    priority: int | None = None,
    timeout: float | dt.timedelta | None = None,
    backoff: registry.Backoff | None = None,
    atomic: bool | None = None,
    unique_for: float | dt.timedelta | None = None,
    unique_states: Sequence[str] | None = None,
) -> ScheduledJob:
    """Schedule ``kind`` with ``payload`` at ``due_at`` (aware) or after ``delay`` (by the database clock).

    ``delay`` counts from this call (``clock_timestamp()``), even inside a transaction opened long
    before; ``delay=0`` is due at once (the transaction's ``now()``, so a claim in the same
    transaction sees it due). Keys belong to their owner (``owner=None``: the system's namespace): a key never
    reaches another owner's job. A key names at most one *waiting* job: pending, or claimed and not
    yet started by a worker. A second schedule for the key either moves that job (``replace``;
    a claim not yet started is taken back), leaves it (``keep``: the waiting job is returned) or
    raises ``KeyConflict`` (``error``), decided by one statement (no check-then-insert window).
    A *running* job (started) is never touched and never waited for: with no job waiting, every
    mode inserts the key's next job, which waits beside the running one (the chain recipe: a
    handler schedules its own key's next run). ``priority`` (0-9, default the kind's): among due
    jobs, a higher one is claimed first.

    ``timeout`` (seconds above 0, at most a day), ``backoff`` (a ``registry.Backoff``, base <= cap)
    and ``atomic`` are this job's own, in place of its kind's (None: the kind's): the worker stops
    the handler past the job's timeout, waits its backoff between failed attempts (the sweeper's
    retry after a lost worker too), and runs it atomic (its writes commit with its outcome) or
    committing as it goes. Kept on the row; a ``replace`` sets them anew, a ``keep`` leaves the
    waiting job's. Bad values raise ``InvalidSchedule`` before anything is stored.

    ``unique_for`` (seconds or a timedelta; default the kind's, 0: none): a uniqueness window. A
    job of the same kind and owner with the same key (without a key: the same payload) scheduled
    in the same window slot (slots of ``unique_for`` from the epoch, by the database clock) while
    that job is in one of ``unique_states`` (default pending, claimed, running, done; pending,
    claimed and running always count) is a conflict, handled by ``on_conflict``: ``error`` raises
    ``DuplicateJob``, ``keep`` returns that job, ``replace`` moves it if it is pending and returns
    it unchanged otherwise. The database decides (a unique index), exactly under concurrent
    inserts (docs/architecture.md, "Uniqueness windows").
    """
    options = options_.JobOptions(
        due_at=due_at,
        delay=delay,
        key=key,
        on_conflict=on_conflict,
        max_attempts=max_attempts,
        owner=owner,
        priority=priority,
        timeout=timeout,
        backoff=backoff,
        atomic=atomic,
        unique_for=unique_for,
        unique_states=unique_states,
    )
    return schedule_with_options(kind, payload, options)[0]


def _parameters_of(model: Callable[P, object]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated function ``model``'s parameters (what type checkers and ``help()`` show), its own return."""

    def give(function: Callable[..., R]) -> Callable[P, R]:
        returns = inspect.signature(function).return_annotation
        function.__signature__ = inspect.signature(model).replace(return_annotation=returns)  # type: ignore[attr-defined]
        return function

    return give


@_parameters_of(schedule)
def schedule_with_outcome(kind: str, payload: Any, **keywords: Any) -> tuple[ScheduledJob, str]:
    """``schedule()`` (the same parameters), also saying what happened: "created", "replaced" or "kept"."""
    return schedule_with_options(kind, payload, options_.JobOptions(**keywords))


def schedule_with_options(kind: str, payload: Any, options: options_.JobOptions) -> tuple[ScheduledJob, str]:
    """``schedule()`` with its options as one ``JobOptions`` value; (the job, "created", "replaced" or "kept")."""
    with tracing.span("timekeeper.schedule", kind=kind, mechanism=registry.Mechanism.DUE_AT) as span:
        job_kind = registry.get(kind)
        validation.encode_payload(job_kind, payload)
        valid = options.validated(job_kind)
        key, on_conflict = valid.key, valid.on_conflict
        new = store.NewJob(kind=kind, payload=payload, options=valid)
        outcome = "created"
        unique = _schedule_unique(new) if valid.unique_for_seconds is not None else None
        if unique is not None:
            held, outcome = unique
            if outcome == "kept":
                span.set("job_id", held.id)
                span.set("outcome", "kept")
                return ScheduledJob.objects.get(pk=held.id), "kept"
            job_id, stored_due_at, in_seconds = held.id, held.due_at, held.in_seconds
        elif key is None:
            row = store.insert_job(new, on_conflict)
            assert row is not None
            job_id, stored_due_at, in_seconds = row.id, row.due_at, row.in_seconds
        else:
            upserted = store.upsert_keyed_job(new, on_conflict)
            if upserted is None:  # every branch of the statement returns its row: not expected
                raise exceptions.KeyConflict(key, -1)
            if not upserted.inserted and on_conflict == "error":
                raise exceptions.KeyConflict(key, upserted.id)
            if not upserted.inserted and on_conflict == "keep":
                logger.info("schedule kept the key's waiting job", extra={"job_id": upserted.id, "action": "kept"})
                span.set("job_id", upserted.id)
                span.set("outcome", "kept")
                return ScheduledJob.objects.get(pk=upserted.id), "kept"
            outcome = "created" if upserted.inserted else "replaced"
            job_id, stored_due_at, in_seconds = upserted.id, upserted.due_at, upserted.in_seconds
        claim.wake_on_commit(in_seconds)
        logger.info("job scheduled", extra={"job_id": job_id, "kind": kind, "action": "scheduled"})
        job = ScheduledJob(
            id=job_id,
            kind=kind,
            payload=payload,
            due_at=stored_due_at,
            state=JobState.PENDING,
            lease_seconds=valid.lease_seconds,
            attempts=0,
            max_attempts=valid.max_attempts,
            key=key,
            owner_id=valid.owner_id,
            priority=valid.priority,
            timeout_seconds=valid.timeout_seconds,
            backoff_base_seconds=valid.backoff_base_seconds,
            backoff_cap_seconds=valid.backoff_cap_seconds,
            atomic=valid.atomic,
        )
        job._state.adding = False
        span.set("job_id", job_id)
        span.set("outcome", outcome)
        return job, outcome


UNIQUE_ATTEMPTS = 3  # a window's holder that leaves it between our insert and our look-up: insert again


def _schedule_unique(new: store.NewJob) -> tuple[store.DueJob, str] | None:
    """Schedule a job with a uniqueness window: (its row, "created", "replaced" or "kept"); None: the key's rule.

    The database decides (``store.insert_unique_job``: a unique index, no check-then-insert). When
    the window holds a job like it, ``on_conflict`` says what happens: ``error`` raises
    ``DuplicateJob`` naming it, ``keep`` returns it, ``replace`` moves it while it waits (pending)
    and otherwise returns it unchanged ("kept": a job claimed, running or finished in the window
    stays as it is). None when no window holds it but the key's waiting job refused the insert (a
    job of the key from an earlier slot): the key's own rule (``upsert_keyed_job``) applies.
    """
    key = store.unique_key(new)
    on_conflict = new.options.on_conflict
    for _ in range(UNIQUE_ATTEMPTS):
        row = store.insert_unique_job(new, key)
        if row is not None:
            return row, "created"
        holder = store.unique_job_holder(key)
        if holder is None:
            if new.options.key is not None:
                return None
            continue  # it left the window meanwhile (cancelled, dead): the slot is free again
        if on_conflict == "error":
            raise exceptions.DuplicateJob(new.options.key or "", holder.id, holder.state)
        if on_conflict == "replace":
            moved = store.replace_unique_job(new, key, holder.id)
            if moved is not None:
                logger.info("schedule moved the window's job", extra={"job_id": holder.id, "action": "replaced"})
                return moved, "replaced"
        logger.info("schedule kept the window's job", extra={"job_id": holder.id, "action": "kept"})
        return store.DueJob(id=holder.id, due_at=dt.datetime.min, in_seconds=0.0), "kept"
    raise exceptions.DuplicateJob(new.options.key or "", -1, "unknown")


def schedule_many(
    kind: str,
    payloads: Sequence[Any],
    *,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
    max_attempts: int | None = None,
    owner: Any = None,
    priority: int | None = None,
    timeout: float | dt.timedelta | None = None,
    backoff: registry.Backoff | None = None,
    atomic: bool | None = None,
    unique_for: float | dt.timedelta | None = None,
    unique_states: Sequence[str] | None = None,
    on_conflict: str = "replace",
) -> list[int]:
    """Schedule one job of ``kind`` per payload, all at ``due_at`` or after ``delay``; returns their ids.

    The same checks as ``schedule()`` (every payload is validated before anything is stored) and
    the same transaction rules, in one statement: for bulk loads, where a row-per-call insert
    dominates. No keys: a keyed job needs ``schedule()``'s conflict handling. ``timeout``,
    ``backoff`` and ``atomic`` as in ``schedule()``, the same for every job of the call.
    With a uniqueness window (``unique_for``, or the kind's) each payload goes through
    ``schedule()``'s window rule in turn (``on_conflict``; one insert each): the id returned for a
    payload whose window already holds a job is that job's.
    """
    mechanism = registry.Mechanism.DUE_AT
    with tracing.span("timekeeper.schedule_many", kind=kind, mechanism=mechanism, count=len(payloads)) as span:
        job_kind = registry.get(kind)
        encoded = [validation.encode_payload(job_kind, payload) for payload in payloads]
        options = options_.JobOptions(
            due_at=due_at,
            delay=delay,
            max_attempts=max_attempts,
            owner=owner,
            priority=priority,
            timeout=timeout,
            backoff=backoff,
            atomic=atomic,
            unique_for=unique_for,
            unique_states=None if unique_states is None else tuple(unique_states),
            on_conflict=on_conflict,
        )
        valid = options.validated(job_kind)
        if not encoded:
            return []
        if valid.unique_for_seconds is not None:
            ids = [schedule_with_options(kind, payload, options)[0].id for payload in payloads]
            span.set("job_ids", ids)
            return ids
        rows = store.insert_jobs(kind, encoded, valid)
        claim.wake_on_commit(min(row.in_seconds for row in rows))  # one wake-up: all rows share the due time
        logger.info("jobs scheduled", extra={"kind": kind, "count": len(rows), "action": "scheduled"})
        span.set("job_ids", [row.id for row in rows])
        return [row.id for row in rows]


def _from_now(delay: float) -> dt.datetime:
    """The due time ``delay`` seconds from this call by the database clock (0: due at once, as in schedule())."""
    if delay > 0:
        return core_store.database_clock() + dt.timedelta(seconds=delay)
    return core_store.database_now()


def _find(job_id: int | None, key: str | None, owner: Any = None) -> int:
    if (job_id is None) == (key is None):
        raise exceptions.InvalidSchedule("Give exactly one of job_id and key.")
    if job_id is not None:
        found = validation.row_id(job_id, "job_id")
        if found is None:
            raise exceptions.JobNotFound(f"No job {validation.shown_number(job_id)}.")
        return found
    assert key is not None
    validation.check_key(key)
    live = store.live_job_by_key(key, getattr(owner, "pk", owner))
    if live is None:
        raise exceptions.JobNotFound(f"No pending or claimed job has key {key!r}.")
    return live.id


def cancel(job_id: int | None = None, *, key: str | None = None, owner: Any = None) -> int:
    """Cancel a pending job; returns its id. ``JobNotCancellable`` says which state it is in otherwise.

    By ``key``, the job is the ``owner``'s (None: the system's namespace).
    """
    target = _find(job_id, key, owner)
    if store.cancel_job(target):
        logger.info("job cancelled", extra={"job_id": target, "action": "cancelled"})
        audit.record("cancel", changed=1, job_ids=[target])
        return target
    state = store.job_state(target)
    if state is None:
        raise exceptions.JobNotFound(f"No job {target}.")
    raise exceptions.JobNotCancellable(target, state)


ABORT_REQUESTED = "requested"  # running: its worker interrupts the handler within about a heartbeat interval
ABORT_CANCELLED = "cancelled"  # claimed, not started: cancelled at once, nothing ran


@dataclasses.dataclass(frozen=True)
class Aborted:
    """What ``abort()`` did: ``outcome`` is ``"requested"`` (running) or ``"cancelled"`` (not started)."""

    job_id: int
    outcome: str

    @property
    def requested(self) -> bool:
        """True for a running job: its worker has yet to stop it (within about a heartbeat interval)."""
        return self.outcome == ABORT_REQUESTED


def _abort(ids: Sequence[int], by: str) -> tuple[list[int], list[int]]:
    """Abort ``ids``: (running jobs asked to stop, claims not started cancelled now).

    The claims first (conditional on ``claimed`` and their token): one that started meanwhile is
    then asked like any running job. A running job's request is a row its worker's heartbeat reads
    (``store.request_aborts``); the worker writes the outcome (``lifecycle.Event.ABORTED``).
    """
    unstarted = store.unstarted_claims(ids)
    text = aborts.reason(by, dt.datetime.now(dt.UTC))
    cancelled = [
        moved.id
        for moved in store.set_job_states([store.Change(i, t, lifecycle.Event.ABORT, error=text) for i, t in unstarted])
    ]
    left = sorted(set(ids) - set(cancelled))
    requested = store.request_aborts(left, by) if left else []
    return requested, cancelled


def abort(job_id: int | None = None, *, key: str | None = None, owner: Any = None, by: str | None = None) -> Aborted:
    """Abort a claimed or running job: stop its handler where it is, roll back its atomic writes, cancel it.

    A running job's worker reads the request with its next heartbeat (within about
    ``SCHEDULING_HEARTBEAT_SECONDS``, on whichever host it runs) and raises ``JobAborted`` inside
    the handler, as a timeout does; the job is then ``cancelled``, its attempt ``aborted`` with who
    asked (``by``, else the operator of the door, else "application") and when. A claim not started
    yet is cancelled at once. ``JobAlreadyFinished`` when the job finished before the abort
    arrived (it stays finished); ``JobNotAbortable`` when it is pending (``cancel()`` it). By
    ``key``, the owner's running (else claimed) job of that key. How it works:
    docs/architecture.md, "Aborting a running job".
    """
    if (job_id is None) == (key is None):
        raise exceptions.InvalidSchedule("Give exactly one of job_id and key.")
    if job_id is None:
        assert key is not None
        validation.check_key(key)
        found = store.abortable_job_by_key(key, getattr(owner, "pk", owner))
        if found is None:
            raise exceptions.JobNotFound(f"No job has key {key!r}.")
        job_id = found.id
    else:
        given = validation.row_id(job_id, "job_id")
        if given is None:
            raise exceptions.JobNotFound(f"No job {validation.shown_number(job_id)}.")
        job_id = given
    asker = aborts.asker(by)
    requested, cancelled = _abort([job_id], asker)
    if requested or cancelled:
        outcome = ABORT_REQUESTED if requested else ABORT_CANCELLED
        logger.info("job abort", extra={"job_id": job_id, "action": f"abort_{outcome}"})
        audit.record("abort", changed=1, job_ids=[job_id], details={"outcome": outcome})
        return Aborted(job_id, outcome)
    state = store.job_state(job_id)
    if state is None:
        raise exceptions.JobNotFound(f"No job {job_id}.")
    if state == JobState.PENDING:
        raise exceptions.JobNotAbortable(job_id, state)
    raise exceptions.JobAlreadyFinished(job_id, state)


def abort_many(ids: Iterable[int], *, by: str | None = None) -> BulkResult:
    """Abort the claimed and running jobs among ``ids`` as ``abort()`` does (two statements); others are reported."""
    selected = _selection(ids)
    if not selected:
        return _bulk_result(selected, [], "aborted")
    requested, cancelled = _abort(selected, aborts.asker(by))
    return _bulk_result(
        selected, requested + cancelled, "aborted", {"requested": len(requested), "cancelled": len(cancelled)}
    )


def reschedule(
    job_id: int | None = None,
    *,
    key: str | None = None,
    due_at: dt.datetime | None = None,
    delay: float | int | dt.timedelta | None = None,
    owner: Any = None,
) -> dt.datetime:
    """Move a pending job to ``due_at`` (or ``delay`` from now); returns the stored due time.

    By ``key``, the job is the ``owner``'s (None: the system's namespace).
    """
    resolved_due_at, resolved_delay = validation.resolve_time(due_at, delay)
    target = _find(job_id, key, owner)
    if resolved_due_at is None:
        assert resolved_delay is not None
        resolved_due_at = _from_now(resolved_delay)
    row = store.reschedule_job(target, resolved_due_at)
    if row is not None:
        claim.wake_on_commit(row.in_seconds)
        logger.info("job rescheduled", extra={"job_id": target, "action": "rescheduled"})
        audit.record("reschedule", changed=1, job_ids=[target], details={"due_at": row.due_at.isoformat()})
        return row.due_at
    state = store.job_state(target)
    if state is None:
        raise exceptions.JobNotFound(f"No job {target}.")
    raise exceptions.JobNotReschedulable(target, state)


def status() -> dict[str, Any]:
    """The table's numbers operators watch: backlog (pending and overdue), oldest overdue age, claimed, stuck.

    A dict (``store.BacklogStatus``'s fields; ``estimated`` a list) so that it serialises as it is.
    """
    settings = conf.get()
    numbers = store.backlog_status(settings.stuck_after_seconds, settings.status_exact_limit)
    return {**dataclasses.asdict(numbers), "estimated": list(numbers.estimated)}


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """A named queue: its due jobs, the Celery queue its batches go to, and the live workers serving it."""

    queue: str
    celery_queue: str
    due: int  # pending and due jobs of its kinds
    live_workers: int | None  # None: unknown (Redis did not answer, or a worker does not say)

    @property
    def unserved(self) -> bool:
        """Due work and no live worker: its jobs wait until a worker started with ``-Q`` serves it."""
        return self.due > 0 and self.live_workers == 0


def queue_status() -> list[QueueStatus]:
    """Every named queue of the registered kinds, with its due jobs and live workers (reads Redis)."""
    queues = claim.kind_queues()
    due: dict[str, int] = {}
    for row in store.kind_breakdown():
        name = queues.get(row.kind, registry.DEFAULT_QUEUE)
        due[name] = due.get(name, 0) + row.due
    try:
        live = holdings.live_queues()
    except redis.RedisError:
        live = None
    out = []
    for name in sorted(set(queues.values()) | set(due) | {registry.DEFAULT_QUEUE}):
        target = claim.celery_queue(name)
        out.append(QueueStatus(name, target, due.get(name, 0), None if live is None else live.get(target, 0)))
    return out


# --- Kind controls: pause, resume, cap ------------------------------------------------------------


def pause(kind: str) -> store.KindControlRow:
    """Pause ``kind``: its due jobs stay pending (counted as paused, not backlog) until ``resume``."""
    registry.get(kind)
    row = store.set_kind_paused(kind, True)
    logger.info("kind paused", extra={"kind": kind, "action": "paused"})
    audit.record("pause", changed=1, selected=1, kind=kind, target=f"kind {kind}")
    return row


def _registered_or_controlled(kind: str) -> None:
    """``UnknownJobKind`` unless ``kind`` is registered or has a control row.

    Lifting a control (resume, no cap) stays possible for a kind whose code is gone: its pending
    jobs then run and fail as an unknown kind, visibly, instead of waiting unseen forever.
    """
    try:
        registry.get(kind)
    except exceptions.UnknownJobKind:
        if not any(row.kind == kind for row in store.kind_controls()):
            raise


def resume(kind: str) -> store.KindControlRow:
    """Resume ``kind``: its due jobs are claimed again (the control loop is woken on commit)."""
    _registered_or_controlled(kind)
    row = store.set_kind_paused(kind, False)
    claim.wake_on_commit(0.0)
    logger.info("kind resumed", extra={"kind": kind, "action": "resumed"})
    audit.record("resume", changed=1, selected=1, kind=kind, target=f"kind {kind}")
    return row


def set_kind_option(kind: str, name: str, value: Any) -> store.KindControlRow:
    """Set per-kind option ``name`` of ``kind`` (``core/kind_options.py``: its check, its verb), None: unset.

    Raises ``InvalidSchedule`` for a value outside the option's type and bounds. An option can be
    unset (None) on a kind no longer registered. Every door (admin, JSON API, CLI) sets options here.
    """
    option = kind_options.BY_NAME[name]
    if value is None:
        _registered_or_controlled(kind)
    else:
        registry.get(kind)
    option.check(value)
    row = store.set_kind_options(kind, {name: value})
    claim.wake_on_commit(0.0)
    logger.info(f"kind {option.done}", extra={"kind": kind, name: value, "action": option.done})
    audit.record(option.verb, changed=1, selected=1, kind=kind, target=f"kind {kind}", details={name: value})
    return row


def set_max_running(kind: str, max_running: int | None) -> store.KindControlRow:
    """Cap how many jobs of ``kind`` are claimed or running at once, cluster-wide (None: no cap).

    The rest wait pending, not claimed. Raises ``InvalidSchedule`` for a cap that is not a whole
    number of at least 1. A cap can be lifted (None) from a kind no longer registered.
    """
    return set_kind_option(kind, "max_running", max_running)


def set_rate(kind: str, rate: registry.Rate | str | None) -> store.KindControlRow:
    """Limit how many jobs of ``kind`` start per period, cluster-wide (``"10/s"``, ``registry.Rate(...)``; None: none).

    Decided at the claim, exactly, under any number of claimers; the kind's due jobs past its rate
    wait pending (counted as ``rate_limited``). The operator's rate replaces the handler's
    registered one (``handler(rate=...)``) from then on, None included. Raises ``InvalidSchedule``
    for a rate that is not one; a limit can be lifted (None) from a kind no longer registered.
    """
    if rate is None:
        _registered_or_controlled(kind)
    else:
        registry.get(kind)
    try:
        parsed = None if rate is None else registry.Rate.of(rate)
    except exceptions.SchedulingError as exc:
        raise exceptions.InvalidSchedule(str(exc)) from None
    if parsed is None:
        row = store.set_kind_rate(kind, None, None, "")
    else:
        row = store.set_kind_rate(kind, parsed.limit, float(parsed.per_seconds), parsed.partition_by)
    claim.wake_on_commit(0.0)
    logger.info("kind rate set", extra={"kind": kind, "rate": str(parsed), "action": "rate_set"})
    audit.record(
        "rate",
        changed=1,
        selected=1,
        kind=kind,
        target=f"kind {kind}",
        details={"rate": None if parsed is None else str(parsed)},
    )
    return row


def kind_controls() -> list[store.KindControlRow]:
    """Every kind with a control (paused or capped), with what waits behind it."""
    return store.kind_controls()


@dataclasses.dataclass(frozen=True)
class KindOverview:
    """A registered kind as an operator sees it: its controls and what it has due, in flight and dead."""

    kind: str
    description: str
    paused: bool
    options: Mapping[str, Any]  # every per-kind option (core/kind_options.py) by name; None: unset
    priority: int  # the kind's default priority
    rate: str  # its rate limit ("10/s per partner"), "" for none
    queue: str  # its named queue (workers serve it with -Q)
    due: int  # pending and due (held back while paused)
    claimed: int  # claimed, waiting for a worker
    running: int
    dead_24h: int

    def __getattr__(self, name: str) -> Any:
        """An option by its name (``overview.max_running``), as the templates read it."""
        if name in kind_options.BY_NAME:
            return self.__dict__.get("options", {}).get(name)
        raise AttributeError(name)

    @property
    def option_values(self) -> list[tuple[kind_options.KindOption, Any]]:
        """(option, value) for every per-kind option, in ``KIND_OPTIONS``' order (the pages' columns)."""
        return [(o, self.options.get(o.name)) for o in kind_options.KIND_OPTIONS]

    @classmethod
    def json_names(cls) -> list[str]:
        """The keys of ``as_json()``, in order: the options flat where ``options`` stands."""
        names = []
        for field in dataclasses.fields(cls):
            names += [o.name for o in kind_options.KIND_OPTIONS] if field.name == "options" else [field.name]
        return names

    def as_json(self) -> dict[str, Any]:
        """The overview as the JSON API and the CLI show it: each option a key of its own, beside paused."""
        return {name: getattr(self, name) for name in self.json_names()}


def rate_text(control: store.KindControlRow | None) -> str:
    """A control row's rate as text (``"10/s"``, ``"5/2s per partner"``), "" when it has none."""
    if control is None or control.rate_limit is None or control.rate_period_seconds is None:
        return ""
    return str(registry.Rate(control.rate_limit, control.rate_period_seconds, control.rate_partition_by))


def kind_overview() -> list[KindOverview]:
    """Every registered kind (and any kind with a control or live rows), with its controls and counts."""
    kinds = registry.all_kinds()
    controls = {row.kind: row for row in store.kind_controls()}
    counts = {row.kind: row for row in store.kind_breakdown()}
    out = []
    for name in sorted(set(kinds) | set(controls) | set(counts)):
        kind, control, count = kinds.get(name), controls.get(name), counts.get(name)
        out.append(
            KindOverview(
                kind=name,
                description=kind.description if kind else "not registered in this process",
                paused=bool(control and control.paused),
                options={o.name: control.options.get(o.name) if control else None for o in kind_options.KIND_OPTIONS},
                rate=rate_text(control),
                queue=kind.queue if kind else registry.DEFAULT_QUEUE,
                priority=kind.priority if kind else 0,
                due=count.due if count else 0,
                claimed=count.claimed if count else 0,
                running=count.running if count else 0,
                dead_24h=count.dead_24h if count else 0,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class BulkResult:
    """What a bulk change did to a selection of job ids."""

    changed: tuple[int, ...]  # the jobs it changed, in id order
    untouched: Mapping[int, JobState]  # the others, with the state that kept them out
    missing: tuple[int, ...] = ()  # ids of no job (never made, or pruned meanwhile)

    @property
    def selected(self) -> int:
        return len(self.changed) + len(self.untouched) + len(self.missing)


def _selection(ids: Iterable[int]) -> list[int]:
    return validation.row_ids(ids, "job_id")


# The bulk calls' log action -> the audit trail's action (scheduling.core.audit, AuditAction).
AUDIT_ACTIONS = {
    "cancelled": "cancel",
    "rescheduled": "reschedule",
    "run_now": "run_now",
    "retried": "retry",
    "aborted": "abort",
}


def _bulk_result(
    selected: list[int], changed: Iterable[int], action: str, details: dict[str, Any] | None = None
) -> BulkResult:
    """Report the change: the others' states are read after it (one SELECT, only when some were left).

    Recorded in the audit trail when a door acts (``audit.record``: who, the ids asked for, how many changed).
    """
    done = sorted(set(changed))
    others = sorted(set(selected) - set(done))
    states = store.job_states(others) if others else {}
    result = BulkResult(
        changed=tuple(done),
        untouched={job_id: states[job_id] for job_id in others if job_id in states},
        missing=tuple(job_id for job_id in others if job_id not in states),
    )
    logger.info(
        "bulk change",
        extra={
            "action": action,
            "changed": len(result.changed),
            "untouched": len(result.untouched),
            "missing": len(result.missing),
            "job_ids": list(result.changed[:100]),
        },
    )
    audit.record(AUDIT_ACTIONS[action], changed=len(result.changed), job_ids=selected, details=details)
    return result


def cancel_many(ids: Iterable[int]) -> BulkResult:
    """Cancel the pending jobs among ``ids`` in one statement; the others are reported, not touched."""
    selected = _selection(ids)
    return _bulk_result(selected, store.cancel_jobs(selected) if selected else [], "cancelled")


def reschedule_many(
    ids: Iterable[int], *, due_at: dt.datetime | None = None, delay: float | int | dt.timedelta | None = None
) -> BulkResult:
    """Move the pending jobs among ``ids`` to ``due_at`` (aware) or ``delay`` from now, in one statement."""
    resolved_due_at, resolved_delay = validation.resolve_time(due_at, delay)
    selected = _selection(ids)
    if not selected:
        return _bulk_result(selected, [], "rescheduled")
    if resolved_due_at is None:
        assert resolved_delay is not None
        resolved_due_at = _from_now(resolved_delay)
    moved = store.reschedule_jobs(selected, resolved_due_at)
    if moved:
        claim.wake_on_commit(min(job.in_seconds for job in moved))
    return _bulk_result(selected, [job.id for job in moved], "rescheduled", {"due_at": resolved_due_at.isoformat()})


def run_now_many(ids: Iterable[int]) -> BulkResult:
    """Make the pending jobs among ``ids`` due now (one statement) and wake the claim loop on commit."""
    selected = _selection(ids)
    changed = store.run_jobs_now(selected) if selected else []
    if changed:
        claim.wake_on_commit(0.0)
    return _bulk_result(selected, changed, "run_now")


def retry_dead_many(ids: Iterable[int]) -> BulkResult:
    """Make the dead jobs among ``ids`` pending again, due now, with a fresh attempts budget.

    A dead job whose key a newer live job holds stays dead (reported untouched), and so does a dead
    occurrence of a recurrence that has a live occurrence (one at a time, retries included), and so
    does a job whose owner was deleted (it never returns to pending: docs/security.md). One statement;
    the claim loop is woken on commit.
    """
    selected = _selection(ids)
    changed = store.retry_dead_jobs(selected) if selected else []
    if changed:
        claim.wake_on_commit(0.0)
    return _bulk_result(selected, changed, "retried")


__all__ = [
    "Aborted",
    "BulkResult",
    "abort",
    "abort_many",
    "cancel",
    "cancel_many",
    "kind_controls",
    "kind_overview",
    "pause",
    "queue_status",
    "reschedule",
    "reschedule_many",
    "resume",
    "retry_dead_many",
    "run_now_many",
    "schedule",
    "schedule_many",
    "schedule_with_outcome",
    "set_max_running",
    "set_rate",
]  # scheduling.api re-exports these; its own status() wraps this module's (adding the broker's counts)
