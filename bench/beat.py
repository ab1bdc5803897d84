"""Beat precision: an every-5-seconds fixed-time schedule, two beat replicas, two workers.

The schedule is declared with ``scheduling.schedules`` and synced; two ``celery beat`` processes
(one leads, one stands by) and two workers run it for the duration. Each tick enters the gate
(``scheduling.fixed``): a ``ScheduleRun`` row per (schedule, tick), duplicates refused and counted.
Figures: tick to run start (``ScheduleRun.started_at - tick``, database clock) p50/p99/max, ticks
with more than one execution (``demo.record`` writes one row per execution), refused duplicates
and ticks that never ran.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from bench import common, procs

SCENARIO = "beat"
SCHEDULE = "bench-every-5s"
EVERY_SECONDS = 5
TARGET_P99_MS = 500


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    from django.db import connection

    from scheduling import schedules
    from scheduling.core import store
    from scheduling.models import ScheduleRun

    seconds = 90 if quick else 600
    common.reset_state()
    schedules.sync(
        declarations=[
            schedules.make(
                name=SCHEDULE,
                kind="demo.record",
                every=EVERY_SECONDS,
                successful_history_limit=10_000,
                failed_history_limit=10_000,
            )
        ]
    )
    with procs.Group(SCENARIO) as group:
        workers = [group.worker(f"w{i + 1}", concurrency=2) for i in range(2)]
        group.wait_ready(*workers)
        for i in range(2):
            group.beat(f"beat{i + 1}")
        started = store.database_now()
        common.say(f"beat: every {EVERY_SECONDS}s for {seconds}s with 2 beats and 2 workers")
        time.sleep(seconds)
        ended = store.database_now()
        time.sleep(EVERY_SECONDS)
    # The first tick after start-up and the ones in flight at the end are left out.
    first = started + dt.timedelta(seconds=2 * EVERY_SECONDS)
    runs = list(
        ScheduleRun.objects.filter(schedule__periodic_task__name=SCHEDULE, tick__gte=first, tick__lte=ended).order_by(
            "tick"
        )
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT idempotency_key, count(*) FROM tasks_execution WHERE idempotency_key LIKE %s GROUP BY 1",
            [f"fixed:{SCHEDULE}@%"],
        )
        executions = dict(cur.fetchall())
    lag_ms = [(r.started_at - r.tick).total_seconds() * 1000 for r in runs]
    expected = int((ended - first).total_seconds() // EVERY_SECONDS)
    ticks = {r.tick for r in runs}
    duplicate_runs = sum(1 for n in executions.values() if n > 1) + (len(runs) - len(ticks))
    refused = sum(r.duplicates_refused for r in runs)
    states: dict[str, int] = {}
    for r in runs:
        states[r.state] = states.get(r.state, 0) + 1
    stats = common.summary_ms(lag_ms)
    print(
        common.table(
            f"Beat: every {EVERY_SECONDS} s for {seconds} s, 2 beats, 2 workers (tick to run start, database clock)",
            ["ticks", "runs", "p50 ms", "p99 ms", "max ms", "duplicate runs", "refused", "states"],
            [
                [
                    expected,
                    len(runs),
                    stats["p50_ms"],
                    stats["p99_ms"],
                    stats["max_ms"],
                    duplicate_runs,
                    refused,
                    ", ".join(f"{k} {v}" for k, v in sorted(states.items())),
                ]
            ],
        )
    )
    common.reset_state()
    figures = {
        "every_seconds": EVERY_SECONDS,
        "seconds": seconds,
        "ticks_expected": expected,
        "runs": len(runs),
        "missing_ticks": max(0, expected - len(ticks)),
        "p50_ms": stats["p50_ms"],
        "p99_ms": stats["p99_ms"],
        "max_ms": stats["max_ms"],
        "duplicate_runs": duplicate_runs,
        "duplicates_refused": refused,
        "states": states,
        "target_p99_ms": TARGET_P99_MS,
        "target_met": bool(lag_ms) and stats["p99_ms"] <= TARGET_P99_MS and duplicate_runs == 0,
    }
    chart(lag_ms)
    return figures


def chart(lag_ms: list[float]) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(range(len(lag_ms)), lag_ms, ".", ms=4)
    ax.axhline(TARGET_P99_MS, color="#c0392b", linestyle="--", label=f"target p99 {TARGET_P99_MS} ms")
    ax.set_xlabel(f"tick (every {EVERY_SECONDS} s)")
    ax.set_ylabel("run start - tick (ms)")
    ax.set_title("Fixed-time schedule: how late each tick's run starts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(common.chart_path(SCENARIO), dpi=110)
    plt.close(fig)
