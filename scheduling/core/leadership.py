"""Who this process is, and leadership: one process in the cluster leads a duty at a time.

A leader holds a session-level advisory lock on a dedicated connection (``locks``); if it dies,
PostgreSQL closes the connection and the lock goes with it, and a standby takes over on its next
try. Beat's scheduler and the worker's control loop (claim and sweep) both lead through
``Leadership``; nothing else takes a leader lock.
"""

from __future__ import annotations

import os
import socket


def process_name() -> str:
    """``host:pid``: how this process is named in claims, run records and heartbeats."""
    return f"{socket.gethostname()}:{os.getpid()}"
