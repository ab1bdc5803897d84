"""dev.py without running its commands: requirements stamps, usage text, the children's argv."""

from __future__ import annotations

from pathlib import Path

import pytest

import dev
from tests.support import ROOT

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
