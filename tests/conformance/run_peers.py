"""Run a peer's Django Tasks test suite against TimekeeperBackend, from outside the repository.

Usage (from a Timekeeper checkout, with the test environment /work/bin/tk or dev.py sets)::

    python tests/conformance/run_peers.py django-tasks /path/to/django-tasks [LABEL ...]   # Django 5.2
    python tests/conformance/run_peers.py django /path/to/django [LABEL ...]               # Django 6.0
    PYTHONPATH=<django_tasks_db here> python tests/conformance/run_peers.py django-tasks-db /path/to/django-tasks-db

It fetches nothing and copies nothing into the repository: it copies the peer's test package from
the checkout into a temporary directory under a name of its own (``peer_suite``, as ``tests`` and
``tasks`` are this project's packages), points the backends those tests configure at Timekeeper's
(the immediate backend at ``RunsAtEnqueue``: ``TimekeeperBackend`` plus ``testing.run_due()``
after each ``enqueue``; the dummy and database backends at ``KeepsResults``: ``TimekeeperBackend``
with the dummy's ``results`` and ``clear()`` read from the rows), gives the tests that expect no
database one (``SimpleTestCase`` becomes ``TransactionTestCase``), tries a task once
(``SCHEDULING_DEFAULT_MAX_ATTEMPTS = 1``, as the peers' backends do), and runs them with Django's
test runner on ``tests.settings`` (a database of its own). The counts (a test with failing
subtests counts once) and each failure are printed at the end; the figures and what each failure
means are in the conformance suite's docstring (tests/conformance/test_backends.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "peer_suite"
IMMEDIATE = "peer_adapters.RunsAtEnqueue"
STORED = "peer_adapters.KeepsResults"
BACKEND_TESTS = ["test_immediate_backend", "test_dummy_backend", "test_tasks"]
SUITES = {  # flavour: (the test package in the checkout, its name there, framework package, default labels)
    "django-tasks": ("tests", "tests", "django_tasks", [f"tests.{label}" for label in BACKEND_TESTS]),
    "django": ("tests/tasks", "tasks", "django.tasks", BACKEND_TESTS),
    # the database backend's suite (its package django_tasks_db importable, e.g. on PYTHONPATH)
    "django-tasks-db": ("tests", "tests", "django_tasks", ["tests"]),
}
PEER_APPS = {"django-tasks-db": ["django_tasks_db"]}  # the peer's own app, for the models its tests read
DEFAULT_BACKEND = {  # TASKS["default"] in the settings: as the peer's own settings configure it
    "django-tasks-db": {"BACKEND": STORED, "QUEUES": ["default", "queue-1"]},
}
ADAPTERS = '''
import asyncio
from concurrent.futures import ThreadPoolExecutor

from django.db import connection

from scheduling import backends, testing
from scheduling.models import ScheduledJob


class RunsAtEnqueue(backends.TimekeeperBackend):
    """Timekeeper's backend with the worker run in this process right after each enqueue."""

    def enqueue(self, task, args, kwargs):
        result = super().enqueue(task, args, kwargs)
        testing.run_due()
        return self.get_result(result.id)


class KeepsResults(backends.TimekeeperBackend):
    """Timekeeper's backend with the dummy backend's ``results`` and ``clear()``, read from the rows."""

    @property
    def results(self):
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a sync caller: read on its connection (its transaction included)
            return self._results()
        with ThreadPoolExecutor(1) as pool:  # the dummy's list read from an async test: in a thread
            return pool.submit(self._results, close=True).result()

    def _results(self, close=False):
        rows = ScheduledJob.objects.filter(task_result_id__isnull=False).order_by("id")
        found = [self.get_result(str(result_id)) for result_id in rows.values_list("task_result_id", flat=True)]
        if close:
            connection.close()
        return found

    def clear(self):
        ScheduledJob.objects.filter(task_result_id__isnull=False).delete()
'''
SETTINGS = """
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, *{apps!r}, "{package}"]  # noqa: F405
TASKS = {{"default": {backend!r}}}
SCHEDULING_DEFAULT_MAX_ATTEMPTS = 1  # tried once, as the peers' backends do (retries do not apply)
SILENCED_SYSTEM_CHECKS = ["postgres.E005"]  # Django 6.0's check that django.contrib.postgres is installed
{urlconf}
"""


def rewrite(text: str, name: str, framework: str) -> str:
    """The peer's test module with its package renamed and its backends pointed at Timekeeper's."""
    text = re.sub(rf"\bfrom {name} import\b", f"from {PACKAGE} import", text)
    text = re.sub(rf"\bfrom {name}\.", f"from {PACKAGE}.", text)
    text = re.sub(rf"([\"']){name}\.(tasks|urls|views)\b", rf"\1{PACKAGE}.\2", text)
    text = text.replace(f"{framework}.backends.immediate.ImmediateBackend", IMMEDIATE)
    text = text.replace(f"{framework}.backends.dummy.DummyBackend", STORED)
    text = text.replace('"django_tasks_db.DatabaseBackend"', f'"{STORED}"')
    text = re.sub(r"\n *available_apps = \[\]\n", "\n", text)  # the backend's own app must stay installed
    if not re.search(r"\bSimpleTestCase\)", text):
        return text
    text = re.sub(r"\bSimpleTestCase\)", "TransactionTestCase)", text)
    future = re.match(r"(from __future__ import .*\n)?", text)
    head = future.group(0) if future else ""
    return f"{head}from django.test import TransactionTestCase\n{text[len(head) :]}"


def prepare(flavour: str, checkout: Path, work: Path) -> None:
    """Copy and rewrite the peer's test package into ``work``, with the adapters and the settings."""
    subdir, name, framework, _ = SUITES[flavour]
    target = work / PACKAGE
    shutil.copytree(checkout / subdir, target)
    for path in target.rglob("*.py"):
        path.write_text(rewrite(path.read_text(), name, framework))
    (work / "peer_adapters.py").write_text(ADAPTERS)
    urlconf = f'ROOT_URLCONF = "{PACKAGE}.urls"' if (target / "urls.py").exists() else ""
    (work / "peer_settings.py").write_text(
        textwrap.dedent(SETTINGS).format(
            package=PACKAGE,
            apps=PEER_APPS.get(flavour, []),
            backend=DEFAULT_BACKEND.get(flavour, {"BACKEND": IMMEDIATE}),
            urlconf=urlconf,
        )
    )


def main(argv: list[str]) -> int:
    flavour, checkout, *labels = argv
    work = Path(tempfile.mkdtemp(prefix=f"peers-{flavour}-"))
    prepare(flavour, Path(checkout), work)
    sys.path[:0] = [str(work), str(ROOT)]
    os.environ["DJANGO_SETTINGS_MODULE"] = "peer_settings"
    import django
    from django.test.runner import DiscoverRunner

    django.setup()
    labels = [f"{PACKAGE}.{label}" for label in labels or SUITES[flavour][3]]

    class Runner(DiscoverRunner):
        def run_suite(self, suite: unittest.TestSuite, **kwargs: Any) -> Any:
            self.outcome: unittest.TestResult = super().run_suite(suite, **kwargs)
            return self.outcome

    runner = Runner(verbosity=1, interactive=False)
    runner.run_tests(labels)
    result = runner.outcome
    failed = result.failures + result.errors
    failing = {getattr(test, "test_case", test).id() for test, _ in failed}  # a subtest counts as its test
    passed = result.testsRun - len(failing) - len(result.skipped)
    print(f"\n{flavour}: ran {result.testsRun}, passed {passed}, failed {len(failing)}, skipped {len(result.skipped)}")
    for test, trace in failed:
        print(f"FAIL {test.id()} -- {trace.strip().splitlines()[-1][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
