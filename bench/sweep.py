"""Sweep: the sweeper (stranded claims back to pending) and the pruner (old history) on a big table.

Every statement of ``scheduling.sweep`` runs in its own transaction (autocommit), so the longest
statement bounds the longest time any row lock is held. Each statement is timed with a Django
execute wrapper around the real ``sweep.reclaim_expired()`` and ``sweep.prune()``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bench import common

SCENARIO = "sweep"
STRANDED = 10_000
TARGET_MAX_STATEMENT_MS = 100

FILL_FINISHED = """
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, claimed_by,
     created_at, updated_at, finished_at)
SELECT 'demo.noop', '{}'::jsonb, now() - make_interval(days => 40), 'done', 60, 1, 5, '', '',
       now() - make_interval(days => 40), now(),
       now() - make_interval(secs => random() * %(max_age_days)s * 86400)
FROM generate_series(1, %(n)s)
"""

FILL_STRANDED = """
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, token, claimed_at, heartbeat_at, claimed_by, lease_seconds, attempts,
     max_attempts, last_error, created_at, updated_at)
SELECT 'demo.noop', '{}'::jsonb, now() - interval '1 hour', 'running', gen_random_uuid(),
       now() - interval '10 minutes', now() - interval '10 minutes', 'gone-host:1', 60,
       CASE WHEN g %% 10 = 0 THEN 5 ELSE 1 END, 5, '', now(), now()
FROM generate_series(1, %(n)s) AS g
"""

FILL_ATTEMPTS = """
INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
SELECT id, 1, gen_random_uuid(), 'host:1', due_at, finished_at, finished_at, 'succeeded', ''
FROM scheduling_scheduledjob WHERE state = 'done' AND id BETWEEN %(lo)s AND %(hi)s
"""


def _execute(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def fill(total: int, old_fraction: float) -> dict[str, int]:
    """``total`` rows: STRANDED stale claims, the rest finished (``old_fraction`` past the retention)."""
    finished = total - STRANDED
    old = int(finished * old_fraction)
    for n, age in ((old, 0), (finished - old, 1)):
        done = 0
        while done < n:
            chunk = min(500_000, n - done)
            if age == 0:  # past the 14-day retention: 15 to 30 days old
                sql = FILL_FINISHED.replace(
                    "now() - make_interval(secs => random() * %(max_age_days)s * 86400)",
                    "now() - make_interval(days => 15) - make_interval(secs => random() * 15 * 86400)",
                )
                _execute(sql, {"n": chunk})
            else:
                _execute(FILL_FINISHED, {"n": chunk, "max_age_days": 13})
            done += chunk
    _execute(FILL_STRANDED, {"n": STRANDED})
    hi = _execute("SELECT max(id) FROM scheduling_scheduledjob")[0][0]
    for lo in range(1, hi + 1, 500_000):
        _execute(FILL_ATTEMPTS, {"lo": lo, "hi": lo + 499_999})
    return {"rows": total, "finished": finished, "past_retention": old, "stranded_claims": STRANDED}


class StatementTimer:
    """A Django execute wrapper recording (statement name, milliseconds) for every statement."""

    def __init__(self) -> None:
        self.samples: list[tuple[str, float]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        from scheduling.due_at import store

        name = next((n for n, q in store.SQL.queries.items() if q == sql), sql.split()[0].lower())
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.samples.append((name, (time.perf_counter() - start) * 1000))


def timed(fn: Any) -> tuple[Any, float, list[tuple[str, float]]]:
    from django.db import connection

    timer = StatementTimer()
    start = time.perf_counter()
    with connection.execute_wrapper(timer):
        out = fn()
    return out, time.perf_counter() - start, timer.samples


def main(quick: bool = False) -> dict[str, Any]:
    common.setup()
    from scheduling.core import conf
    from scheduling.due_at import sweep

    total = 300_000 if quick else 1_000_000
    common.reset_state()
    common.say(f"sweep: filling {total:,} rows ({STRANDED:,} stranded claims, 30% past retention) and attempts")
    with common.stopwatch() as fill_s:
        shape = fill(total, 0.3)
    common.vacuum_analyze("scheduling_scheduledjob", "scheduling_jobattempt")

    logging.getLogger("scheduling.sweep").setLevel(logging.ERROR)  # 10,000 "claim expired" lines otherwise
    (reclaimed, killed), reclaim_s, reclaim_stmts = timed(sweep.reclaim_expired)
    pruned, prune_s, prune_stmts = timed(sweep.prune)
    left = _execute(
        "SELECT count(*) FILTER (WHERE state IN ('claimed', 'running')), count(*) FROM scheduling_scheduledjob"
    )[0]

    def stats(samples: list[tuple[str, float]]) -> dict[str, float]:
        ms = [s[1] for s in samples]
        return {
            "statements": len(ms),
            "p50_ms": round(common.median(ms), 2),
            "p99_ms": round(common.percentile(ms, 99), 2),
            "max_ms": round(max(ms), 2) if ms else 0.0,
            "slowest_statement_number": ms.index(max(ms)) + 1 if ms else 0,
            "over_100_ms": sum(1 for x in ms if x > TARGET_MAX_STATEMENT_MS),
        }

    r, p = stats(reclaim_stmts), stats(prune_stmts)
    rows = [
        [
            "sweeper (reclaim)",
            reclaimed + killed,
            sweep.RECLAIM_BATCH_SIZE,
            r["statements"],
            reclaim_s,
            r["p50_ms"],
            r["max_ms"],
        ],
        [
            "pruner",
            pruned,
            conf.get().prune_batch_size,
            p["statements"],
            prune_s,
            p["p50_ms"],
            p["max_ms"],
        ],
    ]
    print(
        common.table(
            f"Sweep on {total:,} rows: every statement is its own transaction (longest statement = longest lock hold)",
            ["duty", "rows", "batch", "statements", "seconds", "stmt p50 ms", "stmt max ms"],
            rows,
        )
    )
    longest = max(r["max_ms"], p["max_ms"])
    figures = {
        **shape,
        "fill_s": round(fill_s[0], 1),
        "reclaimed": reclaimed,
        "killed": killed,
        "claims_left": left[0],
        "pruned": pruned,
        "rows_left": left[1],
        "reclaim_s": round(reclaim_s, 3),
        "prune_s": round(prune_s, 3),
        "reclaim_batch_size": sweep.RECLAIM_BATCH_SIZE,
        "prune_batch_size": conf.get().prune_batch_size,
        "reclaim_statements": r,
        "prune_statements": p,
        "max_statement_ms": longest,
        "target_max_statement_ms": TARGET_MAX_STATEMENT_MS,
        "target_met": longest <= TARGET_MAX_STATEMENT_MS,
    }
    chart(reclaim_stmts, prune_stmts)
    common.reset_state()
    return figures


def chart(reclaim: list[tuple[str, float]], prune: list[tuple[str, float]]) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(range(len(reclaim)), [s[1] for s in reclaim], "o-", ms=3, label="sweeper statements")
    ax.plot(
        range(len(reclaim), len(reclaim) + len(prune)), [s[1] for s in prune], ".-", ms=2, label="pruner statements"
    )
    ax.axhline(TARGET_MAX_STATEMENT_MS, color="#c0392b", linestyle="--", label=f"target {TARGET_MAX_STATEMENT_MS} ms")
    ax.set_xlabel("statement, in order (each its own transaction)")
    ax.set_ylabel("ms")
    ax.set_title("Sweeper and pruner: how long each statement holds its row locks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(common.chart_path(SCENARIO), dpi=110)
    plt.close(fig)
