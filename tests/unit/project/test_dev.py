"""dev.py's pure parts: what it shows of pip, of migrate and of its children while the dev loop starts."""

from __future__ import annotations

import pytest

import dev

PIP_OUTPUT = """\
Requirement already satisfied: Django<5.3,>=5.2 in ./.venv/lib/python3.11/site-packages (5.2.1)
Collecting celery==5.7.0 (from -r requirements.txt (line 2))
  Downloading celery-5.7.0-py3-none-any.whl.metadata (23 kB)
  Using cached kombu-5.6.0-py3-none-any.whl (214 kB)
Installing collected packages: celery
Successfully installed celery-5.7.0
"""


def test_pip_shows_a_line_per_package_it_collects_and_keeps_back_the_satisfied_ones():
    """Collecting, Downloading, Installing and Successfully lines are shown; already-satisfied ones are not."""
    shown = [line for line in map(dev.pip_line, PIP_OUTPUT.splitlines()) if line]
    assert shown == [
        "Collecting celery==5.7.0 (from -r requirements.txt (line 2))",
        "Downloading celery-5.7.0-py3-none-any.whl.metadata (23 kB)",
        "Installing collected packages: celery",
        "Successfully installed celery-5.7.0",
    ]


def test_migrate_is_summed_up_in_one_line():
    """Seventy "Applying ... OK" lines read as one count; no migration to apply says the schema is up to date."""
    output = "Operations to perform:\n  Apply all migrations: a, b\nRunning migrations:\n"
    output += "".join(f"  Applying scheduling.{n:04d}_x... OK\n" for n in range(70))
    assert dev.migrate_summary(output) == "applied 70 migrations (--verbose lists them)"
    assert dev.migrate_summary("  Applying a.0001_initial... OK\n").startswith("applied 1 migration ")
    assert dev.migrate_summary("Operations to perform:\n  No migrations to apply.\n") == "database schema up to date"


@pytest.mark.parametrize(
    ("name", "line", "quiet"),
    [
        ("flower", "2026-12-05 09:09:49,254 WARNING flower.inspector Inspect method conf failed", True),
        ("flower", "2026-12-05 09:09:48,107 INFO flower.command Visit me at http://127.0.0.1:5555", False),
        ("flower", "2026-12-05 09:09:49,254 ERROR flower.inspector Worker inspection failed: boom", False),
        (
            "worker",
            "[2026-12-05 09:09:48,370: WARNING/MainProcess] This worker consumes the deferral queue "
            "timekeeper.deferred beside celery. Holding 1000 countdown messages would stop it ...",
            True,
        ),
        ("worker", "[2026-12-05 09:10:07,872: WARNING/ForkPoolWorker-2] job raised DemoFailure", False),
        ("web", "WARNING flower.inspector Inspect method conf failed", False),
    ],
)
def test_only_the_known_development_noise_is_kept_back(name, line, quiet):
    """Flower's inspect warnings and the deferral-queue warning are quiet; other warnings and children show."""
    assert dev.quiet_line(name, line) is quiet


def test_manage_is_a_command_and_needs_arguments(capsys):
    """`dev.py manage` alone prints the usage (status 2); the usage names manage and var/services.env."""
    assert dev.main(["manage"]) == 2
    usage = capsys.readouterr().err
    assert "dev.py manage ARGS" in usage
    assert "var/services.env" in usage


def _lane_files(args: list[str]) -> set[str]:
    """The test files a lane's pytest arguments select: its paths' test_*.py less the --ignore'd folders."""
    from tests.support import ROOT

    ignored = [arg.removeprefix("--ignore=") for arg in args if arg.startswith("--ignore=")]
    files = set()
    for path in (arg for arg in args if not arg.startswith("-")):
        assert (ROOT / path).is_dir(), path
        for found in (ROOT / path).rglob("test_*.py"):
            relative = found.relative_to(ROOT).as_posix()
            if not any(relative.startswith(folder + "/") for folder in ignored):
                files.add(relative)
    return files


def test_the_lanes_run_every_test_file_of_the_testpaths_once():
    """The whole-suite lanes split pyproject's testpaths: no test file is left out, none runs twice."""
    import tomllib

    from tests.support import ROOT

    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    every = _lane_files(testpaths)
    lanes = {name: _lane_files(args) for name, args in dev.TEST_LANES.items()}
    assert sum(len(files) for files in lanes.values()) == len(every)
    assert set().union(*lanes.values()) == every
    assert all(files for files in lanes.values())
    assert "tests/e2e/core/test_faults_hosts.py" in lanes["e2e-1"]
    assert "tests/e2e/due_at/test_sweep.py" in lanes["e2e-2"]
