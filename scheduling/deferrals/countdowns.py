"""Short deferrals on the broker: the choice of mechanism, the run, its retries, and the delayed count.

``defer()`` picks the mechanism. A delay up to ``SCHEDULING_BROKER_DELAY_MAX_SECONDS`` (900 s by
default, like SQS DelaySeconds) with no key becomes one Celery message (``scheduling.run_deferred``,
JSON args ``[kind, payload, attempt, deferral_id]``) with an ETA, on the ``timekeeper.deferred``
queue, and no table row. A longer delay, or a ``key`` (which asks for something that can be found,
moved and cancelled), becomes a ``due_at`` row (``scheduling.api.defer`` makes that choice).

The visibility-timeout guard: Redis hands a taken, unacknowledged message to another worker once
it is older than the visibility timeout, and a worker takes a countdown message as soon as it can
and holds it unacknowledged until its ETA. A countdown longer than the visibility timeout is
therefore delivered again and again (celery #2599, #4400). Every countdown (first runs and retries)
must end ``SCHEDULING_VISIBILITY_MARGIN_SECONDS`` before it: the system check ``scheduling.E003``
refuses a ceiling that would allow otherwise, ``defer()`` refuses such a delay with
``DelayTooLong``, and retry countdowns are capped at the ceiling.

Queues and the ETA limit: a worker holding ``CELERY_WORKER_ETA_TASK_LIMIT`` countdown messages
stops taking messages from *every* queue it consumes until one comes due (Celery caps the
channel's prefetch count; kombu's Redis QoS then stops fetching). Deferrals therefore travel on
their own queue, so that production can give them their own workers (``-Q timekeeper.deferred``)
and keep the claim and run_batch workers (``-X timekeeper.deferred``) from ever stalling.

Signed messages: a ``run_deferred`` message runs a kind as the system, with no owner, so anyone who
can put a message on the broker (Flower's task-apply API, a periodic task, a Redis client) could
otherwise run any kind with any payload. ``defer()`` therefore signs each message (an HMAC with
``SECRET_KEY``, salted, over kind, payload, attempt and deferral id: ``sign``) and the worker runs
only a message whose signature checks (``authentic``; ``SECRET_KEY_FALLBACKS`` are accepted, so a
key rotation keeps messages in flight). Its retries are signed again with the next attempt. A
message without a good signature is refused: logged (``refused_unsigned``, no payload), acknowledged,
nothing run or stored. A signed payload that no longer passes its kind's schema (the schema changed
while it waited) is recorded dead at once. Messages sent by a version before signing are refused
too: drain the deferral queue before upgrading (docs/security.md, "Broker deferrals").

Runs: the handler gets a ``registry.Job`` with ``mechanism="deferrals"`` and ``ref`` the deferral id
(the Celery task id, the same across retries), so ``job.idempotency_key`` is stable across
redeliveries and retries. A failure is retried with the kind's backoff up to its max_attempts; the
last failure is recorded as a ``dead`` ScheduledJob row (key ``broker:<deferral id>``) where a
person sees it with every other dead job, and can retry it from the admin (it then runs as a row).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

import redis
from django.core import signing
from django.db import transaction
from django.utils import timezone

from scheduling.core import broker, conf, exceptions, executor, registry, tasknames, validation
from scheduling.core import store as core_store
from scheduling.deferrals import store
from scheduling.models import AttemptOutcome

logger = logging.getLogger(__name__)

QUEUE = "timekeeper.deferred"  # the deferral queue (project settings route run_deferred to it)
HARD_LIMIT_MARGIN_SECONDS = 30  # Celery kills a run this long after the kind's own timeout
DEAD_KEY_PREFIX = "broker:"  # key of the dead row recording a spent deferral: broker:<deferral id>
COUNT_CHUNK = 1000  # messages read per Redis round trip when counting
COUNT_LIMIT_PER_KEY = 200_000  # messages read at most per list or hash when counting; more are estimated
SIGNING_SALT = "timekeeper.deferral"  # keeps a deferral signature from being valid for any other signed value


@dataclasses.dataclass(frozen=True)
class Deferral:
    """What ``defer()`` did: which mechanism, the id to find it again, and when it is due.

    ``id`` is the deferral id (the Celery task id, a UUID string) on the broker path, and the
    ScheduledJob id on the table path. ``due_at`` is by the sender's clock on the broker path (the
    message's ETA) and by the database clock on the table path.
    """

    mechanism: str  # registry.Mechanism: "deferrals" (a broker countdown) or "due_at" (a row)
    id: str | int
    due_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How one broker run ended: ``succeeded``, ``retry`` (in ``retry_in_seconds``) or ``dead``."""

    outcome: str
    attempt: int
    retry_in_seconds: float = 0.0
    error: str = ""
    dead_job_id: int | None = None


# --- Settings and the guard ---------------------------------------------------------------------


def ceiling_seconds() -> float:
    """The longest delay that goes to the broker (``SCHEDULING_BROKER_DELAY_MAX_SECONDS``)."""
    return conf.get().broker_delay_max_seconds


def margin_seconds() -> float:
    """How long before the visibility timeout every countdown must end."""
    return conf.get().visibility_margin_seconds


def guard_allows(countdown_seconds: float) -> bool:
    """Whether a countdown this long ends at least the margin before the visibility timeout."""
    return countdown_seconds + margin_seconds() < broker.visibility_timeout_seconds()


def retry_countdown(backoff: registry.Backoff, attempt: int) -> float:
    """Seconds before the retry after failed attempt ``attempt``: the kind's backoff, capped at the ceiling."""
    return max(0.0, min(backoff.delay(attempt), ceiling_seconds()))


# --- Deferring ----------------------------------------------------------------------------------


def send(job_kind: registry.Kind, payload: Any, seconds: float) -> Deferral:
    """Send a validated deferral of ``seconds`` (at most the ceiling) as a countdown message.

    The message is sent when the caller's transaction commits (at once outside a transaction):
    roll back and nothing runs. Raises ``DelayTooLong`` for a delay that would not end the margin
    before the broker's visibility timeout (only possible when the ceiling is misconfigured: E003),
    ``BrokerNotConfigured`` when there is no Celery app or Redis broker to send to (E004).
    """
    kind = job_kind.name
    problem = broker.app_problem()
    if problem is not None:
        raise exceptions.BrokerNotConfigured(f"{problem} (scheduling.E004)")
    if not guard_allows(seconds):
        raise exceptions.DelayTooLong(
            f"A {seconds:g}s countdown would not end {margin_seconds():g}s before the broker's visibility timeout "
            f"({broker.visibility_timeout_seconds():g}s): Redis would deliver it again while it waits. "
            "Lower SCHEDULING_BROKER_DELAY_MAX_SECONDS (check scheduling.E003)."
        )
    deferral_id = str(uuid.uuid4())
    due_at = timezone.now() + dt.timedelta(seconds=seconds)
    time_limit = job_kind.timeout_seconds + HARD_LIMIT_MARGIN_SECONDS

    def publish() -> None:
        broker.send(
            tasknames.RUN_DEFERRED,
            args=message_args(kind, payload, 1, deferral_id),
            task_id=deferral_id,
            eta=due_at,
            time_limit=time_limit,
        )
        logger.info(
            "deferral sent to the broker",
            extra={"deferral_id": deferral_id, "kind": kind, "action": "deferred_to_broker", "delay": seconds},
        )

    transaction.on_commit(publish)
    return Deferral(mechanism=registry.Mechanism.DEFERRALS, id=deferral_id, due_at=due_at)


# --- Signing --------------------------------------------------------------------------------------


def _signed_value(kind: str, payload: Any, attempt: int, deferral_id: str) -> str:
    """The text a deferral's signature covers: kind, payload, attempt and id as canonical JSON."""
    return json.dumps([kind, payload, int(attempt), str(deferral_id)], sort_keys=True, separators=(",", ":"))


def _signer() -> signing.Signer:
    return signing.Signer(salt=SIGNING_SALT, algorithm="sha256")


def sign(kind: str, payload: Any, attempt: int, deferral_id: str) -> str:
    """The signature of one attempt of a deferral (HMAC-SHA256 with SECRET_KEY, salted)."""
    signer = _signer()
    return signer.sign(_signed_value(kind, payload, attempt, deferral_id)).rsplit(signer.sep, 1)[1]


def message_args(kind: str, payload: Any, attempt: int, deferral_id: str) -> list[Any]:
    """The args of a ``run_deferred`` message: ``[kind, payload, attempt, deferral_id, signature]``."""
    return [kind, payload, attempt, deferral_id, sign(kind, payload, attempt, deferral_id)]


def authentic(kind: Any, payload: Any, attempt: Any, deferral_id: Any, signature: Any) -> bool:
    """Whether a received message was signed by ``sign`` (SECRET_KEY or one of SECRET_KEY_FALLBACKS)."""
    if not isinstance(signature, str) or not signature or not isinstance(kind, str):
        return False
    try:
        value = _signed_value(kind, payload, int(attempt), str(deferral_id))
        signer = _signer()
        signer.unsign(f"{value}{signer.sep}{signature}")
    except (signing.BadSignature, TypeError, ValueError):
        return False
    return True


def refuse(kind: Any, attempt: Any, deferral_id: Any) -> RunResult:
    """A message no ``defer()`` produced (or sent before signing): logged without its payload, nothing run."""
    logger.error(
        "deferral message refused: its signature does not check (not sent by defer(), or before signing)",
        extra={"deferral_id": str(deferral_id)[:100], "kind": str(kind)[:200], "action": "refused_unsigned"},
    )
    core_store.count_refused_message(tasknames.RUN_DEFERRED)  # /metrics: timekeeper_refused_messages_total
    return RunResult("refused", attempt if isinstance(attempt, int) else 0, error="bad signature")


# --- Running ------------------------------------------------------------------------------------


def parse_eta(value: Any) -> dt.datetime | None:
    """A message's ETA (ISO text or datetime) as an aware datetime; None when absent or unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        parsed = value
    else:
        try:
            parsed = dt.datetime.fromisoformat(str(value))
        except ValueError:
            return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def run(
    kind_name: str, payload: Any, attempt: int, deferral_id: str, due_at: dt.datetime | None, snoozes: int = 0
) -> RunResult:
    """Run attempt ``attempt`` of a broker deferral under its kind's timeout; decide retry or dead on failure.

    Called by the ``scheduling.run_deferred`` task, which turns ``retry`` and ``snooze`` into a Celery
    retry (a row past the ceiling). A handler's choice (docs/architecture.md, "Handler-chosen
    outcomes"): ``Snooze`` runs the same attempt again after its delay (``snooze``; ``snoozes`` so
    far, at most the kind's ``max_snoozes``, then it is a failure); ``RetryAfter`` is a failure
    retried after its delay (not the backoff; dead when spent); ``Discard`` records the dead row at
    once; ``Cancel`` stops (``cancelled``: logged, nothing stored).
    """
    max_attempts = conf.get().default_max_attempts
    backoff = registry.Backoff()
    lease_seconds = conf.get().lease_seconds
    log_context = {"deferral_id": deferral_id, "kind": kind_name, "attempt": attempt}
    try:
        kind = registry.get(kind_name)
    except exceptions.UnknownJobKind as exc:
        error = str(exc)
    else:
        max_attempts, backoff, lease_seconds = kind.max_attempts, kind.backoff, kind.lease_seconds
        try:
            validation.encode_payload(kind, payload)
        except exceptions.InvalidPayload as exc:
            # The schema changed while it waited: retrying cannot help, so it is recorded dead at once.
            return _dead(kind_name, payload, attempt, deferral_id, due_at, str(exc), lease_seconds, log_context)
        job = registry.Job(
            kind=kind_name,
            payload=payload if isinstance(payload, dict) else {},
            attempt=attempt,
            max_attempts=max_attempts,
            due_at=due_at,
            mechanism=registry.Mechanism.DEFERRALS,
            ref=deferral_id,
        )
        result = executor.invoke(kind, job, kind.timeout_seconds)
        error = result.error
        if result.ok:
            lateness = None if due_at is None else (timezone.now() - due_at).total_seconds()
            logger.info("deferral ran", extra={**log_context, "action": "succeeded", "late_seconds": lateness})
            return RunResult("succeeded", attempt)
        chosen = _chosen(result, kind, attempt, snoozes, log_context)
        if chosen is not None:
            if chosen.outcome == AttemptOutcome.DISCARDED:
                return _dead(kind_name, payload, attempt, deferral_id, due_at, error, lease_seconds, log_context)
            return chosen
    if attempt < max_attempts:
        countdown = retry_countdown(backoff, attempt)
        logger.info("deferral will be retried", extra={**log_context, "action": "retry", "countdown": countdown})
        return RunResult("retry", attempt, retry_in_seconds=countdown, error=error)
    return _dead(kind_name, payload, attempt, deferral_id, due_at, error, lease_seconds, log_context)


def _chosen(
    result: executor.Result, kind: registry.Kind, attempt: int, snoozes: int, log_context: dict[str, Any]
) -> RunResult | None:
    """The handler's choice as a run result; None for a failure (a snooze past ``max_snoozes`` is one)."""
    if result.outcome == AttemptOutcome.CANCELLED:
        logger.info("deferral cancelled by its handler", extra={**log_context, "action": "cancelled"})
        return RunResult(AttemptOutcome.CANCELLED, attempt, error=result.error)
    if result.outcome == AttemptOutcome.DISCARDED:
        return RunResult(AttemptOutcome.DISCARDED, attempt, error=result.error)
    delay = result.delay_seconds or 0.0
    if result.outcome == AttemptOutcome.SNOOZED and snoozes < kind.max_snoozes:
        logger.info("deferral snoozed", extra={**log_context, "action": "snoozed", "countdown": delay})
        return RunResult("snooze", attempt, retry_in_seconds=delay, error=result.error)
    if result.outcome == AttemptOutcome.RETRY_AFTER and attempt < kind.max_attempts:
        logger.info("deferral will be retried", extra={**log_context, "action": "retry", "countdown": delay})
        return RunResult("retry", attempt, retry_in_seconds=delay, error=result.error)
    return None


def _dead(
    kind_name: str,
    payload: Any,
    attempt: int,
    deferral_id: str,
    due_at: dt.datetime | None,
    error: str,
    lease_seconds: int,
    log_context: dict[str, Any],
) -> RunResult:
    """Record a spent deferral as a dead row (key ``broker:<deferral id>``) a person can see and retry."""
    # The message is acknowledged when this returns or raises: a dead row lost to a database restart
    # would lose the deferral (the insert is idempotent per deferral id, so it is retried).
    dead_id = core_store.while_unreachable(
        lambda: store.record_dead_deferral(
            kind=kind_name,
            payload=payload,
            due_at=due_at,
            attempts=attempt,
            error=error,
            key=f"{DEAD_KEY_PREFIX}{deferral_id}",
            lease_seconds=lease_seconds,
        ),
        what="a dead deferral",
    )
    logger.error("deferral dead: attempts spent", extra={**log_context, "action": "dead", "job_id": dead_id})
    return RunResult("dead", attempt, error=error, dead_job_id=dead_id)


# --- Counting -----------------------------------------------------------------------------------


def queue_names() -> list[str]:
    """The Celery queues Timekeeper's messages may wait in: those this deployment declares (the default
    queue and the deferral queue), where its tasks are routed, and every registered kind's named queue
    (``broker.task_queues``; a web process declares none of those, and their batches went uncounted)."""
    from celery import current_app

    names = set(current_app.amqp.queues.keys())
    for task_name in (tasknames.RUN_BATCH, tasknames.RUN_DEFERRED, tasknames.RUN_FIXED):
        names.update(broker.task_queues(task_name))
    return sorted(names)


def _eta_of(message: Any) -> float | None:
    """The ETA of a stored message (kombu's JSON envelope) as a POSIX timestamp, or None."""
    headers = message.get("headers") if isinstance(message, dict) else None
    eta = parse_eta(headers.get("eta")) if isinstance(headers, dict) else None
    return None if eta is None else eta.timestamp()


def _message(raw: bytes | str) -> Any:
    """A raw queue entry (kombu's JSON envelope), decoded; None when it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _task_of(message: Any) -> str | None:
    """The Celery task name a stored message carries (protocol 2 puts it in the headers)."""
    headers = message.get("headers") if isinstance(message, dict) else None
    task = headers.get("task") if isinstance(headers, dict) else None
    return task if isinstance(task, str) else None


def broker_counts(now: float | None = None) -> dict[str, int | bool] | None:
    """Messages on the broker: ``visible``, ``delayed``, ``in_flight``, ``unacked`` (None if Redis is down).

    - ``visible``: waiting in a queue list and due (no ETA, or its ETA has passed): ready to run.
    - ``delayed``: not yet due (ETA in the future), wherever they are: held unacknowledged by a
      worker (``delayed_held``: how Redis workers keep countdowns) or still in a queue list
      (``delayed_queued``: no worker had room under its ETA limit). The counterpart of SQS's
      ApproximateNumberOfMessagesDelayed.
    - ``in_flight``: taken by a worker and due: running, or about to.
    - ``unacked``: everything taken and not acknowledged (``delayed_held`` + ``in_flight``).
    - ``visible_batches``: the visible messages that are ``run_batch`` messages of claimed due_at
      jobs (their jobs are counted as claimed in the table; a backlog total adds the rest only).

    How exact: a snapshot read in several round trips, not atomically. A message that moves
    between a list and the unacked hash while counting can be counted twice or missed; ETAs are
    compared with this process's clock (an ETA within clock skew of now may be on either side);
    messages held by a worker that died stay counted (as delayed or in flight) until the live
    workers put them back, a lease after its death (``core/holdings.py``). Beyond
    ``COUNT_LIMIT_PER_KEY`` messages per list or hash the rest are estimated from the part read
    (``exact`` is then False).
    """
    moment = time.time() if now is None else now
    prefix = broker.key_prefix()
    counts = {"visible": 0, "visible_batches": 0, "delayed_queued": 0, "delayed_held": 0, "in_flight": 0}
    exact = True
    try:
        client = broker.client()
        keys = broker.queue_keys(queue_names())
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        lengths = pipe.execute()
        for key, length in zip(keys, lengths, strict=True):
            future, batches, read = 0, 0, 0
            while read < min(length, COUNT_LIMIT_PER_KEY):
                chunk = client.lrange(key, read, read + COUNT_CHUNK - 1)
                if not chunk:
                    break
                read += len(chunk)
                for raw in chunk:
                    message = _message(raw)
                    if (_eta_of(message) or 0) > moment:
                        future += 1
                    elif _task_of(message) == tasknames.RUN_BATCH:
                        batches += 1
            if read < length:
                exact = False
                future = round(future * length / read) if read else 0
                batches = round(batches * length / read) if read else 0
            counts["delayed_queued"] += future
            counts["visible"] += length - future
            counts["visible_batches"] += batches
        held, total = 0, 0
        for _tag, raw in client.hscan_iter(f"{prefix}unacked", count=COUNT_CHUNK):
            total += 1
            try:
                message = json.loads(raw)[0]
            except (ValueError, IndexError, TypeError):
                continue
            if (_eta_of(message) or 0) > moment:
                held += 1
            if total >= COUNT_LIMIT_PER_KEY:
                exact = False
                full = int(client.hlen(f"{prefix}unacked"))
                held = round(held * full / total)
                total = full
                break
        counts["delayed_held"] = held
        counts["in_flight"] = total - held
    except redis.RedisError:
        logger.warning("cannot count broker messages: Redis did not answer", exc_info=True)
        return None
    return {
        "visible": counts["visible"],
        "visible_batches": counts["visible_batches"],
        "delayed": counts["delayed_queued"] + counts["delayed_held"],
        "in_flight": counts["in_flight"],
        "unacked": counts["delayed_held"] + counts["in_flight"],
        "delayed_held": counts["delayed_held"],
        "delayed_queued": counts["delayed_queued"],
        "exact": exact,
    }


# --- Worker start ---------------------------------------------------------------------------------


def worker_queue_warning(consumed: Iterable[str]) -> str | None:
    """The warning for a worker consuming the deferral queue beside others (it can stall at its ETA limit)."""
    names = set(consumed)
    if QUEUE not in names or names == {QUEUE}:
        return None
    limit = broker.app().conf.worker_eta_task_limit
    others = ", ".join(sorted(names - {QUEUE}))
    return (
        f"This worker consumes the deferral queue {QUEUE} beside {others}. Holding {limit or 'unlimited'} "
        f"countdown messages would stop it taking {others} messages until one comes due; in production run "
        f"deferral workers apart (-Q {QUEUE}) and the others with -X {QUEUE}."
    )


def ceiling_problem() -> str | None:
    """Why the ceiling is unsafe (scheduling.E003): it plus the margin is not below the visibility timeout."""
    ceiling, margin, timeout = ceiling_seconds(), margin_seconds(), broker.visibility_timeout_seconds()
    if margin > 0 and ceiling + margin < timeout:
        return None
    return (
        f"SCHEDULING_BROKER_DELAY_MAX_SECONDS ({ceiling:g}s) plus the {margin:g}s margin "
        f"(SCHEDULING_VISIBILITY_MARGIN_SECONDS, which must be positive) is not below the broker "
        f"visibility timeout ({timeout:g}s): a countdown that long would be delivered twice."
    )
