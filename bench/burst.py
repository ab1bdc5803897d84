"""Burst: N jobs (one ORM insert each) due at one instant, drained by one worker with 2 processes.

Two stages, each in a cleared database: 30,000 jobs with a ``celery beat`` beside the worker (the
shape issue 32 tried as a new user would: one worker with 2 processes plus beat; target 10 s), then
100,000 jobs (target 25 s). ``--quick`` runs 10,000 and 20,000 and judges nothing.

``api.schedule_many("demo.record", ...)`` with a ``due_at`` a few seconds after the insert commits
(the database clock). One ``celery worker --concurrency 2`` (``bench.tk_worker``: the platform's app
with the control loop's "sweep ran" line logged) claims and runs them. A sampler thread reads, every
100 ms, the claimed-not-started rows (``state = 'claimed'``, through the claimed
set's index) and the queued messages (Redis LLEN of the job queue's key, with the broker's key
prefix). Reported: drain time from the due instant (last attempt's finish), start lag (attempt
``started_at - due_at``), the largest claimed-not-started and queued figures seen, the sweeps that
ran during the burst against the number expected on schedule, and duplicate effects (rows per job
key beyond the first).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from bench import common, procs

SCENARIO = "burst"
KIND = "demo.record"
SAMPLE_EVERY_S = 0.1
LEAD_S = 5.0  # the due instant is this long after the insert commits
DRAIN_TIMEOUT_S = 600
TARGET_DRAIN_S = 25.0  # issue 32: 100,000 due at one instant drained within 25 s (60 s before it)
SMALL_JOBS = 30_000
TARGET_SMALL_DRAIN_S = 10.0  # issue 32: 30,000 due at one instant, 1 worker x 2 + beat, within 10 s


def _one(sql: str, params: Any = None) -> tuple[Any, ...]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


class Sampler(threading.Thread):
    """Every ``SAMPLE_EVERY_S``: claimed-not-started rows and queued messages; keeps the largest of each.

    ``count_claims=False`` samples the queue only (one Redis LLEN): a scenario that reports only the
    queue's bound does not spend the database's time counting claims ten times a second.
    """

    def __init__(self, queue_key: str, *, count_claims: bool = True) -> None:
        super().__init__(name="burst-sampler", daemon=True)
        self.queue_key = queue_key
        self.count_claims = count_claims
        self.stopping = threading.Event()
        self.max_claimed_not_started = 0
        self.max_queued = 0
        self.samples = 0

    def run(self) -> None:
        from django.db import connection

        client = common.redis_client()
        try:
            while not self.stopping.is_set():
                unstarted = (
                    int(
                        _one(
                            "SELECT count(*) FROM scheduling_scheduledjob"
                            " WHERE state = 'claimed' AND claimed_at IS NOT NULL"
                        )[0]
                    )
                    if self.count_claims
                    else 0
                )
                queued = int(client.llen(self.queue_key))
                self.max_claimed_not_started = max(self.max_claimed_not_started, unstarted)
                self.max_queued = max(self.max_queued, queued)
                self.samples += 1
                self.stopping.wait(SAMPLE_EVERY_S)
        finally:
            connection.close()


def _sweeps(worker: procs.Proc) -> int:
    return worker.log().count("sweep ran")


def run(jobs: int, *, with_beat: bool = False) -> dict[str, Any]:
    from django.conf import settings as django_settings
    from django.db import transaction

    from scheduling import api
    from scheduling.core import conf

    settings = conf.get()
    queue_key = f"{getattr(django_settings, 'CELERY_BROKER_KEYPREFIX', '')}{django_settings.CELERY_TASK_DEFAULT_QUEUE}"
    common.reset_state()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", app="bench.tk_worker", concurrency=2)
        group.wait_ready(worker)
        if with_beat:
            beat = group.beat()
            beat.wait_for_text("beat: Starting", 60.0)
        time.sleep(1.0)
        insert_s = jobs / 8000  # schedule_many's pace here, about
        db_now = _one("SELECT now()")[0]
        due_at = db_now + dt.timedelta(seconds=insert_s + LEAD_S)
        with common.stopwatch() as enqueue, transaction.atomic():
            api.schedule_many(KIND, [{} for _ in range(jobs)], due_at=due_at)
        slack_s = float(_one("SELECT extract(epoch FROM %s - clock_timestamp())::float8", [due_at])[0])
        sampler = Sampler(queue_key)
        sampler.start()
        if slack_s > 0:
            time.sleep(slack_s)
        sweeps_before = _sweeps(worker)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not common.jobs_left():
                break
            if not worker.alive():
                raise RuntimeError("the worker exited during the burst")
            time.sleep(0.2)
        sampler.stopping.set()
        sampler.join()
        sweeps = _sweeps(worker) - sweeps_before
    drain_s, done = _one(
        "SELECT extract(epoch FROM max(finished_at) - %s)::float8, count(DISTINCT job_id) FROM scheduling_jobattempt"
        " WHERE outcome = 'succeeded'",
        [due_at],
    )
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM started_at - due_at)::float8 * 1000 FROM scheduling_jobattempt")
        lags = [row[0] for row in cur.fetchall()]
    duplicates, keys = _one(
        "SELECT coalesce(sum(n - 1), 0)::int, count(*)::int FROM"
        " (SELECT count(*) AS n FROM tasks_execution GROUP BY idempotency_key) AS per_key"
    )
    return {
        "jobs": jobs,
        "done": int(done),
        "missing_effects": jobs - int(keys),
        "duplicate_effects": int(duplicates),
        "enqueue_s": round(enqueue[0], 2),
        "slack_s_commit_to_due": round(slack_s, 2),
        "drain_s": round(drain_s, 2) if drain_s is not None else None,
        "jobs_per_s": round(done / drain_s, 1) if drain_s else 0.0,
        "lag": common.summary_ms(lags),
        "max_claimed_not_started": sampler.max_claimed_not_started,
        "max_queued_messages": sampler.max_queued,
        "queued_bound": settings.max_queued_batches,
        "samples": sampler.samples,
        "sweeps": sweeps,
        "sweep_interval_seconds": settings.sweep_interval_seconds,
        "sweeps_expected": round((drain_s or 0) / settings.sweep_interval_seconds, 1),
    }


def _rows(r: dict[str, Any], target_s: float | None) -> list[list[Any]]:
    drain = r["drain_s"] if r["drain_s"] is not None else float("nan")
    return [
        ["drain from the due instant (s)", drain, f"<= {target_s:g}" if target_s else "-"],
        ["jobs/s over the drain", r["jobs_per_s"], "-"],
        ["start lag p50 (ms)", r["lag"]["p50_ms"], "-"],
        ["start lag p99 (ms)", r["lag"]["p99_ms"], "-"],
        ["max claimed, not started", r["max_claimed_not_started"], "-"],
        ["max queued messages", r["max_queued_messages"], f"<= {r['queued_bound']}"],
        ["sweeps during the burst", r["sweeps"], f"~ {r['sweeps_expected']:g}"],
        ["duplicate effects", r["duplicate_effects"], "0"],
        ["missing effects", r["missing_effects"], "0"],
    ]


def _sweeps_on_schedule(r: dict[str, Any]) -> bool:
    return bool(r["sweeps"] >= int(r["sweeps_expected"]) - 1)


def _met(r: dict[str, Any], target_s: float) -> bool:
    return (
        r["drain_s"] is not None
        and r["drain_s"] <= target_s
        and r["duplicate_effects"] == 0
        and r["missing_effects"] == 0
        and r["max_queued_messages"] <= r["queued_bound"]
        and _sweeps_on_schedule(r)
    )


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    small_jobs, jobs = (10_000, 20_000) if quick else (SMALL_JOBS, 100_000)
    stages = [
        (small_jobs, True, TARGET_SMALL_DRAIN_S, "1 worker x 2 processes + beat"),
        (jobs, False, TARGET_DRAIN_S, "1 worker x 2 processes"),
    ]
    small: dict[str, Any] = {}
    r: dict[str, Any] = {}
    for count, with_beat, target_s, shape in stages:
        common.say(f"{SCENARIO}: {count:,} ORM-insert jobs due at one instant, {shape}")
        figures = run(count, with_beat=with_beat)
        common.reset_state()
        print(
            common.table(
                f"Burst: {count:,} jobs (one ORM insert each) due at one instant, {shape}, "
                f"load average {common.load_average()}",
                ["figure", "measured", "target"],
                _rows(figures, None if quick else target_s),
            )
        )
        if with_beat:
            small = figures
        else:
            r = figures
    return {
        **{k: v for k, v in r.items() if k != "lag"},
        "lag_p50_ms": r["lag"]["p50_ms"],
        "lag_p99_ms": r["lag"]["p99_ms"],
        "lag_max_ms": r["lag"]["max_ms"],
        "target_drain_s": TARGET_DRAIN_S,
        "sweeps_on_schedule": _sweeps_on_schedule(r),
        "small": {
            **{k: v for k, v in small.items() if k != "lag"},
            "with_beat": True,
            "lag_p50_ms": small["lag"]["p50_ms"],
            "lag_p99_ms": small["lag"]["p99_ms"],
        },
        "small_drain_s": small["drain_s"],
        "target_small_drain_s": TARGET_SMALL_DRAIN_S,
        "small_target_met": not quick and _met(small, TARGET_SMALL_DRAIN_S),
        "large_target_met": not quick and _met(r, TARGET_DRAIN_S),
        "target_met": not quick and _met(small, TARGET_SMALL_DRAIN_S) and _met(r, TARGET_DRAIN_S),
    }
