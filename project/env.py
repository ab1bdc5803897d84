"""Reading Timekeeper's settings from the environment.

Every value the platform takes from the environment goes through one of these functions, so that
a bad value fails at start-up with a message naming the variable, not later in a worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from project import redaction

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/timekeeper"
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
DATABASE_URL_SHAPE = "postgresql://<user>:<password>@<host>:5432/<database>"
BROKER_URL_SHAPE = "redis://:<password>@<host>:6379/0"
SENTINEL_URL_SHAPE = "sentinel://:<password>@<host1>:26379/0;sentinel://<host2>:26379/0"
DEFAULT_SENTINEL_MASTER = "mymaster"  # the name in Redis's sample sentinel.conf

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def get_bool(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Read a yes/no variable; anything but the usual spellings is a configuration error."""
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no).")


def get_int(name: str, default: int, environ: Mapping[str, str] = os.environ, *, minimum: int = 0) -> int:
    """Read a whole number no smaller than ``minimum``."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}.")
    return value


def get_float(name: str, default: float, environ: Mapping[str, str] = os.environ, *, minimum: float = 0.0) -> float:
    """Read a number (``1.5``) no smaller than ``minimum``."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number (use digits, e.g. 1.5).") from None
    if not value >= minimum:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}.")
    return value


def get_list(name: str, default: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Read a comma-separated list, dropping blanks."""
    raw = environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def parse_database_url(url: str, name: str = "DATABASE_URL") -> dict[str, Any]:
    """Turn ``postgresql://user:pass@host:port/name?sslmode=require`` into a Django DATABASES entry.

    Only PostgreSQL is accepted: SKIP LOCKED, advisory locks and partial indexes are the design.
    A socket directory may be given as ``?host=/path`` (as libpq does). Every refusal is one line
    naming the variable, what is wrong and what to write instead, with any password hidden.
    """
    parts = _split_url(url, name, DATABASE_URL_SHAPE)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(
            f"{name}={redaction.redact(url)} uses {parts.scheme}://, but Timekeeper runs on PostgreSQL only: "
            f"use {DATABASE_URL_SHAPE}."
        )
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ImproperlyConfigured(
            f"{name}={redaction.redact(url)} names no database: add it after the last slash "
            f"({DATABASE_URL_SHAPE})."
        )
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    port = _port_of(parts, url, name, default=5432)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }


def parse_broker_url(url: str, name: str = "CELERY_BROKER_URL") -> str:
    """Check that ``url`` is a usable Redis URL (``redis://:password@host:port/db``) and return it.

    Redis Sentinel, as Celery documents it: ``sentinel://host1:26379;sentinel://host2:26379`` (one
    URL per sentinel, ``;`` between them; the password and database of the first are the primary's),
    with the primary's name in ``CELERY_BROKER_MASTER_NAME`` (``broker_transport_options['master_name']``).
    """
    if url.strip().startswith("sentinel://"):
        for one in url.strip().split(";"):
            parts = _split_url(one, name, SENTINEL_URL_SHAPE)
            if parts.scheme != "sentinel" or not parts.hostname:
                raise ImproperlyConfigured(
                    f"{name}={redaction.redact(url)} mixes other URLs into a Sentinel list: use {SENTINEL_URL_SHAPE}."
                )
            _port_of(parts, url, name, default=26379)
            _database_of(parts, url, name)
        return url
    parts = _split_url(url, name, BROKER_URL_SHAPE)
    if parts.scheme not in {"redis", "rediss"}:
        raise ImproperlyConfigured(
            f"{name}={redaction.redact(url)} uses {parts.scheme}://, but Timekeeper's broker is Redis: "
            f"use {BROKER_URL_SHAPE}."
        )
    if not parts.hostname:
        raise ImproperlyConfigured(f"{name}={redaction.redact(url)} names no host: use {BROKER_URL_SHAPE}.")
    _port_of(parts, url, name, default=6379)
    _database_of(parts, url, name)
    return url


def _database_of(parts: SplitResult, url: str, name: str) -> None:
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ImproperlyConfigured(
            f"{name}={redaction.redact(url)} ends in /{db}, which is not a Redis database number: "
            f"use a number such as /0 ({BROKER_URL_SHAPE})."
        )


def is_sentinel_url(url: str) -> bool:
    """Whether the broker URL names Redis Sentinels (``sentinel://...``) rather than one Redis."""
    return url.strip().startswith("sentinel://")


def broker_master_name(environ: Mapping[str, str] = os.environ) -> str:
    """The Sentinel primary's name (``CELERY_BROKER_MASTER_NAME``), for ``sentinel://`` broker URLs."""
    return environ.get("CELERY_BROKER_MASTER_NAME") or DEFAULT_SENTINEL_MASTER


DEVELOPMENT_SECRET_KEY_PREFIX = "dev-only-insecure-key-"  # noqa: S105 - public on purpose: development only, refused in production


def get_secret_key(debug: bool, environ: Mapping[str, str] = os.environ) -> str:
    """SECRET_KEY from the environment; required in production mode, a fixed dev-only key with DEBUG on."""
    key = environ.get("SECRET_KEY", "")
    if key and not debug and key.startswith(DEVELOPMENT_SECRET_KEY_PREFIX):
        raise ImproperlyConfigured(
            "SECRET_KEY is the development key from the source (anyone can read it): set SECRET_KEY to 50+ random "
            "characters in production (python3 -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
    if key:
        return key
    if not debug:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set and DEBUG is off (production mode): set SECRET_KEY to 50+ random characters "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))'), or DEBUG=1 for development."
        )
    return DEVELOPMENT_SECRET_KEY_PREFIX + "x" * 40


def _split_url(url: str, name: str, shape: str) -> SplitResult:
    """``urlsplit(url)``, refusing a value that is not a URL at all (it is not echoed: it may hold a secret)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # an unbalanced "[" in the host
        parts = None
    if parts is None or not parts.scheme or "://" not in url:
        raise ImproperlyConfigured(f"{name} is not a URL: use {shape}.")
    return parts


def _port_of(parts: SplitResult, url: str, name: str, *, default: int) -> int | None:
    """The URL's port, refusing one that is not a number from 1 to 65535."""
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        shown = parts.netloc.rsplit(":", 1)[-1]
        raise ImproperlyConfigured(
            f"{name}={redaction.redact(url)} has port {shown!r}, which is not a TCP port: use a number "
            f"from 1 to 65535 (the default is {default})."
        )
    return port


def sqlalchemy_url(database: Mapping[str, object]) -> str:
    """The Celery result backend URL (``db+postgresql+psycopg2://``) for a DATABASES entry."""
    from urllib.parse import quote

    user = quote(str(database.get("USER") or ""), safe="")
    password = quote(str(database.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(database.get("HOST") or "")
    port = str(database.get("PORT") or "")
    name = quote(str(database["NAME"]), safe="")
    if host.startswith("/"):
        # A socket directory cannot sit in the authority part; libpq takes it as ?host=.
        return f"db+postgresql+psycopg2://{auth}/{name}?host={quote(host, safe='/')}"
    netloc = host + (f":{port}" if port else "")
    return f"db+postgresql+psycopg2://{auth}{netloc}/{name}"
