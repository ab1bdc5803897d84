"""A spike without workers, for diagnosis: ``python -m bench.spike_probe --jobs 20000``.

Schedules ``--jobs`` ``demo.record`` jobs due at one instant in the bench database
(``BENCH_DATABASE``, default timekeeper_bench: point it at a database of your own), then drains
them in this process with the code a worker and the leader run: the claim
(``store.claim_due_jobs``, 200 rows = 4 messages of 50, the leader's size with the default bound)
and ``runner.run_batch`` per batch (start, run, outcome). Serial, so its drain time is not a
worker's, but every figure below is the same statements' work:

- per job: WAL bytes (``pg_current_wal_lsn``: the whole cluster's, so other databases' writes
  count too), heap and index block accesses of the jobs table (``pg_statio_user_*``), updates and
  how many were HOT (``pg_stat_user_tables``), index growth (``pg_relation_size``);
- per claim: its wall time (p50/p99 over the last third of the spike);
- ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of the claim at 10%, 50% and 90% of the spike, rolled back:
  planning and execution time, shared buffers.

``--vacuum-at 0.5`` VACUUMs the jobs table once half the jobs are done (a vacuum a leader would ask
for); ``--hold-snapshot`` holds another session's snapshot from before the first claim to the end
(a long transaction: the dead entries at the head of the pending index can then not be removed).
``--analyze-first`` analyzes the empty table first. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench import common

CLAIM_ROWS = 200  # the leader's claim with the default bound: 4 messages x 50 rows
MESSAGES = 4
SAMPLES_AT = (0.1, 0.5, 0.9)


def _stats(cur: Any) -> dict[str, int]:
    cur.execute(
        "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'scheduling_scheduledjob'"
    )
    upd, hot, dead = cur.fetchone()
    cur.execute(
        "SELECT coalesce(heap_blks_read + heap_blks_hit, 0), coalesce(idx_blks_read + idx_blks_hit, 0)"
        " FROM pg_statio_user_tables WHERE relname = 'scheduling_scheduledjob'"
    )
    heap, idx = cur.fetchone()
    cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    (wal,) = cur.fetchone()
    cur.execute(
        "SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_index"
        " WHERE indrelid = 'scheduling_scheduledjob'::regclass"
    )
    idx_bytes = int(cur.fetchone()[0])
    return {"upd": upd, "hot": hot, "dead": dead, "heap": heap, "idx": idx, "wal": int(wal), "idx_bytes": idx_bytes}


def _per_index(cur: Any) -> dict[str, tuple[int, int]]:
    cur.execute(
        "SELECT s.indexrelname, s.idx_blks_read + s.idx_blks_hit, pg_relation_size(s.indexrelid)"
        " FROM pg_statio_user_indexes AS s WHERE s.relname = 'scheduling_scheduledjob'"
    )
    return {name: (int(blocks), int(size)) for name, blocks, size in cur.fetchall()}


def _explain_claim(params: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection, transaction

    from scheduling.core import db
    from scheduling.due_at import store

    with transaction.atomic():
        with connection.cursor() as cur:
            # planned as the engine plans it (JIT off, store.INDEX_COSTS)
            cur.execute(db.NO_JIT + store.INDEX_COSTS + store.SQL["lock_capped_kinds"], params)
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + store.SQL["claim_due_jobs"], params)
            plan = cur.fetchone()[0][0]
        transaction.set_rollback(True)
    top = plan["Plan"]
    return {
        "planning_ms": round(plan.get("Planning Time", 0.0), 2),
        "execution_ms": round(plan.get("Execution Time", 0.0), 2),
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "planning_buffers": plan.get("Planning", {}).get("Shared Hit Blocks", 0)
        + plan.get("Planning", {}).get("Shared Read Blocks", 0),
        "rows": top.get("Actual Rows", 0),
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main(jobs: int, analyze_first: bool, vacuum_at: float | None = None, hold_snapshot: bool = False) -> dict[str, Any]:
    common.setup()
    from django.db import connection, transaction

    from scheduling import api
    from scheduling.due_at import claim, runner, store

    common.reset_state()
    with connection.cursor() as cur:
        if analyze_first:
            cur.execute("VACUUM ANALYZE scheduling_scheduledjob")
    with transaction.atomic():
        api.schedule_many("demo.record", [{} for _ in range(jobs)], delay=0)
    claim.sync_rates(force=True)
    sizes = claim.batch_sizes()
    params = store.claim_params(CLAIM_ROWS, messages=MESSAGES, batch_sizes=sizes)
    with connection.cursor() as cur:
        before, before_idx = _stats(cur), _per_index(cur)
    holder = None
    if hold_snapshot:  # another session's snapshot from before the first claim, held to the end
        import psycopg2

        holder = psycopg2.connect(common.dsn())
        holder.set_session(isolation_level="REPEATABLE READ")
        holder.cursor().execute("SELECT count(*) FROM scheduling_scheduledjob")
    claim_ms: list[float] = []
    samples: list[dict[str, Any]] = []
    done = 0
    started = time.perf_counter()
    next_sample = 0
    vacuumed = vacuum_at is None
    while True:
        if not vacuumed and done >= vacuum_at * jobs:  # as a leader asking for one after a large burst would
            with connection.cursor() as cur:
                cur.execute("VACUUM scheduling_scheduledjob")
            vacuumed = True
        if next_sample < len(SAMPLES_AT) and done >= SAMPLES_AT[next_sample] * jobs:
            samples.append({"at": SAMPLES_AT[next_sample], **_explain_claim(params)})
            next_sample += 1
        t0 = time.perf_counter()
        claims = store.claim_due_jobs(CLAIM_ROWS, messages=MESSAGES, batch_sizes=sizes)
        claim_ms.append((time.perf_counter() - t0) * 1000)
        if not claims:
            break
        for batch in claim.batches_for(claims):
            report = runner.run_batch([(c.id, c.token) for c in batch])
            done += report.succeeded
    drain = time.perf_counter() - started
    if holder is not None:
        holder.close()
    with connection.cursor() as cur:
        after, after_idx = _stats(cur), _per_index(cur)
    late = claim_ms[-(len(claim_ms) // 3) - 1 : -1]  # the last third, not the final empty claim
    delta = {k: after[k] - before[k] for k in after if k != "dead"}
    return {
        "jobs": jobs,
        "done": done,
        "drain_s": round(drain, 2),
        "jobs_per_s": round(done / drain, 1) if drain else 0.0,
        "wal_bytes_per_job": round(delta["wal"] / jobs),
        "heap_blocks_per_job": round(delta["heap"] / jobs, 1),
        "index_blocks_per_job": round(delta["idx"] / jobs, 1),
        "updates_per_job": round(delta["upd"] / jobs, 2),
        "hot_share": round(delta["hot"] / delta["upd"], 3) if delta["upd"] else 0.0,
        "index_growth_bytes_per_job": round(delta["idx_bytes"] / jobs),
        "dead_at_end": after["dead"],
        "claims": len(claim_ms),
        "claim_s_total": round(sum(claim_ms) / 1000, 2),
        "claim_ms_p50_late": round(_quantile(late, 0.5), 2),
        "claim_ms_p99_late": round(_quantile(late, 0.99), 2),
        "samples": samples,
        "per_index": {
            name: {
                "blocks_per_job": round((blocks - before_idx.get(name, (0, 0))[0]) / jobs, 2),
                "growth_kib": (size - before_idx.get(name, (0, 0))[1]) // 1024,
            }
            for name, (blocks, size) in sorted(after_idx.items())
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--analyze-first", action="store_true", help="VACUUM ANALYZE the empty table before the spike")
    parser.add_argument("--vacuum-at", type=float, help="VACUUM the jobs table once this share of the jobs is done")
    parser.add_argument("--hold-snapshot", action="store_true", help="hold a snapshot from before the spike to its end")
    args = parser.parse_args()
    print(json.dumps(main(args.jobs, args.analyze_first, args.vacuum_at, args.hold_snapshot)))
