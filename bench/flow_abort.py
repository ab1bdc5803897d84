"""Abort: how long after ``api.abort()`` a running handler is interrupted, and that its writes never commit.

One ``celery worker`` (prefork, ``--concurrency`` WORKERS + 1: the control loop holds one pool
process while it leads) runs ``bench.abort`` jobs (``bench/kinds/abort.py``: an ORM insert in the
job's atomic transaction, then a two-minute sleep), one per batch, so WORKERS of them run at once.
The benchmark aborts each running job as soon as it has started, until JOBS were aborted. Per job:
interruption time = the aborted attempt's ``finished_at`` (the runner's clock when the handler
raised) minus the request's ``requested_at`` (``api.abort``'s ``now()``), both the database clock.
The target (issue 36): p99 <= the heartbeat interval + 1 s, and no committed write of an aborted
job (``tasks_execution`` rows of aborted jobs: the insert ran, inside the transaction that the
abort rolled back). ``run(jobs, heartbeat_s)`` is what ``python -m bench flow`` calls.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import common, procs

SCENARIO = "flow_abort"
JOBS = 100
QUICK_JOBS = 20
WORKERS = 8  # handlers running at once (sleeping: they cost no CPU)
HEARTBEAT_S = 5.0  # SCHEDULING_HEARTBEAT_SECONDS' default: the bound is measured against the real interval
QUICK_HEARTBEAT_S = 1.0
MARGIN_S = 1.0  # the target: p99 <= heartbeat + this
WAIT_S = 120.0  # for all aborted jobs to be cancelled


def _running(asked: set[int]) -> list[int]:
    rows = common.sql(
        "SELECT id FROM scheduling_scheduledjob WHERE kind = %s AND state = 'running' ORDER BY id", ["bench.abort"]
    )
    return [r[0] for r in rows if r[0] not in asked]


def run(jobs: int = JOBS, heartbeat_s: float = HEARTBEAT_S) -> dict[str, Any]:
    """Abort ``jobs`` running handlers on a worker heartbeating every ``heartbeat_s``; the figures."""
    common.setup()
    from django.db import connection

    from bench.kinds import abort as kinds  # registers the kind in this process too
    from scheduling import api

    common.reset_state()
    env = {"DJANGO_SETTINGS_MODULE": "bench.failures_settings", "SCHEDULING_HEARTBEAT_SECONDS": f"{heartbeat_s:g}"}
    asked: set[int] = set()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=WORKERS + 1, env=env)
        group.wait_ready(worker)
        time.sleep(1.0)
        api.schedule_many(kinds.KIND, [{} for _ in range(jobs)], delay=0)
        deadline = time.monotonic() + WAIT_S + jobs * heartbeat_s
        while len(asked) < jobs and time.monotonic() < deadline:
            for job_id in _running(asked):
                api.abort(job_id, by="bench")
                asked.add(job_id)
            if not worker.alive():
                raise RuntimeError("the worker's main process died")
            time.sleep(0.05)
        if len(asked) < jobs:
            raise RuntimeError(f"only {len(asked)} of {jobs} jobs started in time")
        wait_until = time.monotonic() + WAIT_S
        while time.monotonic() < wait_until:
            left = common.sql(
                "SELECT count(*) FROM scheduling_scheduledjob WHERE id = ANY(%s) AND state <> 'cancelled'",
                [list(asked)],
            )[0][0]
            if not left:
                break
            time.sleep(0.2)
    rows = common.sql(
        "SELECT extract(epoch FROM a.finished_at - r.requested_at)::float8, a.outcome"
        " FROM scheduling_jobattempt AS a JOIN scheduling_jobabort AS r ON r.job_id = a.job_id"
        " WHERE a.job_id = ANY(%s)",
        [list(asked)],
    )
    committed = common.sql(
        "SELECT count(*) FROM tasks_execution WHERE idempotency_key = ANY(%s)", [[f"job:{i}" for i in asked]]
    )[0][0]
    states = dict(
        common.sql(
            "SELECT state, count(*) FROM scheduling_scheduledjob WHERE id = ANY(%s) GROUP BY state", [list(asked)]
        )
    )
    connection.close()
    common.reset_state()
    seconds = sorted(r[0] for r in rows if r[1] == "aborted")
    p50 = common.percentile(seconds, 50) if seconds else float("nan")
    p99 = common.percentile(seconds, 99) if seconds else float("nan")
    target = heartbeat_s + MARGIN_S
    met = len(seconds) == jobs and p99 <= target and committed == 0
    print(
        common.table(
            f"Abort of {jobs} running jobs ({WORKERS} at once, heartbeat {heartbeat_s:g} s), "
            f"load average {common.load_average()}",
            ["aborted", "p50 s", "p99 s", "max s", "target p99 s", "committed writes", "states"],
            [
                [
                    len(seconds),
                    round(p50, 2),
                    round(p99, 2),
                    round(seconds[-1] if seconds else 0, 2),
                    target,
                    committed,
                    states,
                ]
            ],
        )
    )
    return {
        "jobs": jobs,
        "aborted": len(seconds),
        "abort_p50_s": round(p50, 3),
        "abort_p99_s": round(p99, 3),
        "abort_max_s": round(max(seconds, default=0.0), 3),
        "heartbeat_s": heartbeat_s,
        "target_p99_s": target,
        "aborted_committed_writes": committed,
        "final_states": states,
        "target_met": met,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench flow_abort", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_JOBS} jobs, heartbeat {QUICK_HEARTBEAT_S:g} s")
    parser.add_argument("--jobs", type=int, help=f"jobs to abort (default {JOBS}, quick {QUICK_JOBS})")
    parser.add_argument("--heartbeat", type=float, help=f"SCHEDULING_HEARTBEAT_SECONDS (default {HEARTBEAT_S:g})")
    args = parser.parse_args(argv)
    jobs = args.jobs or (QUICK_JOBS if args.quick else JOBS)
    heartbeat = args.heartbeat or (QUICK_HEARTBEAT_S if args.quick else HEARTBEAT_S)
    return common.emit(SCENARIO, run(jobs, heartbeat), quick=args.quick)
