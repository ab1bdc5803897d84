"""The settings in production mode (each loaded in a fresh interpreter): a secret key required and never the
development one, the proxy header only when told, credential URLs masked."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings
from django.test import override_settings

from project import error_reports
from tests.support import ROOT


def _settings_in(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Import project.settings in a fresh interpreter with ``env`` on top of a clean environment."""
    environ = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY"}}
    environ.update({"PYTHONPATH": str(ROOT), **env})
    code = "import project.settings as s; print(getattr(s, 'SECURE_PROXY_SSL_HEADER', None))"
    command = [sys.executable, "-c", code]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


def test_production_refuses_the_development_secret_key() -> None:
    """DEBUG=0 with the development SECRET_KEY from the source is ImproperlyConfigured."""
    done = _settings_in({"DEBUG": "0", "SECRET_KEY": "dev-only-insecure-key-" + "x" * 40})
    assert done.returncode != 0
    assert "development key" in done.stderr


def test_x_forwarded_proto_is_trusted_only_when_configured() -> None:
    """Production ignores X-Forwarded-Proto unless TRUST_X_FORWARDED_PROTO=1."""
    key = "k" * 60
    assert _settings_in({"DEBUG": "0", "SECRET_KEY": key}).stdout.strip() == "None"
    trusted = _settings_in({"DEBUG": "0", "SECRET_KEY": key, "TRUST_X_FORWARDED_PROTO": "1"})
    assert "HTTP_X_FORWARDED_PROTO" in trusted.stdout


def test_error_page_masks_urls_with_credentials() -> None:
    """CELERY_BROKER_URL, DATABASE_URL and any URL with a password are masked in the debug report's settings."""
    with override_settings(
        CELERY_BROKER_URL="redis://:hunter2@redis:6379/0",
        DATABASE_URL="postgresql://tk:s3cret@db/tk",
        SOME_ENDPOINT="https://user:pw@example.com/x",
    ):
        safe = error_reports.ExceptionReporterFilter().get_safe_settings()
    text = repr(safe)
    for secret in ("hunter2", "s3cret", "user:pw"):
        assert secret not in text
    assert settings.DEFAULT_EXCEPTION_REPORTER_FILTER == "project.error_reports.ExceptionReporterFilter"


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
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
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
