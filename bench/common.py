"""What every scenario shares: the bench database and broker, Django set-up, statistics, output.

``setup()`` must run before anything imports Django models: it points Django at the bench
database (created and migrated here) and the bench Redis database, never at development data.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOGS = ROOT / "var" / "bench-logs"

PG_HOST = os.environ.get("BENCH_PGHOST", "127.0.0.1")
PG_PORT = os.environ.get("BENCH_PGPORT", "5432")
PG_USER = os.environ.get("BENCH_PGUSER", "postgres")
BENCH_DB = os.environ.get("BENCH_DATABASE", "timekeeper_bench")
REDIS_HOST = os.environ.get("BENCH_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))
BROKER_DB = int(os.environ.get("BENCH_BROKER_DB", "14"))  # the platform's broker in the benchmark
BARE_BROKER_DB = 13  # bare Celery baselines: a separate database so queues never mix


def dsn(dbname: str = BENCH_DB) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"


def broker_url(db: int = BROKER_DB) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"


_BENCH_SECRET_KEY = secrets.token_urlsafe(50)  # production mode needs one; nothing here signs anything kept


def bench_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the platform's processes (and this one): the bench database and broker."""
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "project.settings",
            # Production mode, as workers run: DEBUG on would wrap every cursor to log its SQL.
            "DEBUG": "0",
            "SECRET_KEY": _BENCH_SECRET_KEY,
            "DATABASE_URL": dsn(),
            "CELERY_BROKER_URL": broker_url(),
            "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra or {})
    return env


def admin_connect(dbname: str = "postgres") -> Any:
    import psycopg2

    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=dbname)
    conn.autocommit = True
    return conn


def ensure_database(name: str, *, fresh: bool = False) -> None:
    """Create database ``name`` on the bench server (dropped first when ``fresh``)."""
    conn = admin_connect()
    try:
        with conn.cursor() as cur:
            if fresh:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


_setup_done = False


def setup() -> None:
    """Create and migrate the bench database, then configure Django in this process to use it."""
    global _setup_done
    if _setup_done:
        return
    ensure_database(BENCH_DB)
    env = bench_env()
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    for key in ("DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "LOG_LEVEL"):
        os.environ[key] = env[key]
    # This process fills tables with millions of rows: no statement timeout here (the workers keep theirs).
    os.environ["DATABASE_STATEMENT_TIMEOUT_MS"] = "0"
    import django

    django.setup()
    _setup_done = True


def redis_client(db: int = BROKER_DB) -> Any:
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)


def reset_state() -> None:
    """Empty the job tables and the bench broker: every measurement starts from nothing."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE scheduling_jobattempt, scheduling_scheduledjob, tasks_execution RESTART IDENTITY CASCADE")
        # The beat scenario's schedule must not keep firing during the other scenarios. One statement
        # (then one "changed" mark for beat): the ORM's delete sends a signal and an UPDATE per row,
        # an hour for the 100,000 tasks bench recurring leaves when it is stopped.
        cur.execute("DELETE FROM django_celery_beat_periodictask WHERE name LIKE 'bench-%%'")
    from django_celery_beat.models import PeriodicTasks

    PeriodicTasks.update_changed()
    redis_client().flushdb()
    redis_client(BARE_BROKER_DB).flushdb()


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on this process's connection (autocommit); its rows, or [] when it returns none."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def jobs_left(due_by: Any = None) -> bool:
    """Whether a job (due by ``due_by``, if given) still waits or runs: two index probes, never a count.

    The benchmarks poll this while they wait for the workers to finish; a count of the jobs table
    every fraction of a second took seconds of the database's time a run from the two cores it
    measures. ``claimed_at IS NOT NULL`` names the claimed set's index.
    """
    ((left,),) = sql(
        "SELECT EXISTS (SELECT 1 FROM scheduling_scheduledjob"
        "               WHERE state = 'pending' AND (%(due_by)s::timestamptz IS NULL OR due_at <= %(due_by)s))"
        " OR EXISTS (SELECT 1 FROM scheduling_scheduledjob"
        "            WHERE state IN ('claimed', 'running') AND claimed_at IS NOT NULL)",
        {"due_by": due_by},
    )
    return bool(left)


def server_autovacuum() -> str:
    """The benchmark server's ``autovacuum`` setting ("on" or "off"), recorded with the figures."""
    return str(sql("SHOW autovacuum")[0][0])


@contextmanager
def autovacuum_on(keep: bool) -> Iterator[str]:
    """Autovacuum on for the run (PostgreSQL's default, and what operations.md requires); yields the
    server's own setting. A server configured with it off (some CI images, this machine) gets it
    on through ``ALTER SYSTEM`` and a reload, and its setting back afterwards; ``keep`` measures
    the server as it is."""
    own = server_autovacuum()
    if keep or own == "on":
        yield own
        return
    ((auto_file,),) = sql(
        "SELECT coalesce(sourcefile LIKE '%postgresql.auto.conf', false) FROM pg_settings WHERE name = 'autovacuum'"
    )
    say(f"this PostgreSQL has autovacuum={own}; turning it on for the run (ALTER SYSTEM)")
    try:
        _set_autovacuum("ALTER SYSTEM SET autovacuum = on", "on")  # inside: a refused reload still restores
        yield own
    finally:
        _set_autovacuum("ALTER SYSTEM SET autovacuum = off" if auto_file else "ALTER SYSTEM RESET autovacuum", own)
        say(f"autovacuum back to {own}")


def _set_autovacuum(statement: str, expect: str) -> None:
    sql(statement)  # not in a transaction block: Django's connection is in autocommit
    sql("SELECT pg_reload_conf()")
    for _ in range(50):  # the reload reaches this session at its next command, soon after the signal
        if server_autovacuum() == expect:
            return
        time.sleep(0.1)
    raise RuntimeError(f"autovacuum is not {expect} after a configuration reload")


def vacuum_analyze(*tables: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"VACUUM ANALYZE {table}")


# --- Statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(values_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max (and count) of a list of milliseconds, rounded for reading."""
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 2),
        "p95_ms": round(percentile(values_ms, 95), 2),
        "p99_ms": round(percentile(values_ms, 99), 2),
        "max_ms": round(max(values_ms), 2) if values_ms else math.nan,
    }


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else math.inf


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- Output ----------------------------------------------------------------------------------------


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with right-aligned numbers."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text_rows)) if text_rows else len(h) for i, h in enumerate(headers)]
    lines = [
        title,
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=False))),
    ]
    lines.append("  ".join("-" * w for w in widths))
    for row in text_rows:
        lines.append(
            "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=False)))
        )
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, datetimes ISO text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def emit(scenario: str, figures: dict[str, Any], *, quick: bool) -> dict[str, Any]:
    """Write ``bench/results/<scenario>.json`` and print it as one JSON line (the scenario's last line)."""
    result = {
        "scenario": scenario,
        "quick": quick,
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15": load_average(),
        **figures,
    }
    result = _clean(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{scenario}.json").write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    print(json.dumps(result, separators=(",", ":")), flush=True)
    return result


def chart_path(scenario: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{scenario}.png"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def say(text: str) -> None:
    """Progress on stderr, so stdout stays the table and the JSON line."""
    print(text, file=sys.stderr, flush=True)
