"""The executor's timeouts: a deadline stops a handler, and a batch keeps one SIGALRM handler for all its jobs."""

from __future__ import annotations

import signal
import time

import pytest

from scheduling.core import executor, registry


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
