"""Security settings: JSON only, no anonymous admin or Flower, no payloads in logs, a clean deploy check.

Configuration is checked the way it is used: ``manage.py check`` in a subprocess with the
production environment (or a settings module that turns pickle on), Flower started for real with
``--basic-auth``, and a job carrying a secret marker run through a real worker whose log is read.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from project.celery import app as celery_app
from scheduling import api, checks
from scheduling.models import JobState, ScheduledJob
from tests.celeryconf import override_celery
from tests.e2e import conftest as e2e_fixtures
from tests.e2e import harness
from tests.e2e.private_services import free_port

broker = e2e_fixtures.broker  # the real-worker fixtures of tests/e2e, used here too
cluster = e2e_fixtures.cluster
ROOT = Path(__file__).resolve().parents[2]
yaml = pytest.importorskip("yaml")


def _manage(args: list[str], env: dict[str, str], extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py <args>`` in a fresh interpreter with ``env`` on top of a clean environment."""
    environ = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY"}}
    environ.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(extra_path or ""), str(ROOT)])), **env})
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=180
    )


# --- Only JSON ---------------------------------------------------------------------------------------


def test_celery_accepts_and_produces_json_only() -> None:
    """The Celery app as configured accepts JSON only and serializes tasks and results as JSON."""
    conf = celery_app.conf
    assert list(conf.accept_content) == ["json"]
    assert list(conf.result_accept_content or conf.accept_content) == ["json"]
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"
    assert checks.check_json_only() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"accept_content": ["json", "pickle"]},
        {"accept_content": ["application/x-python-serialize"]},
        {"task_serializer": "pickle"},
        {"result_serializer": "pickle"},
        {"result_accept_content": ["json", "pickle"]},
        {"accept_content": ["json", "yaml"]},
    ],
)
def test_check_e002_fails_when_non_json_is_configured(overrides: dict[str, object]) -> None:
    """scheduling.E002 is an error for every way of letting pickle (or any non-JSON) into Celery's configuration."""
    with override_celery(**overrides):
        errors = checks.check_json_only()
    assert [e.id for e in errors] == ["scheduling.E002"]
    assert errors[0].level >= 40  # an Error: manage.py commands refuse to run


def test_manage_check_fails_with_pickle_settings(tmp_path: Path) -> None:
    """`manage.py check` exits non-zero naming scheduling.E002 under settings that accept pickle."""
    (tmp_path / "pickle_settings.py").write_text(
        "from project.settings import *  # noqa\nCELERY_ACCEPT_CONTENT = ['json', 'pickle']\n"
    )
    bad = _manage(["check"], {"DJANGO_SETTINGS_MODULE": "pickle_settings", "DEBUG": "1"}, tmp_path)
    assert bad.returncode != 0
    assert "scheduling.E002" in bad.stderr
    good = _manage(["check"], {"DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "1"})
    assert good.returncode == 0, good.stderr
    assert "scheduling.E002" not in good.stdout + good.stderr


@pytest.mark.e2e
def test_worker_refuses_to_start_when_pickle_is_accepted(tmp_path: Path, cluster) -> None:
    """A celery worker under settings that accept pickle exits at start naming scheduling.E002, consuming nothing."""
    (tmp_path / "pickle_worker_settings.py").write_text(
        "from project.settings import *  # noqa\nCELERY_ACCEPT_CONTENT = ['json', 'pickle']\n"
    )
    pythonpath = os.pathsep.join([str(tmp_path), str(ROOT)])
    env = {
        "DJANGO_SETTINGS_MODULE": "pickle_worker_settings",
        "PYTHONPATH": pythonpath,
        "C_FORCE_ROOT": "1",  # as root Celery refuses pickle by itself; this test is about Timekeeper's refusal
    }
    worker = cluster.worker(env=env)
    assert worker.popen.wait(60) != 0
    assert "scheduling.E002" in worker.log()
    assert "ready." not in worker.log()


# --- Production mode -----------------------------------------------------------------------------


def test_check_deploy_is_clean_in_production_mode() -> None:
    """`manage.py check --deploy --fail-level WARNING` reports nothing with DEBUG off and a real secret."""
    env = {
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "ALLOWED_HOSTS": "example.com",
    }
    done = _manage(["check", "--deploy", "--fail-level", "WARNING"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "WARNINGS" not in done.stdout + done.stderr
    assert "?: (" not in done.stdout + done.stderr  # no issue lines of any level


def test_production_mode_refuses_to_start_without_a_secret_key() -> None:
    """With DEBUG off and no SECRET_KEY, every command fails instead of running with a known key."""
    done = _manage(["check"], {"DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "0"})
    assert done.returncode != 0
    assert "SECRET_KEY" in done.stderr


# --- The compose file ----------------------------------------------------------------------------


def test_compose_redis_requires_a_password() -> None:
    """docker-compose's Redis requires a password (from a config file, not argv), and every app URL carries it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    script = " ".join(services["redis"]["command"])
    assert 'echo "requirepass $$REDIS_PASSWORD" > /tmp/redis.conf' in script
    assert "--requirepass" not in script
    environment = services["redis"]["environment"]
    assert environment["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?"), "the password is required, not defaulted"
    assert environment["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")  # the healthcheck's redis-cli reads it
    health = " ".join(services["redis"]["healthcheck"]["test"])
    assert "-a" not in health.split()
    assert "REDIS_PASSWORD" not in health
    for name, service in services.items():
        url = (service.get("environment") or {}).get("CELERY_BROKER_URL")
        if url is not None:
            assert url.startswith("redis://:${REDIS_PASSWORD:?"), f"{name} reaches Redis without the password"
    assert "6379" not in str(services["redis"].get("ports", "")), "Redis is not published on the host"
    assert "--basic-auth" not in " ".join(services["flower"]["command"])
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


# --- Nobody anonymous ----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
def test_admin_refuses_anonymous_access(client) -> None:
    """Anonymous requests to the admin and its job pages are sent to the login page, and change nothing."""
    job = api.schedule("demo.record", {"label": "admin"}, delay=3600)
    for url in ["/admin/", "/admin/scheduling/scheduledjob/", f"/admin/scheduling/scheduledjob/{job.id}/change/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/"), url
    response = client.post(
        "/admin/scheduling/scheduledjob/", {"action": "delete_selected", "_selected_action": [job.id], "post": "yes"}
    )
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)  # noqa: S310 - always http://127.0.0.1 (our Flower)
    if auth is not None:
        request.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own local URL
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.mark.e2e
def test_flower_requires_basic_auth(tmp_path: Path) -> None:
    """Flower with FLOWER_BASIC_AUTH answers 401 to anonymous and wrong credentials, 200 to the right ones."""
    port = free_port()
    user, password = "ops", secrets.token_urlsafe(16)
    proc = harness.Proc(
        "flower",
        [*harness.CELERY, "flower", f"--port={port}", "--address=127.0.0.1"],
        harness.base_env({"CELERY_BROKER_URL": settings.CELERY_BROKER_URL, "FLOWER_BASIC_AUTH": f"{user}:{password}"}),
        tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        harness.wait_for(lambda: proc.popen.poll() is not None or _port_open(port), 60, message="Flower to listen")
        assert proc.popen.poll() is None, proc.log()
        for path in ["/", "/workers", "/tasks", "/api/workers", "/api/tasks", "/broker"]:
            assert _get(base + path) == 401, path
            assert _get(base + path, f"{user}:wrong") == 401, path
        assert _get(f"{base}/", f"{user}:{password}") == 200
    finally:
        proc.stop()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --- No payloads in logs ------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
def test_payload_contents_never_reach_the_logs(cluster, caplog) -> None:
    """Jobs and deferrals carrying a secret marker run (and fail) through a real worker; no log shows it."""
    caplog.set_level(logging.DEBUG)
    marker = f"SECRET-{secrets.token_hex(8)}"
    worker = cluster.worker()
    beat = cluster.beat()
    harness.wait_ready(worker)
    ok = api.schedule("demo.record", {"label": marker, "note": marker}, delay=1)
    failing = api.schedule("demo.fail", {"card": marker}, delay=1, max_attempts=2)
    deferred = api.defer("demo.record", {"label": marker}, 1)
    deferred_failing = api.defer("demo.fail", {"card": marker}, 1)
    # Through the HTTP API too: a payload its schema refuses (the 400 answers the caller) and one it takes.
    user = get_user_model().objects.create_user("logs-check")
    web = Client()
    web.force_login(user)
    refused = web.post(
        "/api/jobs/",
        json.dumps({"kind": "reminders.trial_ending", "payload": {"user_id": marker, "trial_id": 1}, "delay": 1}),
        content_type="application/json",
    )
    assert refused.status_code == 400
    created = web.post(
        "/api/jobs/",
        json.dumps({"kind": "demo.record", "payload": {"label": marker}, "delay": 1}),
        content_type="application/json",
    )
    assert created.status_code == 201

    harness.wait_for(lambda: ScheduledJob.objects.get(pk=ok.id).state == JobState.DONE, 60, message="the job")
    harness.wait_for(lambda: ScheduledJob.objects.get(pk=failing.id).state == JobState.DEAD, 60, message="the failure")
    harness.wait_for(
        lambda: ScheduledJob.objects.filter(key=f"broker:{deferred_failing.id}", state=JobState.DEAD).exists(),
        90,
        message="the failing deferral to be recorded dead",
    )
    from tasks.models import Execution

    assert Execution.objects.filter(idempotency_key=f"broker:{deferred.id}").count() == 1
    # The marker did travel (it is stored and was handed to the handlers) ...
    assert ScheduledJob.objects.get(pk=ok.id).payload["label"] == marker
    # ... but no log line anywhere shows it.
    logs = {"worker": worker.log(), "beat": beat.log(), "test process": caplog.text}
    assert "deferral" in logs["test process"] or "scheduled" in logs["test process"]
    assert "deferral dead" in logs["worker"], "the worker log covers the failing deferral"
    for where, text in logs.items():
        assert marker not in text, f"the payload marker appears in the {where} log"
