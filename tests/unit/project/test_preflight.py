"""project.preflight without servers: the variables' checks, and how a failure is reported."""
from __future__ import annotations

import pytest

from project import preflight

GOOD = {
    "DEBUG": "1",
    "DATABASE_URL": "postgresql://app:s3cretpw@db.internal:5432/app",
    "CELERY_BROKER_URL": "redis://:s3cretpw@cache.internal:6379/0",
}


def test_good_environment_passes() -> None:
    """Valid URLs, DEBUG on and no Flower credentials pass without connecting anywhere."""
    preflight.check_environment(GOOD)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        ({"DATABASE_URL": "mysql://u:s3cretpw@h/db"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql://u:s3cretpw@127.0.0.1:99999/x"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql://u:s3cretpw@127.0.0.1:5432/"}, "DATABASE_URL"),
        ({"CELERY_BROKER_URL": "amqp://u:s3cretpw@rabbit//"}, "CELERY_BROKER_URL"),
        ({"DEBUG": "0"}, "SECRET_KEY"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"FLOWER_BASIC_AUTH": "s3cretpw"}, "FLOWER_BASIC_AUTH"),
    ],
)
def test_bad_variable_is_one_line_naming_it(overrides: dict[str, str], setting: str) -> None:
    """Each bad variable gives one line that starts with its name and shows no password."""
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.check_environment({**GOOD, **overrides})
    line = str(refused.value)
    assert line.startswith(setting)
    assert "\n" not in line
    assert "s3cretpw" not in line


def test_exit_on_error_prints_one_line_and_exits_78(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """A PreflightError becomes its line on stderr and exit status 78; nothing else is printed."""
    monkeypatch.delenv(preflight.VERBOSE_VARIABLE, raising=False)
    with pytest.raises(SystemExit) as exited, preflight.exit_on_error(prefix="==> "):
        raise preflight.PreflightError("DATABASE_URL is not a URL: use postgresql://...")
    assert exited.value.code == preflight.EXIT_CONFIG == 78
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "==> DATABASE_URL is not a URL: use postgresql://...\n"


def test_verbose_lets_the_traceback_through(monkeypatch) -> None:
    """With TIMEKEEPER_VERBOSE=1 the exception itself propagates (its traceback is printed)."""
    monkeypatch.setenv(preflight.VERBOSE_VARIABLE, "1")
    with pytest.raises(preflight.PreflightError), preflight.exit_on_error():
        raise preflight.PreflightError("DATABASE_URL is not a URL")


@pytest.mark.parametrize(
    ("argv", "needed"),
    [
        (["timekeeper", "sync"], True),  # the Kubernetes migration Job's second step
        (["timekeeper", "--settings", "project.settings", "sync"], True),
        (["timekeeper", "status", "--json"], True),
        (["sync_schedules"], True),  # the old name of `timekeeper sync`
        (["migrate", "--noinput"], True),
        (["timekeeper", "probe", "worker"], False),  # a liveness probe answers while PostgreSQL is away
        (["timekeeper", "--verbosity", "2", "probe", "beat"], False),
        (["timekeeper"], False),
        (["timekeeper", "--help"], False),
        (["check"], False),
        (["collectstatic", "--noinput"], False),
    ],
)
def test_manage_py_needs_the_database_by_command_and_timekeeper_subcommand(argv: list[str], needed: bool) -> None:
    """`timekeeper sync` (and every database subcommand) gets the database check; `timekeeper probe` does not."""
    assert preflight.needs_database(*argv) is needed
