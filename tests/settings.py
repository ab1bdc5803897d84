"""Settings for the test suite: the project's settings with test-friendly environment defaults."""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
# Each test run gets its own database and its own Redis key prefix, so that runs started at the
# same time (several engineers on one machine) never share a queue or a table. The worker and beat
# processes that e2e tests start inherit the prefix through the environment.
TEST_RUN_ID = os.environ.setdefault("TIMEKEEPER_TEST_RUN", str(os.getpid()))
os.environ.setdefault("CELERY_BROKER_KEYPREFIX", f"tk-test-{TEST_RUN_ID}:")

from project import env  # noqa: E402 - after the environment defaults above
from project.settings import *  # noqa: E402,F403 - the environment above must be set before the settings load

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Celery instantiates its result backend on the first send; point it at the test database
# (pytest-django's name for it) rather than the development one, which may not exist.
DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{TEST_RUN_ID}"}  # noqa: F405
CELERY_RESULT_BACKEND = env.sqlalchemy_url({**DATABASES["default"], "NAME": DATABASES["default"]["TEST"]["NAME"]})  # noqa: F405
SCHEDULING_METRICS_CACHE_SECONDS = 0  # every test reads fresh numbers; the cache has its own test
SCHEDULING_METRICS_PUBLIC = True  # pytest-django runs with DEBUG off; the refusal has its own test
