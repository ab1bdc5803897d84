"""Realistic throughput: N jobs whose handler inserts one row through the ORM, against baselines in the same run.

- timekeeper: ``api.schedule_many("demo.record", ...)`` due now, in one transaction, drained by one
  ``celery worker --concurrency 2`` (its main process runs the control loop; no beat). Each run
  writes one ``tasks.Execution`` row, atomically with its outcome. Drain = first attempt start to
  last attempt finish (JobAttempt, database clock).
- celery reliable / celery default: bare Celery (``bench.celery_orm``), the same ORM insert per
  task, 2 processes on the same Redis server, with late acks and prefetch 1 (the reliable
  configuration) and with Celery's defaults (early acks, prefetch multiplier 4). Drain = first to
  last Execution row (database clock; each insert commits on its own).
- procrastinate: Procrastinate 3.10 in ``var/bench-venv``, 2 processes, a task doing one INSERT of
  the same row shape (plain SQL: that venv has no Django, which favours it slightly); drain from its
  event table.

- floor: ``bench.floor``, a plain Python process per core doing the least for the same guarantees
  (claim 50 with SKIP LOCKED, a savepoint and the same ``demo.record`` handler per job, one
  statement marking the 50 done, commit), no Celery, no Timekeeper. Drain = first claim to last
  commit.

duplicate_effects: rows per job key beyond the first, summed (every system; must be 0 for timekeeper).
Targets (issue 32): >= 3,500 jobs/s, >= 4x Celery reliable, >= 0.75x the floor, 0 duplicate effects;
the ratios to Celery's defaults and Procrastinate are printed beside them.
"""

from __future__ import annotations

import time
from typing import Any

from bench import common, floor, procs, throughput

SCENARIO = "realistic"
KIND = "demo.record"  # writes one tasks.Execution row through the ORM per run
WORKER_CONCURRENCY = 2
DRAIN_TIMEOUT_S = 300
TARGET_JOBS_PER_S = 3500  # issue 32
TARGET_RATIO_VS_CELERY = 4.0  # issue 32: against Celery's reliable configuration (late acks, prefetch 1)
TARGET_RATIO_VS_FLOOR = 0.75  # issue 32: against bench.floor in the same run
SYSTEMS = ("timekeeper", "celery_reliable", "celery_default", "procrastinate", "floor")

DUPLICATES_SQL = (
    "SELECT coalesce(sum(n - 1), 0)::int, count(*)::int FROM"
    " (SELECT count(*) AS n FROM tasks_execution GROUP BY idempotency_key) AS per_key"
)


def _one(sql: str, params: Any = None) -> tuple[Any, ...]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def effects() -> tuple[int, int]:
    """(duplicate effects, distinct job keys) in tasks_execution."""
    duplicates, keys = _one(DUPLICATES_SQL)
    return int(duplicates), int(keys)


def _wait(sql: str, until: int, timeout: float, alive: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(_one(sql)[0]) >= until:
            return
        if alive is not None and not alive():
            raise RuntimeError("the worker exited during the drain")
        time.sleep(0.25)
    common.say(f"  {SCENARIO}: timed out after {timeout:.0f}s waiting for {until:,} ({sql})")


def run_timekeeper(jobs: int) -> dict[str, Any]:
    from django.db import transaction

    from scheduling import api

    common.reset_state()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=WORKER_CONCURRENCY)
        group.wait_ready(worker)
        time.sleep(1.0)
        with common.stopwatch() as enqueue, transaction.atomic():
            api.schedule_many(KIND, [{} for _ in range(jobs)], delay=0)
        _wait(
            "SELECT count(*) FROM scheduling_scheduledjob WHERE state NOT IN ('pending', 'claimed', 'running')",
            jobs,
            DRAIN_TIMEOUT_S,
            worker.alive,
        )
    drain, attempts, distinct_jobs = _one(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8, count(*), count(DISTINCT job_id)"
        " FROM scheduling_jobattempt WHERE outcome = 'succeeded'"
    )
    done = int(_one("SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'done'")[0])
    duplicates, keys = effects()
    return {
        "jobs": jobs,
        "done": done,
        "attempts": attempts,
        "duplicate_attempts": attempts - distinct_jobs,
        "duplicate_effects": duplicates,
        "missing_effects": jobs - keys,
        "drain_s": drain,
        "jobs_per_s": done / drain if drain else 0.0,
        "enqueue_jobs_per_s": jobs / enqueue[0],
    }


def run_celery(jobs: int, mode: str) -> dict[str, Any]:
    from bench import celery_orm

    common.reset_state()
    with celery_orm.connection() as conn:
        for i in range(jobs):
            celery_orm.record.apply_async(args=[f"bare:{i}"], connection=conn)
    with procs.Group(SCENARIO) as group:
        worker = group.worker(
            f"bare-{mode}",
            app="bench.celery_orm",
            concurrency=WORKER_CONCURRENCY,
            queues=celery_orm.QUEUE,
            env=celery_orm.worker_env(mode),
            level="warning",
        )
        _wait("SELECT count(DISTINCT idempotency_key) FROM tasks_execution", jobs, DRAIN_TIMEOUT_S, worker.alive)
        time.sleep(0.5)  # a duplicate delivery, if any, lands now
    drain, rows = _one(
        "SELECT extract(epoch FROM max(started_at) - min(started_at))::float8, count(*) FROM tasks_execution"
    )
    duplicates, keys = effects()
    return {
        "jobs": jobs,
        "done": keys,
        "rows": rows,
        "duplicate_effects": duplicates,
        "missing_effects": jobs - keys,
        "drain_s": drain,
        "jobs_per_s": keys / drain if drain else 0.0,
    }


def run_procrastinate(jobs: int) -> dict[str, Any]:
    figures = throughput.run_procrastinate(jobs, task="record", scenario=SCENARIO)
    figures["done"] = figures["succeeded"]
    figures["missing_effects"] = jobs - figures.get("keys", 0)
    return figures


def run_floor(jobs: int) -> dict[str, Any]:
    figures = floor.run(KIND, jobs, SCENARIO)
    duplicates, keys = effects()
    figures["duplicate_effects"] = duplicates
    figures["missing_effects"] = jobs - keys
    return figures


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    jobs = 5_000 if quick else 20_000
    runs: dict[str, dict[str, Any]] = {}
    common.say(f"{SCENARIO}: {jobs:,} jobs, one ORM insert each, {WORKER_CONCURRENCY} worker processes")
    runs["timekeeper"] = run_timekeeper(jobs)
    common.say(f"  timekeeper {runs['timekeeper']['jobs_per_s']:,.0f} jobs/s")
    for mode in ("reliable", "default"):
        runs[f"celery_{mode}"] = run_celery(jobs, mode)
        common.say(f"  celery {mode} {runs[f'celery_{mode}']['jobs_per_s']:,.0f} jobs/s")
    runs["procrastinate"] = run_procrastinate(jobs)
    common.say(f"  procrastinate {runs['procrastinate']['jobs_per_s']:,.0f} jobs/s")
    runs["floor"] = run_floor(jobs)
    common.say(f"  floor {runs['floor']['jobs_per_s']:,.0f} jobs/s")
    common.reset_state()

    rate = {name: runs[name]["jobs_per_s"] for name in SYSTEMS}
    tk = rate["timekeeper"]
    targets = {
        "timekeeper": f">= {TARGET_JOBS_PER_S:,} jobs/s",
        "celery_reliable": f"timekeeper >= {TARGET_RATIO_VS_CELERY:g}x",
        "celery_default": "-",
        "procrastinate": "-",
        "floor": f"timekeeper >= {TARGET_RATIO_VS_FLOOR:g}x",
    }
    rows = [
        [
            name,
            runs[name]["done"],
            runs[name]["drain_s"],
            rate[name],
            common.ratio(tk, rate[name]),
            runs[name].get("duplicate_effects", "-"),
            runs[name].get("missing_effects", "-"),
            targets[name],
        ]
        for name in SYSTEMS
    ]
    print(
        common.table(
            f"Realistic: {jobs:,} jobs inserting one row each (ORM), {WORKER_CONCURRENCY} worker processes, "
            f"load average {common.load_average()}",
            ["system", "done", "drain s", "jobs/s", "timekeeper / this", "dup effects", "missing", "target"],
            rows,
        )
    )
    ratio_celery = common.ratio(tk, rate["celery_reliable"])
    ratio_default = common.ratio(tk, rate["celery_default"])
    ratio_floor = common.ratio(tk, rate["floor"])
    duplicates = runs["timekeeper"]["duplicate_effects"]
    return {
        "jobs": jobs,
        "kind": KIND,
        "worker_processes": WORKER_CONCURRENCY,
        "jobs_per_s": round(tk, 1),
        "celery_jobs_per_s": round(rate["celery_reliable"], 1),
        "celery_default_jobs_per_s": round(rate["celery_default"], 1),
        "procrastinate_jobs_per_s": round(rate["procrastinate"], 1),
        "floor_jobs_per_s": round(rate["floor"], 1),
        "ratio_vs_celery": ratio_celery,
        "ratio_vs_celery_default": ratio_default,
        "ratio_vs_procrastinate": common.ratio(tk, rate["procrastinate"]),
        "ratio_vs_floor": ratio_floor,
        "duplicate_effects": duplicates,
        "missing_effects": runs["timekeeper"]["missing_effects"],
        "celery_duplicate_effects": runs["celery_reliable"]["duplicate_effects"],
        "celery_default_duplicate_effects": runs["celery_default"]["duplicate_effects"],
        "procrastinate_duplicate_effects": runs["procrastinate"].get("duplicate_effects"),
        "target_jobs_per_s": TARGET_JOBS_PER_S,
        "target_ratio_vs_celery": TARGET_RATIO_VS_CELERY,
        "target_ratio_vs_floor": TARGET_RATIO_VS_FLOOR,
        "target_met": (
            tk >= TARGET_JOBS_PER_S
            and ratio_celery >= TARGET_RATIO_VS_CELERY
            and ratio_floor >= TARGET_RATIO_VS_FLOOR
            and duplicates == 0
            and runs["timekeeper"]["missing_effects"] == 0
        ),
        "detail": runs,
    }
