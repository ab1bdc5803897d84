"""Starting real ``celery worker`` and ``celery beat`` processes against the test database.

The processes get the test database's URL and the test Redis database, log to files kept under
``tests/artifacts/`` (read them when a test fails), and are stopped by pid at the end of the test.
Faults are injected with signals on these pids only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
# Process logs and measurements; the Django 6.0 leg of `dev.py test`, run beside the 5.2 run, has its own.
ARTIFACTS = Path(os.environ.get("TIMEKEEPER_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")
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


class Proc:
    """A started Celery process: its Popen, its log file, and signals to send it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._terminated = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def children(self) -> list[int]:
        """Pids of the process's direct children (a prefork worker's pool processes)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM the whole process group (once): Celery's warm shutdown."""
        if self.popen.poll() is None and not self._terminated:
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """TERM, wait, then KILL the whole process group."""
        if self.popen.poll() is None:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(5)
        self._log.close()


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


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.2, message: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def wait_ready(proc: Proc, text: str = "ready.", timeout: float = 60) -> None:
    """Wait until the process's log shows ``text`` (celery worker prints "ready.")."""
    wait_for(lambda: text in proc.log() or proc.popen.poll() is not None, timeout, message=f"{proc.name}: {text!r}")
    if proc.popen.poll() is not None:
        raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-4000:]}")
