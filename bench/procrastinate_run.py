"""The Procrastinate throughput baseline, run with ``var/bench-venv/bin/python`` (never with ``.venv``).

Applies Procrastinate's schema to an empty database, defers N no-op jobs, starts W worker
processes (``--one-shot``: they exit when the queue is empty) and prints one JSON line with the
drain time taken from Procrastinate's own event table (first ``started`` to last ``succeeded``).
``--task=record`` defers jobs that insert one row each instead, and also counts duplicate effects.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from bench import procrastinate_app


async def prepare(jobs: int, task: str = "noop") -> float:
    async with procrastinate_app.app.open_async():
        await procrastinate_app.app.schema_manager.apply_schema_async()
        if task == "record":
            for statement in procrastinate_app.RECORD_TABLE:
                await procrastinate_app.app.connector.execute_query_async(statement)
        start = time.perf_counter()
        for offset in range(0, jobs, 1000):
            count = min(1000, jobs - offset)
            if task == "record":
                await procrastinate_app.record.batch_defer_async(*({"key": f"job:{offset + i}"} for i in range(count)))
            else:
                await procrastinate_app.noop.batch_defer_async(*({} for _ in range(count)))
        elapsed = time.perf_counter() - start
        # Fresh planner statistics, as autovacuum would have them on a live table: without them the
        # fetch statement's plan sorts the whole queue for every job (an order of magnitude slower).
        pool = procrastinate_app.app.connector._async_pool  # type: ignore[attr-defined]
        async with pool.connection() as conn:
            await conn.set_autocommit(True)
            await conn.execute("VACUUM ANALYZE procrastinate_jobs")
            await conn.set_autocommit(False)
        return elapsed


async def measure(task: str = "noop") -> dict[str, float]:
    async with procrastinate_app.app.open_async():
        pool = procrastinate_app.app.connector._async_pool  # type: ignore[attr-defined]
        async with pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(
                "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
                " - min(at) FILTER (WHERE type = 'started'))::float8,"
                " count(*) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
            )
            drain, done = await cur.fetchone()
            figures = {"drain_s": drain, "succeeded": done}
            if task == "record":  # rows per job key beyond the first: effects that happened twice
                await cur.execute(
                    "SELECT coalesce(sum(n - 1), 0)::int, count(*)::int FROM"
                    " (SELECT count(*) AS n FROM bench_execution GROUP BY idempotency_key) AS per_key"
                )
                figures["duplicate_effects"], figures["keys"] = await cur.fetchone()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--task", choices=["noop", "record"], default="noop")
    args = parser.parse_args()
    enqueue_s = asyncio.run(prepare(args.jobs, args.task))
    argv = [
        sys.executable,
        "-m",
        "procrastinate",
        "--app=bench.procrastinate_app.app",
        "--log-level=warning",
        "worker",
        f"--concurrency={args.concurrency}",
        "--one-shot",
    ]
    with open(args.log, "ab") as log:
        started = time.perf_counter()
        procs = [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT) for _ in range(args.workers)]
        for proc in procs:
            proc.wait(600)
        wall = time.perf_counter() - started
    figures = asyncio.run(measure(args.task))
    figures.update({"enqueue_s": enqueue_s, "wall_s_with_startup": wall, "jobs": args.jobs})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
