"""One scheduler measured in a fresh process: ``python -m bench.recurring_probe beat|timekeeper``.

``beat``: django-celery-beat's ``DatabaseScheduler`` (one periodic task per entity, as teams do
today) loads its entries and ticks ``TICKS`` times; ``timekeeper``: the recurrence planner's pass
and one claim, the work Timekeeper's leader does per turn, ``TICKS`` times. Prints one JSON line:
resident memory (VmRSS, and its growth over the process's start) and each tick's time.
"""

from __future__ import annotations

import json
import sys
import time

from bench import common

TICKS = 5


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main(which: str) -> dict[str, object]:
    common.setup()
    before = rss_kib()
    ticks_ms: list[float] = []
    if which == "beat":
        from django_celery_beat.schedulers import DatabaseScheduler

        from project.celery import app

        scheduler = DatabaseScheduler(app=app, lazy=True)
        start = time.perf_counter()
        entries = len(scheduler.schedule)  # loads every enabled periodic task
        load_ms = (time.perf_counter() - start) * 1000
        for _ in range(TICKS):
            start = time.perf_counter()
            scheduler.tick()
            ticks_ms.append((time.perf_counter() - start) * 1000)
    else:
        from scheduling.due_at import store
        from scheduling.models import Recurrence
        from scheduling.recurring import planner

        entries = Recurrence.objects.count()
        load_ms = 0.0
        for _ in range(TICKS):
            start = time.perf_counter()
            planner.plan_once()
            store.claim_due_jobs(500)
            ticks_ms.append((time.perf_counter() - start) * 1000)
    return {
        "scheduler": which,
        "entries": entries,
        "load_ms": round(load_ms, 1),
        "tick_ms": round(common.median(ticks_ms), 2),
        "ticks_ms": [round(t, 2) for t in ticks_ms],
        "rss_mib": round(rss_kib() / 1024, 1),
        "rss_growth_mib": round((rss_kib() - before) / 1024, 1),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
