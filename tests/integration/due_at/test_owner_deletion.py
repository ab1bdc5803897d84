"""A deleted user's work: pending jobs and recurrences cancelled first, history kept as theirs, never the system's."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduling import api
from scheduling.core import exceptions, registry, store
from scheduling.due_at import runner
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


def test_a_claimed_job_of_a_deleted_owner_fails_its_last_attempt_instead_of_running_as_the_system(
    django_user_model: Any, run_sql
):
    """Claimed before the deletion, run after: payments.retry's owner check gets OwnerDeleted, the job is dead."""
    frank = django_user_model.objects.create_user("frank")
    payment = Payment.objects.create(reference="pay-frank", amount_cents=100, owner=frank)
    job = api.schedule("payments.retry", {"reference": "pay-frank"}, delay=0, owner=frank)
    overdue(run_sql, [job.id])
    [claim] = jobs_store.claim_due_jobs(10)

    frank_id = frank.pk
    frank.delete()
    report = runner.run_batch([(claim.id, claim.token)])

    assert (report.started, report.failed) == (1, 1)
    row = ScheduledJob.objects.get(pk=job.id)
    assert (row.state, row.owner_id, row.former_owner) == (JobState.DEAD, None, f"frank (#{frank_id})")
    attempt = JobAttempt.objects.get(job_id=job.id)
    assert "was deleted; it does not run as the system" in attempt.error
    payment.refresh_from_db()
    assert payment.attempts == 0, "the payment was not charged as the system"


def test_owner_id_of_a_system_job_is_none_and_of_a_deleted_owners_job_raises():
    """job.owner_id: None for the system's job, OwnerDeleted when former_owner says a user owned it."""
    system = api.schedule("demo.record", {}, delay=60)
    assert registry.Job("demo.record", {}, 1, 1, None, id=system.id).owner_id is None
    ScheduledJob.objects.filter(pk=system.id).update(former_owner="gone (#99)")
    with pytest.raises(exceptions.OwnerDeleted, match="gone"):
        _ = registry.Job("demo.record", {}, 1, 1, None, id=system.id).owner_id
