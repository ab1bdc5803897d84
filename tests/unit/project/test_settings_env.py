"""project.env parsing (the settings module loaded in production mode is tested in tests/integration/project)."""
from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from project import env


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


@pytest.mark.parametrize("port", ["notaport", "99999", "0"])
def test_parse_database_url_rejects_bad_port(port: str) -> None:
    """A port that is not a TCP port number is refused, naming the variable, the port and the range."""
    with pytest.raises(ImproperlyConfigured, match=rf"^DATABASE_URL=.* has port '{port}', .* from 1 to 65535"):
        env.parse_database_url(f"postgresql://postgres@127.0.0.1:{port}/db")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:s3cretpw@127.0.0.1:99999/x",
        "mysql://u:s3cretpw@h/db",
        "postgresql://u:s3cretpw@127.0.0.1:5432/",
        "u:s3cretpw@127.0.0.1/x",  # no scheme: not echoed at all
    ],
)
def test_database_url_errors_hide_the_password(url: str) -> None:
    """A refused DATABASE_URL is shown with its password masked, or not shown when it is no URL at all."""
    with pytest.raises(ImproperlyConfigured) as refused:
        env.parse_database_url(url)
    assert "s3cretpw" not in str(refused.value)
    assert str(refused.value).startswith("DATABASE_URL")


def test_parse_database_url_refuses_what_is_no_url() -> None:
    """A value without scheme:// is not a URL; the message shows the shape to write."""
    with pytest.raises(ImproperlyConfigured, match=r"^DATABASE_URL is not a URL: use postgresql://"):
        env.parse_database_url("not a url")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://:pw@cache.internal:6380/2", "redis://cache"])
def test_parse_broker_url_accepts_redis(url: str) -> None:
    """Redis URLs, with or without password, port and database number, are accepted as they are."""
    assert env.parse_broker_url(url) == url


@pytest.mark.parametrize(
    "url",
    ["sentinel://10.0.0.1:26379", "sentinel://:pw@s1:26379/2;sentinel://s2:26380/2;sentinel://s3"],
)
def test_parse_broker_url_accepts_sentinels(url: str) -> None:
    """Redis Sentinel URLs as Celery documents them (one per sentinel, ';' between them) are accepted."""
    assert env.parse_broker_url(url) == url
    assert env.is_sentinel_url(url)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sentinel://s1:26379;redis://cache:6379/0", "mixes other URLs into a Sentinel list"),
        ("sentinel://:pw@s1:99999", "has port '99999'"),
        ("sentinel://s1:26379/zero", "not a Redis database number"),
    ],
)
def test_parse_broker_url_refuses_a_bad_sentinel_list(url: str, problem: str) -> None:
    """A bad Sentinel list is one line naming the variable and the problem, without the password."""
    with pytest.raises(ImproperlyConfigured) as refused:
        env.parse_broker_url(url)
    assert str(refused.value).startswith("CELERY_BROKER_URL")
    assert problem in str(refused.value)
    assert ":pw@" not in str(refused.value)


def test_the_sentinel_primary_is_named_by_its_variable() -> None:
    """CELERY_BROKER_MASTER_NAME names the primary; Redis's sample name when it is unset."""
    assert env.broker_master_name({"CELERY_BROKER_MASTER_NAME": "queues"}) == "queues"
    assert env.broker_master_name({}) == env.DEFAULT_SENTINEL_MASTER


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("not a url", "is not a URL"),
        ("amqp://guest:pw@rabbit//", "uses amqp://, but Timekeeper's broker is Redis"),
        ("redis://:pw@cache:99999/0", "has port '99999'"),
        ("redis://cache:6379/zero", "not a Redis database number"),
        ("redis://:pw@/0", "names no host"),
    ],
)
def test_parse_broker_url_refuses_with_one_line(url: str, problem: str) -> None:
    """A bad CELERY_BROKER_URL is one line naming the variable and the problem, without the password."""
    with pytest.raises(ImproperlyConfigured) as refused:
        env.parse_broker_url(url)
    message = str(refused.value)
    assert message.startswith("CELERY_BROKER_URL")
    assert problem in message
    assert ":pw@" not in message
    assert "\n" not in message


def test_get_float_parses_and_refuses() -> None:
    """A decimal number is parsed; text and values below the minimum are errors naming the variable."""
    assert env.get_float("F", 1.0, {"F": "0.5"}) == 0.5
    assert env.get_float("F", 1.0, {}) == 1.0
    with pytest.raises(ImproperlyConfigured, match=r"F='abc' is not a number"):
        env.get_float("F", 1.0, {"F": "abc"})
    with pytest.raises(ImproperlyConfigured, match="below its minimum"):
        env.get_float("F", 1.0, {"F": "0.01"}, minimum=0.1)


def test_get_secret_key_required_in_production_only() -> None:
    """SECRET_KEY is required with DEBUG off (the message says how to make one); DEBUG on has a dev key."""
    with pytest.raises(ImproperlyConfigured, match=r"^SECRET_KEY is not set and DEBUG is off .*secrets\.token_urlsafe"):
        env.get_secret_key(False, {})
    assert env.get_secret_key(False, {"SECRET_KEY": "k" * 50}) == "k" * 50
    assert env.get_secret_key(True, {}).startswith("dev-only-")


def test_sqlalchemy_url_tcp() -> None:
    """A TCP database becomes a db+postgresql+psycopg2 URL with quoted credentials."""
    database = env.parse_database_url("postgresql://app:p%40ss@db:5432/timekeeper")
    assert env.sqlalchemy_url(database) == "db+postgresql+psycopg2://app:p%40ss@db:5432/timekeeper"


def test_sqlalchemy_url_socket() -> None:
    """A socket directory goes into ?host=, not the authority part."""
    database = env.parse_database_url("postgresql://postgres:@/timekeeper?host=/tmp/pg")
    assert env.sqlalchemy_url(database) == "db+postgresql+psycopg2://postgres@/timekeeper?host=/tmp/pg"
