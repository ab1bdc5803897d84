"""Checking the configuration before anything starts: one line per problem, and no traceback.

A wrong setting or a server that cannot be reached is a ``PreflightError`` whose message is the
line to print: the variable, what is wrong with it and what to do, with any password hidden
(``redaction.redact``). ``exit_on_error()`` prints that line and exits with ``EXIT_CONFIG``; with
``TIMEKEEPER_VERBOSE=1`` (or ``dev.py run --verbose``) it lets the exception and its traceback through.

Every entry point runs the same checks:

- ``dev.py`` (run and test): ``check_environment()`` on the variables, then ``check_database()``
  and ``check_broker()`` on the configured URLs, before it starts an embedded server or a process;
- ``manage.py``: ``check_command()``: the settings for every command, PostgreSQL and Redis for the
  commands that cannot work without them (``DATABASE_COMMANDS``, ``BROKER_COMMANDS``; for
  ``timekeeper``, by its subcommand: ``TIMEKEEPER_DATABASE_SUBCOMMANDS``, so ``timekeeper sync``
  is checked and ``timekeeper probe`` never connects);
- Celery (``project/celery.py``): ``check_settings()`` when the app reads its configuration (every
  ``celery`` command), ``check_services()`` when a worker or beat initialises, before it builds its
  consumer or scheduler.

Connections are bounded by ``CONNECT_TIMEOUT_SECONDS``: a server that does not answer is reported
after a few seconds, not after a client library's retries.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from project import env, redaction

EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: the configuration is wrong; the line says why
CONNECT_TIMEOUT_SECONDS = 3  # for each connection the preflight opens (libpq's minimum is 2)
VERBOSE_VARIABLE = "TIMEKEEPER_VERBOSE"
# manage.py commands that cannot do anything without PostgreSQL / Redis (others, such as
# collectstatic at image build time or makemigrations --check, must work with neither).
DATABASE_COMMANDS = frozenset({"migrate", "runserver", "seed_demo", "sync_schedules", "createsuperuser"})
# `manage.py timekeeper <subcommand>`: every subcommand reads or writes the database but the
# liveness probe, which must answer (from its file) while PostgreSQL is away.
TIMEKEEPER_DATABASE_SUBCOMMANDS = frozenset(
    {"jobs", "cancel", "retry", "reschedule", "kinds", "schedules", "sync", "status", "recurrences"}
)
# Django's options that take a value as the next argument (before a subcommand, it is not one).
_OPTIONS_WITH_A_VALUE = frozenset({"--settings", "--pythonpath", "-v", "--verbosity"})
BROKER_COMMANDS = frozenset({"runserver"})
# Keys of a DATABASES entry's OPTIONS that Django consumes itself and libpq would refuse.
_DJANGO_ONLY_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role"})


class PreflightError(Exception):
    """A setting is wrong, or names a server that cannot be used; ``str()`` is the one line to print."""


def verbose(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether tracebacks were asked for (``TIMEKEEPER_VERBOSE=1``)."""
    return environ.get(VERBOSE_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}


@contextlib.contextmanager
def exit_on_error(prefix: str = "") -> Iterator[None]:
    """Turn a ``PreflightError`` into its line on stderr (after ``prefix``) and exit status ``EXIT_CONFIG``."""
    try:
        yield
    except PreflightError as error:
        if verbose():
            raise
        print(f"{prefix}{error}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None


@contextlib.contextmanager
def _as_preflight_error() -> Iterator[None]:
    """Re-raise ``ImproperlyConfigured`` (from ``project.env`` or the settings) as a one-line ``PreflightError``."""
    try:
        yield
    except ImproperlyConfigured as exc:
        line = " ".join(str(exc).split())  # one line, whatever the message's layout
        raise PreflightError(redaction.redact(line)) from exc


# --- The variables alone: no connection, no Django settings ----------------------------------------


def check_environment(environ: Mapping[str, str] = os.environ) -> None:
    """DEBUG, SECRET_KEY in production mode, and the shape of every URL and credential that is set."""
    with _as_preflight_error():
        debug = env.get_bool("DEBUG", False, environ)
        env.get_secret_key(debug, environ)
        if environ.get("DATABASE_URL"):
            env.parse_database_url(environ["DATABASE_URL"])
        if environ.get("CELERY_BROKER_URL"):
            env.parse_broker_url(environ["CELERY_BROKER_URL"])
    basic_auth = environ.get("FLOWER_BASIC_AUTH", "")
    if basic_auth and not all(user and password for user, _, password in _pairs(basic_auth)):
        raise PreflightError(
            "FLOWER_BASIC_AUTH is not USER:PASSWORD (several may be separated by commas): "
            "set it to admin:<a password>, or unset it to use the generated one."
        )


def _pairs(basic_auth: str) -> list[tuple[str, str, str]]:
    """Flower's ``user:password[,user:password...]`` split into (user, ':', password) triples."""
    return [item.strip().partition(":") for item in basic_auth.split(",")]


# --- The settings, and the servers they name -------------------------------------------------------


def check_settings() -> None:
    """Load Django's settings (each variable is checked where it is read), or fail in one line."""
    from django.conf import settings

    with _as_preflight_error():
        settings.INSTALLED_APPS  # noqa: B018 - reading a setting is what loads the module


def check_services(*, database: bool = True, broker: bool = True) -> None:
    """Connect to the settings' PostgreSQL and Redis once each, within ``CONNECT_TIMEOUT_SECONDS``."""
    from django.conf import settings

    check_settings()
    if database:
        entry = settings.DATABASES["default"]
        check_database_entry(entry, shown=_url_behind(entry))
    if broker:
        check_broker(settings.CELERY_BROKER_URL)


def _url_behind(entry: Mapping[str, Any]) -> str | None:
    """``DATABASE_URL`` as the user wrote it, when the settings' database came from it (to name it in a message)."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        return None
    try:
        parsed = env.parse_database_url(url)
    except ImproperlyConfigured:
        return None
    same = all(parsed[key] == entry.get(key) for key in ("NAME", "USER", "HOST", "PORT"))
    return url if same else None


def check_command(command: str, *args: str) -> None:
    """What ``manage.py <command> <args>`` needs: the settings, and the servers the command cannot do without."""
    check_services(database=needs_database(command, *args), broker=command in BROKER_COMMANDS)


def needs_database(command: str, *args: str) -> bool:
    """Whether ``manage.py <command> <args>`` cannot work without PostgreSQL (``timekeeper``: by subcommand)."""
    if command != "timekeeper":
        return command in DATABASE_COMMANDS
    return _subcommand(args) in TIMEKEEPER_DATABASE_SUBCOMMANDS


def _subcommand(args: tuple[str, ...]) -> str:
    """The first argument that is neither an option nor an option's value ("" when there is none)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _OPTIONS_WITH_A_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return ""


def check_database(url: str, name: str = "DATABASE_URL") -> None:
    """``url`` is a PostgreSQL URL and the server behind it lets us in."""
    with _as_preflight_error():
        entry = env.parse_database_url(url, name)
    check_database_entry(entry, name=name, shown=url)


def check_database_entry(entry: Mapping[str, Any], *, name: str = "DATABASE_URL", shown: str | None = None) -> None:
    """Open and close one connection with a DATABASES entry; a failure is one line saying what to fix."""
    import psycopg2

    options = {key: value for key, value in entry.get("OPTIONS", {}).items() if key not in _DJANGO_ONLY_OPTIONS}
    options["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    params = {
        "dbname": entry["NAME"],
        "user": entry.get("USER") or None,
        "password": entry.get("PASSWORD") or None,
        "host": entry.get("HOST") or None,
        "port": entry.get("PORT") or None,
        **options,
    }
    try:
        psycopg2.connect(**params).close()
    except psycopg2.OperationalError as exc:
        raise PreflightError(_database_problem(entry, name, shown, str(exc))) from exc


def _database_problem(entry: Mapping[str, Any], name: str, shown: str | None, message: str) -> str:
    """The one line for a failed PostgreSQL connection, from libpq's message."""
    host = str(entry.get("HOST") or "localhost")
    port = str(entry.get("PORT") or "5432")
    where = f"the socket in {host}" if host.startswith("/") else f"{host}:{port}"
    user = str(entry.get("USER") or "")
    database = str(entry["NAME"])
    setting = f"{name}={redaction.redact(shown)}" if shown else f"{name} (postgresql://{user}@{where}/{database})"
    text = message.lower()
    if "connection refused" in text or "no such file or directory" in text:
        return (
            f"{setting} points at {where}, where nothing accepts connections: start PostgreSQL there, "
            f"or fix the host and port."
        )
    if "timeout expired" in text or "timed out" in text:
        return (
            f"{setting}: no answer from {where} within {CONNECT_TIMEOUT_SECONDS} s: check the host, port and "
            f"firewall, or start PostgreSQL there."
        )
    if "could not translate host name" in text or "name or service not known" in text:
        return f"{setting} names host {host!r}, which does not resolve: fix the host name."
    if "password authentication failed" in text or "no password supplied" in text or "authentication" in text:
        return f"{setting}: PostgreSQL at {where} refused user {user!r} and this password: fix the user or password."
    if f'database "{database.lower()}" does not exist' in text:
        return (
            f"{setting} names database {database!r}, which does not exist on {where}: create it "
            f"(createdb -h {host} -p {port} -U {user or 'postgres'} {database}) or name an existing one."
        )
    if "role" in text and "does not exist" in text:
        return f"{setting} names user {user!r}, which does not exist on {where}: fix the user name, or create it."
    first_line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return f"{setting}: cannot connect to PostgreSQL at {where} ({redaction.redact(first_line)})."


def check_broker(url: str, name: str = "CELERY_BROKER_URL") -> None:
    """``url`` is a Redis URL and the server behind it answers PING (with the URL's password, if any)."""
    import redis

    with _as_preflight_error():
        env.parse_broker_url(url, name)
    if env.is_sentinel_url(url):  # the primary the sentinels name (CELERY_BROKER_MASTER_NAME)
        from scheduling.core import broker

        client = broker.sentinel_client(url, env.broker_master_name(), CONNECT_TIMEOUT_SECONDS)
    else:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, socket_timeout=CONNECT_TIMEOUT_SECONDS
        )
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
        raise PreflightError(_broker_problem(url, name, exc)) from exc
    finally:
        client.close()


def _broker_problem(url: str, name: str, exc: Exception) -> str:
    """The one line for a failed Redis PING, from redis-py's exception."""
    import redis

    if env.is_sentinel_url(url):
        first = redaction.redact(str(exc).splitlines()[0]) if str(exc).strip() else type(exc).__name__
        return (
            f"{name}={redaction.redact(url)}: the sentinels name no reachable primary {env.broker_master_name()!r} "
            f"({first}): check the sentinel hosts and ports, and CELERY_BROKER_MASTER_NAME."
        )
    client = redis.Redis.from_url(url)
    kwargs = client.connection_pool.connection_kwargs
    client.close()
    where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    setting = f"{name}={redaction.redact(url)}"
    text = str(exc).lower()
    if isinstance(exc, redis.TimeoutError) or "timeout" in text or "timed out" in text:
        return (
            f"{setting}: no answer from {where} within {CONNECT_TIMEOUT_SECONDS} s: check the host, port and "
            f"firewall, or start Redis there."
        )
    if "connection refused" in text:
        return (
            f"{setting} points at {where}, where nothing accepts connections: start Redis there, or fix the host "
            f"and port."
        )
    if "name or service not known" in text or "temporary failure in name resolution" in text or "nodename" in text:
        return f"{setting} names host {kwargs.get('host')!r}, which does not resolve: fix the host name."
    if "noauth" in text or "authentication required" in text:
        return f"{setting}: Redis at {where} requires a password: put it in the URL (redis://:<password>@<host>:<port>/<db>)."
    if "without any password configured" in text:
        return f"{setting} carries a password, but Redis at {where} has none set: remove it from the URL."
    if isinstance(exc, redis.AuthenticationError) or "invalid password" in text or "invalid username" in text:
        return f"{setting}: Redis at {where} refused this password: fix the password in the URL."
    if "db index is out of range" in text:
        return f"{setting} names a Redis database this server does not have: use a lower one (/0 to /15 by default)."
    return f"{setting}: cannot use Redis at {where} ({redaction.redact(str(exc).splitlines()[0])})."


def main() -> int:
    """``python -m project.preflight``: check the settings and both servers; 0, or the line and ``EXIT_CONFIG``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    with exit_on_error():
        check_environment()
        check_services()
    return 0


if __name__ == "__main__":
    sys.exit(main())
