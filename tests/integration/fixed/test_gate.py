"""The fixed-time gate on real PostgreSQL: ledger, overlap lock, deadline, timeout, retries, pruning."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django_celery_beat.models import PeriodicTask

from scheduling import registry, schedules
from scheduling import tasks as celery_tasks
from scheduling.core import store
from scheduling.fixed import gate, messages, orphans
from scheduling.models import OutcomeCounter, RunState, SchedulePolicy, ScheduleRun
from tasks.models import Execution
from tests.e2e import harness

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[tuple[str, int]] = []  # (job.ref, attempt) of every call of the probe kind
RELEASE = threading.Event()  # the probe waits on it when its payload says "wait"


@registry.handler("tests.fixed_probe", schema={"type": "object"}, timeout=30, backoff=registry.Backoff(0.01, 0.02))
def probe(job: registry.Job) -> None:
    """Record the call; wait, sleep or fail as the payload says."""
    CALLS.append((job.ref, job.attempt))
    if job.payload.get("wait"):
        RELEASE.wait(30)
    if job.payload.get("sleep"):
        time.sleep(float(job.payload["sleep"]))
    if job.attempt <= int(job.payload.get("fail_times", 0)):
        raise RuntimeError(f"attempt {job.attempt} fails on purpose")


@pytest.fixture(autouse=True)
def _reset_probe() -> Iterator[None]:
    CALLS.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


@pytest.fixture
def make_schedule() -> Callable[..., SchedulePolicy]:
    """Sync a fixed-time schedule (every 60 s unless told otherwise) and return its policy."""

    def make(name: str = "gate", **fields: Any) -> SchedulePolicy:
        fields.setdefault("kind", "tests.fixed_probe")
        if "cron" not in fields:
            fields.setdefault("every", 60)
        declaration = schedules.make(name=name, **fields)
        schedules.sync(declarations=[declaration])
        return SchedulePolicy.objects.select_related("periodic_task").get(periodic_task__name=name)

    return make


def db_now() -> dt.datetime:
    return store.database_now()


def in_thread(func: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``func`` on its own thread (and its own database connection, closed at the end)."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(func())
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def run_of(policy: SchedulePolicy, tick: dt.datetime) -> ScheduleRun:
    return ScheduleRun.objects.get(schedule=policy, tick=tick)


def test_duplicate_deliveries_of_a_tick_are_refused_counted_and_never_run(make_schedule):
    """Four concurrent deliveries of one tick: one runs, three are refused and counted; a fifth later too."""
    policy = make_schedule()
    tick = db_now().replace(microsecond=0)
    barrier = threading.Barrier(4)

    def deliver() -> gate.RunReport:
        barrier.wait()
        return gate.run("gate", tick, task_id="t")

    threads = [in_thread(deliver) for _ in range(4)]
    for thread, _ in threads:
        thread.join(30)
    outcomes = sorted(out[0].outcome for _, out in threads)
    assert outcomes == ["refused", "refused", "refused", "succeeded"]
    assert run_of(policy, tick).duplicates_refused == 3
    assert gate.run("gate", tick).outcome == "refused"
    row = run_of(policy, tick)
    assert row.duplicates_refused == 4
    assert row.state == RunState.SUCCEEDED
    assert len(CALLS) == 1
    assert CALLS[0][0] == f"gate@{tick.isoformat()}"


def test_forbid_skips_a_tick_while_another_session_holds_the_lock(make_schedule):
    """forbid: with the schedule's lock held by another connection the tick is recorded skipped, not run."""
    policy = make_schedule(concurrency_policy="forbid", failed_history_limit=5)
    other = gate.lock_for(policy.pk)
    assert other.try_acquire()
    try:
        tick = db_now()
        report = gate.run("gate", tick)
    finally:
        other.release()
    assert report.outcome == RunState.SKIPPED
    row = run_of(policy, tick)
    assert row.state == RunState.SKIPPED
    assert "still going" in row.error
    assert row.finished_at is not None
    assert CALLS == []
    assert gate.run("gate", db_now()).outcome == RunState.SUCCEEDED, "free again once the other session let go"


@pytest.mark.parametrize("repeat", range(3))
def test_two_ticks_at_once_under_forbid_one_runs_and_the_other_is_skipped(make_schedule, repeat):
    """Two ticks delivered together (a backlog): one runs, the other is skipped, never closed as a lost run."""
    policy = make_schedule(concurrency_policy="forbid", payload={"sleep": 0.3}, failed_history_limit=5)
    now = db_now()
    ticks = [now - dt.timedelta(seconds=2), now - dt.timedelta(seconds=1)]
    barrier = threading.Barrier(2)

    def deliver(tick: dt.datetime) -> gate.RunReport:
        barrier.wait()
        return gate.run("gate", tick)

    threads = [in_thread(lambda t=t: deliver(t)) for t in ticks]
    for thread, _ in threads:
        thread.join(30)
    assert sorted(out[0].outcome for _, out in threads) == ["skipped", "succeeded"]
    states = sorted(ScheduleRun.objects.filter(schedule=policy).values_list("state", flat=True))
    assert states == ["skipped", "succeeded"]


def test_allow_runs_even_while_the_lock_is_held(make_schedule):
    """allow takes no lock: a tick runs while another session holds the schedule's lock."""
    policy = make_schedule(concurrency_policy="allow")
    other = gate.lock_for(policy.pk)
    assert other.try_acquire()
    try:
        assert gate.run("gate", db_now()).outcome == RunState.SUCCEEDED
    finally:
        other.release()


def test_a_tick_past_its_starting_deadline_is_missed_not_run(make_schedule):
    """A tick 120 s old by the database clock with a 60 s starting deadline is missed; a fresh one runs."""
    policy = make_schedule(starting_deadline_seconds=60, failed_history_limit=5)
    old = db_now() - dt.timedelta(seconds=120)
    assert gate.run("gate", old).outcome == RunState.MISSED
    assert "starting deadline is 60s" in run_of(policy, old).error
    assert CALLS == []
    fresh = db_now() - dt.timedelta(seconds=30)
    assert gate.run("gate", fresh).outcome == RunState.SUCCEEDED
    assert gate.run("gate", old - dt.timedelta(seconds=1), trigger="manual").outcome == RunState.SUCCEEDED


def test_run_now_does_not_refuse_a_beat_tick_still_in_the_queue(make_schedule):
    """History limit 1: a second "run now" used to prune the first and move the watermark to its tick (the wall
    clock when it was asked), past a beat tick sent earlier and not yet delivered, which was then refused for ever."""
    policy = make_schedule(successful_history_limit=1)
    queued = db_now().replace(microsecond=0) - dt.timedelta(seconds=5)  # beat sent it; it waits in the queue
    manual = [db_now(), db_now() + dt.timedelta(seconds=1)]
    for tick in manual:
        assert gate.run("gate", tick, trigger="manual").outcome == RunState.SUCCEEDED
    assert gate.run("gate", queued).outcome == RunState.SUCCEEDED, "delivered late, it still runs once"
    assert gate.run("gate", queued).outcome == "refused", "and only once"
    kept = set(ScheduleRun.objects.filter(schedule=policy, trigger="manual").values_list("tick", flat=True))
    assert kept == set(manual), "run-now rows are kept while their messages could come again"


def test_a_run_now_tick_delayed_behind_beats_ticks_still_runs_once(make_schedule):
    """History limit 1: beat's later ticks run and are pruned, the watermark passes the waiting run-now tick;
    it still runs (the watermark is beat's), and its row refuses a copy."""
    make_schedule(successful_history_limit=1)
    now = db_now().replace(microsecond=0)
    asked = now - dt.timedelta(seconds=3)  # "run now" clicked; its message waits behind two of beat's
    for tick in (now - dt.timedelta(seconds=2), now - dt.timedelta(seconds=1)):
        assert gate.run("gate", tick).outcome == RunState.SUCCEEDED
    assert gate.run("gate", asked, trigger="manual").outcome == RunState.SUCCEEDED
    assert gate.run("gate", asked, trigger="manual").outcome == "refused"


def test_a_paused_kind_skips_its_fixed_time_ticks_with_the_reason(make_schedule):
    """While its kind is paused a schedule's ticks (beat's and run now's) are skipped, not run; resumed, they run."""
    from scheduling import api

    policy = make_schedule(failed_history_limit=5)
    api.pause("tests.fixed_probe")
    tick = db_now().replace(microsecond=0) - dt.timedelta(seconds=5)
    assert gate.run("gate", tick).outcome == RunState.SKIPPED
    assert run_of(policy, tick).error == (
        "kind tests.fixed_probe is paused: its fixed-time runs are skipped until it is resumed"
    )
    assert gate.run("gate", tick + dt.timedelta(seconds=1), trigger="manual").outcome == RunState.SKIPPED
    assert CALLS == []
    api.resume("tests.fixed_probe")
    assert gate.run("gate", tick + dt.timedelta(seconds=2)).outcome == RunState.SUCCEEDED
    assert len(CALLS) == 1


def test_history_is_pruned_to_its_limits_and_pruned_ticks_stay_refused(make_schedule):
    """Limits 2 succeeded / 1 failed keep the latest of each; a late delivery of a pruned tick is still refused."""
    policy = make_schedule(successful_history_limit=2, failed_history_limit=1)
    base = db_now().replace(microsecond=0) - dt.timedelta(minutes=30)
    ok_ticks = [base + dt.timedelta(minutes=i) for i in range(4)]
    for tick in ok_ticks:
        assert gate.run("gate", tick).outcome == RunState.SUCCEEDED
    SchedulePolicy.objects.filter(pk=policy.pk).update(payload={"fail_times": 9})
    bad_ticks = [base + dt.timedelta(minutes=10 + i) for i in range(2)]
    for tick in bad_ticks:
        assert gate.run("gate", tick).outcome == RunState.FAILED
    rows = list(ScheduleRun.objects.filter(schedule=policy).order_by("tick").values_list("tick", "state"))
    assert rows == [(ok_ticks[2], "succeeded"), (ok_ticks[3], "succeeded"), (bad_ticks[1], "failed")]
    calls = len(CALLS)
    assert gate.run("gate", ok_ticks[0]).outcome == "refused"
    assert gate.run("gate", bad_ticks[0]).outcome == "refused"
    assert len(CALLS) == calls
    assert SchedulePolicy.objects.get(pk=policy.pk).pruned_through == bad_ticks[0]


def test_the_lock_is_held_for_the_run_and_released_after_it(make_schedule):
    """While a run goes the schedule's lock is in pg_locks and its row says running; after it, neither."""
    policy = make_schedule(payload={"wait": True})
    tick = db_now()
    thread, out = in_thread(lambda: gate.run("gate", tick))
    harness.wait_for(lambda: CALLS, 10, message="the run to start")
    assert gate.is_running(policy.pk)
    assert run_of(policy, tick).state == RunState.RUNNING
    RELEASE.set()
    thread.join(30)
    assert out[0].outcome == RunState.SUCCEEDED
    assert not gate.is_running(policy.pk)
    row = run_of(policy, tick)
    assert row.state == RunState.SUCCEEDED
    assert row.finished_at >= row.started_at


def _subprocess_run(name: str, tick: dt.datetime, task_id: str) -> subprocess.Popen[bytes]:
    """A separate process running one tick through the gate (demo.record sleeping 60 s), like a worker."""
    code = (
        "import datetime, django; django.setup(); from scheduling.fixed import gate; "
        f"gate.run({name!r}, datetime.datetime.fromisoformat({tick.isoformat()!r}), task_id={task_id!r})"
    )
    env = harness.base_env()
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=harness.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def test_a_killed_run_releases_the_lock_and_the_next_tick_closes_its_row(make_schedule):
    """SIGKILL of the process running a tick frees the lock (pg_locks); the next tick runs and marks it failed."""
    policy = make_schedule(name="killed", kind="demo.record", payload={"sleep": 60}, failed_history_limit=5)
    first = db_now()
    proc = _subprocess_run("killed", first, "task-1")
    try:
        harness.wait_for(lambda: gate.is_running(policy.pk), 30, message="the subprocess to take the lock")
        assert gate.run("killed", db_now()).outcome == RunState.SKIPPED, "forbid while it runs"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        harness.wait_for(lambda: not gate.is_running(policy.pk), 10, message="the lock to be released")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    SchedulePolicy.objects.filter(pk=policy.pk).update(payload={})
    second = db_now()
    assert gate.run("killed", second).outcome == RunState.SUCCEEDED
    dead = run_of(policy, first)
    assert dead.state == RunState.FAILED
    assert "worker running it was lost" in dead.error
    assert not gate.is_running(policy.pk)


def test_replace_waits_for_the_stopped_run_and_marks_it_replaced(make_schedule, settings):
    """replace: the new tick waits for the previous run's lock, then marks that run replaced and runs."""
    settings.SCHEDULING_FIXED_REPLACE_WAIT_SECONDS = 20
    policy = make_schedule(name="swap", kind="demo.record", concurrency_policy="replace", payload={"sleep": 60})
    first = db_now()
    proc = _subprocess_run("swap", first, "task-old")
    try:
        harness.wait_for(lambda: gate.is_running(policy.pk), 30, message="the first run to take the lock")
        SchedulePolicy.objects.filter(pk=policy.pk).update(payload={})
        second = db_now()
        thread, out = in_thread(lambda: gate.run("swap", second, task_id="task-new"))
        time.sleep(1.5)
        assert thread.is_alive(), "the new run waits while the old one holds the lock"
        assert not ScheduleRun.objects.filter(schedule=policy, tick=second).exists(), "admission is not committed yet"
        os.kill(proc.pid, signal.SIGKILL)  # what the revoke with terminate=True does on a real worker
        thread.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert out[0].outcome == RunState.SUCCEEDED
    old = run_of(policy, first)
    assert old.state == RunState.REPLACED
    assert old.error == f"stopped for the run of {second.isoformat()}"


def test_replace_gives_up_when_the_previous_run_does_not_stop(make_schedule, settings):
    """replace: if the previous run still holds the lock after the wait, the new tick is recorded skipped."""
    settings.SCHEDULING_FIXED_REPLACE_WAIT_SECONDS = 1
    policy = make_schedule(concurrency_policy="replace", failed_history_limit=5)
    other = gate.lock_for(policy.pk)
    assert other.try_acquire()
    try:
        tick = db_now()
        assert gate.run("gate", tick).outcome == RunState.SKIPPED
    finally:
        other.release()
    assert "did not stop within 1s" in run_of(policy, tick).error


def test_the_active_deadline_stops_a_run(make_schedule):
    """A run sleeping 5 s under a 1 s active deadline is stopped and recorded timed_out, and the lock is freed."""
    policy = make_schedule(payload={"sleep": 5}, active_deadline_seconds=1, failed_history_limit=5)
    tick = db_now()
    started = time.monotonic()
    assert gate.run("gate", tick).outcome == RunState.TIMED_OUT
    assert time.monotonic() - started < 5, "stopped: it did not sleep its 5 s out"
    row = run_of(policy, tick)
    assert row.state == RunState.TIMED_OUT
    assert row.error == "stopped after 1s (active deadline)"
    assert not gate.is_running(policy.pk)


def test_backoff_retries_within_the_tick(make_schedule):
    """backoff_limit=2: two failures then success is one succeeded run of attempt 3; with 1 retry it fails."""
    policy = make_schedule(payload={"fail_times": 2}, backoff_limit=2, failed_history_limit=5)
    tick = db_now()
    assert gate.run("gate", tick).outcome == RunState.SUCCEEDED
    row = run_of(policy, tick)
    assert row.attempt == 3
    assert [attempt for _, attempt in CALLS] == [1, 2, 3]
    assert len({ref for ref, _ in CALLS}) == 1, "one idempotency key across the retries of a tick"
    SchedulePolicy.objects.filter(pk=policy.pk).update(backoff_limit=1)
    later = db_now()
    assert gate.run("gate", later).outcome == RunState.FAILED
    failed = run_of(policy, later)
    assert failed.attempt == 2
    assert failed.error == "RuntimeError: attempt 2 fails on purpose"


def refused_count() -> int:
    row = OutcomeCounter.objects.filter(metric="refused_messages", label="scheduling.run_fixed").first()
    return row.value if row is not None else 0


def test_a_run_fixed_message_not_made_by_beat_or_run_now_runs_nothing(make_schedule, caplog):
    """Hand-made run_fixed messages (no tick, unsigned, made-up or another tick's signature) are refused and counted."""
    policy = make_schedule()
    tick = db_now().isoformat()
    real = messages.message_kwargs("gate", dt.datetime.fromisoformat(tick), "beat")
    forged = [
        {"schedule": "gate"},  # a periodic task sent by hand: once a manual run at "now"
        {"schedule": "gate", "tick": tick, "trigger": "manual"},  # as Flower's send-task would send it
        {"schedule": "gate", "tick": tick, "trigger": "beat", "signature": "A" * 43},
        {**real, "trigger": "manual"},  # beat's signature, with the deadline-free trigger
        {**real, "tick": db_now().isoformat()},  # beat's signature, another tick
        {**real, "schedule": "other"},
        {**real, "policy": str(policy.pk + 1)},  # beat's signature, another policy row
        {key: value for key, value in real.items() if key != "policy"},  # a message signed before #22
    ]
    with caplog.at_level(logging.ERROR, logger="scheduling.fixed.messages"):
        for kwargs in forged:
            result = celery_tasks.run_fixed.apply(kwargs=kwargs).get()
            assert result == {"outcome": "refused", "run_id": None, "attempt": 0}, kwargs
    assert not ScheduleRun.objects.filter(schedule=policy).exists()
    assert refused_count() == len(forged)
    refusals = [r for r in caplog.records if getattr(r, "action", "") == "refused_unsigned"]
    assert len(refusals) == len(forged)
    assert all(tick not in r.getMessage() + str(r.__dict__) for r in refusals), "the tick is not logged"


def test_a_tick_sent_before_its_schedule_was_renamed_runs_under_the_renamed_schedule(make_schedule):
    """The message names the policy row it was signed for: a rename while it waits (the admin's, which
    edits.point_at_gate supports) loses no tick. Found by name, it raised ScheduleNotFound: no row, no run."""
    policy = make_schedule(name="before-rename")
    tick = db_now().replace(microsecond=0)
    kwargs = messages.message_kwargs("before-rename", tick, "beat", policy_id=policy.pk)
    PeriodicTask.objects.filter(pk=policy.periodic_task_id).update(name="after-rename")
    assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == "succeeded"
    assert list(ScheduleRun.objects.filter(schedule=policy).values_list("tick", "state")) == [
        (tick, RunState.SUCCEEDED)
    ]
    assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == "refused", "its copy: the ledger's"


def test_a_tick_of_a_schedule_deleted_since_is_refused_and_counted(make_schedule):
    """Its policy row is gone: refused like a message of another row (not a ScheduleNotFound in Celery)."""
    policy = make_schedule(name="deleted-since")
    kwargs = messages.message_kwargs("deleted-since", db_now().replace(microsecond=0), "beat", policy_id=policy.pk)
    PeriodicTask.objects.filter(pk=policy.periodic_task_id).delete()
    assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == "refused"
    assert refused_count() == 1


def test_a_signed_tick_runs_once_and_its_copy_is_refused_by_the_ledger(make_schedule):
    """The message beat signs runs through the gate; the same message sent again is a duplicate, not a new run."""
    policy = make_schedule()
    kwargs = messages.message_kwargs("gate", db_now(), "beat")
    first = celery_tasks.run_fixed.apply(kwargs=kwargs).get()
    assert first["outcome"] == RunState.SUCCEEDED
    assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == "refused"
    assert ScheduleRun.objects.filter(schedule=policy).count() == 1
    assert refused_count() == 0, "a duplicate is the ledger's refusal, not a forged message"


@pytest.mark.parametrize("trigger", ["beat", "manual"])
def test_a_message_signed_before_the_schedule_was_deleted_and_declared_again_is_refused(make_schedule, trigger):
    """#22: a captured message of a deleted schedule does not run against its re-declaration; a fresh one does."""
    old = make_schedule()
    tick = db_now()
    captured = messages.message_kwargs("gate", tick, trigger, policy_id=old.pk)
    PeriodicTask.objects.filter(name="gate").delete()  # deleting the schedule deletes its policy and ledger
    new = make_schedule()
    assert new.pk != old.pk
    result = celery_tasks.run_fixed.apply(kwargs=captured).get()
    assert result == {"outcome": "refused", "run_id": None, "attempt": 0}
    assert not ScheduleRun.objects.exists(), "the old message recorded nothing"
    assert CALLS == []
    assert refused_count() == 1, "counted like a bad signature"
    fresh = messages.message_kwargs("gate", tick, trigger, policy_id=new.pk)
    assert celery_tasks.run_fixed.apply(kwargs=fresh).get()["outcome"] == RunState.SUCCEEDED
    assert ScheduleRun.objects.filter(schedule=new, tick=tick).count() == 1
    assert len(CALLS) == 1


def test_a_tick_signed_with_a_rotated_out_key_still_runs(make_schedule, settings):
    """SECRET_KEY_FALLBACKS: a tick beat signed before a key rotation runs after it."""
    make_schedule()
    kwargs = messages.message_kwargs("gate", db_now(), "beat")
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "rotated-" + "k" * 50
    assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == RunState.SUCCEEDED


def test_run_now_sends_a_manual_tick_to_the_broker(make_schedule):
    """run_now() puts a scheduling.run_fixed message with a database-clock tick and trigger manual on Redis."""
    policy = make_schedule()
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = settings.CELERY_BROKER_KEYPREFIX + settings.CELERY_TASK_DEFAULT_QUEUE  # this run's keys only
    client.delete(queue)
    before = db_now()
    task_id = gate.run_now("gate")
    sent = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]
    client.delete(queue)
    ours = [m for m in sent if m["headers"]["id"] == task_id]
    assert len(ours) == 1
    assert ours[0]["headers"]["task"] == "scheduling.run_fixed"
    _, kwargs, _ = json.loads(base64.b64decode(ours[0]["body"]))
    assert kwargs["schedule"] == "gate"
    assert kwargs["trigger"] == "manual"
    assert dt.datetime.fromisoformat(kwargs["tick"]) >= before
    assert kwargs["policy"] == str(policy.pk)
    assert messages.authentic(
        kwargs["schedule"], kwargs["tick"], kwargs["trigger"], kwargs["signature"], kwargs["policy"]
    )


def test_demo_record_counts_executions_per_tick(make_schedule):
    """A demo.record schedule writes one Execution per tick, keyed fixed:<schedule>@<tick>."""
    make_schedule(name="counted", kind="demo.record")
    tick = db_now()
    gate.run("counted", tick)
    gate.run("counted", tick)
    assert Execution.objects.filter(idempotency_key=f"fixed:counted@{tick.isoformat()}").count() == 1


def test_an_abort_interrupts_the_running_run_and_records_who_asked(make_schedule):
    """abort_schedule_run() while the handler sleeps: interrupted, recorded aborted with who and when, no retry."""
    from django.test import override_settings

    from scheduling import api, exceptions

    policy = make_schedule(payload={"sleep": 30, "fail_times": 0}, backoff_limit=2, failed_history_limit=5)
    tick = db_now()

    def ask() -> None:
        run = harness.wait_for(
            lambda: ScheduleRun.objects.filter(schedule=policy, state=RunState.RUNNING).first(), 30, 0.02, "the run"
        )
        harness.wait_for(lambda: CALLS, 30, 0.02, "the handler to start")
        api.abort_schedule_run(run.pk, by="bob")

    with override_settings(SCHEDULING_HEARTBEAT_SECONDS=0.05):
        thread, _ = in_thread(ask)
        report = gate.run("gate", tick)
        thread.join()
    assert report.outcome == RunState.ABORTED
    run = run_of(policy, tick)
    assert (run.state, run.abort_requested_by) == (RunState.ABORTED, "bob")
    assert run.error.startswith("aborted by bob at ")
    assert len(CALLS) == 1, "no retry after an abort"
    with pytest.raises(exceptions.RunNotRunning):
        api.abort_schedule_run(run.pk)
    for not_an_id in (True, 1.5, "abc"):  # were a ProgrammingError or a DataError in the SQL
        with pytest.raises(exceptions.InvalidSchedule, match="run_id must be a whole number"):
            api.abort_schedule_run(not_an_id)
    with pytest.raises(exceptions.RunNotRunning, match="does not exist"):
        api.abort_schedule_run(2**70)
    with pytest.raises(exceptions.RunNotRunning, match="Schedule run past bigint does not exist"):
        api.abort_schedule_run(10**5000)  # str() refuses 4,300 digits: the message does not write it out


def _allow_run_going(make_schedule: Callable[..., SchedulePolicy], **fields: Any) -> tuple[dt.datetime, Any, list]:
    """An allow schedule's run, admitted and waiting in its handler on another thread."""
    policy = make_schedule(concurrency_policy="allow", payload={"wait": True}, **fields)
    tick = db_now().replace(microsecond=0)
    thread, out = in_thread(lambda: gate.run("gate", tick))
    harness.wait_for(lambda: ScheduleRun.objects.filter(schedule=policy, tick=tick).exists(), 10, message="admitted")
    harness.wait_for(lambda: CALLS, 10, message="its handler to run")
    return tick, thread, out


def test_a_run_admitted_under_allow_is_not_lost_when_its_schedule_becomes_forbid(make_schedule):
    """Edited to forbid while an allow run goes: the orphan duty judged it by the policy now (its lock "free"),
    closed it as lost, and the next tick ran beside it. Now it is judged by what it was admitted under:
    left running, and forbid skips the next tick while it goes. Found by review."""
    tick, thread, out = _allow_run_going(make_schedule)
    policy = make_schedule(concurrency_policy="forbid", payload={"wait": True})
    assert orphans.close_orphans().closed == []
    nxt = gate.run("gate", tick + dt.timedelta(minutes=1))
    assert nxt.outcome == "skipped"
    RELEASE.set()
    thread.join(30)
    assert out[0].outcome == "succeeded"
    assert ScheduleRun.objects.get(schedule=policy, tick=tick).state == RunState.SUCCEEDED


def test_a_run_admitted_under_allow_keeps_its_deadline_when_the_schedules_is_cut(make_schedule, settings):
    """The active deadline cut from 50 s to 1 s while it runs: not closed as lost a lease past the new one."""
    settings.SCHEDULING_LEASE_SECONDS = 1
    tick, thread, out = _allow_run_going(make_schedule, active_deadline_seconds=50)
    policy = make_schedule(concurrency_policy="allow", payload={"wait": True}, active_deadline_seconds=1)
    run = ScheduleRun.objects.get(schedule=policy, tick=tick)
    assert (run.holds_lock, run.deadline_seconds) == (False, 50.0)
    ScheduleRun.objects.filter(pk=run.pk).update(started_at=db_now() - dt.timedelta(seconds=5))  # 5 s old: past 1 + 1
    assert orphans.close_orphans().closed == []
    RELEASE.set()
    thread.join(30)
    assert out[0].outcome == "succeeded"


def test_replace_stops_and_marks_a_run_admitted_under_allow_before_the_edit(make_schedule):
    """Edited to replace while an allow run goes: the next tick takes the free lock; the allow run (no lock to
    wait for) is revoked and marked replaced, not left running beside it (found by review)."""
    tick, thread, out = _allow_run_going(make_schedule)
    policy = make_schedule(concurrency_policy="replace", payload={})
    nxt = gate.run("gate", tick + dt.timedelta(minutes=1))
    assert nxt.outcome == "succeeded"
    first = ScheduleRun.objects.get(schedule=policy, tick=tick)
    assert first.state == RunState.REPLACED
    RELEASE.set()
    thread.join(30)
    assert out[0].outcome != "succeeded", "its own outcome came after it was replaced"
    assert ScheduleRun.objects.get(pk=first.pk).state == RunState.REPLACED
