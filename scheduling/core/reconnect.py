"""What a worker holds when its Redis connection resets: acknowledged on the new connection, or put back at once.

A Celery worker with late acknowledgement holds every message it took until the task ends, and
every countdown (ETA) message until it comes due, unacknowledged in kombu's Redis ``unacked``
hash. When the connection resets (a Redis restart, a failover, a network blip), Celery 5.7 and
kombu 5.7 do three things that this consumer step (``Reconnect``) undoes:

1. **The worker dies.** The consumer closes the lost connection and detaches its transport
   (``Connection.collect``). A task still running finishes after the reconnect and Celery
   acknowledges it on the channel it came on: kombu builds a client from the detached transport,
   raises ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which is not a
   connection error, and the worker's main process exits with "Unrecoverable error" (and with it
   its control loop and every batch it held). Here the channel a message came on forwards its
   acknowledgement (and rejection) to the live channel: a delivery tag names the message in the
   ``unacked`` hash, whatever channel took it. An acknowledgement made while Redis is away is
   kept and made once the worker is connected again.
2. **Running messages would be restored twice.** Closing the lost channel tries to put back
   everything it holds, running tasks included; with Redis back by then (a fast failover) a task
   still running would be delivered again. Here closing a lost channel restores nothing: it hands
   its delivery tags to this step (a warm shutdown still puts everything back at once, as before).
3. **Countdowns park for the visibility timeout.** Celery drops the countdowns and prefetched
   messages it held in memory (they "cannot be acked"); Redis gives them out again only once
   older than ``visibility_timeout`` (an hour by default). Here, once connected again, the step
   puts back at once every message of the lost channel that is not running now and not
   acknowledged meanwhile (kombu's ``restore_by_tag``: one transaction that moves the message from
   the ``unacked`` hash to the front of its queue, and does nothing if another worker restored it
   first). A deferral is then late by the outage plus the reconnect (kombu retries every 2 s or
   less) instead of up to the visibility timeout.

What Redis itself lost (no persistence, or the last second of an append-only file after a crash)
cannot be put back: those messages are gone, as before (``docs/fault-tolerance.md``). A message is
never put back while its task runs in this worker, so nothing runs twice that would not already
under at-least-once delivery. One window remains: a message handed to a pool process in the
instant of the reset but not yet started there is put back and may also run (its task is then
delivered twice, which every Timekeeper task tolerates: claims, tokens, the ledger, idempotency keys).

``scheduling.tasks`` adds the step to every worker (``worker_init``).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from celery import bootsteps
from celery.worker import state

logger = logging.getLogger(__name__)


class Reconnect(bootsteps.StartStopStep):
    """Consumer step: carry the messages of a lost broker connection over to the next one (see the module)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "timekeeper-reconnect"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.live: Any = None  # the task channel of the connection in use
        self.orphans: set[str] = set()  # tags held by lost channels, not acknowledged yet
        self.pending: dict[str, bool | None] = {}  # tag -> None (ack) or requeue flag, made while Redis was away
        self.shutting_down = False
        self.lock = threading.Lock()

    # --- lifecycle (Celery calls start after every (re)connect, shutdown once at the end) ----------

    def start(self, c: Any) -> None:
        if self.live is None:
            silence_cancel_warning(c.app)
        channel = c.task_consumer.channel
        self.settle(channel)
        self.live = channel
        self.adopt(channel, c.connection.connection_errors)

    def shutdown(self, c: Any) -> None:
        self.shutting_down = True  # the connection closes next: its channel puts back what it holds

    # --- what happens on the new connection ----------------------------------------------------

    def settle(self, channel: Any) -> None:
        """On a new connection: make the acknowledgements kept during the outage, then put back the rest."""
        qos = channel.qos
        with self.lock:
            pending, self.pending = dict(self.pending), {}
            orphans = set(self.orphans)
        running = {getattr(request.message, "delivery_tag", None) for request in tuple(state.active_requests)}
        acked = rejected = restored = 0
        done: set[str] = set()
        try:
            for tag, requeue in pending.items():
                if requeue is None or not requeue:
                    qos._remove_from_indices(tag).execute()
                    acked += requeue is None
                    rejected += requeue is not None
                else:
                    qos.restore_by_tag(tag, leftmost=True)
                    rejected += 1
                done.add(tag)
            for tag in sorted(orphans - done - running):
                qos.restore_by_tag(tag)
                restored += 1
                done.add(tag)
        finally:
            with self.lock:
                for tag, requeue in pending.items():
                    if tag not in done:
                        self.pending.setdefault(tag, requeue)
                self.orphans -= done
        if acked or rejected:
            logger.warning(
                "%d messages finished while the broker was away: acknowledged on the new connection (%d rejected)",
                acked,
                rejected,
                extra={"action": "late_ack", "acked": acked, "rejected": rejected},
            )
        if restored:
            logger.warning(
                "%d countdowns put back in their queues after the broker connection was lost"
                " (held in memory, not running; they would otherwise wait for the visibility timeout)",
                restored,
                extra={"action": "restored_after_reconnect", "restored": restored},
            )

    # --- what a channel does once its connection is lost ---------------------------------------

    def adopt(self, channel: Any, connection_errors: tuple[type[BaseException], ...]) -> None:
        """Route this channel's acknowledgements to the live channel once it is lost; keep its tags on close."""
        step = self
        lost: tuple[type[BaseException], ...] = (*connection_errors, AttributeError)  # AttributeError: detached
        basic_ack, basic_reject = channel.basic_ack, channel.basic_reject
        qos = channel.qos
        restore_unacked_once = qos.restore_unacked_once

        def ack(delivery_tag: str, multiple: bool = False) -> None:
            live = step.live
            if live is not channel and live is not None:
                logger.info(
                    "a message taken before the broker connection was lost: acknowledged on the new connection",
                    extra={"action": "late_ack"},
                )
                return live.basic_ack(delivery_tag, multiple)
            try:
                basic_ack(delivery_tag, multiple)
            except lost:
                step.keep(delivery_tag, None)
            else:
                step.orphans.discard(delivery_tag)

        def reject(delivery_tag: str, requeue: bool = False) -> None:
            live = step.live
            if live is not channel and live is not None:
                logger.info(
                    "a message taken before the broker connection was lost: rejected on the new connection",
                    extra={"action": "late_reject", "requeue": requeue},
                )
                return live.basic_reject(delivery_tag, requeue)
            try:
                basic_reject(delivery_tag, requeue)
            except lost:
                step.keep(delivery_tag, bool(requeue))
            else:
                step.orphans.discard(delivery_tag)

        def restore_or_hand_over(stderr: Any = None) -> Any:
            if step.shutting_down:
                return restore_unacked_once(stderr)
            qos._on_collect.cancel()
            qos._flush()
            with step.lock:
                step.orphans.update(qos._delivered)
            qos._delivered.clear()
            qos._delivered.restored = True
            return None

        channel.basic_ack = ack
        channel.basic_reject = reject
        qos.restore_unacked_once = restore_or_hand_over

    def keep(self, delivery_tag: str, requeue: bool | None) -> None:
        """An acknowledgement (None) or rejection the broker could not take now: made after the reconnect."""
        with self.lock:
            self.pending[delivery_tag] = requeue
        logger.warning(
            "the broker is away: acknowledgement kept until the worker reconnects",
            extra={"action": "ack_kept", "requeue": requeue},
        )


def install(app: Any) -> None:
    """Add the step to ``app``'s worker consumer (before the worker builds it: ``worker_init``).

    Celery warns on every reconnect that ``worker_cancel_long_running_tasks_on_connection_loss``
    will become True in Celery 6 because late-acknowledged tasks "cannot be acknowledged" after a
    connection loss. With this step they can, and cancelling them would throw away every running
    batch on each blip (their claims wait for the lease, non-atomic jobs run again). Timekeeper's
    settings set it to False; the warning, no longer true, is silenced here (only that one).
    """
    app.steps["consumer"].add(Reconnect)


def silence_cancel_warning(app: Any) -> None:
    """Silence Celery's reconnect warning about cancelling late-acked tasks when the setting says False.

    Called once the worker's logging is set up (Celery's logging setup makes its deprecation
    warnings "always" shown, which would put this filter behind its own).
    """
    if app.conf.worker_cancel_long_running_tasks_on_connection_loss is False:
        warnings.filterwarnings(
            "ignore", message=r"\s*In Celery 5\.1 we introduced an optional breaking change", category=Warning
        )
