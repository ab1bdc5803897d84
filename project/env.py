"""Reading Timekeeper's settings from the environment.

Every value the platform takes from the environment goes through one of these functions, so that
a bad value fails at start-up with a message naming the variable, not later in a worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/timekeeper"
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"

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


def get_list(name: str, default: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Read a comma-separated list, dropping blanks."""
    raw = environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def parse_database_url(url: str) -> dict[str, Any]:
    """Turn ``postgresql://user:pass@host:port/name?sslmode=require`` into a Django DATABASES entry.

    Only PostgreSQL is accepted: SKIP LOCKED, advisory locks and partial indexes are the design.
    A socket directory may be given as ``?host=/path`` (as libpq does).
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(
            "DATABASE_URL must be a postgresql:// URL (Timekeeper runs on PostgreSQL only), "
            f"got scheme {parts.scheme!r}."
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database (expected postgresql://user@host:port/dbname).")
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"DATABASE_URL has an invalid port: {url!r}.") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }


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
