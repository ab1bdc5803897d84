"""Failures: the realistic handler with 2% raising, 1% past a 1 s timeout and 1% whose on_commit raises.

Two runs in one invocation, each N jobs of ``bench.failures`` (``bench/kinds/failures.py``: one ORM
insert, every call and every callback counted in Redis) drained by one ``celery worker
--concurrency 2``: a clean run (no fates), then the mixed run (the first attempt of a ``raise`` job
fails, of a ``timeout`` job works past its timeout; both succeed on the retry; a ``callback`` job's
on_commit raises every time). Reported:

- handler calls per attempt (target exactly 1.00): every call is counted whatever was rolled back;
- duplicate direct effects outside crashes (target 0): calls beyond the first within one attempt;
  duplicate database effects: committed rows per job beyond the first;
- on_commit callbacks run (target: every done job but the ``callback`` ones) and the failures kept on
  their attempts;
- throughput as a ratio of the clean run. Each timeout costs its process the full second whatever
  the runner does (timeouts x 1 s / 2 processes of drain no design avoids), so the ratio is given
  raw and net of that floor; the target (>= 0.9, issue 32) is checked on the net ratio.
"""

from __future__ import annotations

import time
from typing import Any

from bench import common, procs, realistic

SCENARIO = "failures"
WORKER_CONCURRENCY = 2
DRAIN_TIMEOUT_S = 600
TARGET_CALLS_PER_ATTEMPT = 1.0
TARGET_RATIO_VS_CLEAN = 0.9  # issue 32: net-of-timeouts ratio >= 0.9 (0.8 before it)
FATES = {0: "raise", 1: "raise", 2: "timeout", 3: "callback"}  # by job index % 100: 2%, 1%, 1%


def _fate(i: int) -> str:
    return FATES.get(i % 100, "")


def _run(jobs: int, mixed: bool) -> dict[str, Any]:
    from django.db import transaction

    from bench.kinds import failures as kinds
    from scheduling import api

    common.reset_state()
    payloads = [{"fate": _fate(i) if mixed else ""} for i in range(jobs)]
    env = {"DJANGO_SETTINGS_MODULE": "bench.failures_settings", "BENCH_COUNTER_URL": common.broker_url()}
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=WORKER_CONCURRENCY, env=env)
        group.wait_ready(worker)
        time.sleep(1.0)
        with transaction.atomic():
            api.schedule_many(kinds.KIND, payloads, delay=0)
        realistic._wait(
            "SELECT count(*) FROM scheduling_scheduledjob WHERE state NOT IN ('pending', 'claimed', 'running')",
            jobs,
            DRAIN_TIMEOUT_S,
            worker.alive,
        )
        time.sleep(0.5)  # the last chunk's callbacks run just after its commit
    drain, attempts, failed, timed_out, callback_failures = realistic._one(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8, count(*),"
        " count(*) FILTER (WHERE outcome = 'failed'), count(*) FILTER (WHERE outcome = 'timed_out'),"
        " count(*) FILTER (WHERE error LIKE 'on_commit failed:%%')"
        " FROM scheduling_jobattempt"
    )
    done = int(realistic._one("SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'done'")[0])
    calls = [int(v) for v in common.redis_client().hvals(kinds.CALLS)]
    callbacks = [int(v) for v in common.redis_client().hvals(kinds.CALLBACKS)]
    duplicates, keys = realistic.effects()
    expected_callbacks = sum(1 for p in payloads if p["fate"] != "callback")
    return {
        "jobs": jobs,
        "done": done,
        "attempts": attempts,
        "failed_attempts": failed,
        "timed_out_attempts": timed_out,
        "handler_calls": sum(calls),
        "attempts_called": len(calls),
        "calls_per_attempt": round(sum(calls) / attempts, 4) if attempts else 0.0,
        "max_calls_in_one_attempt": max(calls, default=0),
        "duplicate_direct_effects": sum(n - 1 for n in calls),
        "duplicate_db_effects": duplicates,
        "missing_db_effects": jobs - keys,
        "callbacks_run": len(callbacks),
        "callbacks_expected": expected_callbacks,
        "duplicate_callbacks": sum(n - 1 for n in callbacks),
        "callback_failures_recorded": callback_failures,
        "drain_s": drain,
        "jobs_per_s": done / drain if drain else 0.0,
    }


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    from bench.kinds import failures as kinds  # registers the kind in this process too

    jobs = 5_000 if quick else 20_000
    common.say(
        f"{SCENARIO}: {jobs:,} jobs, 2% raising, 1% past the {kinds.TIMEOUT_SECONDS:g} s timeout, 1% on_commit raising"
    )
    clean = _run(jobs, mixed=False)
    common.say(f"  clean {clean['jobs_per_s']:,.0f} jobs/s")
    mixed = _run(jobs, mixed=True)
    common.say(f"  mixed {mixed['jobs_per_s']:,.0f} jobs/s")
    common.reset_state()

    timeouts = sum(1 for i in range(jobs) if _fate(i) == "timeout")
    floor_s = timeouts * kinds.TIMEOUT_SECONDS / WORKER_CONCURRENCY
    net_drain = max(mixed["drain_s"] - floor_s, 1e-9)
    ratio_raw = common.ratio(mixed["jobs_per_s"], clean["jobs_per_s"])
    ratio_net = common.ratio(mixed["done"] / net_drain, clean["jobs_per_s"])
    rows = [
        [
            name,
            r["done"],
            r["attempts"],
            r["calls_per_attempt"],
            r["duplicate_direct_effects"],
            r["duplicate_db_effects"],
            f"{r['callbacks_run']:,}/{r['callbacks_expected']:,}",
            r["drain_s"],
            r["jobs_per_s"],
        ]
        for name, r in (("clean", clean), ("mixed", mixed))
    ]
    print(
        common.table(
            f"Failures: {jobs:,} jobs, {WORKER_CONCURRENCY} worker processes, load average {common.load_average()}",
            ["run", "done", "attempts", "calls/attempt", "dup direct", "dup db", "callbacks", "drain s", "jobs/s"],
            rows,
        )
    )
    met = (
        mixed["calls_per_attempt"] == TARGET_CALLS_PER_ATTEMPT
        and mixed["max_calls_in_one_attempt"] == 1
        and mixed["duplicate_direct_effects"] == 0
        and mixed["duplicate_db_effects"] == 0
        and mixed["missing_db_effects"] == 0
        and mixed["callbacks_run"] == mixed["callbacks_expected"]
        and mixed["duplicate_callbacks"] == 0
        and ratio_net >= TARGET_RATIO_VS_CLEAN
    )
    return {
        "jobs": jobs,
        "kind": kinds.KIND,
        "worker_processes": WORKER_CONCURRENCY,
        "calls_per_attempt": mixed["calls_per_attempt"],
        "duplicate_direct_effects": mixed["duplicate_direct_effects"],
        "duplicate_db_effects": mixed["duplicate_db_effects"],
        "callbacks_run": mixed["callbacks_run"],
        "callbacks_expected": mixed["callbacks_expected"],
        "callback_failures_recorded": mixed["callback_failures_recorded"],
        "clean_jobs_per_s": round(clean["jobs_per_s"], 1),
        "mixed_jobs_per_s": round(mixed["jobs_per_s"], 1),
        "timeouts": timeouts,
        "timeout_floor_s": floor_s,
        "ratio_vs_clean": ratio_raw,
        "ratio_vs_clean_net_of_timeouts": ratio_net,
        "target_calls_per_attempt": TARGET_CALLS_PER_ATTEMPT,
        "target_ratio_vs_clean": TARGET_RATIO_VS_CLEAN,
        "target_met": met,
        "detail": {"clean": clean, "mixed": mixed},
    }
