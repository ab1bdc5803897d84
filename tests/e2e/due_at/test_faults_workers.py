"""Worker faults against real Celery processes: kill -9, SIGSTOP, poison pills, clock skew, shutdown.

Each test starts its own beat and workers (``cluster``) with short leases (the test kinds in
``tests.faultkit.kinds`` lease for 2-3 s, workers heartbeat every second, beat sweeps every
second), injects the fault with a signal on a pid the test started, and then checks the rows:
the database is the truth. Workers run two pool processes: the claim loop occupies one while it
leads, jobs run in the other. Recovery times are measured on the database clock, printed, and
written to ``tests/artifacts/faults.json``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from scheduling import api, exceptions
from scheduling import tasks as celery_tasks
from scheduling.core import locks
from scheduling.deferrals import countdowns
from scheduling.due_at import control, runner
from scheduling.models import CLAIM_STATES, AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution, Notification
from tests.e2e.harness import Cluster, Proc, wait_for, wait_ready
from tests.faultkit import measure
from tests.faultkit.kinds import handlers as fault_kinds  # registers the test kinds in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Workers and beat load the test kinds, heartbeat every second and sweep every second.
FAST = {
    "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings",
    "SCHEDULING_HEARTBEAT_SECONDS": "1",
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1",
    "CELERY_BROKER_RESTORE_INTERVAL_SECONDS": "1",
}


def _start(cluster: Cluster, workers: int = 1, concurrency: int = 2, env: dict[str, str] | None = None) -> list[Proc]:
    procs = [cluster.worker(f"w{i + 1}", concurrency=concurrency, env={**FAST, **(env or {})}) for i in range(workers)]
    cluster.beat(env=FAST)
    for proc in procs:
        wait_ready(proc)
    return procs


def _job(job_id: int) -> ScheduledJob:
    return ScheduledJob.objects.get(pk=job_id)


def _executions(job_id: int) -> list[Execution]:
    return list(Execution.objects.filter(idempotency_key=f"job:{job_id}").order_by("id"))


def _outcomes(job_id: int) -> list[str]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("number").values_list("outcome", flat=True))


def _notifications(job_id: int) -> int:
    return Notification.objects.filter(idempotency_key=f"job:{job_id}").count()


def _wait_state(job_id: int, state: str, timeout: float) -> ScheduledJob:
    wait_for(lambda: _job(job_id).state == state, timeout, message=f"job {job_id} to be {state}")
    return _job(job_id)


def _loop_lock_held() -> bool:
    """Whether some process holds the cluster-wide control-loop lead (a bigint advisory lock)."""
    key = locks.lock_key(control.ROLE, "leader") & 0xFFFFFFFFFFFFFFFF
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
            " AND classid::bigint = %s AND objid::bigint = %s",
            [key >> 32, key & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0] > 0


def _leads_control(proc: Proc) -> bool:
    """Whether ``proc`` leads the control loop (claiming and sweeping) and has not lost the lead since."""
    log = proc.log()
    led = log.rfind("control loop leads here")
    return led >= 0 and log.find("lost the lead", led) < 0


def _finished_lines(proc: Proc, task_id: str) -> list[str]:
    """The log lines where ``proc`` reports the message ``task_id`` done (with its return value)."""
    return [line for line in proc.log().splitlines() if f"[{task_id}] succeeded" in line]


def _batches_received(proc: Proc, kind: str) -> list[str]:
    """Ids of the run_batch messages ``proc`` received for ``kind``, once per delivery.

    Worker logs show a batch as ``batch:<kind>`` (Celery's ``shadow`` header), or as
    ``scheduling.run_batch`` when no name was given.
    """
    return re.findall(rf"(?:scheduling\.run_batch|batch:{re.escape(kind)})\[([0-9a-f-]+)\] received", proc.log())


def _owner(procs: list[Proc], pid: int) -> Proc:
    (owner,) = [p for p in procs if pid in p.children()]
    return owner


# --- 1. kill -9 in the middle of a due_at job -------------------------------------------------------


def test_kill_9_of_the_pool_process_mid_job_reruns_it_once(cluster):
    """kill -9 of the pool process running a job: reclaimed after the lease, rerun once, one side effect."""
    via, kind, hold = "run_batch", "faults.effect", 30
    (worker,) = _start(cluster)
    job = api.schedule(kind, {"hold": hold}, delay=0)
    first = wait_for(lambda: _executions(job.id), 30, message="the job to start")[0]
    assert first.pid in worker.children(), "the job runs in one of this worker's pool processes"
    killed_at = measure.db_now()  # read just before the fault: recovery times are not understated
    os.kill(first.pid, signal.SIGKILL)

    done = _wait_state(job.id, JobState.DONE, 45)
    reclaimed, succeeded = JobAttempt.objects.filter(job_id=job.id).order_by("number")
    runs = _executions(job.id)
    assert (reclaimed.outcome, succeeded.outcome) == (AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED)
    assert done.attempts == 2
    assert len(runs) == 2
    assert runs[1].pid != first.pid
    assert runs[1].pid in worker.children(), "the worker replaced its pool process and ran the job again"
    assert _notifications(job.id) == 1, "the re-run sends nothing: one side effect"
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()
    # reject_on_worker_lost put the message back; its redelivery found the claim started and ran nothing.
    wait_for(lambda: "claims skipped" in worker.log(), 10, message="the redelivered batch to be skipped")
    reclaim_s = measure.seconds(reclaimed.finished_at, killed_at)
    lease = fault_kinds.EFFECT_LEASE_SECONDS
    assert lease - 1.5 <= reclaim_s <= lease + 10, "taken back after the lease, not before, not much later"
    measure.record(
        f"1a kill -9 pool process mid-job ({via})",
        "reclaimed after the lease, ran again, 1 notification, nothing left claimed",
        lease_s=lease,
        kill_to_reclaim_s=reclaim_s,
        kill_to_rerun_s=measure.seconds(succeeded.started_at, killed_at),
        kill_to_done_s=measure.seconds(done.finished_at, killed_at),
    )


def _held_in_postgres() -> bool:
    """Whether some session is inside faults.atomic_effect's pg_sleep (the job runs; nothing committed yet)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE query LIKE '%%AS faults_atomic_hold%%' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_kill_9_mid_atomic_batch_leaves_no_effect_and_every_job_commits_once(cluster):
    """kill -9 mid-batch of an atomic kind: the unfinished chunk's writes vanish; each job commits one effect."""
    (worker,) = _start(cluster)
    # The held job's pg_sleep outlives its killed process (PostgreSQL notices the lost client when the
    # statement ends), and the rescue waits for it: 10 s is ample to see the hold and kill, and no longer.
    ids = api.schedule_many("faults.atomic_effect", [{}, {}, {"hold": 10}, {}, {}], delay=0)
    wait_for(_held_in_postgres, 30, message="the third job to hold inside the batch's transaction")
    started = ScheduledJob.objects.filter(pk__in=ids).exclude(claimed_by="")
    (holder,) = {job.claimed_by for job in started}
    pid = int(holder.rsplit(":", 1)[1])
    assert pid in worker.children()
    assert not Execution.objects.filter(idempotency_key__in=[f"job:{i}" for i in ids]).exists(), "nothing committed yet"
    os.kill(pid, signal.SIGKILL)

    for job_id in ids:
        _wait_state(job_id, JobState.DONE, 60)
    per_job = {i: len(_executions(i)) for i in ids}
    assert per_job == dict.fromkeys(ids, 1), "exactly one committed effect per job, none from the killed chunk"
    first_chunk = [i for i in ids if _outcomes(i)[0] == AttemptOutcome.RECLAIMED]
    assert ids[2] in first_chunk, "the held job was in the killed chunk and was taken back"
    assert all(_outcomes(i)[-1] == AttemptOutcome.SUCCEEDED for i in ids)
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()


def test_kill_9_of_a_whole_worker_mid_job_reruns_it_on_another(cluster):
    """kill -9 of a whole worker (main and pool) mid-job: another worker reruns it; its lost message runs nothing."""
    # A short visibility timeout so the dead worker's unacknowledged run_batch message comes back
    # within the test (the ceiling and margin are lowered to match, or scheduling.E003 stops the worker).
    short_vt = {
        "CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS": "8",
        "SCHEDULING_BROKER_DELAY_MAX_SECONDS": "1",
        "SCHEDULING_VISIBILITY_MARGIN_SECONDS": "2",
    }
    workers = _start(cluster, workers=2, env=short_vt)
    job = api.schedule("faults.effect", {"hold": 30}, delay=0)
    first = wait_for(lambda: _executions(job.id), 30, message="the job to start")[0]
    victim = _owner(workers, first.pid)
    (survivor,) = [w for w in workers if w is not victim]
    victim_led = _leads_control(victim)
    killed_at = measure.db_now()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.popen.wait(10)

    done = _wait_state(job.id, JobState.DONE, 45)
    runs = _executions(job.id)
    assert _outcomes(job.id) == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED]
    assert len(runs) == 2
    assert runs[1].pid in survivor.children(), "the surviving worker ran it"
    assert _notifications(job.id) == 1
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()
    # The dead worker never acknowledged its run_batch message: Redis gives it to the survivor once
    # it is older than the visibility timeout, and the claim's token, no longer current, makes it a no-op.
    (lost,) = _batches_received(victim, "faults.effect")
    back = wait_for(
        lambda: _finished_lines(survivor, lost),
        30,
        message="the dead worker's message to come back to the survivor",
    )
    assert "'started': 0" in back[0], back
    assert len(_executions(job.id)) == 2
    reclaimed, succeeded = JobAttempt.objects.filter(job_id=job.id).order_by("number")
    measure.record(
        "1b kill -9 whole worker mid-job",
        "another worker reruns it after the lease, 1 notification; the dead worker's message runs nothing",
        lease_s=fault_kinds.EFFECT_LEASE_SECONDS,
        victim_ran_the_claim_loop=victim_led,
        kill_to_reclaim_s=measure.seconds(reclaimed.finished_at, killed_at),
        kill_to_rerun_s=measure.seconds(succeeded.started_at, killed_at),
        kill_to_done_s=measure.seconds(done.finished_at, killed_at),
    )


# --- 2. SIGSTOP past the lease, then SIGCONT ----------------------------------------------------------


def test_a_stopped_worker_resumed_after_its_lease_cannot_complete(cluster):
    """kill -STOP a worker mid-job past its lease, then -CONT: its late completion is refused by the token."""
    workers = _start(cluster, workers=2)
    job = api.schedule("faults.effect", {"hold": 15}, delay=0)
    first = wait_for(lambda: _executions(job.id), 30, message="the job to start")[0]
    victim = _owner(workers, first.pid)
    (survivor,) = [w for w in workers if w is not victim]
    # If the victim also leads the claim loop, claiming resumes elsewhere only once its lock
    # session has been silent for control.LEAD_SILENCE_SECONDS: the rerun then waits for that.
    victim_led = _leads_control(victim)
    first_token = str(_job(job.id).token)
    stopped_at = measure.db_now()
    os.killpg(victim.pid, signal.SIGSTOP)
    try:
        done = _wait_state(job.id, JobState.DONE, 45)
        rerun = _executions(job.id)[1]
        assert rerun.pid in survivor.children()
    finally:
        os.killpg(victim.pid, signal.SIGCONT)
    resumed_at = measure.db_now()
    # The resumed process finishes its hold and presents the old token: refused, nothing changes.
    wait_for(lambda: "outcome refused" in victim.log(), 30, message="the stale completion to be refused")
    after = _job(job.id)
    assert (after.state, after.token, after.finished_at) == (JobState.DONE, done.token, done.finished_at)
    assert str(after.token) != first_token
    assert _outcomes(job.id) == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED]
    assert len(_executions(job.id)) == 2
    assert _notifications(job.id) == 1
    assert "claim lost while running" in victim.log(), "its heartbeat learned the claim was gone"
    reclaimed, succeeded = JobAttempt.objects.filter(job_id=job.id).order_by("number")
    measure.record(
        "2a SIGSTOP a worker mid-job past the lease, then SIGCONT",
        "rerun elsewhere after the lease; the resumed worker's completion refused by the token; 1 notification",
        lease_s=fault_kinds.EFFECT_LEASE_SECONDS,
        victim_ran_the_claim_loop=victim_led,
        stop_to_reclaim_s=measure.seconds(reclaimed.finished_at, stopped_at),
        stop_to_rerun_s=measure.seconds(succeeded.started_at, stopped_at),
        stopped_for_s=measure.seconds(resumed_at, stopped_at),
    )


def test_claiming_moves_on_when_the_claim_loop_worker_is_stopped(cluster):
    """kill -STOP the control loop's leader: another worker claims after the lead silence; resumed, it stands down."""
    leader = cluster.worker("w1", concurrency=2, env=FAST)
    cluster.beat(env=FAST)
    wait_ready(leader)
    wait_for(_loop_lock_held, 20, message="the claim loop to start on the only worker")
    other = cluster.worker("w2", concurrency=2, env=FAST)
    wait_ready(other)
    assert _leads_control(leader), "w1, the first worker, leads"
    stopped_at = measure.db_now()
    os.killpg(leader.pid, signal.SIGSTOP)
    try:
        job = api.schedule("faults.effect", {"hold": 0, "hold_on": []}, delay=0)
        done = _wait_state(job.id, JobState.DONE, 40)
    finally:
        os.killpg(leader.pid, signal.SIGCONT)
    (run,) = _executions(job.id)
    assert run.pid in other.children()
    started = JobAttempt.objects.get(job_id=job.id).started_at
    stop_to_run = measure.seconds(started, stopped_at)
    assert stop_to_run >= control.LEAD_SILENCE_SECONDS - 1, "claims waited for the stopped leader's lock to lapse"
    # Resumed, the old leader finds its lock session ended and stops its loop; nothing runs twice.
    wait_for(lambda: "lost the lead" in leader.log(), 20, message="the old loop to stand down")
    assert len(_executions(job.id)) == 1
    assert done.attempts == 1
    measure.record(
        "2b SIGSTOP the worker leading the claim loop",
        "another worker's loop takes over once the stopped leader's lock session is silent; resumed, the old one stops",
        lead_silence_s=control.LEAD_SILENCE_SECONDS,
        stop_to_claimed_and_run_s=stop_to_run,
    )


# --- 10. A poison job that kills its own worker process ---------------------------------------------


def _broker_messages(broker, task: str) -> int:
    """Messages for ``task`` waiting in the default queue or taken and unacknowledged, in this run's Redis keys."""
    prefix = settings.CELERY_BROKER_KEYPREFIX
    raw = [*broker.lrange(f"{prefix}celery", 0, -1)]
    raw += [json.loads(value)[0] for value in broker.hvals(f"{prefix}unacked")]
    found = 0
    for message in raw:
        envelope = json.loads(message) if isinstance(message, bytes | str) else message
        found += envelope.get("headers", {}).get("task") == task
    return found


def test_a_poison_job_that_kills_its_worker_ends_dead(cluster, broker):
    """A job that SIGKILLs its own process every time ends dead after max attempts; nothing requeues it after."""
    (worker,) = _start(cluster)
    job = api.schedule("faults.poison", {}, delay=0)
    wait_for(lambda: _executions(job.id), 30, message="the first attempt")
    first_at = _executions(job.id)[0].started_at
    dead = _wait_state(job.id, JobState.DEAD, 60)
    runs = _executions(job.id)
    max_attempts = fault_kinds.POISON_MAX_ATTEMPTS
    assert dead.attempts == max_attempts == len(runs)
    assert _outcomes(job.id) == [AttemptOutcome.RECLAIMED] * max_attempts
    assert len({run.pid for run in runs}) == max_attempts, "each attempt killed a fresh pool process"
    # reject_on_worker_lost put each killed batch back once; each redelivery found its claim started.
    wait_for(lambda: worker.log().count("claims skipped") >= max_attempts, 15, message="each redelivery skipped")
    batches = _batches_received(worker, "faults.poison")
    # A negative, so a window: a batch put back when its process died is redelivered at once, and nothing
    # claims a dead job; 2 s is two sweep and restore intervals (1 s each, FAST) for anything else to show.
    time.sleep(2)
    assert _batches_received(worker, "faults.poison") == batches, "no batch message after it died"
    deliveries = Counter(batches)
    assert len(deliveries) == max_attempts, "one batch message per attempt"
    assert set(deliveries.values()) == {2}, "each delivered twice: once, and once put back when its process died"
    assert len(_executions(job.id)) == max_attempts
    assert _broker_messages(broker, "scheduling.run_batch") == 0
    assert worker.popen.poll() is None, "the worker itself survived every kill"
    measure.record(
        "10 poison job kills its worker every time",
        f"dead after {max_attempts} attempts, {len(batches)} run_batch deliveries, none after",
        lease_s=fault_kinds.POISON_LEASE_SECONDS,
        first_run_to_dead_s=measure.seconds(dead.finished_at, first_at),
    )


def test_a_poison_job_in_a_batch_dies_alone_and_its_siblings_finish_with_their_budget(cluster):
    """A poison job + 9 good ones in one atomic batch, max_attempts 2: 9 done, effects committed; the poison dead."""
    (worker,) = _start(cluster)
    payloads = [{"poison": i == 4} for i in range(fault_kinds.BATCH_SIZE)]
    ids = api.schedule_many("faults.batch_member", payloads, delay=0)
    poison, good = ids[4], [job_id for i, job_id in enumerate(ids) if i != 4]
    first_at = measure.db_now()
    dead = _wait_state(poison, JobState.DEAD, 90)
    for job_id in good:
        _wait_state(job_id, JobState.DONE, 60)
    # The batch died together: nobody was charged, everyone ran alone afterwards.
    for job_id in good:
        job = _job(job_id)
        assert _outcomes(job_id) == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED]
        assert (job.attempts, job.max_attempts, job.run_alone) == (2, fault_kinds.BATCH_MAX_ATTEMPTS + 1, True)
        assert len(_executions(job_id)) == 1, "one committed effect (the killed chunk's writes rolled back)"
    # The poison: refunded once with its batch, then charged alone until its attempts were spent.
    assert _outcomes(poison) == [AttemptOutcome.RECLAIMED] * 3
    assert (dead.attempts, dead.max_attempts) == (3, fault_kinds.BATCH_MAX_ATTEMPTS + 1)
    assert _executions(poison) == [], "its writes died with its process every time"
    (batch_error, *alone_errors) = JobAttempt.objects.filter(job_id=poison).order_by("number")
    assert "batch of 10 jobs; not counted" in batch_error.error
    assert all("not counted" not in a.error for a in alone_errors), "each crash alone was charged"
    retried = JobAttempt.objects.filter(job_id__in=ids, number=2).order_by("started_at")
    assert all(a.started_at > batch_error.finished_at for a in retried), "retried after the reclaim, not in it"
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()
    assert worker.popen.poll() is None
    measure.record(
        "10b poison job in an atomic batch of 10 (max_attempts 2)",
        "batch reclaimed uncharged, each job retried alone with backoff: 9 done (1 effect each), poison dead",
        lease_s=fault_kinds.POISON_LEASE_SECONDS,
        first_run_to_dead_s=measure.seconds(dead.finished_at, first_at),
    )


# --- 16. A capped kind with a backlog next to another kind -------------------------------------------


def _most_at_once(intervals: list[tuple[object, object]]) -> int:
    """The largest number of (start, end) intervals open at one instant (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_a_capped_kind_with_a_backlog_never_exceeds_its_cap_nor_holds_up_another_kind(cluster):
    """Cap 3 on a kind with 300 due short jobs, then 10 of another kind: those run at once; never 4 capped at a time."""
    api.set_max_running("faults.effect", 3)
    # Short jobs: the cap's room is open again at most claims, which is when a full LIMIT of the
    # capped kind's rows used to crowd the other kind out of every claim.
    capped = api.schedule_many("faults.effect", [{"hold": 0.1}] * 300, delay=0)
    others = api.schedule_many("faults.effect_inline", [{}] * 10, delay=0)
    _start(cluster, concurrency=4)
    for job_id in others:
        _wait_state(job_id, JobState.DONE, 90)
    left = ScheduledJob.objects.filter(pk__in=capped, state=JobState.PENDING).count()
    # With the capped kind's rows filling each claim's LIMIT (200 rows here), the others waited
    # for 100 of them to finish first; now they run while the backlog is still there.
    assert left > 250, f"the other kind did not wait for the capped backlog ({left} capped jobs pending)"
    ran = JobAttempt.objects.filter(job_id__in=capped, outcome=AttemptOutcome.SUCCEEDED)
    wait_for(ran.exists, 60, message="the capped kind runs too, three at a time")
    assert _most_at_once(list(ran.values_list("started_at", "finished_at"))) <= 3, "never more than the cap at once"
    assert ScheduledJob.objects.filter(pk__in=capped, state__in=CLAIM_STATES).count() <= 3
    measure.record(
        "16 cap 3 on a kind with 300 due 0.1 s jobs, 10 of another kind due after them",
        "the other kind ran while the capped backlog waited; at most 3 capped jobs at once",
        capped_left_pending=left,
    )


# --- 9. A worker whose clock is ten minutes ahead ------------------------------------------------------

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SKEW_SECONDS = 600
# libfaketime moves CLOCK_REALTIME (and, by the same offset, CLOCK_MONOTONIC: faking only the wall
# clock makes time.sleep fail with EINVAL) for the process and its pool children.
TEN_MINUTES_AHEAD = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"+{SKEW_SECONDS}"}


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime is not installed (apt-get install faketime)")
@pytest.mark.parametrize("ahead", ["worker", "worker and beat"])
def test_a_worker_ten_minutes_ahead_runs_nothing_early(cluster, ahead):
    """A worker (and beat) with the clock 10 min ahead runs jobs at their due time by the database clock, none early."""
    worker = cluster.worker("w1", concurrency=2, env={**FAST, **TEN_MINUTES_AHEAD})
    cluster.beat(env={**FAST, **(TEN_MINUTES_AHEAD if ahead == "worker and beat" else {})})
    wait_ready(worker)
    # Batches sent to workers and short jobs run inside the claim loop, both on the skewed worker.
    kinds = ("faults.effect", "faults.effect_inline", "faults.effect")
    soon = [api.schedule(kind, {"hold": 0, "hold_on": []}, delay=d) for kind, d in zip(kinds, (2, 4, 6), strict=True)]
    # Due in 5 minutes: by the worker's clock it has been due for 5 minutes already.
    later = api.schedule("faults.effect", {"hold": 0, "hold_on": []}, delay=300)
    for job in soon:
        _wait_state(job.id, JobState.DONE, 40)
    time.sleep(3)  # a few more claims by the skewed worker

    lags, skews = [], []
    for job in soon:
        (run,) = _executions(job.id)
        attempt = JobAttempt.objects.get(job_id=job.id)
        assert run.started_at >= job.due_at, "ran before its due time by the database clock"
        assert attempt.started_at >= job.due_at
        assert run.pid in worker.children(), "the skewed worker claimed and ran it"
        lags.append((run.started_at - job.due_at).total_seconds())
        subject = Notification.objects.get(idempotency_key=f"job:{job.id}").subject
        worker_clock = float(subject.rsplit(" ", 1)[1])
        skews.append(worker_clock - run.started_at.timestamp())
    assert all(SKEW_SECONDS - 10 < skew < SKEW_SECONDS + 10 for skew in skews), f"the worker's clock: {skews}"
    waiting = _job(later.id)
    assert (waiting.state, waiting.attempts) == (JobState.PENDING, 0), "the job due in 5 minutes has not run"
    assert not _executions(later.id)
    # What the skew does on the broker side: a message whose `expires` was set by a sender on the
    # right clock may already be past by the worker's clock, and is discarded unrun.
    discarded = worker.log().count("Discarding revoked task")
    measure.record(
        f"9 clock 10 min ahead ({ahead})",
        "nothing ran early (database clock decides); a job due in 5 min stayed pending",
        worker_clock_ahead_s=round(sum(skews) / len(skews), 1),
        max_lag_s=round(max(lags), 2),
        messages_discarded_as_expired=discarded,
    )


# --- 11. Warm shutdown with a short and a long job running ---------------------------------------------

# REMAP_SIGTERM=SIGQUIT makes SIGTERM Celery's soft shutdown: stop taking messages, let running
# tasks finish for CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS, then cancel the rest (SIGTERM to
# their pool processes, which release their claims: scheduling.shutdown).
SOFT_SHUTDOWN = {"REMAP_SIGTERM": "SIGQUIT", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS": "4"}
QUICK = {"hold": 0, "hold_on": []}


def test_sigterm_finishes_the_short_job_and_requeues_the_long_one_once(cluster):
    """SIGTERM with a short and a long job running: the short one is recorded, the long one released once and rerun."""
    leaving = cluster.worker("w1", concurrency=3, env={**FAST, **SOFT_SHUTDOWN})
    cluster.beat(env=FAST)
    wait_ready(leaving)
    short = api.schedule("faults.effect", {"hold": 2}, delay=0)
    long = api.schedule("faults.effect", {"hold": 30}, delay=0)
    countdown = api.defer("faults.effect", QUICK, delay=10)  # a broker countdown w1 holds in memory
    assert countdown.mechanism == "deferrals"
    for job in (short, long):
        wait_for(lambda job=job: _executions(job.id), 30, message=f"job {job.id} to start")
    wait_for(lambda: f"[{countdown.id}] received" in leaving.log(), 15, message="w1 to hold the countdown")
    term_at = measure.db_now()
    leaving.signal(signal.SIGTERM)
    staying = cluster.worker("w2", concurrency=2, env=FAST)
    assert leaving.popen.wait(30) is not None

    finished = _job(short.id)
    assert finished.state == JobState.DONE, "the short job finished within the soft shutdown and was recorded"
    assert _outcomes(short.id) == [AttemptOutcome.SUCCEEDED]
    released = JobAttempt.objects.get(job_id=long.id, number=1)
    assert released.outcome == AttemptOutcome.RECLAIMED
    assert released.error == runner.RELEASE_REASON, "given back by the stopping process, not by the sweeper"
    wait_ready(staying)
    rerun = _wait_state(long.id, JobState.DONE, 30)
    assert rerun.attempts == 2
    assert _outcomes(long.id) == [AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED], "requeued once"
    assert [run.pid in staying.children() for run in _executions(long.id)] == [False, True]
    assert _notifications(long.id) == 1
    # The countdown w1 held unacknowledged went back to Redis when it left; w2 runs it, once.
    key = f"broker:{countdown.id}"
    wait_for(lambda: Execution.objects.filter(idempotency_key=key).exists(), 30, message="the countdown to run")
    time.sleep(3)  # a negative (no second copy runs): a window; a copy put back at w1's exit would come at once
    assert Execution.objects.filter(idempotency_key=key).count() == 1, "no countdown lost, none doubled"
    assert not ScheduledJob.objects.filter(state__in=CLAIM_STATES).exists()
    ran = JobAttempt.objects.get(job_id=long.id, number=2)
    measure.record(
        "11 SIGTERM (soft shutdown) with a short and a long job",
        "short job finished and recorded; long job released once and rerun on another worker; countdown ran once",
        soft_shutdown_s=float(SOFT_SHUTDOWN["CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS"]),
        term_to_release_s=measure.seconds(released.finished_at, term_at),
        term_to_rerun_s=measure.seconds(ran.started_at, term_at),
        short_finished_after_term_s=measure.seconds(finished.finished_at, term_at),
    )


# --- 5. A countdown longer than the visibility timeout ------------------------------------------------

# A worker whose Redis visibility timeout is 4 s, scanning for stale unacknowledged messages every
# second; its ceiling (1 s) plus margin (2 s) sits below that, or scheduling.E003 stops it.
SHORT_VISIBILITY = {
    "CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS": "4",
    "SCHEDULING_BROKER_DELAY_MAX_SECONDS": "1",
    "SCHEDULING_VISIBILITY_MARGIN_SECONDS": "2",
}


def test_a_countdown_longer_than_the_visibility_timeout_runs_once_only_through_the_guard(cluster, settings):
    """A raw countdown past the visibility timeout is delivered again and again; through defer() every one runs once."""
    (worker,) = _start(cluster, env=SHORT_VISIBILITY)
    # Without the guard: a 12 s countdown sent straight to the deferral task.
    raw_id = str(uuid.uuid4())
    sent_at = measure.db_now()
    celery_tasks.run_deferred.apply_async(
        args=countdowns.message_args("faults.effect", QUICK, 1, raw_id), task_id=raw_id, countdown=12
    )
    # Through the guard, with this process configured like the worker.
    settings.SCHEDULING_BROKER_DELAY_MAX_SECONDS = 1
    settings.SCHEDULING_VISIBILITY_MARGIN_SECONDS = 2
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS, "visibility_timeout": 4}
    long = api.defer("faults.effect", QUICK, delay=12)
    short = api.defer("faults.effect", QUICK, delay=1)
    assert (long.mechanism, short.mechanism) == ("due_at", "deferrals"), "over the ceiling it is a due_at row"
    settings.SCHEDULING_BROKER_DELAY_MAX_SECONDS = 30  # a ceiling too close to the visibility timeout
    with pytest.raises(exceptions.DelayTooLong):
        api.defer("faults.effect", QUICK, delay=12)
    # ...and a worker configured that way refuses to start at all.
    refused = cluster.worker("w-misconfigured", env={**FAST, "CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS": "4"})
    assert refused.popen.wait(60) != 0
    assert "scheduling.E003" in refused.log()

    raw_key = f"broker:{raw_id}"
    wait_for(lambda: Execution.objects.filter(idempotency_key=raw_key).exists(), 30, message="the raw countdown")
    _wait_state(long.id, JobState.DONE, 30)
    time.sleep(6)  # longer than the visibility timeout: any copy still held would come back and run
    raw_runs = Execution.objects.filter(idempotency_key=raw_key).count()
    redelivered = len(re.findall(rf"\[{raw_id}\] received", worker.log()))
    assert raw_runs >= 2, "Redis handed the held countdown out again each visibility timeout (celery #2599, #4400)"
    assert Notification.objects.filter(idempotency_key=raw_key).count() == 1, "only an idempotent handler saves it"
    assert Execution.objects.filter(idempotency_key=f"broker:{short.id}").count() == 1
    assert len(_executions(long.id)) == 1
    first_run = Execution.objects.filter(idempotency_key=raw_key).order_by("id").first()
    measure.record(
        "5 countdown longer than the visibility timeout",
        "raw 12 s countdown with a 4 s visibility timeout: delivered and run repeatedly; through defer() it "
        "becomes a due_at row (or DelayTooLong; a worker with such a ceiling refuses to start): each runs once",
        visibility_timeout_s=4,
        raw_countdown_s=12,
        raw_deliveries=redelivered,
        raw_executions=raw_runs,
        guarded_executions=1,
        raw_first_run_after_s=measure.seconds(first_run.started_at, sent_at),
    )


def _run_one(kind: str) -> ScheduledJob:
    job = api.schedule(kind, {}, delay=0)
    return _wait_state(job.id, JobState.DONE, 30)


def test_a_pool_process_keeps_its_database_session_between_batches_and_replaces_a_dead_one(cluster):
    """Batches reuse one PostgreSQL session; after it is killed, the next batch runs on a new one, first time."""
    _start(cluster, concurrency=1)
    first = [_run_one("faults.session") for _ in range(3)]  # batch_size 1: one message, one task each
    sessions = {e.pid for job in first for e in _executions(job.id)}
    assert len(sessions) == 1, f"each batch opened its own connection: {sessions}"
    (backend,) = sessions

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    after = _run_one("faults.session")

    (execution,) = _executions(after.id)
    assert execution.pid != backend, "a new session after the old one was terminated"
    assert after.attempts == 1, "run at the first try, not rescued later"
    assert _outcomes(after.id) == ["succeeded"]
