"""Security settings: JSON only, no anonymous admin, a clean deploy check, a password for compose's Redis.

Configuration is checked the way it is used: ``manage.py check`` in a subprocess with the
production environment (or a settings module that turns pickle on). The parts that need a real
worker or Flower are in ``tests/e2e/project/test_security.py``.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from project.celery import app as celery_app
from scheduling import api, checks
from scheduling.models import JobState, ScheduledJob
from tests import support
from tests.celeryconf import override_celery
from tests.support import ROOT

yaml = pytest.importorskip("yaml")


UNSET = ("DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY")  # the test run's own; each test says what it wants


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
    bad = support.manage(
        "check", env={"DJANGO_SETTINGS_MODULE": "pickle_settings", "DEBUG": "1"}, drop=UNSET, python_path=[tmp_path]
    )
    assert bad.returncode != 0
    assert "scheduling.E002" in bad.stderr
    good = support.manage("check", env={"DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "1"}, drop=UNSET)
    assert good.returncode == 0, good.stderr
    assert "scheduling.E002" not in good.stdout + good.stderr


# --- Production mode -----------------------------------------------------------------------------


def test_check_deploy_is_clean_in_production_mode() -> None:
    """`manage.py check --deploy --fail-level WARNING` reports nothing with DEBUG off and a real secret."""
    env = {
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "ALLOWED_HOSTS": "example.com",
    }
    done = support.manage("check", "--deploy", "--fail-level", "WARNING", env=env, drop=UNSET)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "WARNINGS" not in done.stdout + done.stderr
    assert "?: (" not in done.stdout + done.stderr  # no issue lines of any level


def test_production_mode_refuses_to_start_without_a_secret_key() -> None:
    """With DEBUG off and no SECRET_KEY, every command fails instead of running with a known key."""
    done = support.manage("check", env={"DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "0"}, drop=UNSET)
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
