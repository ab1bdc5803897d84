"""The ``*_total`` counters: kept by triggers in the outcome's transaction, in /metrics, never lowered by pruning."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction

from scheduling import api, schedules
from scheduling.core import store as core_store
from scheduling.due_at import runner, sweep
from scheduling.due_at import store as jobs_store
from scheduling.fixed import store as fixed_store
from scheduling.models import JobState, OutcomeCounter, RunState, RunTrigger, ScheduledJob, SchedulePolicy
from tests import support
from tests.integration.web.test_metrics import scrape

pytestmark = pytest.mark.django_db(transaction=True)


def counters() -> dict[tuple[str, str, str], int]:
    return {(c.metric, c.label, c.outcome): c.value for c in OutcomeCounter.objects.all()}


def claim_due(run_sql, ids: list[int]) -> list[jobs_store.Claim]:
    support.make_due(ids)
    return jobs_store.claim_due_jobs(100)


def test_each_outcome_is_counted_once_by_kind_in_the_recording_statement(run_sql):
    """3 successes in one batch, a retry, a death, a reclaim and a sweeper death: each counter holds exactly that."""
    ok = [api.schedule("demo.record", {"label": f"ok-{i}"}, delay=60).id for i in range(3)]
    retried = api.schedule("demo.fail", {}, delay=60, max_attempts=3).id
    dies = api.schedule("demo.fail", {"n": 2}, delay=60, max_attempts=1).id
    claims = claim_due(run_sql, [*ok, retried, dies])
    by_kind: dict[str, list[tuple[int, str]]] = {}
    for claim in claims:
        by_kind.setdefault(claim.kind, []).append((claim.id, claim.token))
    runner.run_batch(by_kind["demo.record"])
    runner.run_batch(by_kind["demo.fail"])
    stranded = api.schedule("demo.record", {"label": "stranded"}, delay=60).id
    killed = api.schedule("demo.record", {"label": "killed"}, delay=60, max_attempts=1).id
    claim_due(run_sql, [stranded, killed])
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '2 minutes' WHERE id = ANY(%s)",
            [[stranded, killed]])  # fmt: skip
    assert sweep.reclaim_expired() == (0, 0), "never started: their messages must be missing at two sweeps"
    assert sweep.reclaim_expired() == (1, 1)

    assert counters() == {
        ("job_attempts", "demo.record", "succeeded"): 3,
        ("job_attempts", "demo.fail", "failed"): 2,
        ("job_attempts", "demo.record", "reclaimed"): 2,
        ("jobs_finished", "demo.record", "done"): 3,
        ("jobs_finished", "demo.fail", "dead"): 1,
        ("jobs_finished", "demo.record", "dead"): 1,
        ("job_retries", "demo.fail", ""): 1,
        ("jobs_reclaimed", "demo.record", ""): 2,
    }


def test_a_rolled_back_outcome_is_not_counted(run_sql):
    """The counter is in the outcome's transaction: rolled back together, nothing counted."""
    (claim,) = claim_due(run_sql, [api.schedule("demo.record", {}, delay=60).id])
    jobs_store.start_jobs([(claim.id, claim.token)], "w:1")
    now = core_store.database_now()
    seen_inside: list[int] = []

    def record_then_fail() -> None:
        with transaction.atomic():
            jobs_store.complete_jobs([jobs_store.Outcome(claim.id, claim.token, now, now, "succeeded")])
            seen_inside.append(counters()[("jobs_finished", "demo.record", "done")])
            raise RuntimeError("the batch's transaction fails after recording")

    with pytest.raises(RuntimeError):
        record_then_fail()
    assert seen_inside == [1], "counted inside the transaction"
    assert counters() == {}
    assert ScheduledJob.objects.get(pk=claim.id).state == JobState.RUNNING


def test_counters_survive_pruning_and_metrics_expose_them_as_totals(client, run_sql):
    """After the pruner deletes the jobs and their attempts, the counters and /metrics' *_total keep their values."""
    ids = [api.schedule("demo.record", {"label": f"p-{i}"}, delay=60).id for i in range(4)]
    runner.run_batch([(c.id, c.token) for c in claim_due(run_sql, ids)])
    before = scrape(client)
    run_sql("UPDATE scheduling_scheduledjob SET finished_at = now() - interval '30 days' WHERE id = ANY(%s)", [ids])
    assert sweep.prune() == 4
    assert not ScheduledJob.objects.filter(pk__in=ids).exists()
    m = scrape(client)
    done = (("kind", "demo.record"), ("outcome", "done"))
    assert m["timekeeper_jobs_finished_total"][done] == before["timekeeper_jobs_finished_total"][done] == 4
    attempts = (("kind", "demo.record"), ("outcome", "succeeded"))
    assert m["timekeeper_job_attempts_total"][attempts] == 4
    recent = m.get("timekeeper_job_attempts_recent", {})
    assert recent.get(attempts, 0) == 0, "the window gauge fell with the pruned rows; the counter did not"


def test_fixed_runs_are_counted_when_they_end_or_are_born_final():
    """A run that succeeds, one that fails and two recorded missed count once each; a duplicate tick adds nothing."""
    schedules.sync(declarations=[schedules.make(name="counted", kind="demo.record", every=60)])
    policy = SchedulePolicy.objects.get(periodic_task__name="counted")
    tick = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    first = fixed_store.insert_schedule_run(policy.pk, tick, RunTrigger.BEAT, "w:1", "t1")
    second = fixed_store.insert_schedule_run(policy.pk, tick + dt.timedelta(minutes=1), RunTrigger.BEAT, "w:1", "t2")
    assert first is not None
    assert second is not None
    assert fixed_store.insert_schedule_run(policy.pk, tick, RunTrigger.BEAT, "w:2", "t3") is not None  # a duplicate
    assert counters() == {}, "running runs are not counted yet"
    assert fixed_store.finish_schedule_run(first.id, RunState.SUCCEEDED)
    assert fixed_store.finish_schedule_run(second.id, RunState.FAILED, "boom")
    assert not fixed_store.finish_schedule_run(second.id, RunState.SUCCEEDED), "already finished: no second count"
    fixed_store.record_missed_ticks(policy.pk, [tick + dt.timedelta(minutes=m) for m in (2, 3)], "missed")
    assert counters() == {
        ("fixed_runs", "counted", "succeeded"): 1,
        ("fixed_runs", "counted", "failed"): 1,
        ("fixed_runs", "counted", "missed"): 2,
    }


def test_the_triggers_aggregate_per_statement_not_per_row(run_sql):
    """A batch of 20 successes leaves one counter row per (metric, kind, outcome), updated by one upsert."""
    ids = [api.schedule("demo.record", {"label": f"s-{i}"}, delay=60).id for i in range(20)]
    claims = claim_due(run_sql, ids)
    jobs_store.start_jobs([(c.id, c.token) for c in claims], "w:1")
    now = core_store.database_now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_tup_upd + n_tup_ins FROM pg_stat_xact_user_tables WHERE relname = %s",
                       ["scheduling_outcomecounter"])  # fmt: skip
        assert cursor.fetchone() in (None, (0,))
    with transaction.atomic():
        jobs_store.complete_jobs([jobs_store.Outcome(c.id, c.token, now, now, "succeeded") for c in claims])
        with connection.cursor() as cursor:
            cursor.execute("SELECT n_tup_upd + n_tup_ins FROM pg_stat_xact_user_tables WHERE relname = %s",
                           ["scheduling_outcomecounter"])  # fmt: skip
            (written,) = cursor.fetchone()
    assert written == 2, "one row each for job_attempts and jobs_finished, not one per job"
    assert counters()[("jobs_finished", "demo.record", "done")] == 20


def test_forged_broker_messages_are_counted_in_metrics_refused_messages_total(client):
    """A forged run_deferred and two forged run_fixed messages: /metrics' refused counters go from 0 to 1 and 2."""
    from scheduling import tasks as celery_tasks

    deferred = (("task", "scheduling.run_deferred"),)
    fixed = (("task", "scheduling.run_fixed"),)
    before = scrape(client)["timekeeper_refused_messages_total"]
    assert (before[deferred], before[fixed]) == (0, 0), "both are exposed before any refusal"
    celery_tasks.run_deferred.apply(args=["demo.record", {"label": "forged"}, 1, "d-forged"]).get()
    for kwargs in ({"schedule": "refused"}, {"schedule": "refused", "tick": "2030-01-01T00:00:00+00:00"}):
        assert celery_tasks.run_fixed.apply(kwargs=kwargs).get()["outcome"] == "refused"
    after = scrape(client)["timekeeper_refused_messages_total"]
    assert (after[deferred], after[fixed]) == (1, 2)
    assert not ScheduledJob.objects.exists()
    assert counters()[("refused_messages", "scheduling.run_fixed", "")] == 2


def test_forged_messages_of_any_shape_are_refused_and_counted_not_a_type_error(broker):
    """Too few, too many or unknown arguments: refused and counted like a bad signature, nothing run.

    They were a TypeError in Celery's call (logged with the arguments, payload included), not counted.
    A message defer() signed, with one argument more, is refused too: its shape is not defer()'s.
    """
    from scheduling import tasks as celery_tasks
    from scheduling.deferrals import countdowns

    signed = countdowns.message_args("demo.record", {"label": "signed"}, 1, "d-shape")
    deferred_shapes = [
        ((), {}),
        (("demo.record",), {}),
        ((*signed, "extra"), {}),
        (tuple(signed), {"priority": 9}),
        (tuple(signed), {"self": 1}),  # a keyword named as the bound task's own first parameter
    ]
    for args, kwargs in deferred_shapes:
        result = celery_tasks.run_deferred.apply(args=args, kwargs=kwargs).get()
        assert result["outcome"] == "refused", (args, kwargs)
    fixed_shapes = [
        ((), {}),
        (("a", "2030-01-01T00:00:00+00:00", "beat", "sig", "1", "extra"), {}),
        ((), {"when": 1}),
        ((), {"self": 1}),
    ]
    for args, kwargs in fixed_shapes:
        assert celery_tasks.run_fixed.apply(args=args, kwargs=kwargs).get()["outcome"] == "refused", (args, kwargs)
    assert counters()[("refused_messages", "scheduling.run_deferred", "")] == len(deferred_shapes)
    assert counters()[("refused_messages", "scheduling.run_fixed", "")] == len(fixed_shapes)
    assert not ScheduledJob.objects.exists()
    assert celery_tasks.run_deferred.apply(args=signed).get()["outcome"] == "succeeded", "the signed shape still runs"
