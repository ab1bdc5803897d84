"""dev.py without running its commands: requirements stamps, usage text, the children's argv."""

from __future__ import annotations

from pathlib import Path

import pytest

import dev

ROOT = Path(__file__).resolve().parents[2]
# What `dev.py test` runs, as a newcomer would look for it in the usage text and the README.
TEST_STEPS = ["ruff", "makemigrations --check", "mypy", "apt-get", "chromium", "faketime", "pytest"]


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
