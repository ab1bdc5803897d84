"""project.redaction.redact: the one mask for passwords in printed text."""
from __future__ import annotations

import pytest

from project import redaction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://:secret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app:secret@db/app", "postgresql://app:***@db/app"),
        ("db+postgresql+psycopg2://app:secret@db:5432/app", "db+postgresql+psycopg2://app:***@db:5432/app"),
        ("postgresql://app:p@ss@db/app", "postgresql://app:***@db/app"),  # an unquoted @ in the password
        ("postgresql://app@db:5432/app?password=secret&sslmode=require", "postgresql://app@db:5432/app?password=***&sslmode=require"),
    ],
)
def test_redact_hides_the_password_of_a_url(text: str, expected: str) -> None:
    """The password of a URL, wherever it is written, becomes ***; everything else stays readable."""
    assert redaction.redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://postgres@127.0.0.1:5432/x",
        "redis://127.0.0.1:6379/0",
        "postgresql://postgres:@/timekeeper?host=/var/pgdata",  # an empty password: nothing to hide
        "use postgresql://<user>:<password>@<host>:5432/<database>",  # a placeholder in a help text
    ],
)
def test_redact_leaves_text_without_a_password_alone(text: str) -> None:
    """URLs without a password, and help texts showing a URL's shape, are unchanged."""
    assert redaction.redact(text) == text


def test_redact_hides_every_url_in_a_message() -> None:
    """In free text (an error message, a log line) each URL's password is hidden."""
    message = "DATABASE_URL='postgresql://u:one@h/x' and broker redis://:two@r:6379/0 failed"
    assert redaction.redact(message) == "DATABASE_URL='postgresql://u:***@h/x' and broker redis://:***@r:6379/0 failed"
