"""Exactly-once per tick across beat replicas and workers, as a reusable scenario.

``soak()`` starts beats and workers in a ``harness.Cluster``, declares a short interval schedule,
re-sends some of its ticks itself (a third sender racing beat's message, so the ledger has real
duplicates to refuse), optionally kills the leading beat with SIGKILL midway (``kills`` times,
each killed beat replaced by a fresh standby once the lead has moved), and then checks every
tick: exactly one succeeded run (so none recorded ``missed``) and exactly one execution. The e2e
test runs it for under a minute; a benchmark can run it for minutes with the same function.
It must run inside a test or command that owns a committed database (``transactional_db``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import time

from django.db.models import Sum

from project.celery import app as celery_app
from scheduling import schedules
from scheduling.core import store
from scheduling.fixed import beat, cron, messages
from scheduling.models import SchedulerHeartbeat, ScheduleRun
from tasks.models import Execution
from tests.e2e import harness


@dataclasses.dataclass
class SoakReport:
    """What a soak saw; ``problems`` is empty when every tick ran exactly once."""

    ticks_checked: int
    problems: list[str]
    injected: int  # tick messages re-sent by the soak itself, beside beat's
    injected_refused_ticks: int  # injected ticks whose row counted at least one refused duplicate
    duplicates_refused: int  # the sum over all rows
    handover_seconds: float | None  # SIGKILL of the leader -> the standby holds the lead (the first kill)
    first_run_after_kill_seconds: float | None  # SIGKILL of the leader -> the first run of a later tick starts
    handovers: list[float] = dataclasses.field(default_factory=list)  # every kill's handover, in seconds
    missed: int = 0  # rows of the schedule recorded missed (ticks beat did not send)
    # "ticks missed" warnings in the beats' logs: a missed tick whose injected duplicate ran first leaves
    # no missed row (the row exists already), but the beat that gave up on it still says so.
    missed_warnings: int = 0

    def summary(self) -> str:
        handover = f"{self.handover_seconds:.2f}s" if self.handover_seconds is not None else "n/a"
        first = f"{self.first_run_after_kill_seconds:.2f}s" if self.first_run_after_kill_seconds is not None else "n/a"
        each = ", ".join(f"{seconds:.2f}s" for seconds in self.handovers) or "n/a"
        return (
            f"{self.ticks_checked} ticks checked, {len(self.problems)} problems, {self.missed} missed "
            f"({self.missed_warnings} beat warnings); "
            f"{self.injected} duplicate sends injected, {self.duplicates_refused} duplicates refused; "
            f"leader handover {handover} (all {len(self.handovers)}: {each}), first run after the kill {first}"
        )


def leader_pid() -> int | None:
    """The pid in the beat heartbeat row (host:pid of the leading beat)."""
    row = SchedulerHeartbeat.objects.filter(role="beat").first()
    return int(row.holder.rsplit(":", 1)[1]) if row is not None else None


def soak(
    cluster: harness.Cluster,
    *,
    seconds: float,
    every: int = 2,
    name: str = "soak-every-2s",
    beats: int = 2,
    workers: int = 2,
    kill_leader_after: float | None = None,
    kills: int = 1,
    kill_every: float = 12.0,
    standby_pauses: tuple[float, ...] = (),
    missed_policy: str = "run_all",
    inject_every: int = 2,
) -> SoakReport:
    """Run the scenario (see the module docstring) and return its report; processes stay for the caller to stop.

    With ``kill_leader_after``, the leader is killed then and again every ``kill_every`` seconds
    (once the previous handover is done), ``kills`` times in all. ``standby_pauses[i]`` seconds
    (none by default) the standbys are stopped (SIGSTOP) from just before the i-th kill, a slow
    takeover on a loaded host: the next leader then finds several ticks come due meanwhile.
    """
    worker_procs = [cluster.worker(f"w{i + 1}", concurrency=2) for i in range(workers)]
    beat_procs = [cluster.beat(f"beat{i + 1}") for i in range(beats)]
    for proc in worker_procs:
        harness.wait_ready(proc)
    beat_pids = {proc.pid for proc in beat_procs}
    harness.wait_for(lambda: leader_pid() in beat_pids, 60, message="a beat to lead")
    # allow: catch-up ticks after the handover may run side by side; the ledger alone keeps each tick once.
    declaration = schedules.make(
        name=name,
        kind="demo.record",
        every=every,
        concurrency_policy="allow",
        missed_policy=missed_policy,
        missed_window_seconds=120,
        successful_history_limit=10_000,
        failed_history_limit=10_000,
    )
    schedules.sync(declarations=[declaration])
    started = store.database_now()
    injected: set[dt.datetime] = set()
    handovers: list[float] = []
    killed_at: dt.datetime | None = None
    kill_mono: float | None = None
    victim: int | None = None
    done_kills = 0
    paused: list[harness.Proc] = []
    resume_at = 0.0
    deadline = time.monotonic() + seconds
    begin = time.monotonic()
    last_seen: dt.datetime | None = None
    while time.monotonic() < deadline:
        tick = cron.interval_tick(dt.datetime.now(dt.UTC), every)
        if tick != last_seen and tick > started:
            last_seen = tick
            if int(tick.timestamp()) // every % inject_every == 0:
                # signed, as a second beat's duplicate send would be
                celery_app.send_task("scheduling.run_fixed", kwargs=messages.message_kwargs(name, tick, "beat"))
                injected.add(tick)
        settled = kill_mono is None or len(handovers) == done_kills
        due = kill_leader_after is not None and time.monotonic() - begin >= kill_leader_after + done_kills * kill_every
        if done_kills < kills and settled and due:
            victim = leader_pid()
            assert victim in beat_pids, f"the leader {victim} is one of ours"
            pause = standby_pauses[done_kills] if done_kills < len(standby_pauses) else 0.0
            if pause > 0:
                paused = [proc for proc in beat_procs if proc.pid != victim and proc.popen.poll() is None]
                for proc in paused:
                    proc.signal(signal.SIGSTOP)
                resume_at = time.monotonic() + pause
            os.kill(victim, signal.SIGKILL)
            kill_mono = time.monotonic()
            done_kills += 1
            if killed_at is None:
                killed_at = store.database_now()
        if paused and time.monotonic() >= resume_at:
            for proc in paused:
                proc.signal(signal.SIGCONT)
            paused = []
        if kill_mono is not None and len(handovers) < done_kills:
            current = leader_pid()
            if current is not None and current != victim and current in beat_pids:
                handovers.append(time.monotonic() - kill_mono)
                # a fresh standby in place of the killed beat, so the next kill has a replica to hand over to
                beat_procs.append(cluster.beat(f"beat{len(beat_procs) + 1}"))
                beat_pids.add(beat_procs[-1].pid)
        time.sleep(0.05)
    for proc in paused:
        proc.signal(signal.SIGCONT)
    end = store.database_now()
    harness.wait_for(
        lambda: not ScheduleRun.objects.filter(schedule__periodic_task__name=name, state="running").exists(),
        30,
        message="the last runs to finish",
    )
    last_tick = cron.interval_tick(end - dt.timedelta(seconds=2 * every), every)
    first_tick = cron.interval_next_after(started, every)
    report = _check(name, every, first_tick, last_tick, injected, handovers[0] if handovers else None, killed_at)
    report.handovers = handovers
    report.missed_warnings = sum(proc.log().count(beat.MISSED_LOG) for proc in beat_procs)
    return report


def _check(
    name: str,
    every: int,
    first_tick: dt.datetime,
    last_tick: dt.datetime,
    injected: set[dt.datetime],
    handover: float | None,
    killed_at: dt.datetime | None,
) -> SoakReport:
    runs = ScheduleRun.objects.filter(schedule__periodic_task__name=name)
    by_tick: dict[dt.datetime, list[ScheduleRun]] = {}
    for run in runs:
        by_tick.setdefault(run.tick, []).append(run)
    executions: dict[str, int] = {}
    for key in Execution.objects.filter(idempotency_key__startswith=f"fixed:{name}@").values_list(
        "idempotency_key", flat=True
    ):
        executions[key] = executions.get(key, 0) + 1
    problems: list[str] = []
    checked = 0
    tick = first_tick
    while tick <= last_tick:
        checked += 1
        rows = by_tick.get(tick, [])
        states = [row.state for row in rows]
        count = executions.get(f"fixed:{name}@{tick.isoformat()}", 0)
        if states != ["succeeded"] or count != 1:
            problems.append(f"{tick.isoformat()}: runs {states}, executions {count}")
        tick += dt.timedelta(seconds=every)
    checked_injected = [t for t in injected if first_tick <= t <= last_tick]
    refused_ticks = sum(1 for t in checked_injected if any(row.duplicates_refused >= 1 for row in by_tick.get(t, [])))
    first_after: float | None = None
    if killed_at is not None:
        later = runs.filter(tick__gt=killed_at).order_by("started_at").first()
        if later is not None:
            first_after = (later.started_at - killed_at).total_seconds()
    total = runs.aggregate(total=Sum("duplicates_refused"))["total"] or 0
    missed = runs.filter(state="missed").count()
    return SoakReport(
        ticks_checked=checked,
        problems=problems,
        injected=len(checked_injected),
        injected_refused_ticks=refused_ticks,
        duplicates_refused=total,
        handover_seconds=handover,
        first_run_after_kill_seconds=first_after,
        missed=missed,
    )
