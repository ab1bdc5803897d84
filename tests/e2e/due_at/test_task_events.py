"""Flower tells the truth: each due_at job's attempt is a task of its kind's name in its real state.

A real worker (prefork: the events leave from a forked pool process) with task events on, as the
project's settings have them, and a real Flower process started as ``dev.py run`` starts it; the
test reads Flower's own API (``/api/tasks``).
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import api
from tests.e2e import harness
from tests.e2e.project import test_flower as flower

pytestmark = pytest.mark.e2e


def _tasks(base: str, name: str) -> list[dict[str, Any]]:
    return [t for t in flower.flower_tasks(base).values() if t.get("name") == name]


def test_flower_shows_a_failing_job_failed_and_a_succeeding_one_succeeded(cluster):
    """demo.fail's attempts show as RETRY, RETRY, FAILURE under its kind, demo.record's as SUCCESS; no payload."""
    _, base = flower.start_flower(cluster)
    worker = cluster.worker(concurrency=2)
    harness.wait_for(lambda: "ready" in worker.log(), timeout=90, message="the worker did not start")
    ok = api.schedule("demo.record", {"label": "secret-ok"}, delay=0)
    failing = api.schedule("demo.fail", {"email": "secret@example.com"}, delay=0)

    def finished() -> list[dict[str, Any]]:
        return [t for t in _tasks(base, "demo.fail") if t.get("state") == "FAILURE"]

    (dead,) = harness.wait_for(finished, timeout=90, message="Flower never showed demo.fail as FAILURE")
    attempts = sorted(_tasks(base, "demo.fail"), key=lambda t: t["retries"])
    assert [t["state"] for t in attempts] == ["RETRY", "RETRY", "FAILURE"]
    assert all(t["args"] == f"[{failing.id}]" for t in attempts)
    assert [t["uuid"].rsplit("-", 1)[0] for t in attempts] == [f"job-{failing.id}-{n}" for n in (1, 2, 3)]
    assert "DemoFailure" in dead["exception"]
    assert f"job {failing.id}, attempt 3" in dead["exception"]
    (succeeded,) = harness.wait_for(
        lambda: [t for t in _tasks(base, "demo.record") if t.get("state") == "SUCCESS"],
        timeout=30,
        message="Flower never showed demo.record as SUCCESS",
    )
    assert succeeded["args"] == f"[{ok.id}]"
    assert succeeded["runtime"] is not None
    everything = str(flower.flower_tasks(base))
    assert "secret" not in everything  # no payload, no error message
    # The kinds' names are their jobs' alone (batches show as batch:<kind>, or as scheduling.run_batch when the
    # sender's task-sent event reaches Flower after the worker's events).
    assert all(t["uuid"].startswith("job-") for t in [*_tasks(base, "demo.fail"), *_tasks(base, "demo.record")])
