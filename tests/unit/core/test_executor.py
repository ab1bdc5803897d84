"""The executor's timeouts and aborts: a deadline or an abort stops a handler; a batch keeps one SIGALRM handler."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from scheduling.core import aborts, executor, registry


def _sleeper(job: registry.Job) -> None:
    time.sleep(float(job.payload["sleep"]))


KIND = registry.Kind("exec.sleep", _sleeper, None, 0.0, 1, registry.Backoff(), 30, 1, "")


def _job(sleep: float) -> registry.Job:
    return registry.Job(kind=KIND.name, payload={"sleep": sleep}, attempt=1, max_attempts=1, due_at=None, id=1)


def test_a_deadline_inside_alarms_still_stops_the_handler():
    """Inside alarms(), a call past its 0.05 s timeout is timed out, the next finishes, no timer is left armed."""
    with executor.alarms():
        assert executor.invoke(KIND, _job(2), 0.05).outcome == executor.TIMED_OUT
        assert executor.invoke(KIND, _job(0), 0.5).ok
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_alarms_installs_the_handler_once_and_restores_the_previous_one():
    """alarms() installs the timeout handler for the block (deadlines inside leave it), then puts back the old one."""

    def previous(signum: int, frame: object) -> None:
        raise AssertionError("the previous handler must not run")

    old = signal.signal(signal.SIGALRM, previous)
    try:
        with executor.alarms():
            with executor.alarms():
                assert signal.getsignal(signal.SIGALRM) is executor._on_alarm
            with executor.deadline(1.0) as enforced:
                assert enforced
            assert signal.getsignal(signal.SIGALRM) is executor._on_alarm, "a deadline inside kept the handler"
        assert signal.getsignal(signal.SIGALRM) is previous
        with executor.deadline(1.0):
            assert signal.getsignal(signal.SIGALRM) is executor._on_alarm
        assert signal.getsignal(signal.SIGALRM) is previous, "a deadline alone restores what it replaced"
    finally:
        signal.signal(signal.SIGALRM, old)


def test_a_timeout_raised_by_a_callers_deadline_propagates():
    """A JobTimeout from a deadline around several calls is not the call's own: it propagates."""
    with pytest.raises(executor.JobTimeout), executor.deadline(0.05):
        executor.invoke(KIND, _job(2), None)


def _claimed(sleep: float, token: str) -> registry.Job:
    return registry.Job(
        kind=KIND.name, payload={"sleep": sleep}, attempt=1, max_attempts=1, due_at=None, id=7, token=token
    )


def _abort_later(token: str, seconds: float) -> threading.Thread:
    """The heartbeat's part, from another thread: the abort of claim (7, token) arrives after ``seconds``."""
    thread = threading.Timer(seconds, aborts.request, args=(7, token, "aborted by test at noon"))
    thread.start()
    return thread


def test_an_abort_interrupts_the_handlers_blocking_call_and_ends_as_aborted():
    """An abort from another thread interrupts a 30 s sleep on the main thread: ABORTED, with who asked."""
    thread = _abort_later("t-1", 0.1)
    try:
        result = executor.invoke(KIND, _claimed(30, "t-1"), 60)
    finally:
        thread.join()
        aborts.forget([(7, "t-1")])
    assert (result.outcome, result.error) == (executor.ABORTED, "aborted by test at noon")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_abort_seen_before_the_handler_starts_means_it_never_runs():
    """A claim aborted while it waited in its batch is not called at all."""
    calls: list[int] = []
    kind = registry.Kind("exec.count", lambda job: calls.append(1), None, 0.0, 1, registry.Backoff(), 30, 1, "")
    aborts.request(7, "t-2", "aborted by test at noon")
    try:
        result = executor.invoke(kind, _claimed(0, "t-2"), None)
    finally:
        aborts.forget([(7, "t-2")])
    assert result.outcome == executor.ABORTED
    assert calls == []


def test_an_abort_of_another_claim_interrupts_nothing():
    """A request for another claim (a later attempt's token) leaves the running handler alone, and a stray poke too."""
    thread = _abort_later("other", 0.05)
    try:
        with executor.alarms():
            poke = threading.Timer(0.1, signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGALRM))
            poke.start()
            result = executor.invoke(KIND, _claimed(0.3, "mine"), 5)
            poke.join()
    finally:
        thread.join()
        aborts.forget([(7, "other")])
    assert result.ok


def _deferred_block(steps: list[str], seconds: float) -> None:
    with executor.alarms_deferred():
        steps.append("first")
        time.sleep(seconds)  # the alarm comes here
        steps.append("second")
    steps.append("after the block")


def _deferring(seconds: float) -> list[str]:
    """A handler's block under ``alarms_deferred`` that outlives its deadline: what ran before the raise."""
    steps: list[str] = []
    with executor.alarms(), executor.deadline(0.05), pytest.raises(executor.JobTimeout):
        _deferred_block(steps, seconds)
    return steps


def test_an_alarm_inside_alarms_deferred_raises_when_the_block_ends():
    """A timeout that falls inside the block lets the block finish, then raises at its end, not after."""
    assert _deferring(0.3) == ["first", "second"]


def test_alarms_deferred_holds_nothing_once_it_ended():
    """After the block, a later alarm raises at once; the held one raised at the block's end."""
    with executor.alarms(), executor.deadline(2.0), executor.alarms_deferred():
        pass  # no alarm within
    assert executor._deferring == [0, False]
    with pytest.raises(executor.JobTimeout), executor.alarms(), executor.deadline(0.05):
        time.sleep(5)  # a held alarm would let it end without a raise
