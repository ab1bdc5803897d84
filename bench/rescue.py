"""Rescue: how long a job whose pool process was killed (``kill -9``) waits before it starts again.

Default settings (lease 30 s, heartbeat 5 s, sweep every 5 s): one ``celery worker --concurrency 2``
(its main process runs the control loop). Each round schedules one ``demo.record`` job that sleeps,
waits until it has started, reads the pool process's pid from the started claim (``claimed_by`` is
``host:pid``; the handler's Execution row is not visible yet: demo.record is atomic, so it commits
with the outcome), reads the database clock, and kills that process with SIGKILL. Celery replaces
the process; the message it held is redelivered and skipped (the claim was started); the sweeper
takes the claim back once its heartbeat is older than the lease, and the control loop claims it
again. Rescue time = the new attempt's ``started_at`` minus the kill instant (both database clock).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from bench import common, procs

SCENARIO = "rescue"
KIND = "demo.record"
SLEEP_S = 6.0  # the handler's sleep: long enough to be killed mid-run, short enough for the rerun
TARGET_S = 45.0  # lease 30 + sweep interval 5 + a claim, with room for a loaded machine
WAIT_START_S = 60.0
WAIT_RESCUE_S = 150.0


def _one(sql: str, params: Any = None) -> tuple[Any, ...] | None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def _started_pid(job_id: int, timeout: float) -> int:
    """The pid of the pool process that started ``job_id`` (from ``claimed_by``), waiting for the start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _one("SELECT claimed_by FROM scheduling_scheduledjob WHERE id = %s AND state = 'running'", [job_id])
        if row and row[0]:
            return int(row[0].rsplit(":", 1)[1])
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not start within {timeout}s")


def one_round(worker: procs.Proc) -> dict[str, Any]:
    from scheduling import api

    job_id = api.schedule(KIND, {"sleep": SLEEP_S}, delay=0).pk
    pid = _started_pid(job_id, WAIT_START_S)
    time.sleep(0.5)  # inside the handler's sleep
    killed_at = _one("SELECT clock_timestamp()")[0]  # the database clock, just before the kill
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_RESCUE_S
    row = None
    while time.monotonic() < deadline:
        row = _one(
            "SELECT extract(epoch FROM started_at - %s)::float8, number, worker FROM scheduling_jobattempt"
            " WHERE job_id = %s AND started_at > %s ORDER BY started_at LIMIT 1",
            [killed_at, job_id, killed_at],
        )
        if row:
            break
        if not worker.alive():
            raise RuntimeError("the worker's main process died")
        time.sleep(0.2)
    if row is None:
        raise RuntimeError(f"job {job_id} was not started again within {WAIT_RESCUE_S}s of the kill")
    # Let the rerun finish, then count its effects: exactly one Execution row (the killed run's rolled back).
    deadline = time.monotonic() + SLEEP_S + 30
    while time.monotonic() < deadline:
        state = _one("SELECT state FROM scheduling_scheduledjob WHERE id = %s", [job_id])[0]
        if state in ("done", "dead"):
            break
        time.sleep(0.2)
    effects = _one("SELECT count(*) FROM tasks_execution WHERE idempotency_key = %s", [f"job:{job_id}"])[0]
    lost = _one(
        "SELECT outcome FROM scheduling_jobattempt WHERE job_id = %s AND started_at <= %s ORDER BY number LIMIT 1",
        [job_id, killed_at],
    )
    return {
        "job_id": job_id,
        "killed_pid": pid,
        "rescue_s": round(row[0], 2),
        "new_attempt_number": row[1],
        "new_worker": row[2],
        "killed_attempt_outcome": lost[0] if lost else None,
        "final_state": state,
        "effects": effects,
    }


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    from scheduling.core import conf

    settings = conf.get()
    rounds = 1 if quick else 3
    results = []
    common.reset_state()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=2)
        group.wait_ready(worker)
        time.sleep(1.0)
        for n in range(rounds):
            common.say(f"{SCENARIO}: round {n + 1} of {rounds} (kill -9 of the pool process running the job)")
            results.append(one_round(worker))
            common.say(f"  started again {results[-1]['rescue_s']} s after the kill")
    common.reset_state()
    seconds = [r["rescue_s"] for r in results]
    med = common.median(seconds)
    target = f"<= {TARGET_S:g} s"
    print(
        common.table(
            f"Rescue after kill -9 of the pool process (lease {settings.lease_seconds} s, heartbeat "
            f"{settings.heartbeat_seconds:g} s, sweep {settings.sweep_interval_seconds:g} s), "
            f"load average {common.load_average()}",
            ["round", "killed pid", "kill to restart s", "killed attempt", "final", "effects", "target"],
            [
                [
                    i + 1,
                    str(r["killed_pid"]),
                    r["rescue_s"],
                    r["killed_attempt_outcome"],
                    r["final_state"],
                    r["effects"],
                    target,
                ]
                for i, r in enumerate(results)
            ],
        )
    )
    return {
        "rounds": rounds,
        "lease_seconds": settings.lease_seconds,
        "heartbeat_seconds": settings.heartbeat_seconds,
        "sweep_interval_seconds": settings.sweep_interval_seconds,
        "rescue_s_median": round(med, 2),
        "rescue_s_max": max(seconds),
        "samples_s": seconds,
        "duplicate_effects": sum(max(0, r["effects"] - 1) for r in results),
        "target_s": TARGET_S,
        "target_met": med <= TARGET_S and all(r["effects"] == 1 for r in results),
        "detail": results,
    }
