"""The event loop's timer drops cancelled entries (core/worker_timers.py), on kombu's own Timer."""

from __future__ import annotations

from kombu.asynchronous.hub import Hub
from kombu.asynchronous.timer import Timer

from scheduling.core import worker_timers


def _due_now(timer: Timer) -> list[object]:
    """What the timer would call now, in order (its own iteration, as the hub runs it)."""
    called = []
    for _, entry in timer:
        if entry is None:
            break
        called.append(entry())
    return called


def test_cancelled_entries_are_dropped_and_the_live_ones_still_fire_in_order():
    timer = Timer()
    cancelled = [timer.call_after(3600, lambda: "late") for _ in range(300)]
    live = [timer.call_after(-1 - i / 1000, lambda i=i: i) for i in range(5)]  # already due, earliest last
    for entry in cancelled:
        entry.cancel()
    assert len(timer) == 305
    assert worker_timers.compact(timer) == 300
    assert len(timer) == 5
    assert {item[2] for item in timer._queue} == set(live)
    assert _due_now(timer) == [4, 3, 2, 1, 0]


def test_a_heap_mostly_alive_or_few_cancelled_is_left_alone():
    timer = Timer()
    few = [timer.call_after(3600, lambda: None) for _ in range(worker_timers.MIN_CANCELLED - 1)]
    for entry in few:
        entry.cancel()
    assert worker_timers.compact(timer) == 0, "fewer than MIN_CANCELLED"
    assert len(timer) == worker_timers.MIN_CANCELLED - 1
    for _ in range(2 * worker_timers.MIN_CANCELLED):
        timer.call_after(3600, lambda: None)
    timer.call_after(3600, lambda: None).cancel()
    assert worker_timers.compact(timer) == 0, "cancelled, but under half the heap"
    assert len(timer) == 3 * worker_timers.MIN_CANCELLED


def test_a_timer_without_kombus_heap_is_left_alone():
    assert worker_timers.compact(object()) == 0


def test_a_compaction_run_by_the_hub_between_due_entries_runs_each_live_one_once():
    """As in the worker: the compaction is an entry of the hub's own timer, fired by its loop between
    two live entries due now; the loop goes on over the rebuilt heap, losing and repeating nothing."""
    timer = Timer()
    hub = Hub(timer)
    ran: list[str] = []
    timer.call_after(-3, lambda: ran.append("before"))
    timer.call_after(-2, worker_timers._compact_and_log, (timer,))
    timer.call_after(-1, lambda: ran.append("after"))
    for delay in (3600, -0.5):  # cancelled, due later and due now
        for _ in range(150):
            timer.call_after(delay, lambda: ran.append("cancelled")).cancel()
    hub.fire_timers(max_timers=100)
    assert ran == ["before", "after"]
    assert len(timer) == 0, "the cancelled entries were dropped, the due ones run"
