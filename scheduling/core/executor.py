"""Stopping a handler that runs past its timeout.

Celery's prefork children run tasks on their main thread, so a real-time interval timer
(SIGALRM) can interrupt the handler wherever it is, even in a blocking call (PEP 475 retries the
call only after the signal handler ran, and ours raises). Off the main thread (thread pools, the
heartbeat) there is no signal to use: the Celery hard time limit of the batch is the backstop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class JobTimeout(BaseException):
    """Raised inside a handler when its timeout expires.

    A BaseException so that a handler's own ``except Exception`` cannot swallow it.
    """


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise JobTimeout()


@contextlib.contextmanager
def limit(seconds: float) -> Iterator[bool]:
    """Raise ``JobTimeout`` in the block after ``seconds``; yields whether the limit is enforced here."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
