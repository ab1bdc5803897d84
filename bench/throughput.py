"""Throughput: N no-op jobs due now, drained by the platform, against its baselines in the same run.

- timekeeper: ``api.schedule_many`` in one transaction, drained by one celery worker (concurrency 2)
  with beat; drain = first handler start to last completion, from JobAttempt's database times.
- celery: bare Celery no-op tasks, same broker server, same worker count; drain = first message
  taken to last message acknowledged (the queue and the unacked hash polled every 2 ms).
- procrastinate: Procrastinate 3.10 from PyPI (separate venv), same PostgreSQL server, two worker
  processes; drain from its event table.
- raw SQL: the claim statement + a completion UPDATE in psycopg2 on one connection, batches of 50,
  and one row per transaction (the floor and the ceiling of a table-based queue).
- floor: ``bench.floor``, a plain Python process per core doing the least for the same guarantees
  (claim 50 with SKIP LOCKED, a savepoint and the same Django handler per job, one statement
  marking the 50 done, commit), no Celery, no Timekeeper.

Targets (issue 32): >= 10,000 jobs/s and >= 0.6x the raw batch-50 baseline of the same run; the
ratios to Celery, Procrastinate and the floor are printed and kept beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from bench import common, floor, procs

SCENARIO = "throughput"
WORKER_CONCURRENCY = 2  # one worker process pool of 2 for every system: the machine has 2 cores
PROCRASTINATE_WORKERS = 2
PROCRASTINATE_CONCURRENCY = 10  # async jobs per Procrastinate process (its best of 1, 4 and 10 here)
BENCH_VENV = common.ROOT / "var" / "bench-venv"
PROCRASTINATE_DB = "timekeeper_bench_procrastinate"
TARGET_JOBS_PER_S = 10_000  # issue 32
TARGET_RATIO_VS_RAW_BATCH_50 = 0.6  # issue 32: timekeeper / the raw batch-50 claim + done of the same run
DRAIN_TIMEOUT_S = 300


# --- timekeeper ------------------------------------------------------------------------------------


def run_timekeeper(jobs: int) -> dict[str, Any]:
    from django.db import connection, transaction

    from scheduling import api

    common.reset_state()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=WORKER_CONCURRENCY)
        group.beat("tk-beat")
        group.wait_ready(worker)
        time.sleep(1.0)
        with common.stopwatch() as enqueue, transaction.atomic():
            api.schedule_many("demo.noop", [{} for _ in range(jobs)], delay=0)
        committed = time.perf_counter()
        deadline = committed + DRAIN_TIMEOUT_S
        while common.jobs_left() and time.perf_counter() < deadline:
            time.sleep(0.25)
        wall = time.perf_counter() - committed
    with connection.cursor() as cur:
        cur.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8, count(*),"
            " count(DISTINCT job_id) FROM scheduling_jobattempt WHERE outcome = 'succeeded'"
        )
        drain, attempts, distinct_jobs = cur.fetchone()
        cur.execute("SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'done'")
        done = cur.fetchone()[0]
    return {
        "jobs": jobs,
        "done": done,
        "attempts": attempts,
        "duplicate_attempts": attempts - distinct_jobs,
        "drain_s": drain,
        "jobs_per_s": jobs / drain if drain else 0.0,
        "enqueue_jobs_per_s": jobs / enqueue[0],
        "wall_s_from_commit": wall,
    }


# --- bare Celery -----------------------------------------------------------------------------------


def run_celery(jobs: int) -> dict[str, Any]:
    from bench import celery_bare

    common.reset_state()
    client = common.redis_client(common.BARE_BROKER_DB)
    with celery_bare.connection() as conn:
        for _ in range(jobs):
            celery_bare.noop.apply_async(connection=conn)
    queued = client.llen("bare")
    with procs.Group(SCENARIO) as group:
        group.worker(
            "bare-w1",
            app="bench.celery_bare",
            concurrency=WORKER_CONCURRENCY,
            queues="bare",
            env=celery_bare.worker_env(),
            level="warning",
        )
        first = last = None
        deadline = time.perf_counter() + DRAIN_TIMEOUT_S + 60
        pipe = client.pipeline(transaction=False)
        while time.perf_counter() < deadline:
            pipe.llen("bare")
            pipe.hlen("unacked")
            waiting, unacked = pipe.execute()
            now = time.perf_counter()
            if first is None and waiting < queued:
                first = now
            if first is not None and waiting == 0 and unacked == 0:
                last = now
                break
            time.sleep(0.002)
    drain = (last - first) if (first is not None and last is not None) else float("nan")
    return {"jobs": queued, "drain_s": drain, "jobs_per_s": queued / drain if drain else 0.0}


# --- Procrastinate ---------------------------------------------------------------------------------


def ensure_bench_venv() -> None:
    """Create ``var/bench-venv`` with Procrastinate 3.10 (kept out of .venv: it brings psycopg 3)."""
    python = BENCH_VENV / "bin" / "python"
    if python.exists():
        check = subprocess.run([str(python), "-c", "import procrastinate"], capture_output=True)
        if check.returncode == 0:
            return
    common.say("creating var/bench-venv with procrastinate 3.10 ...")
    subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "procrastinate==3.10.*", "psycopg[binary]"], check=True)


def run_procrastinate(jobs: int, task: str = "noop", scenario: str = SCENARIO) -> dict[str, Any]:
    """Drain ``jobs`` Procrastinate jobs of ``task`` ("noop", or "record": one INSERT each) in its venv."""
    ensure_bench_venv()
    common.ensure_database(PROCRASTINATE_DB, fresh=True)
    log = common.LOGS / scenario / "procrastinate.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        "BENCH_PROCRASTINATE_DSN": common.dsn(PROCRASTINATE_DB),
        "PYTHONPATH": str(common.ROOT),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [
            str(BENCH_VENV / "bin" / "python"),
            "-m",
            "bench.procrastinate_run",
            f"--jobs={jobs}",
            f"--workers={PROCRASTINATE_WORKERS}",
            f"--concurrency={PROCRASTINATE_CONCURRENCY}",
            f"--log={log}",
            f"--task={task}",
        ],
        cwd=common.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DRAIN_TIMEOUT_S * 3,
        check=True,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["jobs_per_s"] = figures["succeeded"] / figures["drain_s"] if figures["drain_s"] else 0.0
    return figures


# --- raw SQL ---------------------------------------------------------------------------------------

RAW_COMPLETE = (
    "UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now(), updated_at = now(), heartbeat_at = NULL"
    " WHERE id = ANY(%(ids)s) AND token = ANY(%(tokens)s::uuid[]) AND state = 'claimed'"
)


def _insert_due(cur: Any, n: int) -> None:
    cur.execute(
        "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, lease_seconds, attempts, max_attempts,"
        " last_error, claimed_by, created_at, updated_at)"
        " SELECT 'demo.noop', '{}'::jsonb, now(), 'pending', 60, 0, 5, '', '', now(), now()"
        " FROM generate_series(1, %s)",
        [n],
    )


def run_raw(jobs: int, batch: int) -> dict[str, Any]:
    """Claim ``batch`` rows and complete them, one transaction per batch, on one connection."""
    from scheduling.core import db
    from scheduling.due_at import store

    common.reset_state()
    conn = common.admin_connect(common.BENCH_DB)
    # as the engine sends it: JIT off, and its planner settings (store.INDEX_COSTS)
    claim_sql = db.NO_JIT + store.INDEX_COSTS + store.SQL["claim_due_jobs"]
    try:
        with conn.cursor() as cur:
            _insert_due(cur, jobs)
            cur.execute("ANALYZE scheduling_scheduledjob")
        conn.autocommit = False
        done = 0
        start = time.perf_counter()
        with conn.cursor() as cur:
            while True:
                cur.execute(claim_sql, store.claim_params(batch))
                rows = cur.fetchall()
                if not rows:
                    conn.commit()
                    break
                cur.execute(RAW_COMPLETE, {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
                done += cur.rowcount
                conn.commit()
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    return {"jobs": done, "batch": batch, "drain_s": elapsed, "jobs_per_s": done / elapsed}


# --- the scenario ----------------------------------------------------------------------------------

SYSTEMS = ("timekeeper", "celery", "procrastinate", "raw_batch_50", "raw_row_per_txn", "floor")


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    jobs = 10_000 if quick else 20_000
    reps = 1 if quick else 3
    row_jobs = 2_000 if quick else 5_000  # one row per transaction is slow: fewer rows say the same
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for rep in range(reps):
        common.say(f"throughput: round {rep + 1} of {reps} ({jobs:,} jobs)")
        runs["timekeeper"].append(run_timekeeper(jobs))
        common.say(f"  timekeeper {runs['timekeeper'][-1]['jobs_per_s']:,.0f} jobs/s")
        runs["celery"].append(run_celery(jobs))
        common.say(f"  celery {runs['celery'][-1]['jobs_per_s']:,.0f} jobs/s")
        runs["procrastinate"].append(run_procrastinate(jobs))
        common.say(f"  procrastinate {runs['procrastinate'][-1]['jobs_per_s']:,.0f} jobs/s")
        runs["raw_batch_50"].append(run_raw(jobs, 50))
        runs["raw_row_per_txn"].append(run_raw(row_jobs, 1))
        runs["floor"].append(floor.run("demo.noop", jobs, SCENARIO))
        common.say(f"  floor {runs['floor'][-1]['jobs_per_s']:,.0f} jobs/s")
    common.reset_state()

    med = {name: common.median([r["jobs_per_s"] for r in runs[name]]) for name in SYSTEMS}
    tk = med["timekeeper"]
    rows = []
    for name in SYSTEMS:
        rates = [r["jobs_per_s"] for r in runs[name]]
        rows.append([name, runs[name][0]["jobs"], med[name], min(rates), max(rates), common.ratio(tk, med[name])])
    print(
        common.table(
            f"Throughput: no-op jobs due now, {WORKER_CONCURRENCY} worker processes, median of {reps}, "
            f"load average {common.load_average()}",
            ["system", "jobs", "jobs/s (median)", "min", "max", "timekeeper / this"],
            rows,
        )
    )
    ratio_raw = common.ratio(tk, med["raw_batch_50"])
    figures = {
        "jobs": jobs,
        "runs": reps,
        "worker_processes": WORKER_CONCURRENCY,
        "jobs_per_s": round(tk, 1),
        "celery_jobs_per_s": round(med["celery"], 1),
        "procrastinate_jobs_per_s": round(med["procrastinate"], 1),
        "raw_batch_50_rows_per_s": round(med["raw_batch_50"], 1),
        "raw_row_per_txn_rows_per_s": round(med["raw_row_per_txn"], 1),
        "floor_jobs_per_s": round(med["floor"], 1),
        "ratio_vs_celery": common.ratio(tk, med["celery"]),
        "ratio_vs_procrastinate": common.ratio(tk, med["procrastinate"]),
        "ratio_vs_raw_batch_50": ratio_raw,
        "ratio_vs_floor": common.ratio(tk, med["floor"]),
        "target_jobs_per_s": TARGET_JOBS_PER_S,
        "target_ratio_vs_raw_batch_50": TARGET_RATIO_VS_RAW_BATCH_50,
        "target_met": tk >= TARGET_JOBS_PER_S and ratio_raw >= TARGET_RATIO_VS_RAW_BATCH_50,
        "duplicate_attempts": sum(r["duplicate_attempts"] for r in runs["timekeeper"]),
        "timekeeper_enqueue_jobs_per_s": round(common.median([r["enqueue_jobs_per_s"] for r in runs["timekeeper"]])),
        "samples": {name: [round(r["jobs_per_s"], 1) for r in runs[name]] for name in SYSTEMS},
    }
    chart(med)
    return figures


def chart(med: dict[str, float]) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [n for n in SYSTEMS if not n.startswith("raw_batch")]
    values = [med[n] for n in names]
    colors = ["#2b7bba" if n == "timekeeper" else "#9aa5b1" for n in names]
    ax.barh(names, values, color=colors)
    ax.axvline(TARGET_JOBS_PER_S, color="#c0392b", linestyle="--", label=f"target {TARGET_JOBS_PER_S:,}/s")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.0f}", va="center")
    ax.set_xlabel("jobs per second (median)")
    ax.set_title(f"No-op jobs drained, 2 worker processes (raw batch of 50: {med['raw_batch_50']:,.0f} rows/s)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(common.chart_path(SCENARIO), dpi=110)
    plt.close(fig)
