"""project.preflight against real servers, and through the entry points a newcomer runs.

Each entry point (``python3 dev.py run``, ``manage.py``, ``celery worker`` / ``beat``) is started
as a subprocess with a wrong setting: it must exit with status 78 after one line that names the
setting and says what to do, with no traceback and no password in anything it printed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from project import preflight
from tests.support import ROOT

SECRET = "s3cretpw"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a server that hangs, or a black hole)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def server_url(database: str = "postgres", password: str = SECRET) -> str:
    """A URL for the test PostgreSQL server (trust authentication takes any password)."""
    entry = settings.DATABASES["default"]
    return f"postgresql://{entry['USER']}:{password}@{entry['HOST']}:{entry['PORT'] or 5432}/{database}"


def clean_env(**overrides: str) -> dict[str, str]:
    """This environment without the test run's settings, plus ``overrides``: what a newcomer's shell has."""
    dropped = {
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "CELERY_BROKER_KEYPREFIX",
        "DJANGO_SETTINGS_MODULE",
        "FLOWER_BASIC_AUTH",
        "SECRET_KEY",
        preflight.VERBOSE_VARIABLE,
    }
    environ = {key: value for key, value in os.environ.items() if key not in dropped}
    environ.update(DEBUG="1", WEB_PORT=str(free_port()), FLOWER_PORT=str(free_port()))
    environ.update(overrides)
    return environ


def run(argv: list[str], **overrides: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the checkout with a clean environment; stdout and stderr together."""
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=clean_env(**overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], setting: str, *, says: str) -> None:
    """Exit 78 after exactly one line naming ``setting`` (the last one), no traceback, no password."""
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode == preflight.EXIT_CONFIG, result.stdout
    assert "Traceback" not in result.stdout
    assert SECRET not in result.stdout
    naming = [line for line in lines if setting in line]
    assert len(naming) == 1, result.stdout
    assert naming[0] == lines[-1]
    assert says in naming[0], naming[0]


# --- The checks themselves, against real servers ---------------------------------------------------


def test_working_servers_pass() -> None:
    """The test PostgreSQL and Redis pass both checks."""
    preflight.check_database(server_url())
    preflight.check_broker(settings.CELERY_BROKER_URL)


def test_refused_database_port_is_one_line() -> None:
    """A port nothing listens on is named, with how to fix it and the password masked."""
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.check_database(f"postgresql://postgres:{SECRET}@127.0.0.1:1/x")
    assert str(refused.value) == (
        "DATABASE_URL=postgresql://postgres:***@127.0.0.1:1/x points at 127.0.0.1:1, where nothing accepts "
        "connections: start PostgreSQL there, or fix the host and port."
    )


def test_silent_database_gives_up_after_the_connect_timeout(silent_port: int) -> None:
    """A server that accepts and never answers is reported after the bounded connect timeout, not waited on."""
    with pytest.raises(preflight.PreflightError, match=rf"no answer from 127.0.0.1:{silent_port} within 3 s"):
        preflight.check_database(f"postgresql://postgres@127.0.0.1:{silent_port}/x")


def test_silent_broker_gives_up_after_the_connect_timeout(silent_port: int) -> None:
    """The same for Redis: one line naming CELERY_BROKER_URL after the timeout."""
    with pytest.raises(preflight.PreflightError, match=rf"^CELERY_BROKER_URL=.*no answer .*{silent_port} within 3 s"):
        preflight.check_broker(f"redis://127.0.0.1:{silent_port}/0")


def test_missing_database_says_how_to_create_it() -> None:
    """A database that does not exist is named, with the createdb command that makes it."""
    with pytest.raises(preflight.PreflightError, match=r"names database 'no_such_db_17'.*\(createdb -h "):
        preflight.check_database(server_url("no_such_db_17"))


def test_missing_redis_database_is_named() -> None:
    """A Redis database number the server does not have is a configuration error, not a traceback."""
    with pytest.raises(preflight.PreflightError, match="names a Redis database this server does not have"):
        preflight.check_broker("redis://127.0.0.1:6379/999")


# --- Through the entry points -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "is not a URL"),
        (f"mysql://u:{SECRET}@127.0.0.1/db", "runs on PostgreSQL only"),
        (f"postgresql://u:{SECRET}@127.0.0.1:99999/x", "has port '99999'"),
        ("postgresql://postgres@127.0.0.1:5432/", "names no database"),
        (f"postgresql://postgres:{SECRET}@127.0.0.1:1/x", "where nothing accepts connections"),
    ],
)
def test_dev_run_with_a_bad_database_url_prints_one_line(url: str, says: str) -> None:
    """`python3 dev.py run` with a bad or unreachable DATABASE_URL exits 78 after one line naming it."""
    result = run(["python3", "dev.py", "run"], DATABASE_URL=url)
    assert_one_line(result, "DATABASE_URL", says=says)
    assert "using configured PostgreSQL" not in result.stdout  # checked before anything is announced


def test_dev_run_with_an_unreachable_broker_prints_one_line() -> None:
    """`python3 dev.py run` with CELERY_BROKER_URL on a closed port exits 78 after one line naming it."""
    result = run(
        ["python3", "dev.py", "run"],
        DATABASE_URL=server_url(),
        CELERY_BROKER_URL=f"redis://:{SECRET}@127.0.0.1:1/0",
    )
    assert_one_line(result, "CELERY_BROKER_URL", says="where nothing accepts connections: start Redis there")


def test_dev_run_in_production_mode_without_a_secret_key_prints_one_line() -> None:
    """`DEBUG=0 python3 dev.py run` without SECRET_KEY says how to make one, in one line."""
    result = run(["python3", "dev.py", "run"], DEBUG="0")
    assert_one_line(result, "SECRET_KEY", says="set SECRET_KEY to 50+ random characters")


def test_dev_run_verbose_shows_the_traceback() -> None:
    """`python3 dev.py run --verbose` shows the traceback the one line replaces."""
    result = run(["python3", "dev.py", "run", "--verbose"], DATABASE_URL=f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    assert result.returncode != 0
    assert "Traceback" in result.stdout
    assert "PreflightError: DATABASE_URL=" in result.stdout


def test_manage_py_migrate_with_an_unreachable_database_prints_one_line() -> None:
    """`manage.py migrate` (compose's migrate job) on a closed port exits 78 after one line."""
    result = run([sys.executable, "manage.py", "migrate"], DATABASE_URL=f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    assert_one_line(result, "DATABASE_URL", says="points at 127.0.0.1:1")


def test_manage_py_timekeeper_sync_with_an_unreachable_database_prints_one_line() -> None:
    """`manage.py timekeeper sync` (the migration Job's second step) is checked like migrate: exit 78, one line."""
    argv = [sys.executable, "manage.py", "timekeeper", "sync"]
    result = run(argv, DATABASE_URL=f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    assert_one_line(result, "DATABASE_URL", says="points at 127.0.0.1:1")


def test_manage_py_timekeeper_probe_does_not_check_the_database() -> None:
    """`manage.py timekeeper probe` answers from its file with PostgreSQL unreachable: no preflight exit 78."""
    argv = [sys.executable, "manage.py", "timekeeper", "probe", "worker"]
    result = run(argv, DATABASE_URL=f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    assert result.returncode != preflight.EXIT_CONFIG, result.stdout
    assert "DATABASE_URL" not in result.stdout
    assert "alive" in result.stdout, "the probe itself ran"


def test_manage_py_with_a_bad_setting_prints_one_line() -> None:
    """Any manage.py command with a variable the settings refuse exits 78 after one line naming it."""
    result = run([sys.executable, "manage.py", "check"], SCHEDULING_LEASE_SECONDS="sixty")
    assert_one_line(result, "SCHEDULING_LEASE_SECONDS", says="is not a whole number")


def test_manage_py_without_services_still_works_offline() -> None:
    """Commands that need no server (makemigrations --check, collectstatic at build time) do not connect."""
    result = run([sys.executable, "manage.py", "check"], DATABASE_URL="postgresql://u@127.0.0.1:1/x")
    assert result.returncode == 0, result.stdout


def test_celery_worker_with_an_unreachable_broker_prints_one_line() -> None:
    """`celery worker` on a closed broker port exits 78 after one line instead of retrying for minutes."""
    result = run(
        [sys.executable, "-m", "celery", "-A", "project", "worker", "-l", "info"],
        DATABASE_URL=server_url(),
        CELERY_BROKER_URL=f"redis://:{SECRET}@127.0.0.1:1/0",
    )
    assert_one_line(result, "CELERY_BROKER_URL", says="where nothing accepts connections")


def test_celery_beat_with_an_unreachable_database_prints_one_line() -> None:
    """`celery beat` on a closed database port exits 78 after one line instead of a traceback."""
    result = run(
        [sys.executable, "-m", "celery", "-A", "project", "beat", "-l", "info"],
        DATABASE_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:1/x",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/15",
    )
    assert_one_line(result, "DATABASE_URL", says="where nothing accepts connections")


def test_celery_with_a_bad_url_prints_one_line() -> None:
    """Any celery command reads the settings first: a URL that is no URL is one line, not a traceback."""
    result = run([sys.executable, "-m", "celery", "-A", "project", "inspect", "ping"], DATABASE_URL="not a url")
    assert_one_line(result, "DATABASE_URL", says="is not a URL")


def test_gunicorn_with_an_unreachable_database_prints_one_line() -> None:
    """The image's web command (gunicorn with project.gunicorn_conf) exits 78 after one line, before any worker."""
    result = run(
        [sys.executable, "-m", "gunicorn", "--config=python:project.gunicorn_conf", "project.wsgi:application",
         f"--bind=127.0.0.1:{free_port()}"],
        DATABASE_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:1/x",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/15",
    )  # fmt: skip
    assert_one_line(result, "DATABASE_URL", says="where nothing accepts connections")
    assert "Booting worker" not in result.stdout
