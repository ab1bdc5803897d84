"""Flow control: a rate-limited kind beside an unlimited one, decided at the claim (issue 36).

Scenarios (``SCENARIOS``; each adds its figures to the one JSON line):

- ``abort`` (``bench/flow_abort.py``, also ``python -m bench flow_abort``): 100 running jobs
  aborted; abort() to the handler's interruption p99 <= the heartbeat interval + 1 s, 0 committed
  writes of aborted atomic jobs (``abort_p99_s``, ``heartbeat_s``, ``aborted_committed_writes``).
- ``rate``: ``demo.record`` limited to 50 starts/s (``api.set_rate``) with 5,000 due at once,
  beside ``demo.noop`` scheduled at 200 jobs/s (due 0.5-5 s ahead), for 60 s. Starts are the
  handlers' starts (``JobAttempt.started_at``, the database clock). The limited kind's rate over
  the window must be within 2% of 50/s and no 1 s window (sliding, over every start) may hold more
  than 50; ``demo.noop``'s lag (start minus due) p99 <= 50 ms.
  The same two figures are also measured on the claim's own instants (its rate windows, read
  every 0.25 s: ``claimed_rate_error_pct``, ``max_claimed_in_1s``), which is where the claim's
  limit is decided. A handler starts after its batch crosses the queue; its worker takes a start
  permit first (``scheduling/due_at/starts.py``), so a worker that falls behind waits for room
  instead of bunching starts that were claimed apart.
- ``partitioned``: the same kind limited to 5/s per ``label`` (20 labels, the backlog spread over
  them), the same two checks per partition, the same other kind beside it.

One worker process of concurrency 2 (its main process runs the control loop). ``--quick``: 15 s
per scenario and smaller backlogs.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import common, lag, procs

SCENARIO = "flow"
LIMITED_KIND, OTHER_KIND = "demo.record", "demo.noop"
LIMIT_PER_S = 50
BACKLOG = 5000
OTHER_RATE_PER_S = 200
PARTITIONS, PARTITION_LIMIT_PER_S = 20, 5
TARGET_RATE_ERROR_PCT = 2.0
TARGET_LAG_P99_MS = 50.0
WARMUP_S = 2.0  # the window measured starts this long after the first limited start (the claim loop settles)
WINDOW_S = 10.0  # the detail's time series: the other kind's lag p99 and the limited kind's starts per this long


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most of ``times`` (seconds, sorted) inside any half-open span ``[t, t + window)``."""
    best = 0
    for i, start in enumerate(times):
        best = max(best, bisect.bisect_left(times, start + window, lo=i) - i)
    return best


def _starts(kind: str, before: Any) -> list[tuple[float, str]]:
    """The kind's handler starts (epoch seconds, label) before ``before``, when its rate was lifted.

    The run ends by lifting the rate, so that the rest of the backlog goes and the worker stops
    cleanly; the starts after that are not limited and not counted (``starts_after_lift``).
    """
    rows = common.sql(
        "SELECT extract(epoch FROM a.started_at)::float8, coalesce(j.payload ->> 'label', '')"
        " FROM scheduling_jobattempt AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id"
        " WHERE j.kind = %s AND a.number = 1 AND a.started_at < %s ORDER BY a.started_at",
        [kind, before],
    )
    return [(float(at), str(label)) for at, label in rows]


def _starts_after(kind: str, lifted: Any) -> int:
    rows = common.sql(
        "SELECT count(*) FROM scheduling_jobattempt AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id"
        " WHERE j.kind = %s AND a.started_at >= %s",
        [kind, lifted],
    )
    return int(rows[0][0])


def _other_lags_ms() -> list[tuple[float, float]]:
    """The other kind's (due time in epoch seconds, start lag in ms), one per job."""
    rows = common.sql(
        "SELECT extract(epoch FROM a.due_at)::float8, extract(epoch FROM a.started_at - a.due_at)::float8 * 1000"
        " FROM scheduling_jobattempt AS a"
        " JOIN scheduling_scheduledjob AS j ON j.id = a.job_id WHERE j.kind = %s AND a.number = 1",
        [OTHER_KIND],
    )
    return [(float(due), float(lag_ms)) for due, lag_ms in rows]


def _windows(points: Sequence[tuple[float, float]], seconds: float) -> list[list[float]]:
    """The values of ``(time, value)`` points in each ``seconds`` from the earliest time, empty spans included."""
    if not points:
        return []
    first = min(t for t, _ in points)
    spans: dict[int, list[float]] = {}
    for t, value in points:
        spans.setdefault(int((t - first) // seconds), []).append(value)
    return [spans.get(w, []) for w in range(max(spans) + 1)]


def by_window(lags: Sequence[tuple[float, float]], seconds: float = WINDOW_S) -> list[float]:
    """The lag p99 (ms) in each ``seconds`` of due times: whether a run's lag is steady or comes in spells."""
    return [common.summary_ms(span)["p99_ms"] for span in _windows(lags, seconds) if span]


def _counts_by_window(times: Sequence[float], seconds: float = WINDOW_S) -> list[int]:
    """How many of ``times`` (seconds) fall in each ``seconds`` from the first."""
    return [len(span) for span in _windows([(t, t) for t in times], seconds)]


def _rate_figures(times: list[float], limit: float, seconds: float) -> dict[str, Any]:
    """Rate over [first + warm-up, + seconds) and the most starts in any 1 s window (all starts)."""
    if not times:
        return {"starts": 0, "rate_per_s": 0.0, "rate_error_pct": 100.0, "max_starts_in_1s": 0}
    begin = times[0] + WARMUP_S
    inside = [t for t in times if begin <= t < begin + seconds]
    rate = len(inside) / seconds
    return {
        "starts": len(inside),
        "rate_per_s": round(rate, 3),
        "rate_error_pct": round(abs(rate - limit) / limit * 100, 3),
        "max_starts_in_1s": max_in_window(times),
    }


class ClaimLog:
    """The limited kind's claims as the claim recorded them (its rate windows, read every 0.25 s).

    A window keeps every claim of the last period, so reading it more often than the period
    misses none: the union is every claim's instant and count, per partition.
    """

    def __init__(self) -> None:
        self.seen: set[tuple[str, float, int]] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(0.25):
                for partition, at, n in common.sql(
                    "SELECT w.partition, extract(epoch FROM u.at)::float8, u.n FROM scheduling_kindrate AS w"
                    " CROSS JOIN LATERAL unnest(w.starts_at, w.starts) AS u(at, n) WHERE w.kind = %s",
                    [LIMITED_KIND],
                ):
                    self.seen.add((str(partition), float(at), int(n)))
        finally:
            connection.close()

    def times(self, partition: str | None = None) -> list[float]:
        """Each claimed job's claim instant (a claim of n jobs counts n times), sorted."""
        return sorted(at for p, at, n in self.seen if partition is None or p == partition for _ in range(n))


def _run(
    seconds: float, set_rate: Callable[[], object], payloads: list[dict[str, Any]], rng: random.Random
) -> tuple[list[tuple[float, str]], list[tuple[float, float]], int, ClaimLog, int]:
    """One scenario: the limited backlog due now, the other kind paced beside it.

    Returns the limited kind's starts while it was limited, the other kind's lags, how many of the
    other kind were sent, the claims' log, and how many limited starts came after the rate was lifted.
    """
    from scheduling import api

    common.reset_state()
    common.sql("DELETE FROM scheduling_kindrate")
    common.sql("DELETE FROM scheduling_kindcontrol")
    set_rate()
    with procs.Group(SCENARIO) as group:
        worker = group.worker("tk-w1", concurrency=2)
        group.wait_ready(worker)
        time.sleep(2.0)
        log = ClaimLog()
        log.thread.start()
        for chunk in range(0, len(payloads), 1000):
            api.schedule_many(LIMITED_KIND, payloads[chunk : chunk + 1000], delay=0)
        sent = lag.paced(
            OTHER_RATE_PER_S,
            seconds + WARMUP_S + 1,
            lambda: api.schedule(OTHER_KIND, {}, delay=rng.uniform(*lag.DELAY_RANGE_S)),
        )
        time.sleep(lag.DELAY_RANGE_S[1] + 1)  # the last paced jobs come due and run
        log.stop.set()
        log.thread.join(5)
        ((lifted,),) = common.sql("SELECT clock_timestamp()")  # the database clock, as the starts'
        api.set_rate(LIMITED_KIND, None)  # let the rest of the backlog go, so the group stops cleanly
    starts, lags = _starts(LIMITED_KIND, lifted), _other_lags_ms()
    after_lift = _starts_after(LIMITED_KIND, lifted)
    common.reset_state()
    return starts, lags, sent, log, after_lift


def scenario_rate(seconds: float, backlog: int, rng: random.Random) -> dict[str, Any]:
    from scheduling import api

    common.say(f"flow rate: {LIMITED_KIND} at {LIMIT_PER_S}/s with {backlog} due, {OTHER_KIND} at {OTHER_RATE_PER_S}/s")
    starts, lags, sent, log, after_lift = _run(
        seconds,
        lambda: api.set_rate(LIMITED_KIND, f"{LIMIT_PER_S}/s"),
        [{"label": "one"}] * backlog,
        rng,
    )
    times = [t for t, _ in starts]
    figures = _rate_figures(times, LIMIT_PER_S, seconds)
    claimed = _rate_figures(log.times(), LIMIT_PER_S, seconds)
    other = common.summary_ms([lag_ms for _, lag_ms in lags])
    return {
        **figures,
        "claimed_rate_error_pct": claimed["rate_error_pct"],
        "max_claimed_in_1s": claimed["max_starts_in_1s"],
        "other_sent": sent,
        "starts_after_lift": after_lift,
        "other_kind_lag": other,
        "other_kind_lag_p99_ms": other["p99_ms"],
        "other_kind_lag_p99_ms_by_10s": by_window(lags),
        "starts_by_10s": _counts_by_window(times),
    }


def scenario_partitioned(seconds: float, per_partition: int, rng: random.Random) -> dict[str, Any]:
    from scheduling import api, registry

    common.say(f"flow partitioned: {PARTITIONS} labels at {PARTITION_LIMIT_PER_S}/s each, {per_partition} due each")
    labels = [f"p{i:02d}" for i in range(PARTITIONS)]
    payloads = [{"label": labels[i % PARTITIONS]} for i in range(PARTITIONS * per_partition)]
    starts, lags, sent, log, after_lift = _run(
        seconds,
        lambda: api.set_rate(LIMITED_KIND, registry.Rate(PARTITION_LIMIT_PER_S, 1.0, partition_by="label")),
        payloads,
        rng,
    )
    per = {
        label: _rate_figures([t for t, got in starts if got == label], PARTITION_LIMIT_PER_S, seconds)
        for label in labels
    }
    claimed = {label: _rate_figures(log.times(label), PARTITION_LIMIT_PER_S, seconds) for label in labels}
    other = common.summary_ms([lag_ms for _, lag_ms in lags])
    return {
        "partition_claimed_rate_error_pct_max": max(p["rate_error_pct"] for p in claimed.values()),
        "partition_max_claimed_in_1s": max(p["max_starts_in_1s"] for p in claimed.values()),
        "partition_rate_error_pct_max": max(p["rate_error_pct"] for p in per.values()),
        "partition_max_starts_in_1s": max(p["max_starts_in_1s"] for p in per.values()),
        "partition_limit_per_s": PARTITION_LIMIT_PER_S,
        "partitions": PARTITIONS,
        "other_sent": sent,
        "starts_after_lift": after_lift,
        "other_kind_lag": other,
        "other_kind_lag_p99_ms": other["p99_ms"],
        "other_kind_lag_p99_ms_by_10s": by_window(lags),
        "starts_by_10s": _counts_by_window(sorted(t for t, _ in starts)),
        "per_partition": per,
    }


def scenario_abort(quick: bool) -> dict[str, Any]:
    """100 running jobs aborted (``bench/flow_abort.py``): abort() to the handler's interruption, and writes."""
    from bench import flow_abort

    if quick:
        return flow_abort.run(flow_abort.QUICK_JOBS, flow_abort.QUICK_HEARTBEAT_S)
    return flow_abort.run(flow_abort.JOBS, flow_abort.HEARTBEAT_S)


# The scenarios, in order; each returns its figures.
SCENARIOS: dict[str, Callable[[float, bool, random.Random], dict[str, Any]]] = {
    "rate": lambda s, quick, rng: scenario_rate(s, 1500 if quick else BACKLOG, rng),
    "partitioned": lambda s, quick, rng: scenario_partitioned(s, 100 if quick else 400, rng),
    "abort": lambda s, quick, rng: scenario_abort(quick),
}


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    seconds = 15.0 if quick else 60.0
    rng = random.Random(36)
    detail = {name: run(seconds, quick, rng) for name, run in SCENARIOS.items()}
    rate, part, abort = detail["rate"], detail["partitioned"], detail["abort"]
    rows = [
        [
            f"{LIMIT_PER_S}/s, one window",
            rate["starts"],
            rate["rate_per_s"],
            rate["rate_error_pct"],
            rate["max_starts_in_1s"],
            rate["other_kind_lag_p99_ms"],
        ],
        [
            f"{PARTITION_LIMIT_PER_S}/s x {PARTITIONS} labels (worst)",
            sum(p["starts"] for p in part["per_partition"].values()),
            "-",
            part["partition_rate_error_pct_max"],
            part["partition_max_starts_in_1s"],
            part["other_kind_lag_p99_ms"],
        ],
    ]
    print(
        common.table(
            f"Flow: rate limits decided at the claim, {seconds:.0f} s each; load average {common.load_average()}",
            ["scenario", "starts", "rate/s", "error %", "max in 1 s", "other lag p99 ms"],
            rows,
        )
    )
    other_p99 = max(rate["other_kind_lag_p99_ms"], part["other_kind_lag_p99_ms"])
    met = (
        rate["rate_error_pct"] <= TARGET_RATE_ERROR_PCT
        and rate["max_starts_in_1s"] <= LIMIT_PER_S
        and part["partition_rate_error_pct_max"] <= TARGET_RATE_ERROR_PCT
        and part["partition_max_starts_in_1s"] <= PARTITION_LIMIT_PER_S
        and other_p99 <= TARGET_LAG_P99_MS
        and abort["target_met"]
    )
    return {
        "seconds": seconds,
        "limit_per_s": LIMIT_PER_S,
        "rate_per_s": rate["rate_per_s"],
        "rate_error_pct": rate["rate_error_pct"],
        "max_starts_in_1s": rate["max_starts_in_1s"],
        "partition_limit_per_s": PARTITION_LIMIT_PER_S,
        "partition_rate_error_pct_max": part["partition_rate_error_pct_max"],
        "partition_max_starts_in_1s": part["partition_max_starts_in_1s"],
        # the same figures on the claim's own instants (the decision), beside the handlers' starts
        "claimed_rate_error_pct": rate["claimed_rate_error_pct"],
        "max_claimed_in_1s": rate["max_claimed_in_1s"],
        "partition_claimed_rate_error_pct_max": part["partition_claimed_rate_error_pct_max"],
        "partition_max_claimed_in_1s": part["partition_max_claimed_in_1s"],
        "other_kind_lag_p99_ms": other_p99,
        "other_rate_per_s": OTHER_RATE_PER_S,
        "target_rate_error_pct": TARGET_RATE_ERROR_PCT,
        "target_lag_p99_ms": TARGET_LAG_P99_MS,
        "abort_p99_s": abort["abort_p99_s"],
        "heartbeat_s": abort["heartbeat_s"],
        "aborted_committed_writes": abort["aborted_committed_writes"],
        "abort_target_met": abort["target_met"],
        "target_met": met,
        "scenarios": list(SCENARIOS),
        "detail": detail,
    }
