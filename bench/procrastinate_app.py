"""The Procrastinate baseline's app: imported from ``var/bench-venv`` only (Procrastinate brings psycopg 3).

Not imported by the platform's processes: Django would switch drivers if psycopg 3 were in ``.venv``.
"""

from __future__ import annotations

import os

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", "")),
)


@app.task(name="noop")
async def noop() -> None:
    """Do nothing."""


RECORD_TABLE = (  # tasks.Execution's shape; one statement each (psycopg 3 sends parameters: no scripts)
    "CREATE TABLE IF NOT EXISTS bench_execution (id bigserial PRIMARY KEY, idempotency_key varchar(200) NOT NULL,"
    " kind varchar(100) NOT NULL, pid integer NOT NULL CHECK (pid >= 0),"
    " started_at timestamptz NOT NULL DEFAULT now())",
    "CREATE INDEX IF NOT EXISTS bench_execution_key_idx ON bench_execution (idempotency_key)",
)


@app.task(name="record")
async def record(key: str) -> None:
    """Insert one row shaped like ``tasks.Execution`` (plain SQL: this venv has no Django)."""
    await app.connector.execute_query_async(
        "INSERT INTO bench_execution (idempotency_key, kind, pid) VALUES (%(key)s, 'record', %(pid)s)",
        key=key,
        pid=os.getpid(),
    )
