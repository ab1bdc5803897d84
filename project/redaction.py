"""Hiding secrets in text that is about to be printed, logged or shown on an error page.

``redact()`` is the one mask: every place that prints a URL or an error message that may hold one
(dev.py's lines, the preflight's one-line errors, settings errors, the debug error page) goes
through it. It is standard library only, so dev.py can use it before Django is set up.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:password@host — the password runs to the last "@" before the path, so an unquoted
# "@" inside it is hidden too. An empty password ("postgres:@/db", the embedded server's URL) is
# left as it is: there is nothing to hide.
# Angle brackets cannot appear unquoted in a URL: "<password>" is a placeholder in a help text.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#\s@'\"<>]*:)(?P<password>[^/?#\s'\"<>]+)@")
# libpq and redis-py also take a password as a query parameter: ...?password=secret
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd|pass|requirepass)=)(?P<password>[^&#\s'\"]+)", re.I)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (URLs without one are unchanged)."""
    text = _URL_PASSWORD.sub(lambda match: f"{match['head']}{MASK}@", text)
    return _QUERY_PASSWORD.sub(lambda match: f"{match['head']}{MASK}", text)
