"""The floor: the least any process can do for the guarantees Timekeeper gives an atomic job.

``run(kind, jobs)`` measures it in the bench run that quotes it (throughput: ``demo.noop``;
realistic: ``demo.record``). One plain Python process per core (``PROCESSES``: the workers'
concurrency, which is the core count here), no Celery and none of Timekeeper's claim loop or
runner: each loops on one Django connection through

    BEGIN; SELECT 50 due pending rows FOR UPDATE SKIP LOCKED (the pending index Timekeeper's claim
    reads); per row a SAVEPOINT and the kind's Django handler (the function Timekeeper calls),
    rolled back to its savepoint if it raises; one UPDATE marking the rows done; COMMIT

until no row is left. A job's effect and its ``done`` commit together or not at all, a failing
handler costs only itself, and SKIP LOCKED keeps the processes apart: the guarantees of an atomic
chunk, without a lease, heartbeat, token, timeout, attempt row, tracing or log line. Drain: the
first claim to the last commit over all processes (one machine, one clock), the same span as
Timekeeper's first attempt start to last attempt finish.

``python -m bench.floor --kind K --batch 50 --start-at T`` is one such process (started by
``run``); it prints one JSON line: {"jobs", "first", "last", "failed"}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench import common

PROCESSES = 2  # one per core (the machine has 2; the same as the workers' concurrency)
BATCH = 50  # rows per transaction, as a Timekeeper chunk of jobs that write (runner.ATOMIC_CHUNK_SAVEPOINTS)
START_DELAY_S = 4.0  # the processes import Django and connect first, then start together at this offset
DRAIN_TIMEOUT_S = 300

CLAIM = (
    "SELECT id, kind, payload, attempts, max_attempts, due_at FROM scheduling_scheduledjob"
    " WHERE state = 'pending' AND due_at <= now() ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED"
)
DONE = (
    "UPDATE scheduling_scheduledjob SET state = 'done', finished_at = clock_timestamp(), updated_at = now()"
    " WHERE id = ANY(%s)"
)


def run(kind: str, jobs: int, scenario: str) -> dict[str, Any]:
    """Schedule ``jobs`` of ``kind`` due now and drain them with ``PROCESSES`` floor processes."""
    from django.db import transaction

    from scheduling import api

    common.reset_state()
    with transaction.atomic():
        api.schedule_many(kind, [{} for _ in range(jobs)], delay=0)
    start_at = time.time() + START_DELAY_S
    log_dir = common.LOGS / scenario
    log_dir.mkdir(parents=True, exist_ok=True)
    children = []
    for n in range(PROCESSES):
        err = open(log_dir / f"floor-{n}.log", "w")  # noqa: SIM115 (closed below, after the child ends)
        command = [sys.executable, "-m", "bench.floor", f"--kind={kind}", f"--batch={BATCH}", f"--start-at={start_at}"]
        child = subprocess.Popen(
            command, cwd=common.ROOT, env=common.bench_env(), stdout=subprocess.PIPE, stderr=err, text=True
        )
        children.append((child, err))
    reports = []
    for child, err in children:
        out, _ = child.communicate(timeout=DRAIN_TIMEOUT_S + START_DELAY_S + 60)
        err.close()
        if child.returncode != 0:
            raise RuntimeError(f"a floor process exited with {child.returncode} (see {log_dir})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    done = sum(r["jobs"] for r in reports)
    busy = [r for r in reports if r["jobs"]]
    drain = max(r["last"] for r in busy) - min(r["first"] for r in busy) if busy else 0.0
    return {
        "jobs": jobs,
        "done": done,
        "failed": sum(r["failed"] for r in reports),
        "processes": PROCESSES,
        "batch": BATCH,
        "per_process": [r["jobs"] for r in reports],
        "drain_s": drain,
        "jobs_per_s": done / drain if drain else 0.0,
    }


def drain(kind: str, batch: int) -> dict[str, Any]:
    """One floor process: claim, run and mark done ``batch`` rows per transaction until none is left."""
    from django.db import connection, transaction

    from scheduling import registry

    handler = registry.get(kind).func
    jobs = failed = 0
    first = last = 0.0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(CLAIM, [batch])
                rows = cursor.fetchall()
            if not rows:
                break
            if not first:
                first = time.time()
            for job_id, job_kind, payload, attempts, max_attempts, due_at in rows:
                savepoint = transaction.savepoint()
                job = registry.Job(
                    kind=job_kind,
                    payload=payload if isinstance(payload, dict) else json.loads(payload),
                    attempt=attempts + 1,
                    max_attempts=max_attempts,
                    due_at=due_at,
                    id=job_id,
                    mechanism=registry.Mechanism.DUE_AT,
                )
                try:
                    handler(job)
                except Exception:
                    transaction.savepoint_rollback(savepoint)
                    failed += 1
            with connection.cursor() as cursor:
                cursor.execute(DONE, [[row[0] for row in rows]])
        last = time.time()
        jobs += len(rows)
    return {"jobs": jobs, "first": first, "last": last, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", required=True, help="the job kind whose handler runs (demo.noop, demo.record)")
    parser.add_argument("--batch", type=int, default=BATCH, help="rows claimed per transaction")
    parser.add_argument("--start-at", type=float, default=0.0, help="epoch seconds at which to start draining")
    args = parser.parse_args(argv)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from django.db import connection

    connection.ensure_connection()
    time.sleep(max(0.0, args.start_at - time.time()))
    print(json.dumps(drain(args.kind, args.batch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
