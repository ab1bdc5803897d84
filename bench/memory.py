"""Memory: a worker's peak RSS while it holds countdown messages, with and without the ETA limit.

A Celery worker on Redis takes a countdown message as soon as it can and keeps it in memory (a
timer entry plus the request) until its ETA, unacknowledged. 10,000 deferrals due in ten minutes
are 10,000 requests in one process, unless ``worker_eta_task_limit`` (``CELERY_WORKER_ETA_TASK_LIMIT``)
caps the prefetch count: then the worker holds that many and the rest wait in the Redis list.

Each case starts one deferral worker (``-Q timekeeper.deferred``, concurrency 1), sends N
``scheduling.run_deferred`` messages with a 600 s countdown straight to the broker, waits until the
worker has taken all it will take (the ``unacked`` hash stops growing), and reads the main
process's peak RSS (``VmHWM``). The messages never run: the keys live under their own prefix in
the bench Redis database and are deleted afterwards.

``python -m bench memory`` (or ``python -m bench.memory``) prints a table, then one JSON line, and
writes ``bench/results/memory.json``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

from bench import common, procs

PREFIX = "bench-memory:"  # every Redis key of this scenario (kombu's global_keyprefix)
QUEUE = "timekeeper.deferred"
COUNTDOWN_SECONDS = 600  # far enough that nothing comes due during a measurement
ETA_LIMIT = 1000  # the project's default CELERY_WORKER_ETA_TASK_LIMIT
SETTLE_SECONDS = 3.0  # the unacked count must stay put this long to call the fill finished
FILL_TIMEOUT_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    messages: int
    eta_limit: int | None


@dataclasses.dataclass(frozen=True)
class Measurement:
    case: Case
    held: int
    left_in_queue: int
    baseline_rss_mb: float
    peak_rss_mb: float
    fill_seconds: float


def _clean(client: Any) -> None:
    keys = list(client.scan_iter(match=f"{PREFIX}*", count=1000))
    if keys:
        client.delete(*keys)


def _status_kb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return float(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _sender() -> Any:
    """A bare Celery app that publishes JSON run_deferred messages under this scenario's key prefix."""
    from celery import Celery

    app = Celery("bench-memory", broker=common.broker_url(), set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options={"global_keyprefix": PREFIX},
        task_create_missing_queues=True,
    )
    return app


SIGNATURE_STANDIN = "s" * 43  # a deferral signature's length (countdowns.sign): held, never run, so never checked


def _send(app: Any, count: int) -> None:
    eta = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=COUNTDOWN_SECONDS)
    with app.producer_or_acquire() as producer:
        for i in range(count):
            deferral_id = str(uuid.uuid4())
            payload = {"reference": f"mem-{i:06d}", "fail_times": 0}  # a payments.retry-sized payload
            app.send_task(
                "scheduling.run_deferred",
                args=["payments.retry", payload, 1, deferral_id, SIGNATURE_STANDIN],
                task_id=deferral_id,
                eta=eta,
                queue=QUEUE,
                producer=producer,
            )


def measure(case: Case) -> Measurement:
    """Start a deferral worker with the case's ETA limit, fill it with countdown messages, read its peak RSS."""
    client = common.redis_client()
    _clean(client)
    env = {
        "CELERY_BROKER_KEYPREFIX": PREFIX,
        "CELERY_WORKER_ETA_TASK_LIMIT": str(case.eta_limit or 0),  # 0: no limit
        "LOG_LEVEL": "WARNING",
    }
    try:
        with procs.Group("memory") as group:
            worker = group.worker(case.name, concurrency=1, queues=QUEUE, env=env)
            worker.wait_for_text("ready.", timeout=120)
            time.sleep(1)
            baseline_kb = _status_kb(worker.pid, "VmRSS")
            common.say(f"  {case.name}: sending {case.messages:,} countdown messages")
            started = time.monotonic()
            _send(_sender(), case.messages)
            expected = case.messages if case.eta_limit is None else min(case.messages, case.eta_limit)
            held, last_change, last_held = 0, time.monotonic(), -1
            while True:
                held = int(client.hlen(f"{PREFIX}unacked"))
                now = time.monotonic()
                if held != last_held:
                    last_held, last_change = held, now
                if held >= expected and now - last_change >= SETTLE_SECONDS:
                    break
                if now - started > FILL_TIMEOUT_SECONDS:
                    raise RuntimeError(f"{case.name}: the worker took {held} of {expected} within the timeout")
                if not worker.alive():
                    raise RuntimeError(f"{case.name}: the worker exited:\n{worker.log()[-3000:]}")
                time.sleep(0.2)
            fill_seconds = last_change - started
            peak_kb = _status_kb(worker.pid, "VmHWM")
            left = int(client.llen(f"{PREFIX}{QUEUE}"))
    finally:
        _clean(client)
    return Measurement(case, held, left, round(baseline_kb / 1024, 1), round(peak_kb / 1024, 1), round(fill_seconds, 1))


def main(quick: bool = False) -> dict[str, Any]:
    """Measure the three cases, print the table, emit the JSON (``quick`` changes nothing: about two minutes)."""
    cases = [
        Case("limited_10k", 10_000, ETA_LIMIT),
        Case("unlimited_10k", 10_000, None),
        Case("limited_1k", 1_000, ETA_LIMIT),
    ]
    results = {m.case.name: m for m in (measure(case) for case in cases)}
    rows = [
        [
            m.case.name,
            m.case.messages,
            "none" if m.case.eta_limit is None else m.case.eta_limit,
            m.held,
            m.left_in_queue,
            m.baseline_rss_mb,
            m.peak_rss_mb,
            round(m.peak_rss_mb - m.baseline_rss_mb, 1),
            m.fill_seconds,
        ]
        for m in results.values()
    ]
    print(
        common.table(
            "One deferral worker holding countdown messages (600 s ETA), main process RSS",
            ["case", "sent", "ETA limit", "held", "left in Redis", "RSS idle MB", "peak RSS MB", "growth MB", "fill s"],
            rows,
        )
    )
    limited, unlimited, small = results["limited_10k"], results["unlimited_10k"], results["limited_1k"]
    figures = {
        "eta_task_limit": ETA_LIMIT,
        "peak_rss_mb_limited_10k": limited.peak_rss_mb,
        "peak_rss_mb_unlimited_10k": unlimited.peak_rss_mb,
        "peak_rss_mb_limited_1k": small.peak_rss_mb,
        "idle_rss_mb": limited.baseline_rss_mb,
        "held_limited_10k": limited.held,
        "held_unlimited_10k": unlimited.held,
        "held_limited_1k": small.held,
        "ratio_10k_vs_1k_limited": common.ratio(limited.peak_rss_mb, small.peak_rss_mb),
        "ratio_unlimited_vs_limited_10k": common.ratio(unlimited.peak_rss_mb, limited.peak_rss_mb),
        "growth_kb_per_held_message_unlimited": round(
            (unlimited.peak_rss_mb - unlimited.baseline_rss_mb) * 1024 / max(1, unlimited.held), 2
        ),
    }
    return common.emit("memory", figures, quick=quick)


if __name__ == "__main__":
    main()
