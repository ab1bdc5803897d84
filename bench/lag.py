"""Lag: how late a handler starts after its due time, under a steady load and on an idle system.

- timekeeper: ``api.schedule`` one job at a time at a steady rate, each due 0.5 to 5 s ahead;
  lag = ``JobAttempt.started_at - JobAttempt.due_at`` (both from the database clock). One worker,
  no beat: its main process runs the control loop that claims. 200 jobs/s (the target's load),
  then 1,000 jobs/s reported beside it (the generator may fall short of 1,000/s: "sent" says).
- celery: bare Celery ``countdown`` tasks at the same rate and spread; lag = handler start minus
  the ETA the task was sent with (both from this machine's clock).
Then the same one job at a time on an otherwise idle system (each waits for the previous to run).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import common, procs

SCENARIO = "lag"
RATE_PER_S = 200  # the target's load
HIGH_RATE_PER_S = 1000  # reported beside it (no target)
DELAY_RANGE_S = (0.5, 5.0)
TARGET_P99_MS = 50
WORKER_CONCURRENCY = 2


GENERATOR_THREADS = 4  # one api.schedule() is a round trip and a commit: one thread cannot send 200/s here


def paced(rate: float, seconds: float, send: Callable[[], None], threads: int = GENERATOR_THREADS) -> int:
    """Call ``send`` ``rate`` times a second for ``seconds`` from ``threads`` threads; returns how many were sent.

    Each thread keeps its own schedule (rate / threads, offset so the sends interleave) and its
    own database connection; a thread that falls behind catches up without sleeping.
    """
    from django.db import connection

    counts = [0] * threads
    start = time.perf_counter() + 0.05

    def run(index: int) -> None:
        interval = threads / rate
        first = start + index / rate
        try:
            while True:
                due = first + counts[index] * interval
                if due - start >= seconds:
                    return
                now = time.perf_counter()
                if now < due:
                    time.sleep(due - now)
                send()
                counts[index] += 1
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def _attempt_lags_ms() -> list[float]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT extract(epoch FROM started_at - due_at)::float8 * 1000 FROM scheduling_jobattempt"
            " WHERE number = 1 ORDER BY id"
        )
        return [row[0] for row in cur.fetchall()]


def _wait_drained(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and common.jobs_left():
        time.sleep(0.2)


def run_timekeeper(seconds: float, idle_jobs: int, rng: random.Random) -> dict[str, Any]:
    from scheduling import api

    common.reset_state()
    with procs.Group(SCENARIO) as group:
        # No beat: the worker's main process runs the control loop that claims (scheduling.due_at.control).
        worker = group.worker("tk-w1", concurrency=WORKER_CONCURRENCY)
        group.wait_ready(worker)
        time.sleep(2.0)
        loaded_by_rate = {}
        for rate in (RATE_PER_S, HIGH_RATE_PER_S):
            sent = paced(rate, seconds, lambda: api.schedule("demo.noop", {}, delay=rng.uniform(*DELAY_RANGE_S)))
            _wait_drained(DELAY_RANGE_S[1] + 60)
            loaded_by_rate[rate] = {"sent": sent, "lags": _attempt_lags_ms()}
            common.reset_state()
            time.sleep(1.0)
        time.sleep(1.0)
        for _ in range(idle_jobs):
            api.schedule("demo.noop", {}, delay=rng.uniform(*DELAY_RANGE_S))
            _wait_drained(30)
        idle = _attempt_lags_ms()
    return {"by_rate": loaded_by_rate, "idle": idle}


def run_celery(seconds: float, idle_jobs: int, rng: random.Random) -> dict[str, Any]:
    from bench import celery_bare

    common.reset_state()
    client = common.redis_client(common.BARE_BROKER_DB)
    with procs.Group(SCENARIO) as group, celery_bare.connection() as conn:
        worker = group.worker(
            "bare-w1",
            app="bench.celery_bare",
            concurrency=WORKER_CONCURRENCY,
            queues="bare",
            env=celery_bare.worker_env(),
            level="warning",
        )
        celery_bare.wait_ready(conn, client, worker.alive)

        def send() -> None:
            countdown = rng.uniform(*DELAY_RANGE_S)
            celery_bare.lag.apply_async(args=[time.time() + countdown], countdown=countdown, connection=conn)

        loaded_by_rate = {}
        for rate in (RATE_PER_S, HIGH_RATE_PER_S):
            sent = paced(rate, seconds, send)
            deadline = time.monotonic() + DELAY_RANGE_S[1] + 60
            while client.llen(celery_bare.LAG_KEY) < sent and time.monotonic() < deadline:
                time.sleep(0.2)
            lags = [float(x) for x in client.lrange(celery_bare.LAG_KEY, 0, -1)]
            loaded_by_rate[rate] = {"sent": sent, "lags": lags}
            client.delete(celery_bare.LAG_KEY)
        for i in range(idle_jobs):
            send()
            deadline = time.monotonic() + 30
            while client.llen(celery_bare.LAG_KEY) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        idle = [float(x) for x in client.lrange(celery_bare.LAG_KEY, 0, -1)]
    return {"by_rate": loaded_by_rate, "idle": idle}


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    seconds = 20.0 if quick else 60.0
    idle_jobs = 8 if quick else 20
    rng = random.Random(8)
    rates = f"{RATE_PER_S}/s then {HIGH_RATE_PER_S}/s"
    common.say(f"lag: timekeeper, {rates} for {seconds:.0f}s each, then {idle_jobs} one at a time")
    tk = run_timekeeper(seconds, idle_jobs, rng)
    common.say(f"lag: bare celery countdowns, {rates} for {seconds:.0f}s each, then {idle_jobs} one at a time")
    cel = run_celery(seconds, idle_jobs, rng)
    common.reset_state()

    tk["loaded"], cel["loaded"] = tk["by_rate"][RATE_PER_S]["lags"], cel["by_rate"][RATE_PER_S]["lags"]
    tk["sent"] = tk["by_rate"][RATE_PER_S]["sent"]
    high_tk, high_cel = tk["by_rate"][HIGH_RATE_PER_S], cel["by_rate"][HIGH_RATE_PER_S]
    stats = {
        "timekeeper_loaded": common.summary_ms(tk["loaded"]),
        "celery_loaded": common.summary_ms(cel["loaded"]),
        "timekeeper_loaded_high": common.summary_ms(high_tk["lags"]),
        "celery_loaded_high": common.summary_ms(high_cel["lags"]),
        "timekeeper_idle": common.summary_ms(tk["idle"]),
        "celery_idle": common.summary_ms(cel["idle"]),
    }
    phases = {
        "timekeeper_loaded": (f"timekeeper {RATE_PER_S}/s", tk["sent"], f"p99 <= {TARGET_P99_MS} ms"),
        "celery_loaded": (f"celery {RATE_PER_S}/s", cel["by_rate"][RATE_PER_S]["sent"], "-"),
        "timekeeper_loaded_high": (f"timekeeper {HIGH_RATE_PER_S}/s", high_tk["sent"], "-"),
        "celery_loaded_high": (f"celery {HIGH_RATE_PER_S}/s", high_cel["sent"], "-"),
        "timekeeper_idle": ("timekeeper idle", idle_jobs, "-"),
        "celery_idle": ("celery idle", idle_jobs, "-"),
    }
    rows = [
        [phases[name][0], phases[name][1], s["n"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["max_ms"], phases[name][2]]
        for name, s in stats.items()
    ]
    print(
        common.table(
            f"Lag: handler start minus due time (ms); load = {rates} due "
            f"{DELAY_RANGE_S[0]}-{DELAY_RANGE_S[1]} s ahead for {seconds:.0f} s each; "
            f"load average {common.load_average()}",
            ["system / phase", "sent", "ran", "p50 ms", "p95 ms", "p99 ms", "max ms", "target"],
            rows,
        )
    )
    p99 = stats["timekeeper_loaded"]["p99_ms"]
    figures = {
        "rate_per_s": RATE_PER_S,
        "seconds": seconds,
        "sent": tk["sent"],
        "ran": len(tk["loaded"]),
        "p50_ms": stats["timekeeper_loaded"]["p50_ms"],
        "p95_ms": stats["timekeeper_loaded"]["p95_ms"],
        "p99_ms": p99,
        "max_ms": stats["timekeeper_loaded"]["max_ms"],
        "idle_p50_ms": stats["timekeeper_idle"]["p50_ms"],
        "idle_p99_ms": stats["timekeeper_idle"]["p99_ms"],
        "idle_max_ms": stats["timekeeper_idle"]["max_ms"],
        "celery_p50_ms": stats["celery_loaded"]["p50_ms"],
        "celery_p99_ms": stats["celery_loaded"]["p99_ms"],
        "celery_idle_p99_ms": stats["celery_idle"]["p99_ms"],
        "high_rate_per_s": HIGH_RATE_PER_S,
        "high_sent": high_tk["sent"],
        "high_ran": len(high_tk["lags"]),
        "high_p50_ms": stats["timekeeper_loaded_high"]["p50_ms"],
        "high_p99_ms": stats["timekeeper_loaded_high"]["p99_ms"],
        "high_max_ms": stats["timekeeper_loaded_high"]["max_ms"],
        "celery_high_p99_ms": stats["celery_loaded_high"]["p99_ms"],
        "ratio_p99_vs_celery": common.ratio(p99, stats["celery_loaded"]["p99_ms"]),
        "target_p99_ms": TARGET_P99_MS,
        "target_met": p99 <= TARGET_P99_MS,
        "detail": stats,
    }
    chart(tk["loaded"], cel["loaded"])
    return figures


def chart(tk: list[float], cel: list[float]) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for values, label, color in (
        (tk, "timekeeper (table + claim loop)", "#2b7bba"),
        (cel, "bare Celery countdown", "#9aa5b1"),
    ):
        if not values:
            continue
        ordered = sorted(values)
        ys = [100 * (i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, label=label, color=color)
    ax.axvline(TARGET_P99_MS, color="#c0392b", linestyle="--", label=f"target p99 {TARGET_P99_MS} ms")
    ax.axhline(99, color="#555", linewidth=0.5)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel("handler start minus due time (ms)")
    ax.set_ylabel("% of jobs")
    ax.set_title(f"Lag at {RATE_PER_S} jobs/s due 0.5-5 s ahead (cumulative)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(common.chart_path(SCENARIO), dpi=110)
    plt.close(fig)
