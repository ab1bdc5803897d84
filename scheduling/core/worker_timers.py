"""The worker's event-loop timer: cancelled entries dropped, not kept until their due time.

Celery's prefork pool sets a timer in the worker's main process for every task that carries a
time limit (``asynpool``'s ``on_timeout_set``: a ``hub.call_later`` of the hard limit), and cancels
it when the task ends. kombu's ``Timer.cancel`` only marks the entry: it stays in the timer's heap
until its due time. Every ``scheduling.run_batch`` message carries a hard limit (the sum of its
jobs' timeouts plus a margin, ``due_at/claim.py``), so at 20-50 batches a second the heap held
tens of thousands of dead entries (a batch of 20 ``demo.record`` jobs: 1,230 s each), four
objects apiece, all in the main process, the one that claims and dispatches: its full garbage
collections grew with them, to 80 ms ten minutes into ``python -m bench soak`` with the startup
objects already frozen (bench/README.md).

``TimerCompaction``, a worker step, drops them every ``EVERY_SECONDS`` once at least
``MIN_CANCELLED`` are cancelled and they are at least half the heap, as asyncio's event loop
does with its cancelled timer handles. It runs as a timer of the same hub, so in the event loop's
own thread, between two entries: the heap is rebuilt in place (the same list, ``heapq.heapify``)
and the loop goes on reading it. A timer without that heap (another kombu) is left alone.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

from celery import bootsteps

logger = logging.getLogger(__name__)

EVERY_SECONDS = 10.0
MIN_CANCELLED = 100


def compact(timer: Any, min_cancelled: int = MIN_CANCELLED) -> int:
    """Drop ``timer``'s cancelled entries once ``min_cancelled`` or more and half its heap or more; how many."""
    queue = getattr(timer, "_queue", None)
    if not isinstance(queue, list) or len(queue) < min_cancelled:
        return 0
    cancelled = sum(1 for item in queue if getattr(item[2], "canceled", False))
    if cancelled < min_cancelled or cancelled * 2 < len(queue):
        return 0
    queue[:] = [item for item in queue if not getattr(item[2], "canceled", False)]
    heapq.heapify(queue)
    return cancelled


def _compact_and_log(timer: Any) -> None:
    dropped = compact(timer)
    if dropped:
        logger.info(
            "timer compacted: %d cancelled entries dropped, %d left",
            dropped,
            len(timer._queue),
            extra={"action": "timer_compacted", "count": dropped},
        )


class TimerCompaction(bootsteps.StartStopStep):
    """Worker step: every ``EVERY_SECONDS``, the event loop's timer drops its cancelled entries."""

    requires = ("celery.worker.components:Hub",)
    label = "timekeeper-timer-compaction"

    def start(self, w: Any) -> None:
        hub = getattr(w, "hub", None)
        if hub is not None:  # no event loop (another pool): no per-task timers in this process
            hub.call_repeatedly(EVERY_SECONDS, _compact_and_log, hub.timer)


def install(app: Any) -> None:
    """Add the step to ``app``'s worker (before the worker builds it: ``worker_init``)."""
    app.steps["worker"].add(TimerCompaction)
