"""Per-kind authorization, handlers checking owners, owner-scoped keys, staff permissions."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.utils import timezone

from scheduling import api, registry
from scheduling.models import ScheduledJob
from scheduling.web import auth
from tasks.models import Notification, Payment, PaymentState, Trial

URL = "/api/jobs/"


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob")


def token_client(user: Any) -> Client:
    _, raw = auth.issue_token(user, "test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post(client: Client, body: dict[str, Any], url: str = URL) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def grant(user: Any, *codenames: str) -> None:
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))


def run_handler(job: ScheduledJob) -> None:
    """Hand a stored job to its handler the way the runner does (table mechanism, its id)."""
    handed = registry.Job(
        kind=job.kind, payload=job.payload, attempt=1, max_attempts=job.max_attempts, due_at=job.due_at, id=job.id
    )
    registry.get(job.kind).func(handed)


# --- 1. authorization per kind, handlers check the owner --------------------------------------------------


@pytest.mark.django_db
def test_a_user_cannot_schedule_a_reminder_for_another_users_trial(alice, bob):
    """Alice's token may not schedule reminders.trial_ending naming Bob and his trial: 403, nothing stored."""
    trial = Trial.objects.create(user=bob, ends_at=timezone.now() + dt.timedelta(days=10))
    client = token_client(alice)
    for payload in ({"user_id": bob.id, "trial_id": trial.id}, {"user_id": alice.id, "trial_id": trial.id}):
        response = post(client, {"kind": "reminders.trial_ending", "payload": payload, "delay": 5})
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "kind_not_allowed"
    assert ScheduledJob.objects.count() == 0


@pytest.mark.django_db
def test_payment_retry_needs_the_permission_and_the_payment_owner(alice, bob):
    """payments.retry: 403 without tasks.schedule_payment, 403 for Bob's payment, accepted for Alice's own."""
    Payment.objects.create(reference="pay-bob", amount_cents=100, owner=bob)
    Payment.objects.create(reference="pay-alice", amount_cents=100, owner=alice)
    client = token_client(alice)
    body = {"kind": "payments.retry", "payload": {"reference": "pay-alice"}, "delay": 5}
    assert post(client, body).status_code == 403
    grant(alice, "schedule_payment")
    client = token_client(alice)
    bobs = {"kind": "payments.retry", "payload": {"reference": "pay-bob"}, "delay": 5}
    assert post(client, bobs).status_code == 403
    assert post(client, body).status_code == 201
    assert list(ScheduledJob.objects.values_list("payload", flat=True)) == [{"reference": "pay-alice"}]


@pytest.mark.django_db
def test_a_kind_without_access_is_refused_even_to_superusers(django_user_model):
    """demo.fail declares no api Access: the JSON API refuses it for everyone, superusers included."""
    root = django_user_model.objects.create_superuser("root", password="pw-root")
    response = post(token_client(root), {"kind": "demo.fail", "payload": {}, "delay": 5})
    assert response.status_code == 403
    assert ScheduledJob.objects.count() == 0


@pytest.mark.django_db
def test_admin_add_form_offers_and_accepts_only_allowed_kinds_for_non_superusers(django_user_model):
    """A staff user who may add jobs sees only kinds their Access allows, and a posted other kind is refused."""
    clerk = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    grant(clerk, "add_scheduledjob", "view_scheduledjob")
    client = Client()
    client.force_login(clerk)
    page = client.get("/admin/scheduling/scheduledjob/add/").content.decode()
    assert 'value="demo.noop"' in page
    assert 'value="demo.fail"' not in page
    assert 'value="payments.retry"' not in page
    response = client.post(
        "/admin/scheduling/scheduledjob/add/",
        {"kind": "demo.fail", "payload": "{}", "delay_seconds": "5", "on_conflict": "error"},
    )
    assert response.status_code == 200
    assert ScheduledJob.objects.count() == 0


@pytest.mark.django_db
def test_handlers_refuse_entities_of_another_owner(alice, bob, mailoutbox):
    """A job owned by Alice naming Bob's trial or payment sends no mail and charges nothing when it runs."""
    trial = Trial.objects.create(user=bob, ends_at=timezone.now() + dt.timedelta(days=10))
    Payment.objects.create(reference="pay-bob", amount_cents=100, owner=bob, state=PaymentState.FAILED)
    reminder = api.schedule("reminders.trial_ending", {"user_id": bob.id, "trial_id": trial.id}, delay=5, owner=alice)
    retry = api.schedule("payments.retry", {"reference": "pay-bob"}, delay=5, owner=alice)
    run_handler(ScheduledJob.objects.get(pk=reminder.pk))
    run_handler(ScheduledJob.objects.get(pk=retry.pk))
    assert Notification.objects.count() == 0
    assert mailoutbox == []
    assert Payment.objects.get(reference="pay-bob").attempts == 0
    own = api.schedule("reminders.trial_ending", {"user_id": bob.id, "trial_id": trial.id}, delay=5, owner=bob)
    run_handler(ScheduledJob.objects.get(pk=own.pk))
    assert Notification.objects.count() == 1


# --- 2. the key race ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_owners_racing_on_one_new_key_each_get_their_own_job(alice, bob):
    """A and B posting the same new key at once: each gets 201 and a job of their own, every round."""
    clients = {alice.id: token_client(alice), bob.id: token_client(bob)}
    for round_number in range(25):
        barrier = threading.Barrier(2)
        answers: dict[int, Any] = {}

        def call(
            user_id: int,
            key: str = f"race-{round_number}",
            barrier: threading.Barrier = barrier,
            answers: dict[int, Any] = answers,
        ) -> None:
            try:
                barrier.wait()
                answers[user_id] = post(clients[user_id], {"kind": "demo.noop", "delay": 600, "key": key})
            finally:
                connection.close()

        threads = [threading.Thread(target=call, args=(uid,)) for uid in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bodies = {uid: answers[uid].json() for uid in clients}
        assert {answers[uid].status_code for uid in clients} == {201}, bodies
        assert {bodies[uid]["job"]["owner"] for uid in clients} == set(clients)
        assert bodies[alice.id]["job"]["id"] != bodies[bob.id]["job"]["id"]
    assert ScheduledJob.objects.count() == 50


@pytest.mark.django_db(transaction=True)
def test_one_owner_racing_on_one_new_key_gets_created_once_and_replaced_once(alice):
    """Two requests of one owner for a new key: one 201 created and one 200 replaced, the same job."""
    client = token_client(alice)
    for round_number in range(15):
        barrier = threading.Barrier(2)
        answers: list[Any] = []

        def call(
            key: str = f"same-{round_number}", barrier: threading.Barrier = barrier, answers: list[Any] = answers
        ) -> None:
            try:
                barrier.wait()
                answers.append(post(client, {"kind": "demo.noop", "delay": 600, "key": key}))
            finally:
                connection.close()

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(a.status_code for a in answers) == [200, 201]
        assert sorted(a.json()["outcome"] for a in answers) == ["created", "replaced"]
        assert len({a.json()["job"]["id"] for a in answers}) == 1
    assert ScheduledJob.objects.count() == 15


# --- 3. keys are per owner ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_another_users_job_under_my_trial_key_is_not_mine(alice, bob):
    """A job Alice makes under key trial-ending:<Bob's trial> is not shown or moved by Bob's trial pages."""
    bob_client = Client()
    bob_client.force_login(bob)
    ends = (timezone.localtime() + dt.timedelta(days=10)).strftime("%Y-%m-%dT%H:%M")
    bob_client.post("/trials/start", {"plan": "pro", "ends_at": ends})
    trial = Trial.objects.get(user=bob)
    bobs_job = ScheduledJob.objects.get(owner=bob)
    response = post(token_client(alice), {"kind": "demo.noop", "delay": 3600, "key": trial.reminder_key})
    assert response.status_code == 201
    alices = ScheduledJob.objects.get(pk=response.json()["job"]["id"])
    page = bob_client.get(f"/trials/{trial.id}/").content.decode()
    assert f"#{alices.id}" not in page
    assert f"#{bobs_job.id}" in page
    new_end = (timezone.localtime() + dt.timedelta(days=20)).strftime("%Y-%m-%dT%H:%M")
    bob_client.post(f"/trials/{trial.id}/end", {"ends_at": new_end})
    assert ScheduledJob.objects.get(pk=alices.id).due_at == alices.due_at
    assert ScheduledJob.objects.get(pk=bobs_job.id).due_at != bobs_job.due_at


@pytest.mark.django_db
def test_conflict_answers_never_name_another_owners_job(alice, bob):
    """on_conflict=error meets only the caller's own job; another owner's key is invisible in every answer."""
    theirs = api.schedule("demo.noop", {}, delay=600, key="k", owner=bob)
    response = post(token_client(alice), {"kind": "demo.noop", "delay": 5, "key": "k", "on_conflict": "error"})
    assert response.status_code == 201
    assert str(theirs.id) != str(response.json()["job"]["id"])
    assert "cannot see" not in response.content.decode()


# --- 4. staff power needs model permissions ----------------------------------------------------------------


@pytest.mark.django_db
def test_staff_flag_alone_gives_no_api_power(alice, django_user_model):
    """A staff user without job permissions cannot read, cancel or take over another user's job."""
    clerk = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    job = api.schedule("demo.noop", {"secret": "alice-only"}, delay=600, key="alice-key", owner=alice)
    client = token_client(clerk)
    assert client.get(URL).json()["count"] == 0
    assert client.get(f"/api/jobs/{job.id}").status_code == 404
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").status_code == 404
    taken = post(client, {"kind": "demo.noop", "payload": {"v": 2}, "delay": 5, "key": "alice-key"})
    assert taken.status_code == 201
    stored = ScheduledJob.objects.get(pk=job.id)
    assert (stored.owner_id, stored.payload, stored.state) == (alice.id, {"secret": "alice-only"}, "pending")


@pytest.mark.django_db
def test_view_permission_reads_but_change_permission_is_needed_to_change(alice, django_user_model):
    """scheduling.view_scheduledjob shows every job; cancel of another's job is 403 until change is granted."""
    clerk = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    grant(clerk, "view_scheduledjob")
    job = api.schedule("demo.noop", {}, delay=600, owner=alice)
    client = token_client(clerk)
    assert client.get(f"/api/jobs/{job.id}").status_code == 200
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").status_code == 403
    grant(clerk, "change_scheduledjob")
    client = token_client(clerk)
    assert client.post(f"/api/jobs/{job.id}/cancel", content_type="application/json").status_code == 200
