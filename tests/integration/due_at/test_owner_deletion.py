"""A deleted user's work: pending jobs and recurrences cancelled first, history kept as theirs, never the system's."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling import api
from scheduling.core import exceptions, registry, store
from scheduling.due_at import runner, sweep
from scheduling.due_at import store as jobs_store
from scheduling.models import JobAttempt, JobState, Recurrence, ScheduledJob
from tasks.models import Payment

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: no collectstatic here
]


def overdue(run_sql, ids: list[int]) -> None:
    run_sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '10 minutes' WHERE id = ANY(%s)", [ids])


def states(ids: list[int]) -> dict[int, tuple[str, int | None, str]]:
    rows = ScheduledJob.objects.filter(pk__in=ids).values_list("pk", "state", "owner_id", "former_owner")
    return {pk: (state, owner, former) for pk, state, owner, former in rows}


def backlog(admin_client: Client) -> int:
    return int(admin_client.get("/healthz").json()["checks"]["backlog"]["backlog"])


def test_deleting_a_user_in_the_admin_cancels_their_waiting_work_and_keeps_who_owned_it(
    django_user_model: Any, admin_client: Client, run_sql
):
    """A superuser deletes alice: her pending jobs and recurrence are cancelled, not claimed, not in /healthz."""
    alice = django_user_model.objects.create_user("alice", password="pw-alice")
    bob = django_user_model.objects.create_user("bob", password="pw-bob")
    hers = [api.schedule("demo.record", {"label": f"a{i}"}, delay=0, owner=alice).id for i in range(2)]
    hers.append(api.schedule("demo.record", {}, key="k", delay=0, owner=alice).id)
    done = api.schedule("demo.record", {}, delay=0, owner=alice).id
    ScheduledJob.objects.filter(pk=done).update(state=JobState.DONE, finished_at=store.database_now())
    recurrence = api.recur("demo.record", {}, key="digest", every=3600, owner=alice)
    occurrence = Recurrence.objects.get(pk=recurrence.id).current_job_id
    assert occurrence is not None
    his = api.schedule("demo.record", {}, key="k", delay=0, owner=bob).id
    system = api.schedule("demo.record", {}, key="k", delay=0).id
    overdue(run_sql, [*hers, occurrence, his, system])
    assert backlog(admin_client) == 1, "the system's own overdue job only"

    response = admin_client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not django_user_model.objects.filter(pk=alice.pk).exists()
    label = f"alice (#{alice.pk})"
    after = states([*hers, occurrence, done, his, system])
    assert {after[i] for i in [*hers, occurrence]} == {(JobState.CANCELLED, None, label)}
    assert after[done] == (JobState.DONE, None, label), "history stays, marked as hers"
    assert after[his] == (JobState.PENDING, bob.pk, "")
    assert after[system] == (JobState.PENDING, None, "")
    assert not Recurrence.objects.filter(pk=recurrence.id).exists()
    assert backlog(admin_client) == 1, "her jobs did not join the system's backlog"
    claimed = {claim.id for claim in jobs_store.claim_due_jobs(100)}
    assert claimed == {his, system}


def test_deleting_users_through_the_orm_cancels_only_their_pending_jobs(django_user_model: Any, run_sql):
    """user.delete() and QuerySet.delete(): each deleted user's pending jobs cancelled, a kept user's untouched."""
    carol, dave, erin = (django_user_model.objects.create_user(name) for name in ("carol", "dave", "erin"))
    jobs = {user.username: api.schedule("demo.record", {}, delay=0, owner=user).id for user in (carol, dave, erin)}
    overdue(run_sql, list(jobs.values()))
    ids = {user.username: user.pk for user in (carol, dave)}  # delete() forgets the instance's pk

    carol.delete()
    django_user_model.objects.filter(username="dave").delete()

    after = states(list(jobs.values()))
    assert after[jobs["carol"]] == (JobState.CANCELLED, None, f"carol (#{ids['carol']})")
    assert after[jobs["dave"]] == (JobState.CANCELLED, None, f"dave (#{ids['dave']})")
    assert after[jobs["erin"]] == (JobState.PENDING, erin.pk, "")
    assert {claim.id for claim in jobs_store.claim_due_jobs(100)} == {jobs["erin"]}


def test_a_claimed_job_of_a_deleted_owner_is_cancelled_and_never_runs_as_the_system(django_user_model: Any, run_sql):
    """Claimed before the deletion, delivered after: cancelled by the deletion, the runner starts nothing."""
    frank = django_user_model.objects.create_user("frank")
    payment = Payment.objects.create(reference="pay-frank", amount_cents=100, owner=frank)
    job = api.schedule("payments.retry", {"reference": "pay-frank"}, delay=0, owner=frank)
    overdue(run_sql, [job.id])
    [claim] = jobs_store.claim_due_jobs(10)

    frank_id = frank.pk
    frank.delete()
    report = runner.run_batch([(claim.id, claim.token)])

    assert (report.started, report.failed) == (0, 0)
    row = ScheduledJob.objects.get(pk=job.id)
    assert (row.state, row.owner_id, row.former_owner) == (JobState.CANCELLED, None, f"frank (#{frank_id})")
    assert not JobAttempt.objects.filter(job_id=job.id).exists()
    payment.refresh_from_db()
    assert payment.attempts == 0, "the payment was not charged as the system"


def test_a_running_job_of_a_deleted_owner_fails_its_last_attempt_instead_of_running_as_the_system(
    django_user_model: Any, run_sql
):
    """Started before the deletion: its handler's job.owner_id raises OwnerDeleted; the failure is final (dead)."""
    fay = django_user_model.objects.create_user("fay")
    job = api.schedule("demo.record", {}, delay=0, owner=fay)
    overdue(run_sql, [job.id])
    [claim] = jobs_store.claim_due_jobs(10)
    [started] = jobs_store.start_jobs([(claim.id, claim.token)], "test:1")
    fay_id = fay.pk

    fay.delete()

    with pytest.raises(exceptions.OwnerDeleted, match=f"fay \\(#{fay_id}\\)"):
        _ = registry.Job("demo.record", {}, 1, 1, None, id=job.id).owner_id
    failed = jobs_store.fail_jobs(
        [jobs_store.Outcome(started.id, started.token, started.db_now, started.db_now, "failed", "x", 0.0)]
    )
    row = ScheduledJob.objects.get(pk=job.id)
    assert (row.state, row.max_attempts, row.former_owner) == (JobState.DEAD, 1, f"fay (#{fay_id})")
    assert len(failed) == 1


def test_owner_id_of_a_system_job_is_none_and_of_a_deleted_owners_job_raises():
    """job.owner_id: None for the system's job, OwnerDeleted when former_owner says a user owned it."""
    system = api.schedule("demo.record", {}, delay=60)
    assert registry.Job("demo.record", {}, 1, 1, None, id=system.id).owner_id is None
    ScheduledJob.objects.filter(pk=system.id).update(former_owner="gone (#99)")
    with pytest.raises(exceptions.OwnerDeleted, match="gone"):
        _ = registry.Job("demo.record", {}, 1, 1, None, id=system.id).owner_id


def test_deleting_a_user_whose_unstarted_claim_shares_a_key_with_a_system_job_succeeds(django_user_model: Any, run_sql):
    """A claimed-not-started job keyed like the system's waiting job: the deletion cancels it, no IntegrityError."""
    gina = django_user_model.objects.create_user("gina")
    hers = api.schedule("demo.record", {}, key="report", delay=0, owner=gina).id
    overdue(run_sql, [hers])
    [claim] = jobs_store.claim_due_jobs(10)
    assert claim.id == hers
    system = api.schedule("demo.record", {}, key="report", delay=3600).id
    gina_id = gina.pk

    gina.delete()

    after = states([hers, system])
    assert after[hers] == (JobState.CANCELLED, None, f"gina (#{gina_id})")
    assert after[system] == (JobState.PENDING, None, "")
    assert ScheduledJob.objects.get(pk=hers).finished_at is not None
    assert jobs_store.start_jobs([(claim.id, claim.token)], "test:1") == [], "the runner finds the claim lost"


@pytest.mark.parametrize("started", [False, True], ids=["claimed", "running"])
def test_after_the_deletion_a_system_schedule_of_the_same_key_creates_a_fresh_system_job(
    django_user_model: Any, run_sql, started: bool
):
    """The deleted owner's claimed or running job leaves the key: schedule(key=K) by the system gets its own new job."""
    hank = django_user_model.objects.create_user("hank")
    hers = api.schedule("demo.record", {}, key="nightly", delay=0, owner=hank).id
    overdue(run_sql, [hers])
    [claim] = jobs_store.claim_due_jobs(10)
    if started:
        assert len(jobs_store.start_jobs([(claim.id, claim.token)], "test:1")) == 1
    hank.delete()
    before = ScheduledJob.objects.get(pk=hers)
    # out of the key namespace: a running job loses its key, a claim not started is cancelled (final)
    assert (before.state, before.key) == ((JobState.RUNNING, None) if started else (JobState.CANCELLED, "nightly"))

    kept = api.schedule("demo.record", {"n": 1}, key="nightly", delay=3600, on_conflict="keep")
    replaced = api.schedule("demo.record", {"n": 2}, key="nightly", delay=3600, on_conflict="replace")

    assert kept.id != hers
    assert replaced.id == kept.id
    row = ScheduledJob.objects.get(pk=kept.id)
    assert (row.state, row.owner_id, row.former_owner, row.payload) == (JobState.PENDING, None, "", {"n": 2})
    assert registry.Job("demo.record", {}, 1, 1, None, id=row.id).owner_id is None, "the system's job runs"


def test_a_retired_owners_unsent_claim_given_back_is_cancelled_not_pending(run_sql):
    """unclaim_jobs: a claim whose owner was deleted (former_owner set) ends cancelled, not pending again."""
    job = api.schedule("demo.record", {}, delay=0).id
    overdue(run_sql, [job])
    [claim] = jobs_store.claim_due_jobs(10)
    run_sql("UPDATE scheduling_scheduledjob SET former_owner = 'ivy (#99)' WHERE id = %s", [job])

    assert jobs_store.unclaim_jobs([(claim.id, claim.token)]) == [job]

    row = ScheduledJob.objects.get(pk=job)
    assert (row.state, row.attempts) == (JobState.CANCELLED, 0)
    assert row.finished_at is not None


def test_a_deleted_owners_unsent_claim_stays_cancelled_when_the_claim_gives_it_back(django_user_model: Any, run_sql):
    """Deleted while its claim waits to be sent: cancelled by the deletion, and unclaim_jobs leaves it so."""
    jack = django_user_model.objects.create_user("jack")
    job = api.schedule("demo.record", {}, delay=0, owner=jack).id
    overdue(run_sql, [job])
    [claim] = jobs_store.claim_due_jobs(10)
    jack.delete()

    assert jobs_store.unclaim_jobs([(claim.id, claim.token)]) == []

    assert ScheduledJob.objects.get(pk=job).state == JobState.CANCELLED
    assert jobs_store.claim_due_jobs(10) == []


def _running_pair(django_user_model: Any, run_sql, name: str) -> tuple[list[tuple[int, str]], str]:
    """Two jobs of a new user claimed in one batch and started, then the user deleted; (claims, label)."""
    user = django_user_model.objects.create_user(name)
    ids = [api.schedule("demo.record", {"i": i}, delay=0, owner=user).id for i in range(2)]
    overdue(run_sql, ids)
    claims = [(c.id, c.token) for c in jobs_store.claim_due_jobs(10)]
    assert sorted(c[0] for c in claims) == sorted(ids)
    assert len(jobs_store.start_jobs(claims, "test:1")) == 2
    label = f"{name} (#{user.pk})"
    user.delete()
    return claims, label


def test_a_deleted_owners_running_batch_swept_as_shared_is_cancelled_not_refunded(django_user_model: Any, run_sql):
    """The sweeper's refund of a batch that died together: a retired owner's jobs end cancelled, not pending."""
    claims, label = _running_pair(django_user_model, run_sql, "kate")
    ids = [c[0] for c in claims]
    run_sql(
        "UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '10 minutes',"
        " heartbeat_at = now() - interval '10 minutes' WHERE id = ANY(%s)",
        [ids],
    )

    assert sweep.reclaim_expired() == (0, 0), "neither pending again nor dead"

    assert set(states(ids).values()) == {(JobState.CANCELLED, None, label)}
    assert ScheduledJob.objects.filter(pk__in=ids, finished_at__isnull=False).count() == 2
    assert jobs_store.claim_due_jobs(10) == []


def test_a_deleted_owners_lost_shared_chunk_released_is_cancelled_not_refunded(django_user_model: Any, run_sql):
    """release_lost_chunk of a chunk of two: a retired owner's jobs end cancelled, not pending."""
    claims, label = _running_pair(django_user_model, run_sql, "liam")
    ids = [c[0] for c in claims]

    released = jobs_store.release_lost_chunk([(i, t, 0.0) for i, t in claims], "lost")

    assert {(job.id, job.state) for job in released} == {(i, JobState.CANCELLED) for i in ids}
    assert set(states(ids).values()) == {(JobState.CANCELLED, None, label)}
    assert jobs_store.claim_due_jobs(10) == []


def test_a_deleted_owners_running_jobs_released_on_shutdown_are_cancelled_like_every_give_back(
    django_user_model: Any, run_sql
):
    """A worker's shutdown gives a retired owner's running jobs back: cancelled, as every give-back (was dead)."""
    claims, label = _running_pair(django_user_model, run_sql, "mona")
    ids = [c[0] for c in claims]

    released = jobs_store.release_jobs(claims, runner.RELEASE_REASON)

    assert {(job.id, job.state) for job in released} == {(i, JobState.CANCELLED) for i in ids}
    assert set(states(ids).values()) == {(JobState.CANCELLED, None, label)}
    assert jobs_store.claim_due_jobs(10) == []


def test_a_deleted_owners_running_job_that_fails_is_dead_its_attempt_was_the_last(django_user_model: Any, run_sql):
    """A retired owner's running job whose handler fails ends dead: the attempt it was on was its last."""
    claims, label = _running_pair(django_user_model, run_sql, "nell")
    now = store.database_now()
    failures = [jobs_store.Outcome(i, t, now, now, "failed", "boom", 0.0) for i, t in claims]

    moved = jobs_store.fail_jobs(failures)

    assert {(job.id, job.state) for job in moved} == {(i, JobState.DEAD) for i, _ in claims}
    assert set(states([i for i, _ in claims]).values()) == {(JobState.DEAD, None, label)}


def test_a_deleted_owners_dead_job_is_not_retried_and_a_system_job_of_its_key_is_the_systems(django_user_model: Any):
    """retry_dead_many (the admin's Retry) leaves it dead: retried, it was pending as nobody's job under its key,
    and the system's schedule(key=..., on_conflict="keep") got the deleted user's job back."""
    alice = django_user_model.objects.create_user("alice", password="pw")
    job_id = api.schedule("demo.record", {}, key="invoice-42", delay=60, owner=alice).id
    ScheduledJob.objects.filter(pk=job_id).update(state=JobState.DEAD, finished_at=timezone.now())
    alice.delete()
    result = api.retry_dead_many([job_id])
    assert (result.changed, dict(result.untouched)) == ((), {job_id: JobState.DEAD})
    system = api.schedule("demo.record", {"system": True}, key="invoice-42", delay=60, on_conflict="keep")
    assert system.id != job_id
    assert system.owner_id is None
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.DEAD
