"""run_fixed messages through a real worker and beat: beat's signed ticks run once each, hand-made ones never."""

from __future__ import annotations

import datetime as dt

import pytest

from project.celery import app as celery_app
from scheduling import schedules
from scheduling.core import store
from scheduling.fixed import cron
from scheduling.models import OutcomeCounter, RunTrigger, SchedulePolicy, ScheduleRun
from tasks.models import Execution
from tests.e2e import fixed_soak
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]

EVERY = 3  # seconds between the schedule's ticks
REFUSED = "fixed-time run message refused"


def refused_total() -> int:
    row = OutcomeCounter.objects.filter(metric="refused_messages", label="scheduling.run_fixed").first()
    return row.value if row is not None else 0


def test_hand_published_run_fixed_messages_run_nothing_while_beats_ticks_run_once(cluster):
    """send_task (as Flower sends it) with a made-up, an old or no tick: refused, no run row; beat's ticks run once."""
    name = "signed-3s"
    worker = cluster.worker(concurrency=1)
    wait_ready(worker)
    schedules.sync(declarations=[schedules.make(name=name, kind="demo.record", every=EVERY)])
    policy = SchedulePolicy.objects.get(periodic_task__name=name)
    now = store.database_now()
    on_grid = cron.interval_tick(now, EVERY)
    forged_ticks = {
        now + dt.timedelta(seconds=EVERY + 0.5),  # off the schedule's grid, "beat"
        on_grid - dt.timedelta(hours=1),  # a real tick of the schedule, long before it existed
        on_grid + dt.timedelta(seconds=EVERY * 4),  # a real tick, in the future
    }
    for tick in sorted(forged_ticks):
        celery_app.send_task("scheduling.run_fixed", kwargs={"schedule": name, "tick": tick.isoformat()})
    celery_app.send_task(
        "scheduling.run_fixed", kwargs={"schedule": name, "tick": now.isoformat(), "trigger": RunTrigger.MANUAL}
    )
    celery_app.send_task("scheduling.run_fixed", kwargs={"schedule": name})  # a periodic task "run" by hand
    forged = len(forged_ticks) + 2
    wait_for(lambda: worker.log().count(REFUSED) == forged, 60, message="the worker to refuse every forged message")

    beat = cluster.beat()
    wait_for(lambda: fixed_soak.leader_pid() == beat.pid, 60, message="beat to lead")
    wait_for(lambda: ScheduleRun.objects.filter(schedule=policy).count() >= 3, 60, message="three of beat's ticks")
    beat.stop()
    wait_for(
        lambda: not ScheduleRun.objects.filter(schedule=policy, state="running").exists(), 30, message="runs to end"
    )

    runs = list(ScheduleRun.objects.filter(schedule=policy).order_by("tick"))
    assert {r.trigger for r in runs} == {RunTrigger.BEAT}, "only beat's ticks ran"
    assert not {r.tick for r in runs} & forged_ticks
    assert all(r.tick == cron.interval_tick(r.tick, EVERY) for r in runs), "every run is a tick of the schedule"
    assert len({r.tick for r in runs}) == len(runs), "each tick has one run"
    keys = list(Execution.objects.filter(idempotency_key__startswith=f"fixed:{name}@").values_list("idempotency_key"))
    assert sorted(k for (k,) in keys) == sorted(
        f"fixed:{name}@{r.tick.isoformat()}" for r in runs if r.state == "succeeded"
    )
    assert refused_total() == forged
    assert worker.log().count(REFUSED) == forged
    for tick in forged_ticks:
        assert tick.isoformat() not in worker.log(), "a refused message's tick is not logged"
