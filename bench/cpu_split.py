"""Where the CPU goes while ``realistic``'s jobs drain: CPU seconds per process group, per 1,000 jobs.

``python -m bench.cpu_split [--jobs N] [--kind demo.record|demo.noop] [--system timekeeper|floor|both]
[--rounds N]`` drains N ``demo.record`` jobs (one ORM insert each; ``demo.noop`` jobs do nothing) as
``bench realistic`` does (Timekeeper: one ``celery worker --concurrency 2`` whose main process runs
the control loop; the floor: ``bench.floor``'s two plain processes) and samples, every
``SAMPLE_SECONDS``, the user + system CPU time of every process taking part (psutil). CPU time,
not wall time: the machine may be shared, and what a process spends per job does not depend on
who else runs.

Groups: the Celery main process (by thread: its main thread is Celery's consumer, the others the
control loop and Celery's helpers), its pool processes (or the floor's processes), the PostgreSQL
backends of each of them (a backend is matched to its client process by the client's TCP port),
PostgreSQL's own background processes, and redis-server. The benchmark process's own work
(enqueueing, waiting) and its backend, and the backends of other clients, are shown apart and left
out of the total.

The window: Timekeeper's from just after the jobs are enqueued (the worker started and idle, the
jobs due ``DUE_IN_SECONDS`` later) to the moment the last one is finished; the floor's from just
before its processes start together (they import Django and connect first) to their exit. A
process that ends between two samples loses at most one interval of CPU (the floor's do not:
their CPU at exit comes from ``wait4``). ``--json FILE`` keeps every run's figures (CPU seconds
per group, drain seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import psutil

from bench import common, floor, procs, realistic

SAMPLE_SECONDS = 0.05
DRAIN_TIMEOUT_S = 300
DUE_IN_SECONDS = 2.0  # Timekeeper's jobs fall due this long after their insert; the window opens in between
KIND = realistic.KIND
DRIVER = "bench driver"  # this process and its backend: shown, not counted
MASTER = "celery main process"
POOL = "celery pool processes"
FLOOR = "floor processes"
OTHERS = "postgres backends of: others"  # other clients' sessions (the machine is shared): shown, not counted


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


class Sampler:
    """Samples the CPU time of the processes of each group (and their PostgreSQL backends) on a thread.

    ``clients``: group name -> pids; a Celery main process's descendants are its pool. A process
    seen in the first sample counts from there, one born later from zero.
    """

    def __init__(self, clients: dict[str, list[int]]) -> None:
        self.clients = clients
        self.master = clients.get(MASTER, [None])[0]
        self.postmaster = _postmaster()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.group_of: dict[int, str] = {self.postmaster: "postgres background", _redis_server(): "redis-server"}
        self.procs: dict[int, psutil.Process] = {}
        self.threads_first: dict[int, float] = {}
        self.threads_last: dict[int, float] = {}
        self.started = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _classify(self) -> None:
        """Name the processes not seen before: clients' descendants, then PostgreSQL's new children."""
        for name, pids in self.clients.items():
            for pid in pids:
                self.group_of.setdefault(pid, name)
                if name == MASTER:
                    for child in psutil.Process(pid).children(recursive=True):
                        self.group_of.setdefault(child.pid, POOL)
        new = [c for c in psutil.Process(self.postmaster).children() if c.pid not in self.group_of]
        if not new:
            return
        ports: dict[int, str] = {}
        for conn in psutil.net_connections(kind="tcp"):
            if conn.pid in self.group_of and conn.raddr and conn.raddr.port == int(common.PG_PORT):
                ports[conn.laddr.port] = self.group_of[conn.pid]
        for child in new:
            try:
                peers = [c.raddr.port for c in child.net_connections(kind="tcp") if c.raddr]
            except psutil.NoSuchProcess:
                continue
            if not peers:
                self.group_of[child.pid] = "postgres background"
            elif peers[0] in ports:
                self.group_of[child.pid] = f"postgres backends of: {ports[peers[0]]}"
            else:
                self.group_of[child.pid] = OTHERS

    def sample(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):  # a client that exited meanwhile
            self._classify()
        for pid in list(self.group_of):
            try:
                proc = self.procs.setdefault(pid, psutil.Process(pid))
                cpu = _cpu(proc)
            except psutil.NoSuchProcess:
                continue
            self.first.setdefault(pid, 0.0 if self.started else cpu)
            self.last[pid] = cpu
        if self.master:
            try:
                for t in psutil.Process(self.master).threads():
                    self.threads_first.setdefault(t.id, 0.0 if self.started else t.user_time + t.system_time)
                    self.threads_last[t.id] = t.user_time + t.system_time
            except psutil.NoSuchProcess:
                pass

    def start(self) -> None:
        self.sample()  # the baseline
        self.started = True
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(SAMPLE_SECONDS):
            self.sample()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.sample()

    def by_group(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for pid, cpu in self.last.items():
            totals[self.group_of[pid]] += cpu - self.first[pid]
        if self.master:
            main = self.threads_last.get(self.master, 0.0) - self.threads_first.get(self.master, 0.0)
            others = sorted(
                (v - self.threads_first[t] for t, v in self.threads_last.items() if t != self.master), reverse=True
            )
            totals["  main thread (Celery's consumer)"] = main
            totals["  busiest other thread (the control loop)"] = others[0] if others else 0.0
            totals["  the other threads"] = sum(others[1:])
        return dict(totals)


def _postmaster() -> int:
    ((pid,),) = common.sql("SELECT pg_backend_pid()")
    return int(psutil.Process(int(pid)).ppid())


def _redis_server() -> int:
    return int(common.redis_client().info("server")["process_id"])


def run_timekeeper(jobs: int, kind: str = KIND) -> dict[str, float]:
    """CPU seconds per group while one worker (2 pool processes) drains ``jobs``; and the drain's seconds."""
    from django.db import transaction

    from scheduling import api

    common.reset_state()
    with procs.Group("cpu_split") as group:
        worker = group.worker("tk-w1", concurrency=realistic.WORKER_CONCURRENCY)
        group.wait_ready(worker)
        time.sleep(1.0)
        with transaction.atomic():
            api.schedule_many(kind, [{} for _ in range(jobs)], delay=DUE_IN_SECONDS)
        sampler = Sampler({MASTER: [worker.pid], DRIVER: [os.getpid()]})
        sampler.start()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        time.sleep(DUE_IN_SECONDS)
        while common.jobs_left():
            if time.monotonic() > deadline or not worker.alive():
                raise RuntimeError("the worker exited, or the jobs did not finish in time")
            time.sleep(0.1)
        sampler.stop()
    ((done, drain),) = common.sql(
        "SELECT count(*) FILTER (WHERE state = 'done'),"
        " (SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM scheduling_jobattempt)"
        " FROM scheduling_scheduledjob"
    )
    if done != jobs:
        raise RuntimeError(f"{done:,} of {jobs:,} jobs done")
    return {**sampler.by_group(), "drain seconds": float(drain)}


def run_floor(jobs: int, kind: str = KIND) -> dict[str, float]:
    """CPU seconds per group while ``bench.floor``'s processes drain ``jobs``; and the drain's seconds."""
    from django.db import transaction

    from scheduling import api

    common.reset_state()
    with transaction.atomic():
        api.schedule_many(kind, [{} for _ in range(jobs)], delay=0)
    start_at = time.time() + floor.START_DELAY_S
    argv = [sys.executable, "-m", "bench.floor", f"--kind={kind}", f"--batch={floor.BATCH}", f"--start-at={start_at}"]
    children = [
        subprocess.Popen(argv, cwd=common.ROOT, env=common.bench_env(), stdout=subprocess.PIPE, text=True)
        for _ in range(floor.PROCESSES)
    ]
    time.sleep(max(0.0, start_at - time.time() - 0.3))  # imported, connected, waiting for the start
    sampler = Sampler({FLOOR: [c.pid for c in children], DRIVER: [os.getpid()]})
    sampler.start()
    reports, at_exit = [], {}
    for child in children:
        assert child.stdout is not None
        reports.append(json.loads(child.stdout.read().strip().splitlines()[-1]))
        _, status, usage = os.wait4(child.pid, 0)  # the CPU of a reaped child: nothing lost between samples
        at_exit[child.pid] = usage.ru_utime + usage.ru_stime
        child.returncode = os.waitstatus_to_exitcode(status)
    sampler.stop()
    totals = sampler.by_group()
    totals[FLOOR] = sum(at_exit[pid] - sampler.first[pid] for pid in at_exit)
    busy = [r for r in reports if r["jobs"]]
    if sum(r["jobs"] for r in reports) != jobs:
        raise RuntimeError("the floor did not run every job")
    return {**totals, "drain seconds": max(r["last"] for r in busy) - min(r["first"] for r in busy)}


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def table(runs: dict[str, list[dict[str, float]]], jobs: int, kind: str = KIND) -> str:
    """CPU ms per 1,000 jobs by group, each system's median over its runs; the driver shown apart."""
    names: list[str] = []
    for rs in runs.values():
        for r in rs:
            names.extend(n for n in r if n not in names)
    apart = [n for n in names if DRIVER in n or n == OTHERS]  # not this system's: shown, not counted
    counted = [n for n in names if not n.startswith("  ") and n not in apart and n != "drain seconds"]
    first = next(iter(runs.values()))
    counted.sort(key=lambda n: -_median([r.get(n, 0.0) for r in first]))

    def per_k(rs: list[dict[str, float]], pick: Any) -> str:
        return f"{1_000_000 * _median([pick(r) for r in rs]) / jobs:,.0f}"

    rows = []
    for name in counted:
        rows.append([name] + [per_k(rs, lambda r, n=name: r.get(n, 0.0)) for rs in runs.values()])
        if name == MASTER:
            for sub in (n for n in names if n.startswith("  ")):
                rows.append([sub] + [per_k(rs, lambda r, n=sub: r.get(n, 0.0)) for rs in runs.values()])
    rows.append(["total"] + [per_k(rs, lambda r: sum(r.get(n, 0.0) for n in counted)) for rs in runs.values()])
    for name in apart:
        rows.append([f"({name}, not counted)"] + [per_k(rs, lambda r, n=name: r.get(n, 0.0)) for rs in runs.values()])
    rows.append(["drain s"] + [f"{_median([r['drain seconds'] for r in rs]):.2f}" for rs in runs.values()])
    rows.append(["jobs/s"] + [f"{jobs / _median([r['drain seconds'] for r in rs]):,.0f}" for rs in runs.values()])
    return common.table(
        f"CPU ms per 1,000 jobs ({jobs:,} {kind} jobs a run, median of {len(first)}), load {common.load_average()}",
        ["group", *runs],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20,000, as bench realistic)")
    parser.add_argument(
        "--kind", choices=(KIND, "demo.noop"), default=KIND, help=f"the jobs' kind (default {KIND}, as bench realistic)"
    )
    parser.add_argument("--system", choices=("timekeeper", "floor", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each system, interleaved (median shown)")
    parser.add_argument("--json", help="also write the runs to this file")
    args = parser.parse_args(argv)
    common.setup()
    systems = ("timekeeper", "floor") if args.system == "both" else (args.system,)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for _ in range(args.rounds):
        for system in systems:
            runs[system].append(
                run_timekeeper(args.jobs, args.kind) if system == "timekeeper" else run_floor(args.jobs, args.kind)
            )
            common.say(f"  {system}: drained in {runs[system][-1]['drain seconds']:.2f} s")
    common.reset_state()
    print(table(runs, args.jobs, args.kind))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"kind": args.kind, "jobs": args.jobs, "commit": common.git_commit(), "runs": runs}, out, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
