"""Starting and stopping the real processes a scenario measures: celery workers and beats.

Each process gets its own session (so a stop takes its pool children with it), logs to
``var/bench-logs/<scenario>/<name>.log`` and is stopped by its own pid at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import common
from tests.e2e import harness

CELERY = [sys.executable, "-m", "celery"]


class Proc(harness.Proc):
    """A logged process in its own session (the e2e tests' kind), with the waits a scenario needs."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        (log_dir / f"{name}.log").unlink(missing_ok=True)  # a fresh log: waits must not match a past run's
        super().__init__(name, list(argv), env, log_dir)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for_text(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not print {text!r} within {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)


class Group:
    """The processes of one measurement; ``with Group("throughput") as g: g.worker(...)``."""

    def __init__(self, scenario: str) -> None:
        self.log_dir = common.LOGS / scenario
        self.procs: list[Proc] = []

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.log_dir)
        self.procs.append(proc)
        return proc

    def worker(
        self,
        name: str = "w1",
        *,
        app: str = "project",
        concurrency: int = 2,
        queues: str | None = None,
        env: dict[str, str] | None = None,
        level: str = "info",
    ) -> Proc:
        argv = [
            *CELERY,
            "-A",
            app,
            "worker",
            "-l",
            level,
            "-n",
            f"{name}@%h",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        ]
        if queues:
            argv.append(f"--queues={queues}")
        return self.start(name, argv, common.bench_env(env))

    def beat(self, name: str = "beat1", *, env: dict[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [*CELERY, "-A", "project", "beat", "-l", "info", "--pidfile=", "-s", str(self.log_dir / f"{name}-db")]
        return self.start(name, argv, common.bench_env(env))

    def wait_ready(self, *procs: Proc, timeout: float = 60.0) -> None:
        for proc in procs:
            proc.wait_for_text("ready.", timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
