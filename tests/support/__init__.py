"""What many tests need, written once: the repository's root, ``manage.py`` in a fresh interpreter,
"make these jobs due" by the database clock, one polling helper, and a start clear of a slot's edge.

Importing this package touches no service: ``make_due`` opens Django's connection only when called.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the folder holding manage.py, dev.py, docs/ and tests/)."""

T = TypeVar("T")


def manage(
    *args: str,
    env: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
    python_path: Iterable[str | Path] = (),
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py <args>`` from the root in a fresh interpreter and capture its text output.

    The child's environment is this process's, without the names in ``drop``, with ``env`` on top;
    ``python_path`` folders come before the root on ``PYTHONPATH`` (a settings module in a temporary
    folder, say).
    """
    dropped = set(drop)
    environ = {key: value for key, value in os.environ.items() if key not in dropped}
    environ["PYTHONPATH"] = os.pathsep.join([*(str(path) for path in python_path), str(ROOT)])
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout
    )


def make_due(ids: int | Iterable[int] | None = None, *, ago: str = "1 ms", state: str | None = None) -> int:
    """Move jobs' ``due_at`` to the database clock minus ``ago`` (an interval); the number of rows changed.

    ``ids``: one job, several, or every job when None; ``state`` narrows to the jobs in that state.
    """
    from django.db import connection  # imported here so that importing tests.support needs no settings

    where: list[str] = ["TRUE"]
    params: list[Any] = [ago]
    if isinstance(ids, int):
        where.append("id = %s")
        params.append(ids)
    elif ids is not None:
        where.append("id = ANY(%s)")
        params.append(list(ids))
    if state is not None:
        where.append("state = %s")
        params.append(state)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE scheduling_scheduledjob SET due_at = now() - %s::interval WHERE {' AND '.join(where)}",  # noqa: S608 (fixed clauses)
            params,
        )
        return cursor.rowcount


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.2, message: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def clear_of_a_slot_edge(slot_seconds: float, margin: float = 20.0) -> float:
    """If the database clock is within ``margin`` s of the end of its slot of ``slot_seconds`` from the epoch,
    wait into the next slot; the seconds waited (0.0 mostly).

    Uniqueness windows are such slots (docs/architecture.md, "Uniqueness windows"), and a UTC day is
    one of 86,400 s. A test whose calls must share one slot starts here: at 10:59:59.9 its second
    call met a new hour's slot and made a second job.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        (now,) = cursor.fetchone()
    left = slot_seconds - now % slot_seconds
    if left >= margin:
        return 0.0
    time.sleep(left + 0.05)
    return left + 0.05


def plan_nodes(node: Any) -> list[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, depth first."""
    if isinstance(node, list):
        return [n for item in node for n in plan_nodes(item)]
    if not isinstance(node, dict):
        return []
    found = [node] if "Node Type" in node else []
    return found + [n for value in node.values() for n in plan_nodes(value)]
