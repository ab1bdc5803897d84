"""Fixed-time faults: replicas racing, a frozen leader, and kill -9 of the process holding a schedule's lock.

Each tick of a fixed-time schedule must end as exactly one ``ScheduleRun`` row, and the handler
(``demo.record``, one ``Execution`` row per execution, keyed ``fixed:<name>@<tick>``) must have run
exactly once for a succeeded run and never for any other state. Recovery times are printed and
written to tests/artifacts/faults-servers.json.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections import Counter

import pytest
from django.db import connection

from project.celery import app as celery_app
from scheduling import schedules
from scheduling.core import locks, store
from scheduling.fixed import cron, gate, messages
from scheduling.models import RunState, SchedulePolicy, ScheduleRun
from tasks.models import Execution
from tests.e2e import fixed_soak
from tests.e2e.harness import wait_for, wait_ready
from tests.e2e.private_services import record_result

pytestmark = [pytest.mark.e2e]


def _declare(name: str, **fields: object) -> SchedulePolicy:
    fields.setdefault("kind", "demo.record")
    fields.setdefault("successful_history_limit", 10_000)
    fields.setdefault("failed_history_limit", 10_000)
    schedules.sync(declarations=[schedules.make(name=name, **fields)])  # type: ignore[arg-type]
    return SchedulePolicy.objects.get(periodic_task__name=name)


def _runs(name: str) -> list[ScheduleRun]:
    return list(ScheduleRun.objects.filter(schedule__periodic_task__name=name).order_by("tick", "id"))


def _executions(name: str) -> Counter[str]:
    keys = Execution.objects.filter(idempotency_key__startswith=f"fixed:{name}@").values_list(
        "idempotency_key", flat=True
    )
    return Counter(keys)


def _tick_problems(name: str, every: int, first: dt.datetime, last: dt.datetime, *, all_succeed: bool) -> list[str]:
    """Every tick from ``first`` to ``last``: one run row; one execution if it succeeded, none otherwise."""
    rows: dict[dt.datetime, list[ScheduleRun]] = {}
    for run in _runs(name):
        rows.setdefault(run.tick, []).append(run)
    executions = _executions(name)
    problems = []
    tick = first
    while tick <= last:
        states = [r.state for r in rows.get(tick, [])]
        ran = executions.get(f"fixed:{name}@{tick.isoformat()}", 0)
        expected_runs = 1 if states == [RunState.SUCCEEDED] else 0
        if len(states) != 1 or ran != expected_runs or (all_succeed and states != [RunState.SUCCEEDED]):
            problems.append(f"{name} {tick.isoformat()}: runs {states}, executions {ran}")
        tick += dt.timedelta(seconds=every)
    extra = [k for k, n in executions.items() if n > 1]
    problems += [f"{k} ran {executions[k]} times" for k in extra]
    return problems


@pytest.mark.slow
def test_two_beats_three_workers_one_run_per_tick_through_a_frozen_leader(cluster):
    """Two beats, three workers, 60 s, duplicate sends and a leader frozen 10 s: every tick runs exactly once."""
    workers = [cluster.worker(f"w{i}", concurrency=2) for i in (1, 2, 3)]
    beats = [cluster.beat("beat1"), cluster.beat("beat2")]
    for worker in workers:
        wait_ready(worker)
    beat_pids = {b.pid for b in beats}
    wait_for(lambda: fixed_soak.leader_pid() in beat_pids, 60, message="a beat to lead")
    # allow + run_all: the ticks of the 10 s the leader is frozen are sent when it thaws (within the 60 s late
    # tolerance, so as on-time ticks), each once.
    _declare("f6-allow-2s", every=2, concurrency_policy="allow", missed_policy="run_all", missed_window_seconds=120)
    # forbid + skip (the defaults): a 1 s run every 3 s; the frozen stretch's ticks sent at the thaw overlap (skipped).
    _declare("f6-forbid-3s", every=3, payload={"sleep": 1})
    started = store.database_now()

    begin = time.monotonic()
    injected = 0
    last_sent: dt.datetime | None = None
    frozen_at = thawed_at = None
    leader = None
    while time.monotonic() - begin < 60:
        tick = cron.interval_tick(dt.datetime.now(dt.UTC), 2)
        frozen = frozen_at is not None and thawed_at is None
        if tick != last_sent and tick > started and not frozen:
            last_sent = tick  # a third sender re-sends every tick of the 2 s schedule, racing beat's own send
            kwargs = messages.message_kwargs("f6-allow-2s", tick, "beat")  # signed, as another beat would
            celery_app.send_task("scheduling.run_fixed", kwargs=kwargs)
            injected += 1
        if frozen_at is None and time.monotonic() - begin >= 25:
            leader = fixed_soak.leader_pid()
            assert leader in beat_pids
            os.kill(leader, signal.SIGSTOP)  # alive, holding the leader lock, sending nothing
            frozen_at = store.database_now()
        if frozen_at is not None and thawed_at is None and time.monotonic() - begin >= 35:
            assert leader is not None
            os.kill(leader, signal.SIGCONT)
            thawed_at = store.database_now()
        time.sleep(0.05)
    end = store.database_now()
    wait_for(
        lambda: not ScheduleRun.objects.filter(state=RunState.RUNNING).exists(), 60, message="the last runs to end"
    )
    assert frozen_at is not None
    assert thawed_at is not None

    problems = _tick_problems(
        "f6-allow-2s", 2, cron.interval_next_after(started, 2), cron.interval_tick(end, 2) - dt.timedelta(seconds=4),
        all_succeed=True,
    )  # fmt: skip
    problems += _tick_problems(
        "f6-forbid-3s", 3, cron.interval_next_after(started, 3), cron.interval_tick(end, 3) - dt.timedelta(seconds=6),
        all_succeed=False,
    )  # fmt: skip
    assert problems == []
    # The forbid schedule only missed ticks while beat was frozen (and ran every other one).
    margin = dt.timedelta(seconds=3)
    for run in _runs("f6-forbid-3s"):
        if run.state != RunState.SUCCEEDED:
            assert frozen_at - margin <= run.tick <= thawed_at + margin, f"{run.tick}: {run.state} {run.error}"
    frozen_ticks = [r for r in _runs("f6-allow-2s") if frozen_at < r.tick < thawed_at]
    assert len(frozen_ticks) >= 4, "the ticks of the frozen stretch were sent after the thaw"
    late = [r for r in frozen_ticks if r.tick < thawed_at - dt.timedelta(seconds=2)]  # not the current tick at thaw
    # Late by under SCHEDULING_FIXED_LATE_SECONDS: sent as ticks of beat, not handed to missed_policy.
    assert [r.trigger for r in late] == ["beat"] * len(late), [(r.tick, r.trigger, r.started_at) for r in frozen_ticks]
    assert all(b.popen.poll() is None for b in beats)
    refused = sum(r.duplicates_refused for r in _runs("f6-allow-2s"))
    assert refused >= injected - 2, "beat sent the re-sent ticks too, and the ledger refused one of each pair"
    caught_up = (min(r.started_at for r in frozen_ticks) - thawed_at).total_seconds()
    lag = sorted((r.started_at - r.tick).total_seconds() for r in _runs("f6-allow-2s") if r.trigger == "beat")
    record_result(
        "fault_6_two_beats_three_workers",
        {
            "seconds": 60,
            "ticks_checked": len(_runs("f6-allow-2s")) + len(_runs("f6-forbid-3s")),
            "duplicate_sends_injected": injected,
            "duplicates_refused": refused,
            "leader_frozen_seconds": round((thawed_at - frozen_at).total_seconds(), 3),
            "recovery_first_catch_up_run_after_thaw_seconds": round(caught_up, 3),
            "tick_to_start_p50_seconds": round(lag[len(lag) // 2], 3),
            "tick_to_start_max_seconds": round(lag[-1], 3),
        },
    )


def _advisory_locks_in_pg_locks(key: int) -> int:
    """Granted advisory locks with ``key`` in pg_locks, read directly (not through ``locks``)."""
    classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            [classid, objid],
        )
        return int(cursor.fetchone()[0])


def test_kill_9_of_the_lock_holding_process_frees_the_lock_and_the_next_tick_runs(cluster):
    """SIGKILL of just the pool process holding a schedule's advisory lock: no lock left, the tick is not re-run."""
    policy = _declare("f7-forbid-3s", every=3, payload={"sleep": 6})
    worker = cluster.worker("w1", concurrency=2)
    cluster.beat("beat1")
    wait_ready(worker)
    running = wait_for(
        lambda: ScheduleRun.objects.filter(schedule=policy, state=RunState.RUNNING).first(), 60, message="a run"
    )
    holder = int(running.worker.rsplit(":", 1)[1])
    assert holder in worker.children(), "the run is on a pool process of our worker"
    key = locks.lock_key(gate.LOCK_NAMESPACE, str(policy.pk))
    wait_for(lambda: _advisory_locks_in_pg_locks(key) == 1, 10, message="the run to hold the lock")
    assert gate.is_running(policy.pk)

    os.kill(holder, signal.SIGKILL)  # only the process holding the lock; the worker itself lives on
    killed = time.monotonic()
    killed_at = store.database_now()
    wait_for(lambda: _advisory_locks_in_pg_locks(key) == 0, 15, 0.02, message="the lock to leave pg_locks")
    released = time.monotonic() - killed
    assert not locks.is_locked(gate.LOCK_NAMESPACE, str(policy.pk))
    nxt = wait_for(
        lambda: (
            ScheduleRun.objects.filter(schedule=policy, tick__gt=running.tick, state=RunState.RUNNING).first()
            or ScheduleRun.objects.filter(schedule=policy, tick__gt=running.tick, state=RunState.SUCCEEDED).first()
        ),
        30,
        message="a later tick to run",
    )
    next_started = (nxt.started_at - killed_at).total_seconds()
    wait_for(
        lambda: ScheduleRun.objects.get(pk=nxt.pk).state == RunState.SUCCEEDED, 30, message="the later tick to finish"
    )
    assert worker.popen.poll() is None, "the worker replaced its pool process and carried on"
    # The killed tick is not run again: Celery requeues its message (reject_on_worker_lost) and the ledger refuses it.
    wait_for(
        lambda: (
            ScheduleRun.objects.get(pk=running.pk).duplicates_refused >= 1
            or ScheduleRun.objects.get(pk=running.pk).state != RunState.RUNNING
        ),
        30,
        message="the killed tick's message to come back, or its row to be closed",
    )
    assert _executions("f7-forbid-3s")[f"fixed:f7-forbid-3s@{running.tick.isoformat()}"] == 1
    assert all(n == 1 for n in _executions("f7-forbid-3s").values())
    assert ScheduleRun.objects.filter(schedule=policy, tick=running.tick).count() == 1
    record_result(
        "fault_7_kill_9_lock_holder",
        {
            "lock_released_after_kill_seconds": round(released, 3),
            "recovery_next_tick_started_after_kill_seconds": round(next_started, 3),
            "killed_tick_runs": 1,
            "killed_tick_state_after": ScheduleRun.objects.get(pk=running.pk).state,
            "killed_tick_redeliveries_refused": ScheduleRun.objects.get(pk=running.pk).duplicates_refused,
        },
    )


@pytest.mark.slow
def test_an_allow_run_whose_worker_is_killed_is_closed_by_the_other_workers_leader(cluster):
    """kill -9 of the whole worker running an allow schedule's run: another worker's leader closes the row failed."""
    env = {"SCHEDULING_LEASE_SECONDS": "5", "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1"}
    policy = _declare(
        "orphan-allow", every=3600, concurrency_policy="allow", payload={"sleep": 60}, active_deadline_seconds=8
    )
    first = cluster.worker("w1", concurrency=1, env=env)
    wait_ready(first)
    gate.run_now("orphan-allow")
    running = wait_for(
        lambda: ScheduleRun.objects.filter(schedule=policy, state=RunState.RUNNING).first(), 60, 0.1, message="a run"
    )
    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool, as a lost container: nothing records an outcome
    killed_at = store.database_now()
    second = cluster.worker("w2", concurrency=1, env=env)
    wait_ready(second)
    closed = wait_for(
        lambda: ScheduleRun.objects.exclude(state=RunState.RUNNING).filter(pk=running.pk).first(),
        60,
        0.2,
        message="the orphaned run to be closed",
    )
    assert closed.state == RunState.FAILED
    assert "worker running it was lost" in closed.error
    assert ScheduleRun.objects.filter(schedule=policy).count() == 1, "its redelivered message ran nothing"
    record_result(
        "fixed_orphan_allow_run_closed",
        {"closed_after_kill_seconds": round((closed.finished_at - killed_at).total_seconds(), 1), "bound": "8 s + 5 s"},
    )
