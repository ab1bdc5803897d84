"""Starting and stopping the real processes a scenario measures: celery workers and beats.

Each process is a ``project.processes.Process`` in its own session (so a stop takes its pool
children with it), logs to ``var/bench-logs/<scenario>/<name>.log`` (emptied at start: waits must
not match a past run's text) and is stopped by its own pid at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench import common
from project import processes

CELERY = [sys.executable, "-m", "celery"]
Proc = processes.Process


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
        proc = Proc(name, argv, cwd=common.ROOT, env=env, log_path=self.log_dir / f"{name}.log", fresh_log=True)
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
        prefix: Sequence[str] = (),
    ) -> Proc:
        argv = [
            *prefix,
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

    def beat(self, name: str = "beat1", *, env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> Proc:
        """A beat; ``prefix`` goes before the command (``ip netns exec <ns>``: it execs, the pid is the beat's)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        schedule = str(self.log_dir / f"{name}-db")
        argv = [*prefix, *CELERY, "-A", "project", "beat", "-l", "info", "--pidfile=", "-s", schedule]
        return self.start(name, argv, common.bench_env(env))

    def wait_ready(self, *procs: Proc, timeout: float = 60.0) -> None:
        for proc in procs:
            proc.wait_for_text("ready.", timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
