"""dev.py without running its commands: requirements stamps, usage text, the children's argv."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dev
from tests.support import ROOT, wait_for

# What `dev.py test` runs, as a newcomer would look for it in the usage text and the README.
TEST_STEPS = ["ruff", "makemigrations --check", "mypy", "apt-get", "chromium", "faketime", "pytest", "Django 6.0"]


@pytest.fixture
def fake_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A venv whose python only records the pip commands it is given; requirements dev > embedded > base."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "pip.log"}\n')
    python.chmod(0o755)
    (tmp_path / "base.txt").write_text("Django\n")
    (tmp_path / "embedded.txt").write_text("-r base.txt\npgserver\n")
    (tmp_path / "dev.txt").write_text("-r embedded.txt\npytest\n")
    monkeypatch.setattr(dev, "VENV", venv)
    monkeypatch.setattr(dev, "VENV_PYTHON", python)
    monkeypatch.setattr(dev, "REQUIREMENTS", {"run": tmp_path / "embedded.txt", "test": tmp_path / "dev.txt"})
    return tmp_path


def pip_runs(tmp_path: Path) -> list[str]:
    """The pip commands the fake venv was given, one per line."""
    log = tmp_path / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


def test_real_requirements_chain() -> None:
    """run installs requirements-embedded.txt (runtime + embedded servers); test's file includes it."""
    assert dev.REQUIREMENTS["run"].name == "requirements-embedded.txt"
    assert dev.included_requirements(dev.REQUIREMENTS["test"]) == [
        ROOT / "requirements-embedded.txt",
        ROOT / "requirements.txt",
    ]


def test_test_install_covers_run(fake_venv: Path) -> None:
    """Installing the test requirements stamps every file they include: run installs nothing afterwards."""
    dev.ensure_venv("test")
    dev.ensure_venv("run")
    dev.ensure_venv("test")
    assert len(pip_runs(fake_venv)) == 1
    assert pip_runs(fake_venv)[0].endswith("dev.txt")


def test_change_in_an_included_file_reinstalls(fake_venv: Path) -> None:
    """Editing requirements.txt (included twice over) makes both commands install again."""
    dev.ensure_venv("test")
    (fake_venv / "base.txt").write_text("Django\ncelery\n")
    dev.ensure_venv("run")
    dev.ensure_venv("test")
    assert [line.rsplit("/", 1)[-1] for line in pip_runs(fake_venv)] == ["dev.txt", "embedded.txt", "dev.txt"]


def test_usage_and_readme_say_what_test_runs() -> None:
    """dev.py's usage text and the README's first lines name every step of the test command."""
    usage = dev.__doc__.split("\n\n")[1]
    readme_top = (ROOT / "README.md").read_text().split("```")[1]
    for step in TEST_STEPS:
        assert step in usage, step
        assert step in readme_top, step
    assert "--verbose" in usage


def test_no_child_has_a_secret_in_its_argv() -> None:
    """The supervised processes' argv hold no credentials (Flower gets FLOWER_BASIC_AUTH from its environment)."""
    for name, argv in dev.child_commands(web_port=8000, flower_port=5555).items():
        assert not any("basic-auth" in part or "password" in part.lower() for part in argv), name


def requirement_lines(path: Path) -> dict[str, str]:
    """A requirements file's packages (lower-case name, extras dropped) and their specifiers, comments dropped."""
    found = {}
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and not spec.startswith("-"):
            name = spec.split("[", 1)[0]
            for mark in "<>=!~":
                name = name.split(mark, 1)[0]
            found[name.strip().lower()] = spec
    return found


def test_django60_requirements_are_the_runtime_with_django_60() -> None:
    """requirements-django60.txt holds every runtime line of requirements.txt unchanged, but Django 6.0 and beat 2.9."""
    runtime = requirement_lines(ROOT / "requirements.txt")
    leg = requirement_lines(dev.DJANGO60_REQUIREMENTS)
    assert leg["django"] == "Django>=6.0,<6.1"
    assert leg["django-celery-beat"] == "django-celery-beat>=2.9,<2.10"
    assert "django-tasks" not in leg  # django.tasks is built into 6.0
    for name, spec in runtime.items():
        if name not in {"django", "django-celery-beat", "django-tasks"}:
            assert leg.get(name) == spec, name
    dev_tools = requirement_lines(ROOT / "requirements-dev.txt")
    for name in set(leg) - set(runtime):
        assert leg[name] == dev_tools[name], name  # test tools at the ranges the 5.2 run uses


def test_django60_leg_checks_migrations_and_runs_tests_that_exist() -> None:
    """The 6.0 leg runs check, makemigrations --check and pytest on DJANGO60_TESTS, every one of which exists."""
    steps = dev.django60_steps(Path("/venv/bin/python"))
    assert [argv[1:3] for _, argv in steps] == [
        ["manage.py", "check"],
        ["manage.py", "makemigrations"],
        ["-m", "pytest"],
    ]
    assert steps[-1][1][3:] == dev.DJANGO60_TESTS + dev.DJANGO60_IGNORED
    for path in dev.DJANGO60_TESTS:
        assert (ROOT / path).exists(), path
    assert "tests/e2e/backends/test_backends_worker.py" in dev.DJANGO60_TESTS


def test_django60_venv_is_installed_once_and_again_when_its_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ensure_django60_venv installs requirements-django60.txt into its own venv only when the file changed."""
    venv = tmp_path / "venv60"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "pip.log"}\n')
    python.chmod(0o755)
    requirements = tmp_path / "django60.txt"
    requirements.write_text("Django>=6.0,<6.1\n")
    monkeypatch.setattr(dev, "DJANGO60_VENV", venv)
    monkeypatch.setattr(dev, "DJANGO60_REQUIREMENTS", requirements)
    assert dev.ensure_django60_venv() == python
    assert dev.ensure_django60_venv() == python
    requirements.write_text("Django>=6.0,<6.1\ncelery\n")
    dev.ensure_django60_venv()
    assert [line.rsplit("/", 1)[-1] for line in pip_runs(tmp_path)] == ["django60.txt", "django60.txt"]


def test_python312_is_found_from_the_variable_and_a_too_old_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIMEKEEPER_PYTHON312 names the interpreter when it is 3.12+; one that says it is older is passed over."""
    new, old = tmp_path / "new-python", tmp_path / "old-python"
    new.write_text("#!/bin/sh\nexit 0\n")
    old.write_text("#!/bin/sh\nexit 1\n")
    for script in (new, old):
        script.chmod(0o755)
    monkeypatch.setenv("TIMEKEEPER_PYTHON312", str(new))
    assert dev.find_python312() == str(new)
    monkeypatch.setenv("TIMEKEEPER_PYTHON312", str(old))
    assert dev.find_python312() != str(old)


def fake_pip(tmp_path: Path, output: str, status: int = 0) -> Path:
    """A python whose ``-m pip install`` prints ``output`` (as pip would, line by line) and exits with ``status``."""
    (tmp_path / "pip-output.txt").write_text(output)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncat {tmp_path / 'pip-output.txt'}\nexit {status}\n")
    python.chmod(0o755)
    return python


PIP_RUN = (
    "Requirement already satisfied: Django<5.3 in ./.venv/lib/python3.11/site-packages (5.2.1)\n"
    "Collecting celery==5.7.0 (from -r requirements.txt (line 2))\n"
    "  Downloading celery-5.7.0-py3-none-any.whl (438 kB)\n"
    "Collecting kombu<5.7 (from celery==5.7.0)\n"
    "Installing collected packages: kombu, celery\n"
    "Successfully installed celery-5.7.0 kombu-5.6.0\n"
)


def test_installing_shows_a_line_per_package_as_pip_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """install_requirements prints pip's Collecting/Downloading/Installed lines, not the already-satisfied ones."""
    dev.install_requirements(fake_pip(tmp_path, PIP_RUN), tmp_path / "requirements.txt")
    shown = capsys.readouterr().out.splitlines()
    assert shown == [
        "    pip | Collecting celery==5.7.0 (from -r requirements.txt (line 2))",
        "    pip | Downloading celery-5.7.0-py3-none-any.whl (438 kB)",
        "    pip | Collecting kombu<5.7 (from celery==5.7.0)",
        "    pip | Installing collected packages: kombu, celery",
        "    pip | Successfully installed celery-5.7.0 kombu-5.6.0",
    ]


def test_a_failing_install_shows_the_end_of_pips_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """When pip fails, its last lines (the reason) are shown whole and the install raises."""
    output = "Collecting nosuchpackage==9\n  Some detail pip printed\nERROR: No matching distribution found\n"
    with pytest.raises(subprocess.CalledProcessError):
        dev.install_requirements(fake_pip(tmp_path, output, status=1), tmp_path / "requirements.txt")
    shown = capsys.readouterr().out
    assert "    pip |   Some detail pip printed" in shown
    assert shown.count("ERROR: No matching distribution found") == 2  # as it came, then in the tail


class Answering(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 401, as Flower does without credentials."""

    def do_GET(self) -> None:
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet."""


def test_the_urls_wait_for_an_answer_and_a_401_is_one(tmp_path: Path) -> None:
    """wait_until_answering returns no URL once each answers (401 included) and the silent ones after the timeout."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        answering = f"http://127.0.0.1:{server.server_address[1]}/admin/login/"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{sock.getsockname()[1]}/"  # bound, never listening: refused
            assert dev.answers(answering)
            assert not dev.answers(closed)
            assert dev.wait_until_answering([answering], []) == []
            assert dev.wait_until_answering([answering, closed], [], timeout=1) == [closed]
    finally:
        server.shutdown()
        server.server_close()


def test_the_services_file_is_removed_only_by_the_run_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """forget_services_file removes var/services.env written by this process, and leaves another run's."""
    from project import services

    path = tmp_path / "services.env"
    monkeypatch.setattr(dev, "SERVICES_FILE", path)
    environ = {"DATABASE_URL": "postgresql://x@h/db", "CELERY_BROKER_URL": "redis://h:1/0"}
    services.write_state(path, os.getpid() + 1, environ)
    dev.forget_services_file()
    assert path.exists()
    services.write_state(path, os.getpid(), environ)
    dev.forget_services_file()
    assert not path.exists()


def test_dev_manage_reaches_the_servers_of_the_running_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], transactional_db: None
) -> None:
    """With a live run's var/services.env, `dev.py manage timekeeper status` reads that run's database, named first."""
    from django.conf import settings
    from django.db import connection

    from project import services
    from scheduling import api

    for i in range(3):
        api.schedule("demo.noop", {"i": i}, delay=3600)
    entry = connection.settings_dict
    database_url = f"postgresql://{entry['USER']}@{entry['HOST']}:{entry['PORT'] or 5432}/{entry['NAME']}"
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "dev.py"])  # a stand-in dev.py
    try:
        # Until the child has exec'd, its /proc cmdline is this process's (pytest's): no dev.py in it yet.
        wait_for(lambda: services._is_dev_run(run.pid), 30, message="the stand-in dev.py to be running")
        path = tmp_path / "services.env"
        state = {
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CELERY_BROKER_KEYPREFIX": settings.CELERY_BROKER_KEYPREFIX,
        }
        services.write_state(path, run.pid, state)
        monkeypatch.setattr(dev, "SERVICES_FILE", path)
        monkeypatch.setattr(dev.Output, "stream", None)
        for name in (*services.STATE_VARIABLES, "DJANGO_SETTINGS_MODULE", "DEBUG"):
            monkeypatch.delenv(name, raising=False)  # a second terminal: nothing configured
        handler = signal.getsignal(signal.SIGTERM)
        try:
            status = dev.command_manage(["timekeeper", "status"])
        finally:
            signal.signal(signal.SIGTERM, handler)
        stand_in = run.poll()  # None: still running (a negative code names the signal that ended it)
    finally:
        run.kill()
        run.wait()
    out, err = capfd.readouterr()
    assert status == 0, f"{err}\n(the stand-in dev.py, pid {run.pid}: exit status {stand_in}, None if running)"
    assert f"using the servers of `python3 dev.py run` (pid {run.pid}" in err
    assert out.splitlines()[0].startswith(f"database {entry['NAME']!r} on ")
    pending = next(line for line in out.splitlines() if "pending (all)" in line)
    assert pending.split()[-1] == "3"
