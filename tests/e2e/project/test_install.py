"""Installing the wheel into a fresh ``django-admin startproject``: the standard Celery setup runs jobs.

The wheel is built from this checkout and installed with its declared dependencies, resolved by
pip, into a new virtualenv that sees nothing of the test environment: a dependency the wheel
forgets to declare (``packaging`` for kombu's Redis transport, once) stops its worker at start.
The versions are pinned to the test environment's (a constraints file), so pip takes them from its
cache and the fresh project runs what the suite ran. Every command of the fresh project runs with
the temporary directory as its working directory and as its only ``PYTHONPATH`` entry, so
``scheduling`` is imported from the wheel, never from this checkout.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis

from tests.e2e import harness
from tests.support import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
REDIS_URL = "redis://127.0.0.1:6379/15"
FIXED_EVERY_SECONDS = 2

CELERY_PY = """\
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""

INIT_PY = """\
from .celery import app as celery_app

__all__ = ("celery_app",)
"""

SETTINGS_TAIL = """
INSTALLED_APPS += ["django.contrib.postgres", "django_celery_beat", "scheduling", "billing"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "{database}",
                          "HOST": "127.0.0.1", "PORT": 5432, "USER": "postgres"}}}}
CELERY_BROKER_URL = "{redis_url}"
CELERY_BROKER_TRANSPORT_OPTIONS = {{"global_keyprefix": "{prefix}"}}
CELERY_BEAT_SCHEDULER = "scheduling.fixed.beat:LeaderDatabaseScheduler"
MIDDLEWARE += ["scheduling.web.middleware.AuditMiddleware"]
TASKS = {{"default": {{"BACKEND": "scheduling.backends.TimekeeperBackend"}}}}
import django  # noqa: E402
if django.VERSION < (6, 0):
    INSTALLED_APPS += ["django_tasks"]
"""

TASKS_PY = """\
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport, from django-timekeeper[tasks]
    from django_tasks import task


@task
def total(a, b):
    return a + b
"""

JOBS_PY = '''\
from pathlib import Path

from scheduling import registry, schedules

RAN = Path(__file__).resolve().parent.parent / "ran"


@registry.handler("billing.mark", schema={{"type": "object", "properties": {{"name": {{"type": "string"}}}},
                                          "required": ["name"], "additionalProperties": False}})
def mark(job):
    """Write a file named for the payload, holding the mechanism that ran it."""
    RAN.mkdir(exist_ok=True)
    (RAN / job.payload["name"]).write_text(job.mechanism)


schedules.declare(name="billing-heartbeat", kind="billing.mark", every={every}, payload={{"name": "fixed"}})
'''

SHELL_SCHEDULE = (
    "from scheduling import api; "
    "print('scheduled', api.schedule('billing.mark', {'name': 'scheduled'}, delay=1).id); "
    "print('deferred', api.defer('billing.mark', {'name': 'deferred'}, 1).mechanism); "
    "from billing.tasks import total; print('task', total.enqueue(2, 3).id)"
)
SHELL_RESULT = (
    "from billing.tasks import total; r = total.get_result({id!r}); "
    "print(r.status, r.attempts, r.return_value if r.is_finished else '')"
)

SHELL_DASHBOARD = (
    "from django.contrib.auth.models import User; from django.test import Client; "
    "from django.test.utils import setup_test_environment; setup_test_environment(); "
    "c = Client(); c.force_login(User.objects.create_superuser('ops', 'ops@example.com', 'pw')); "
    "page = c.get('/admin/').content.decode(); print('dashboard' if 'timekeeper-dashboard' in page else 'none')"
)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a command to the end; fail with its output when it fails."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout (with its sdist), checked to hold only the scheduling package."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], ROOT, dict(os.environ))
    (built,) = out.glob("*.whl")
    names = zipfile.ZipFile(built).namelist()
    assert {name.split("/")[0] for name in names} == {"scheduling", built.name.split("-")[0] + "-0.1.0.dist-info"}
    statements = {path.relative_to(ROOT).as_posix() for path in (ROOT / "scheduling").rglob("*.sql")}
    assert len(statements) > 1  # every mechanism's sql/ folder ships, not only the core's
    assert statements | {"scheduling/templates/scheduling/dashboard.html"} <= set(names)
    assert any(name.startswith("scheduling/migrations/0001_") for name in names)
    (sdist,) = out.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        tops = {member.name.split("/")[1] for member in archive.getmembers() if "/" in member.name}
    assert not tops & {"project", "tasks", "tests", "bench"}, tops
    return built


def constraints(where: Path) -> Path:
    """A pip constraints file pinning every distribution of the test environment to its version here."""
    pins = sorted(
        {
            f"{dist.metadata['Name']}=={dist.version}"
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"] and dist.metadata["Name"].lower() != "django-timekeeper"
        }
    )
    path = where / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv's interpreter with the wheel and its declared dependencies (and nothing else) installed."""
    venv = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv, dict(os.environ))
    interpreter = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(interpreter)]
    wanted = f"{wheel}[tasks]"  # with the Tasks backport (Django 5.2) that docs/installing.md asks for
    run([*pip, "install", "--constraint", str(constraints(venv)), wanted], venv, dict(os.environ), timeout=600)
    run([*pip, "check"], venv, dict(os.environ))  # every installed distribution's own requirements are met
    isolated = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pytest') is not None)"
    run([str(interpreter), "-c", isolated], venv, {})  # the test environment's packages are not visible
    return interpreter


@pytest.fixture
def database() -> Iterator[str]:
    """A new, empty PostgreSQL database for the fresh project, dropped afterwards."""
    name = f"tk_install_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(dbname="postgres", **POSTGRES)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A Redis key prefix of its own for the fresh project; its keys are deleted afterwards."""
    prefix = f"tk-install-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def startproject(python: Path, where: Path) -> tuple[Path, dict[str, str]]:
    """``django-admin startproject shop`` + ``startapp billing``; the environment its commands run with."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(where),
        "PYTHONPATH": str(where),  # only the fresh project: scheduling must come from the wheel
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "shop.settings",
    }
    run([str(python), "-m", "django", "startproject", "shop", str(where)], where, env)
    run([str(python), "manage.py", "startapp", "billing"], where, env)
    return where, env


@contextlib.contextmanager
def started(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A long-running process (worker, beat) logging to ``log``; its process group is stopped at the end."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_fresh_project_with_the_standard_celery_setup_runs_all_three_mechanisms(
    python: Path, tmp_path: Path, database: str, key_prefix: str
):
    """pip install, INSTALLED_APPS, celery.py, migrate, jobs.py and a @task in tasks.py, a worker and beat: all run."""
    site, env = startproject(python, tmp_path)
    where = run([str(python), "-c", "import scheduling; print(scheduling.__file__)"], site, env).stdout
    assert where.startswith(str(python.parent.parent)), f"scheduling imported from {where}, not the wheel"
    (site / "shop" / "celery.py").write_text(CELERY_PY)
    (site / "shop" / "__init__.py").write_text(INIT_PY)
    with (site / "shop" / "settings.py").open("a") as settings:
        settings.write(SETTINGS_TAIL.format(database=database, redis_url=REDIS_URL, prefix=key_prefix))
    (site / "billing" / "jobs.py").write_text(JOBS_PY.format(every=FIXED_EVERY_SECONDS))
    (site / "billing" / "tasks.py").write_text(TASKS_PY)

    check = run([str(python), "manage.py", "check"], site, env)
    assert "System check identified no issues" in check.stdout, check.stdout + check.stderr
    run([str(python), "manage.py", "migrate", "--no-input"], site, env)
    run([str(python), "manage.py", "timekeeper", "sync"], site, env)
    shown = run([str(python), "manage.py", "shell", "-c", SHELL_DASHBOARD], site, env).stdout
    assert shown.splitlines()[-1] == "dashboard", shown

    celery = [str(python), "-m", "celery", "-A", "shop"]
    worker_log, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"
    worker_argv = [*celery, "worker", "-l", "info", "-c", "2", "-n", "shop@%h", "--without-mingle", "--without-gossip"]
    beat_argv = [*celery, "beat", "-l", "info", "--pidfile=", "-s", str(tmp_path / "beat-schedule")]
    with started(worker_argv, site, env, worker_log) as worker, started(beat_argv, site, env, beat_log) as beat:
        harness.wait_for(
            lambda: "ready." in worker_log.read_text() or worker.poll() is not None, 120, message="worker ready"
        )
        assert worker.poll() is None, worker_log.read_text()[-4000:]
        said = run([str(python), "manage.py", "shell", "-c", SHELL_SCHEDULE], site, env).stdout
        assert "deferred deferrals" in said, said
        ran = site / "ran"
        for name in ("scheduled", "deferred", "fixed"):
            harness.wait_for(
                lambda name=name: (ran / name).exists() or worker.poll() is not None or beat.poll() is not None,
                120,
                message=f"the {name} job to run (logs in {tmp_path})",
            )
        (task_id,) = [line.split()[1] for line in said.splitlines() if line.startswith("task ")]
        shell_result = [str(python), "manage.py", "shell", "-c", SHELL_RESULT.format(id=task_id)]
        harness.wait_for(
            lambda: (
                run(shell_result, site, env).stdout.splitlines()[-1].startswith("SUCCESSFUL")
                or worker.poll() is not None
            ),
            120,
            interval=1,
            message=f"the Django task to run (logs in {tmp_path})",
        )
        assert run(shell_result, site, env).stdout.splitlines()[-1].split() == ["SUCCESSFUL", "1", "5"]
        assert worker.poll() is None, worker_log.read_text()[-4000:]
        assert beat.poll() is None, beat_log.read_text()[-4000:]
    assert {name: (ran / name).read_text() for name in ("scheduled", "deferred", "fixed")} == {
        "scheduled": "due_at",
        "deferred": "deferrals",
        "fixed": "fixed",
    }
    listed = run([str(python), "manage.py", "timekeeper", "jobs", "--state", "done"], site, env).stdout
    assert "billing.mark" in listed


def test_fresh_project_is_told_what_is_missing(python: Path, tmp_path: Path, database: str):
    """Without django_celery_beat: E005; without a Celery app or handlers: E004 and W001, before anything runs."""
    site, env = startproject(python, tmp_path)
    with (site / "shop" / "settings.py").open("a") as settings:
        settings.write(
            'INSTALLED_APPS += ["scheduling"]\nDATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", '
            f'"NAME": "{database}", "HOST": "127.0.0.1", "PORT": 5432, "USER": "postgres"}}}}\n'
        )
    check = [str(python), "manage.py", "check"]
    no_beat = subprocess.run(check, cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert no_beat.returncode != 0
    assert "scheduling.E005" in no_beat.stderr
    assert "'django_celery_beat' to INSTALLED_APPS" in no_beat.stderr
    with (site / "shop" / "settings.py").open("a") as settings:
        settings.write('INSTALLED_APPS.insert(-1, "django_celery_beat")\n')
    no_celery = subprocess.run(check, cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert no_celery.returncode != 0
    assert "scheduling.E004" in no_celery.stderr
    assert "celery.py" in no_celery.stderr
    assert "scheduling.W001" in no_celery.stderr
