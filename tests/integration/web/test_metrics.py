"""/metrics and /healthz against real PostgreSQL and Redis."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from prometheus_client.parser import text_string_to_metric_families

from scheduling import api
from scheduling.core import conf, store
from scheduling.models import JobAttempt, JobState, ScheduledJob, SchedulerHeartbeat
from tests.e2e import harness

pytestmark = pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: no collectstatic here


@pytest.fixture
def client(admin_client: Any) -> Any:
    """A superuser's session: /healthz shows its details only to users who may view jobs (or the token)."""
    return admin_client


def scrape(client: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics parsed: {sample name: {sorted labels: value}}."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def attempt(job: ScheduledJob, *, due: dt.datetime, started: dt.datetime, outcome: str = "succeeded") -> JobAttempt:
    return JobAttempt.objects.create(
        job=job, number=1, token=uuid.uuid4(), due_at=due, started_at=started, finished_at=started, outcome=outcome
    )


@pytest.mark.django_db
def test_metrics_report_the_table_the_attempts_and_the_broker(client):
    """Backlog, oldest overdue, pending, claimed, attempts by kind and outcome and the lag histogram match the rows."""
    now = store.database_now()
    api.schedule("demo.noop", {}, due_at=now - dt.timedelta(seconds=90))
    api.schedule("demo.noop", {}, due_at=now - dt.timedelta(seconds=30))
    api.schedule("demo.record", {}, delay=3600)
    claimed = api.schedule("demo.fail", {}, due_at=now - dt.timedelta(seconds=200))
    ScheduledJob.objects.filter(pk=claimed.pk).update(state=JobState.CLAIMED, token=uuid.uuid4(), claimed_at=Now())
    finished = api.schedule("demo.record", {}, delay=1)
    # Made before the attempts' due times: a lag counts from the later of due time and creation.
    ScheduledJob.objects.filter(pk=finished.pk).update(created_at=now - dt.timedelta(hours=3))
    recent = now - dt.timedelta(seconds=10)
    for lag, outcome in ((0.003, "succeeded"), (0.2, "succeeded"), (4.0, "failed"), (4000.0, "timed_out")):
        attempt(finished, due=recent - dt.timedelta(seconds=lag), started=recent, outcome=outcome)
    attempt(finished, due=now - dt.timedelta(hours=2), started=now - dt.timedelta(hours=1))  # outside the window

    m = scrape(client)
    assert m["timekeeper_backlog_jobs"][()] == 2
    assert 89 <= m["timekeeper_oldest_overdue_seconds"][()] <= 92
    assert m["timekeeper_pending_jobs"][()] == 4
    assert m["timekeeper_claimed_jobs"][()] == 1
    attempts = m["timekeeper_job_attempts_recent"]
    assert attempts[(("kind", "demo.record"), ("outcome", "succeeded"))] == 2
    assert attempts[(("kind", "demo.record"), ("outcome", "timed_out"))] == 1
    buckets = {dict(k)["le"]: v for k, v in m["timekeeper_due_to_start_lag_seconds_bucket"].items()}
    assert (buckets["0.005"], buckets["0.25"], buckets["5.0"], buckets["3600.0"], buckets["+Inf"]) == (1, 2, 3, 3, 4)
    assert m["timekeeper_due_to_start_lag_seconds_count"][()] == 4
    assert m["timekeeper_due_to_start_lag_seconds_sum"][()] == pytest.approx(4004.203, abs=0.01)
    assert m["timekeeper_up"] == {(("part", "database"),): 1.0, (("part", "broker"),): 1.0}
    assert "timekeeper_broker_delayed_messages" in m
    assert m["timekeeper_metrics_window_seconds"][()] == conf.Settings().metrics_window_seconds


@pytest.mark.django_db
def test_metrics_token_is_required_when_configured(client):
    """With SCHEDULING_METRICS_TOKEN set, /metrics answers 401 without the bearer token and 200 with it."""
    with override_settings(SCHEDULING_METRICS_TOKEN="scrape-secret"):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret").status_code == 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def beat_heartbeat(age_seconds: float) -> None:
    at = store.database_now() - dt.timedelta(seconds=age_seconds)
    SchedulerHeartbeat.objects.update_or_create(
        role="beat", defaults={"holder": "host:1", "acquired_at": at, "heartbeat_at": at}
    )


@pytest.mark.django_db
def test_healthz_is_200_when_every_part_is_fine(client):
    """A fresh beat heartbeat, a reachable database and broker and a small backlog: 200, status ok."""
    beat_heartbeat(2)
    response = client.get("/healthz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["failing"]) == ("ok", [])
    assert {name: part["status"] for name, part in body["checks"].items()} == {
        "database": "ok",
        "broker": "ok",
        "beat": "ok",
        "backlog": "ok",
    }
    assert response["Cache-Control"].startswith("max-age=0")


def enabled_periodic_task(name: str = "nightly") -> PeriodicTask:
    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    return PeriodicTask.objects.create(name=name, task="celery.backend_cleanup", interval=every, enabled=True)


@pytest.mark.django_db
def test_healthz_names_a_stale_beat(client):
    """A heartbeat older than SCHEDULING_HEALTH_BEAT_MAX_AGE_SECONDS is 503 naming beat; no heartbeat at all too."""
    enabled_periodic_task()
    response = client.get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["beat"])
    beat_heartbeat(45)
    response = client.get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["beat"])
    assert "45s old" in response.json()["checks"]["beat"]["error"]
    with override_settings(SCHEDULING_HEALTH_BEAT_MAX_AGE_SECONDS=60):
        assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_healthz_needs_no_beat_while_no_periodic_task_is_enabled(client, admin_client):
    """due_at jobs and deferrals need no beat: without an enabled periodic task, no (or a stale) beat is ok."""
    response = client.get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (200, [])
    detail = admin_client.get("/healthz").json()["checks"]["beat"]
    assert (detail["status"], detail["needed"]) == ("ok", False)

    task = enabled_periodic_task()
    assert client.get("/healthz").json()["failing"] == ["beat"], "an enabled schedule needs a beat"
    beat_heartbeat(45)
    assert client.get("/healthz").json()["failing"] == ["beat"]
    task.enabled = False
    task.save()
    assert client.get("/healthz").status_code == 200, "a disabled schedule does not"


@pytest.mark.django_db
def test_healthz_names_a_backlog_over_the_threshold(client):
    """More overdue jobs than SCHEDULING_HEALTH_MAX_BACKLOG is 503 naming backlog, with the count."""
    beat_heartbeat(1)
    api.schedule("demo.noop", {}, due_at=store.database_now() - dt.timedelta(minutes=1))
    api.schedule("demo.noop", {}, due_at=store.database_now() - dt.timedelta(minutes=2))
    with override_settings(SCHEDULING_HEALTH_MAX_BACKLOG=1):
        response = client.get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["backlog"])
    assert response.json()["checks"]["backlog"]["backlog"] == 2


@pytest.mark.django_db
def test_healthz_names_an_unreachable_broker(client, monkeypatch):
    """A broker nobody listens on is 503 naming broker, within the bounded wait."""
    beat_heartbeat(1)
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")  # Celery's broker_url reads it first
    response = client.get("/healthz")
    assert (response.status_code, response.json()["failing"]) == (503, ["broker"])
    assert "Error" in response.json()["checks"]["broker"]["error"]


@pytest.mark.django_db(transaction=True)
def test_database_loss_is_503_naming_the_database_and_metrics_say_down(client, raw_connect):
    """With this process's PostgreSQL session killed, /healthz is 503 naming database; /metrics reports up=0."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = raw_connect(autocommit=True)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        response = client.get("/healthz")
        body = response.json()
        assert (response.status_code, body["failing"]) == (503, ["database"])
        assert (body["checks"]["beat"]["status"], body["checks"]["backlog"]["status"]) == ("skipped", "skipped")
        m = scrape(client)
        assert m["timekeeper_up"][(("part", "database"),)] == 0
        assert "timekeeper_backlog_jobs" not in m
    finally:
        connection.close()  # the next query reconnects


@pytest.mark.django_db
def test_metrics_and_healthz_are_exempt_from_the_https_redirect(client):
    """In production mode /healthz and /metrics answer over plain HTTP while the admin is redirected to HTTPS."""
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "x" * 60,
        "ALLOWED_HOSTS": "testserver",
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    code = "import json; from project import settings as s; print(json.dumps(s.SECURE_REDIRECT_EXEMPT))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=harness.ROOT)
    exempt = json.loads(out.stdout)
    with override_settings(SECURE_SSL_REDIRECT=True, SECURE_REDIRECT_EXEMPT=exempt):
        assert client.get("/admin/").status_code == 301
        assert client.get("/metrics", HTTP_AUTHORIZATION="x").status_code != 301
        assert client.get("/healthz").status_code in {200, 503}


# --- /metrics closed in production, cached; /healthz details not for anonymous callers


@pytest.mark.django_db
def test_metrics_are_refused_in_production_without_a_token_unless_opened(client):
    """DEBUG off, no token: /metrics is 401; SCHEDULING_METRICS_PUBLIC=True opens it on purpose."""
    with override_settings(DEBUG=False, SCHEDULING_METRICS_PUBLIC=False, SCHEDULING_METRICS_TOKEN=""):
        assert client.get("/metrics").status_code == 401
    with override_settings(DEBUG=False, SCHEDULING_METRICS_PUBLIC=True, SCHEDULING_METRICS_TOKEN=""):
        assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_scrapes_within_the_cache_period_share_one_computation(client):
    """Within SCHEDULING_METRICS_CACHE_SECONDS a new job does not show: the scrape reused the cached text."""
    from scheduling.web import metrics

    with override_settings(SCHEDULING_METRICS_CACHE_SECONDS=3600):
        metrics.forget_cached()
        first = scrape(client)
        api.schedule("demo.noop", {}, delay=600)
        assert scrape(client) == first
        metrics.forget_cached()
        assert scrape(client)["timekeeper_pending_jobs"] != first["timekeeper_pending_jobs"]
    metrics.forget_cached()


@pytest.mark.django_db
def test_anonymous_healthz_shows_no_internal_detail(monkeypatch):
    """A failing broker: anonymous callers see part statuses only; the token holder sees the error text."""
    from django.test import Client

    monkeypatch.setenv("CELERY_BROKER_URL", "redis://:hunter2@internal-redis.example.invalid:6390/0")
    with override_settings(SCHEDULING_METRICS_TOKEN="scrape-secret"):
        anonymous = Client().get("/healthz")
        text = anonymous.content.decode()
        assert anonymous.status_code == 503
        for secret in ("internal-redis", "6390", "error"):
            assert secret not in text
        assert anonymous.json()["checks"]["broker"] == {"status": "failing"}
        detailed = Client().get("/healthz", HTTP_AUTHORIZATION="Bearer scrape-secret").json()
        assert "error" in detailed["checks"]["broker"]
