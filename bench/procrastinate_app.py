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
