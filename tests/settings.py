"""Settings for the test suite: the project's settings with test-friendly environment defaults."""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")

from project import env
from project.settings import *  # noqa: F403 - the test settings are the project's settings

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Celery instantiates its result backend on the first send; point it at the test database
# (pytest-django's name for it) rather than the development one, which may not exist.
CELERY_RESULT_BACKEND = env.sqlalchemy_url({**DATABASES["default"], "NAME": "test_" + DATABASES["default"]["NAME"]})  # noqa: F405
