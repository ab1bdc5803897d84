"""scheduling.deferrals against real PostgreSQL and Redis: the mechanism choice, the guard, runs, retries, counts."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import subprocess
import time
from typing import Any

import psycopg2
import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from scheduling import api, exceptions, registry
from scheduling import tasks as celery_tasks
from scheduling.core import broker as core_broker
from scheduling.core import conf
from scheduling.core import registry as core_registry
from scheduling.deferrals import countdowns
from scheduling.due_at import store
from scheduling.models import JobState, ScheduledJob
from tasks import payments
from tasks.models import Execution, Payment, PaymentState
from tests import support
from tests.celeryconf import override_celery

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = settings.CELERY_BROKER_KEYPREFIX
DEFERRED = f"{PREFIX}{countdowns.QUEUE}"
DEFAULT = f"{PREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"


def queued(client: redis.Redis, key: str = DEFERRED) -> list[dict[str, Any]]:
    """The messages waiting in a queue list, oldest first, with their decoded args."""
    out = []
    for raw in reversed(client.lrange(key, 0, -1)):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append({"headers": message["headers"], "args": args})
    return out


def test_short_delay_is_a_countdown_message_and_no_row(broker):
    """A 30 s deferral is one run_deferred message on the deferral queue with its ETA; nothing in the table."""
    before = timezone.now()
    handle = api.defer("demo.record", {"label": "soon"}, 30)
    assert handle.mechanism == "deferrals"
    assert before + dt.timedelta(seconds=30) <= handle.due_at <= timezone.now() + dt.timedelta(seconds=30)
    [message] = queued(broker)
    assert message["headers"]["task"] == "scheduling.run_deferred"
    assert message["headers"]["id"] == handle.id
    assert countdowns.parse_eta(message["headers"]["eta"]) == handle.due_at
    assert message["args"][:4] == ["demo.record", {"label": "soon"}, 1, handle.id]
    assert countdowns.authentic(*message["args"]), "the fifth arg is defer()'s signature"
    assert ScheduledJob.objects.count() == 0
    assert broker.llen(DEFAULT) == 0, "deferrals never share the claim workers' queue"


def test_delay_at_the_ceiling_stays_on_the_broker(broker):
    """Exactly the ceiling (900 s) still goes to the broker; a timedelta is accepted."""
    handle = api.defer("demo.record", {}, dt.timedelta(seconds=900))
    assert handle.mechanism == "deferrals"
    assert len(queued(broker)) == 1


def test_delay_past_the_ceiling_is_a_row(broker, run_sql):
    """901 s is over the ceiling: a pending due_at row (database clock), no message."""
    handle = api.defer("demo.record", {"label": "later"}, 901)
    assert handle.mechanism == "due_at"
    job = ScheduledJob.objects.get(pk=handle.id)
    assert job.state == JobState.PENDING
    assert job.payload == {"label": "later"}
    (db_now,) = run_sql("SELECT now()")[0]
    assert dt.timedelta(seconds=895) < job.due_at - db_now <= dt.timedelta(seconds=901)
    assert handle.due_at == job.due_at
    assert queued(broker) == []


def test_key_asks_for_a_row_that_a_second_defer_moves(broker):
    """With a key even 5 s becomes a row; deferring the same key again moves that row (schedule's replace)."""
    first = api.defer("demo.record", {"n": 1}, 5, key="deferral-test:1")
    second = api.defer("demo.record", {"n": 2}, 60, key="deferral-test:1")
    assert first.mechanism == second.mechanism == "due_at"
    assert first.id == second.id
    job = ScheduledJob.objects.get(pk=first.id)
    assert job.payload == {"n": 2}
    assert job.key == "deferral-test:1"
    assert queued(broker) == []
    api.cancel(key="deferral-test:1")
    assert ScheduledJob.objects.get(pk=first.id).state == JobState.CANCELLED


@pytest.fixture
def short_visibility_timeout():
    """Celery's visibility timeout is 600 s (and the project's key prefix kept) for the test."""
    options = {**core_broker.transport_options(), "visibility_timeout": 600}
    with override_celery(broker_transport_options=options):
        yield


@pytest.mark.usefixtures("short_visibility_timeout")
def test_delay_that_breaks_the_visibility_guard_is_refused(broker):
    """With a 600 s visibility timeout, 400 s + the 300 s margin would be redelivered: DelayTooLong, nothing sent."""
    with pytest.raises(exceptions.DelayTooLong):
        api.defer("demo.record", {}, 400)
    assert queued(broker) == []
    assert ScheduledJob.objects.count() == 0
    assert api.defer("demo.record", {}, 299).mechanism == "deferrals", "299 s + 300 s still ends before 600 s"
    assert api.defer("demo.record", {}, 1000).mechanism == "due_at", "past the ceiling the guard does not apply"


@pytest.mark.parametrize(
    ("kind", "payload", "delay", "key", "error"),
    [
        ("no.such.kind", {}, 1, None, exceptions.UnknownJobKind),
        ("reminders.trial_ending", {"user_id": "x", "trial_id": 2}, 1, None, exceptions.InvalidPayload),
        ("reminders.trial_ending", [1, 2], 1, None, exceptions.InvalidPayload),
        ("demo.noop", {"x": float("nan")}, 1, None, exceptions.InvalidPayload),
        ("demo.noop", {"blob": "x" * 70_000}, 1, None, exceptions.PayloadTooLarge),
        ("payments.retry", {"reference": ""}, 1, None, exceptions.InvalidPayload),
        ("demo.noop", {}, -1, None, exceptions.InvalidSchedule),
        ("demo.noop", {}, float("inf"), None, exceptions.InvalidSchedule),
        ("demo.noop", {}, True, None, exceptions.InvalidSchedule),
        ("demo.noop", {}, "10", None, exceptions.InvalidSchedule),
        ("demo.noop", {}, 1, "", exceptions.InvalidSchedule),
        ("demo.noop", {}, 1, "k" * 201, exceptions.InvalidSchedule),
    ],
)
def test_bad_input_raises_named_error_and_sends_nothing(broker, kind, payload, delay, key, error):
    """Bad kinds, payloads, delays and keys get schedule()'s named errors; no message, no row."""
    with pytest.raises(error):
        api.defer(kind, payload, delay, key=key)
    assert queued(broker) == []
    assert ScheduledJob.objects.count() == 0


def test_rolled_back_transaction_sends_nothing(broker):
    """The message goes when the caller's transaction commits: a rollback sends nothing."""

    class Boom(Exception):
        pass

    seen_inside: list[list[dict[str, Any]]] = []

    def defer_then_fail() -> None:
        with transaction.atomic():
            api.defer("demo.record", {}, 10)
            seen_inside.append(queued(broker))
            raise Boom

    with pytest.raises(Boom):
        defer_then_fail()
    assert seen_inside == [[]], "not sent before the commit"
    assert queued(broker) == []
    with transaction.atomic():
        handle = api.defer("demo.record", {}, 10)
    assert [m["headers"]["id"] for m in queued(broker)] == [handle.id]


# --- Runs, retries and the dead record ----------------------------------------------------------


def test_run_gives_the_handler_a_broker_job():
    """A run calls the handler with mechanism broker, the deferral id as ref and its attempt number."""
    due = timezone.now()
    result = countdowns.run("demo.record", {"label": "x"}, 1, "d-1", due)
    assert result.outcome == "succeeded"
    [execution] = Execution.objects.all()
    assert execution.idempotency_key == "broker:d-1"
    assert execution.kind == "demo.record"


def test_failure_retries_with_capped_backoff_then_is_recorded_dead():
    """demo.fail (3 attempts) retries twice with its backoff, then its last failure becomes a dead row."""
    due = timezone.now()
    first = countdowns.run("demo.fail", {}, 1, "d-2", due)
    second = countdowns.run("demo.fail", {}, 2, "d-2", due)
    assert (first.outcome, second.outcome) == ("retry", "retry")
    assert 0.5 <= first.retry_in_seconds <= 1.0  # Backoff(1, 2): attempt 1 waits 0.5..1 s
    assert 1.0 <= second.retry_in_seconds <= 2.0
    assert ScheduledJob.objects.count() == 0, "nothing is written while attempts remain"
    last = countdowns.run("demo.fail", {}, 3, "d-2", due)
    assert last.outcome == "dead"
    dead = ScheduledJob.objects.get(pk=last.dead_job_id)
    assert dead.state == JobState.DEAD
    assert (dead.kind, dead.payload, dead.key) == ("demo.fail", {}, "broker:d-2")
    assert dead.attempts == dead.max_attempts == 3
    assert "DemoFailure: attempt 3 of 3 failed on purpose" in dead.last_error
    assert dead.finished_at is not None
    assert abs((dead.due_at - due).total_seconds()) < 0.01
    assert Execution.objects.filter(idempotency_key="broker:d-2").count() == 3
    again = countdowns.run("demo.fail", {}, 3, "d-2", due)
    assert again.outcome == "dead"
    assert again.dead_job_id is None
    assert ScheduledJob.objects.count() == 1, "a redelivered last attempt records no second dead row"


def _end_own_session_then_fail(job: registry.Job) -> None:
    """Fail after this process's database session was ended from outside, as a PostgreSQL restart ends it."""
    connection.ensure_connection()
    pid = connection.connection.get_backend_pid()
    s = connection.settings_dict
    other = psycopg2.connect(dbname=s["NAME"], user=s["USER"] or None, host=s["HOST"] or None, port=s["PORT"] or None)
    try:
        other.autocommit = True
        other.cursor().execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    raise RuntimeError("downstream refused")


registry.handler("deferral.session_lost", schema={"type": "object"}, max_attempts=1)(_end_own_session_then_fail)


def test_a_dead_deferral_is_recorded_after_the_database_session_is_lost():
    """The last attempt's dead row is written on a new session when the old one died (not lost with the ack)."""
    result = countdowns.run("deferral.session_lost", {}, 1, "d-lost", None)
    assert result.outcome == "dead"
    dead = ScheduledJob.objects.get(key="broker:d-lost")
    assert (dead.state, dead.pk) == (JobState.DEAD, result.dead_job_id)
    assert "downstream refused" in dead.last_error


def test_dead_deferral_can_be_retried_as_a_row():
    """The dead record is an ordinary dead job: the admin's retry makes it pending again."""
    result = countdowns.run("demo.fail", {}, 3, "d-3", None)
    assert store.retry_dead_jobs([result.dead_job_id]) == [result.dead_job_id]
    assert ScheduledJob.objects.get(pk=result.dead_job_id).state == JobState.PENDING


def test_unknown_kind_at_run_time_is_retried_then_dead():
    """A message for a kind this worker does not know fails like a handler error, and ends dead."""
    attempts = conf.get().default_max_attempts
    assert countdowns.run("gone.kind", {}, 1, "d-4", None).outcome == "retry"
    result = countdowns.run("gone.kind", {}, attempts, "d-4", None)
    assert result.outcome == "dead"
    assert "Unknown job kind" in ScheduledJob.objects.get(pk=result.dead_job_id).last_error


def test_retry_countdown_is_capped_at_the_ceiling():
    """A backoff longer than the ceiling is cut to the ceiling, so a retry never breaks the guard."""
    long = registry.Backoff(base_seconds=10_000, cap_seconds=100_000)
    assert countdowns.retry_countdown(long, 3) == 900
    with override_settings(SCHEDULING_BROKER_DELAY_MAX_SECONDS=60):
        assert countdowns.retry_countdown(long, 1) == 60


def test_timeout_is_a_failure_that_retries():
    """A handler past its kind's timeout is stopped and retried like a failure."""
    started = time.monotonic()
    result = countdowns.run("demo.sleep", {"seconds": 30}, 1, "d-5", None)  # demo.sleep: timeout 2 s
    assert result.outcome == "retry"
    assert result.error == "timed out after 2s"
    assert time.monotonic() - started < 30, "interrupted: it did not sleep its 30 s out"


# --- Payments -----------------------------------------------------------------------------------


def charges(reference: str) -> int:
    return Execution.objects.filter(idempotency_key=f"payment:{reference}", kind="gateway.charged").count()


def test_payment_declined_twice_succeeds_on_the_third_attempt_and_is_charged_once(broker):
    """fail_times=2: two declines (retries), a charge on attempt 3, and replays charge nothing more."""
    before = timezone.now()
    handle = payments.retry_later("pay-1", 1999, "card declined", fail_times=2)
    assert handle.mechanism == "deferrals"
    [message] = queued(broker)
    assert message["args"][:3] == ["payments.retry", {"reference": "pay-1", "fail_times": 2}, 1]
    assert before + dt.timedelta(seconds=30) <= handle.due_at <= timezone.now() + dt.timedelta(seconds=30)
    payload = message["args"][1]
    outcomes = [countdowns.run("payments.retry", payload, n, handle.id, handle.due_at).outcome for n in (1, 2, 3)]
    assert outcomes == ["retry", "retry", "succeeded"]
    payment = Payment.objects.get(reference="pay-1")
    assert (payment.state, payment.attempts, payment.last_error) == (PaymentState.SUCCEEDED, 3, "")
    assert charges("pay-1") == 1
    assert countdowns.run("payments.retry", payload, 3, handle.id, handle.due_at).outcome == "succeeded"
    assert countdowns.run("payments.retry", payload, 4, handle.id, handle.due_at).outcome == "succeeded"
    assert charges("pay-1") == 1, "a succeeded payment is never charged again"
    assert Payment.objects.get(reference="pay-1").attempts == 3


def test_payment_retry_backoff_starts_at_30_seconds():
    """The payment kind waits 15..30 s after the first decline, then doubles, up to 5 attempts."""
    kind = registry.get("payments.retry")
    assert kind.max_attempts == 5
    assert [kind.backoff.delay(n, rng=_Max()) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]


class _Max:
    def uniform(self, low: float, high: float) -> float:
        return high


def test_payment_that_keeps_failing_is_recorded_dead_after_five_attempts():
    """A card declined every time: five attempts, then a dead row a person sees; the payment stays failed."""
    Payment.objects.create(reference="pay-2", amount_cents=500, state=PaymentState.FAILED)
    payload = {"reference": "pay-2", "fail_times": 100}
    results = [countdowns.run("payments.retry", payload, n, "d-pay-2", None) for n in range(1, 6)]
    assert [r.outcome for r in results] == ["retry"] * 4 + ["dead"]
    dead = ScheduledJob.objects.get(pk=results[-1].dead_job_id)
    assert (dead.kind, dead.state, dead.attempts, dead.key) == ("payments.retry", "dead", 5, "broker:d-pay-2")
    assert "PaymentDeclined" in dead.last_error
    payment = Payment.objects.get(reference="pay-2")
    assert (payment.state, payment.attempts) == (PaymentState.FAILED, 5)
    assert charges("pay-2") == 0


def test_gateway_returns_the_earlier_charge_for_the_same_reference():
    """A replay after a charge that was never recorded (worker died) gets the same charge back, not a new one."""
    first = payments.gateway.charge("pay-3", 100)
    second = payments.gateway.charge("pay-3", 100)
    assert first == second
    assert charges("pay-3") == 1


# --- Counting -----------------------------------------------------------------------------------


def test_counts_split_queued_messages_into_visible_and_delayed(broker):
    """Countdown messages in a queue list are delayed; a plain message is visible; nothing is unacked."""
    for seconds in (30, 60, 120):
        api.defer("demo.noop", {}, seconds)
    celery_tasks.sweep.apply_async()
    counts = countdowns.broker_counts()
    assert counts == {
        "visible": 1,
        "visible_batches": 0,
        "delayed": 3,
        "in_flight": 0,
        "unacked": 0,
        "delayed_held": 0,
        "delayed_queued": 3,
        "exact": True,
    }
    later = time.time() + 90  # seen from 90 s on, two of the three are due: visible
    assert countdowns.broker_counts(now=later)["visible"] == 3
    assert countdowns.broker_counts(now=later)["delayed"] == 1


def test_counts_include_a_batch_waiting_in_a_kinds_named_queue(broker, monkeypatch):
    """A run_batch message in a kind's named queue (registry.handler(queue=...)) is visible: no process declares
    that queue but the workers serving it, so a web process's counts left it out (found by review)."""
    kind = dataclasses.replace(registry.get("demo.record"), queue="counts-reports")
    monkeypatch.setitem(core_registry._kinds, "demo.record", kind)
    assert "counts-reports" in countdowns.queue_names()
    before = countdowns.broker_counts()
    celery_tasks.run_batch.apply_async(args=[[]], queue="counts-reports")
    after = countdowns.broker_counts()
    assert (after["visible"], after["visible_batches"]) == (before["visible"] + 1, before["visible_batches"] + 1)


def test_counts_read_the_unacked_hash(broker):
    """Messages a worker took (the unacked hash) count as delayed when their ETA is ahead, else in flight."""
    api.defer("demo.noop", {}, 60)
    api.defer("demo.noop", {}, 1)
    # Take both the way kombu's Redis transport does: pop from the list, keep [message, exchange, key].
    for tag in ("tag-a", "tag-b"):
        raw = broker.rpop(DEFERRED)
        broker.hset(f"{PREFIX}unacked", tag, json.dumps([json.loads(raw), countdowns.QUEUE, countdowns.QUEUE]))
        broker.zadd(f"{PREFIX}unacked_index", {tag: time.time()})
    counts = countdowns.broker_counts()
    assert (counts["visible"], counts["delayed"], counts["delayed_held"], counts["in_flight"]) == (0, 2, 2, 0)
    counts = countdowns.broker_counts(now=time.time() + 10)
    assert (counts["delayed"], counts["in_flight"], counts["unacked"]) == (1, 1, 2)


def test_counts_are_none_when_redis_does_not_answer(monkeypatch):
    """No Redis: broker_counts() says None (status() still answers for the table)."""
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # Celery's own variable wins over app.conf
    assert countdowns.broker_counts() is None
    assert api.status()["broker"] is None


def test_status_command_shows_table_and_broker_counts(broker, capsys):
    """timekeeper status prints the backlog and the broker counts, as text and as JSON."""
    api.defer("demo.noop", {}, 60)
    api.schedule("demo.noop", {}, delay=3600)
    call_command("timekeeper", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["pending"] == 1
    assert data["broker"]["delayed"] == 1
    assert data["broker"]["visible"] == 0
    call_command("timekeeper", "status")
    text = capsys.readouterr().out
    assert "backlog (pending and due)" in text
    assert "delayed (countdown not yet due)" in text
    line = next(x for x in text.splitlines() if "delayed (countdown" in x)
    assert line.split()[-1] == "1"


# --- Configuration ------------------------------------------------------------------------------


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py <args>`` under the project's settings with ``env`` on top."""
    return support.manage(*args, env={"DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "1", **env}, timeout=120)


def test_misconfigured_ceiling_fails_the_system_check():
    """A 4000 s ceiling under a 3600 s visibility timeout fails `manage.py check` with scheduling.E003."""
    bad = run_manage(
        "check", SCHEDULING_BROKER_DELAY_MAX_SECONDS="4000", CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS="3600"
    )
    assert bad.returncode != 0
    assert "scheduling.E003" in bad.stderr
    good = run_manage(
        "check", SCHEDULING_BROKER_DELAY_MAX_SECONDS="900", CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS="3600"
    )
    assert good.returncode == 0, good.stderr
    edge = run_manage(
        "check", SCHEDULING_BROKER_DELAY_MAX_SECONDS="3300", CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS="3600"
    )
    assert edge.returncode != 0, "ceiling + margin equal to the visibility timeout is not below it"


def test_worker_queue_warning_only_for_a_shared_deferral_queue():
    """A worker consuming the deferral queue with others is warned; a dedicated or a main-only worker is not."""
    assert countdowns.worker_queue_warning(["celery", countdowns.QUEUE]) is not None
    assert countdowns.worker_queue_warning([countdowns.QUEUE]) is None
    assert countdowns.worker_queue_warning(["celery"]) is None


def test_defer_without_a_celery_app_raises_instead_of_sending_to_amqp(broker):
    """Under Celery's fallback app (no project celery.py) defer() raises BrokerNotConfigured and sends nothing."""
    from celery import Celery
    from celery import current_app as celery_current

    project_app = celery_current._get_current_object()
    Celery("default", set_as_current=False, fixups=[]).set_current()
    try:
        with pytest.raises(exceptions.BrokerNotConfigured, match=r"scheduling\.E004"):
            api.defer("demo.noop", {}, 1)
    finally:
        project_app.set_current()
    assert queued(broker) == []


# --- Signed messages: only what defer() produced runs -------------------------------------------


def test_a_deferral_message_is_signed_over_kind_payload_attempt_and_id(broker):
    """defer()'s message carries a fifth arg, the signature; it checks, and changing any signed part breaks it."""
    handle = api.defer("demo.record", {"label": "signed"}, 30)
    [message] = queued(broker)
    kind, payload, attempt, deferral_id, signature = message["args"]
    assert (kind, payload, attempt, deferral_id) == ("demo.record", {"label": "signed"}, 1, handle.id)
    assert countdowns.authentic(kind, payload, attempt, deferral_id, signature)
    for changed in (
        ("payments.retry", payload, attempt, deferral_id),
        (kind, {"label": "other"}, attempt, deferral_id),
        (kind, payload, attempt + 1, deferral_id),
        (kind, payload, attempt, "another-id"),
    ):
        assert not countdowns.authentic(*changed, signature), changed
    assert not countdowns.authentic(kind, payload, attempt, deferral_id, "")


def test_a_run_deferred_message_not_made_by_defer_runs_nothing(broker):
    """The task refuses hand-made messages (unsigned, made-up or another payload's signature): no run, no row."""
    real = countdowns.sign("demo.record", {"label": "a"}, 1, "d-forged-3")
    forged = [
        ["demo.record", {"label": "by-hand"}, 1, "d-forged-1"],  # as Flower's task-apply would send it
        ["payments.retry", {"reference": "pay-x"}, 1, "d-forged-2", "A" * 43],
        ["demo.record", {"label": "b"}, 1, "d-forged-3", real],
    ]
    for args in forged:
        result = celery_tasks.run_deferred.apply(args=args).get()
        assert result["outcome"] == "refused", args
    assert Execution.objects.count() == 0
    assert ScheduledJob.objects.count() == 0
    handle = api.defer("demo.record", {"label": "real"}, 30)
    [message] = queued(broker)
    assert celery_tasks.run_deferred.apply(args=message["args"]).get()["outcome"] == "succeeded"
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == [f"broker:{handle.id}"]


def test_retries_are_signed_again_with_the_next_attempt():
    """A failing attempt's retry message carries attempt + 1 and a signature that checks for it."""
    from celery.exceptions import Retry

    args = countdowns.message_args("demo.fail", {}, 1, "d-retry")
    with pytest.raises(Retry) as raised:
        celery_tasks.run_deferred.apply(args=args, throw=True)
    retried = list(raised.value.sig.args)
    assert retried[:4] == ["demo.fail", {}, 2, "d-retry"]
    assert countdowns.authentic(*retried)


def test_a_signed_payload_that_no_longer_fits_the_schema_is_recorded_dead_without_running():
    """The kind's schema is checked at run time too: a payload failing it runs nothing and is dead at once."""
    result = countdowns.run("demo.record", {"label": 5}, 1, "d-schema", None)  # label must be a string
    assert result.outcome == "dead"
    assert "fails its schema" in result.error
    assert Execution.objects.count() == 0
    dead = ScheduledJob.objects.get(key="broker:d-schema")
    assert (dead.state, dead.attempts) == (JobState.DEAD, 1)
