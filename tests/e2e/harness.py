"""Starting real ``celery worker`` and ``celery beat`` processes against the test database.

The processes get the test database's URL and the test Redis database, log to files kept under
``tests/artifacts/`` (read them when a test fails), and are stopped by pid at the end of the test.
Faults are injected with signals on these pids only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from django.conf import settings
from django.db import connection

from project import processes
from tests.support import ROOT
from tests.support import wait_for as wait_for  # re-exported: the e2e tests call harness.wait_for

ARTIFACTS = ROOT / "tests" / "artifacts"
CELERY = [sys.executable, "-m", "celery", "-A", "project"]


def database_url() -> str:
    """The URL of the database the tests run on (pytest-django's test database)."""
    s = connection.settings_dict
    auth = s["USER"] or ""
    if s["PASSWORD"]:
        auth += f":{s['PASSWORD']}"
    host = s["HOST"] or ""
    if host.startswith("/"):
        return f"postgresql://{auth}@/{s['NAME']}?host={host}"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgresql://{auth}@{host}{port}/{s['NAME']}"


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DEBUG": "1",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra or {})
    return env


class Proc(processes.Process):
    """A process of an e2e test: started from the root in its own session, its output in ``log_dir/<name>.log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        super().__init__(name, argv, cwd=ROOT, env=env, log_path=log_dir / f"{name}.log")


class Cluster:
    """The processes one test started; stops them all at the end."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = env or {}
        self.procs: list[Proc] = []

    def worker(
        self,
        name: str = "w1",
        *,
        concurrency: int = 2,
        pool: str = "prefork",
        args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        argv = [
            *CELERY,
            "worker",
            "-l",
            "info",
            "-n",
            f"{name}@%h",
            f"--concurrency={concurrency}",
            f"--pool={pool}",
            "--without-mingle",
            "--without-gossip",
            *(args or []),
        ]
        proc = Proc(name, argv, base_env({**self.env, **(env or {})}), self.log_dir)
        self.procs.append(proc)
        return proc

    def beat(self, name: str = "beat1", *, env: Mapping[str, str] | None = None, args: list[str] | None = None) -> Proc:
        schedule_file = str(self.log_dir / f"{name}-schedule")
        argv = [*CELERY, "beat", "-l", "info", "--pidfile=", "-s", schedule_file, *(args or [])]
        proc = Proc(name, argv, base_env({**self.env, **(env or {})}), self.log_dir)
        self.procs.append(proc)
        return proc

    def stop(self, timeout: float = 15.0) -> None:
        """TERM every process at once, give them ``timeout`` s in all to exit, then KILL what is left.

        Signalled together, they shut down side by side: the test waits for the slowest, not the sum.
        """
        for proc in self.procs:
            proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in reversed(self.procs):
            proc.stop(max(0.0, deadline - time.monotonic()))


def wait_ready(proc: Proc, text: str = "ready.", timeout: float = 60) -> None:
    """Wait until the process's log shows ``text`` (celery worker prints "ready.")."""
    proc.wait_for_text(text, timeout)
    if not proc.alive():
        raise processes.ProcessFailed(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-4000:]}")
