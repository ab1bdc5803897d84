"""project.env parsing and the settings module's production-mode refusal."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from project import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", " yes ", "on"])
def test_get_bool_true_spellings(raw: str) -> None:
    """The usual yes spellings read as True, whatever their case and surrounding blanks."""
    assert env.get_bool("FLAG", False, {"FLAG": raw}) is True


@pytest.mark.parametrize("raw", ["0", "false", "No", "off", ""])
def test_get_bool_false_spellings(raw: str) -> None:
    """The usual no spellings, and an empty value, read as False."""
    assert env.get_bool("FLAG", True, {"FLAG": raw}) is False


def test_get_bool_default_when_unset() -> None:
    """An unset variable gives the default."""
    assert env.get_bool("FLAG", True, {}) is True


def test_get_bool_rejects_other_values() -> None:
    """A value that is no boolean is a configuration error naming the variable."""
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        env.get_bool("FLAG", False, {"FLAG": "maybe"})


def test_get_int_parses_and_defaults() -> None:
    """A number is parsed; unset or blank gives the default."""
    assert env.get_int("N", 7, {"N": "42"}) == 42
    assert env.get_int("N", 7, {}) == 7
    assert env.get_int("N", 7, {"N": "  "}) == 7


def test_get_int_rejects_non_numbers() -> None:
    """A value that is not a whole number is a configuration error naming the variable."""
    with pytest.raises(ImproperlyConfigured, match=r"N='1\.5'"):
        env.get_int("N", 7, {"N": "1.5"})


def test_get_int_enforces_minimum() -> None:
    """A number below the minimum is refused."""
    with pytest.raises(ImproperlyConfigured, match="minimum of 1"):
        env.get_int("N", 7, {"N": "0"}, minimum=1)


def test_get_list_splits_and_drops_blanks() -> None:
    """A comma-separated list is split, stripped and cleared of empty items."""
    assert env.get_list("L", [], {"L": " a.example, ,b.example ,"}) == ["a.example", "b.example"]


def test_get_list_default_is_a_copy() -> None:
    """An unset list gives a copy of the default, never the default object itself."""
    default = ["x"]
    value = env.get_list("L", default, {})
    assert value == default
    assert value is not default


def test_parse_database_url_full() -> None:
    """User, quoted password, host, port, name and query options map onto a DATABASES entry."""
    parsed = env.parse_database_url("postgresql://app:p%40ss@db.internal:6543/timekeeper?sslmode=require")
    assert parsed == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "timekeeper",
        "USER": "app",
        "PASSWORD": "p@ss",
        "HOST": "db.internal",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }


def test_parse_database_url_socket_host() -> None:
    """A socket directory given as ?host= becomes HOST and is not passed on as an option."""
    parsed = env.parse_database_url("postgresql://postgres:@/timekeeper?host=/work/var/pgdata")
    assert parsed["HOST"] == "/work/var/pgdata"
    assert parsed["PORT"] == ""
    assert parsed["OPTIONS"] == {}
    assert parsed["NAME"] == "timekeeper"


@pytest.mark.parametrize("url", ["sqlite:///db.sqlite3", "mysql://u@h/db"])
def test_parse_database_url_rejects_other_databases(url: str) -> None:
    """Only PostgreSQL URLs are accepted."""
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL only"):
        env.parse_database_url(url)


def test_parse_database_url_requires_a_name() -> None:
    """A URL without a database name is refused."""
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        env.parse_database_url("postgresql://postgres@127.0.0.1:5432/")


def test_parse_database_url_rejects_bad_port() -> None:
    """A port that is not a number is refused with the URL in the message."""
    with pytest.raises(ImproperlyConfigured, match="invalid port"):
        env.parse_database_url("postgresql://postgres@127.0.0.1:notaport/db")


def test_sqlalchemy_url_tcp() -> None:
    """A TCP database becomes a db+postgresql+psycopg2 URL with quoted credentials."""
    database = env.parse_database_url("postgresql://app:p%40ss@db:5432/timekeeper")
    assert env.sqlalchemy_url(database) == "db+postgresql+psycopg2://app:p%40ss@db:5432/timekeeper"


def test_sqlalchemy_url_socket() -> None:
    """A socket directory goes into ?host=, not the authority part."""
    database = env.parse_database_url("postgresql://postgres:@/timekeeper?host=/tmp/pg")
    assert env.sqlalchemy_url(database) == "db+postgresql+psycopg2://postgres@/timekeeper?host=/tmp/pg"


def _load_settings(**overrides: str) -> subprocess.CompletedProcess[str]:
    """Import project.settings in a fresh interpreter with a controlled environment."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in {"SECRET_KEY", "DEBUG", "DATABASE_URL", "CELERY_BROKER_URL"}
    }
    environ.update(overrides)
    return subprocess.run(
        [sys.executable, "-c", "import project.settings as s; print(s.DEBUG, s.SECURE_SSL_REDIRECT)"],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60,
    )


def test_production_settings_refuse_missing_secret_key() -> None:
    """With DEBUG=0 and no SECRET_KEY, loading the settings raises ImproperlyConfigured."""
    result = _load_settings(DEBUG="0")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "SECRET_KEY" in result.stderr


def test_production_settings_load_with_secret_key() -> None:
    """With DEBUG=0 and a SECRET_KEY, the settings load in production mode (HTTPS redirect on)."""
    result = _load_settings(DEBUG="0", SECRET_KEY="k" * 60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
