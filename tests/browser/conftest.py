"""Headless Chromium (Debian's, driven by Playwright) against pytest-django's live server.

Screenshots go to ``tests/artifacts/browser/<test>/`` (ignored by git, kept as CI artifacts).
Playwright's sync API runs an event loop in the test's thread, and Django refuses ORM calls from a
thread with a running loop; the tests set ``DJANGO_ALLOW_ASYNC_UNSAFE`` because their own ORM
calls (setup and checks) never overlap a Playwright call.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connections

from tests.e2e import harness

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000  # per action: two shared cores can be slow


@pytest.fixture
def chromium(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Headless Chromium for one test (skipped with the reason when it is not installed).

    Started per test so that ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set exactly while its loop runs.
    """
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Shots:
    """Numbered screenshots of one test."""

    def __init__(self, page: Any, directory: Path) -> None:
        self.page = page
        self.directory = directory
        self.n = 0

    def __call__(self, name: str) -> Path:
        self.n += 1
        path = self.directory / f"{self.n:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def page(transactional_db: None, live_server: Any, chromium: Any, request: pytest.FixtureRequest) -> Any:
    """A fresh browser context on the live server, with ``page.shot(name)`` for screenshots.

    ``transactional_db`` comes first so that the test database is created before the (session)
    live server starts, and is dropped only after the server and its connection are gone.
    """
    directory = harness.ARTIFACTS / "browser" / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    context = chromium.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    tab.shot = Shots(tab, directory)
    yield tab
    if request.node.stash.get(FAILED, False):
        tab.shot("failure")
    context.close()
    # Connections opened while Playwright's loop ran are not the ones the database teardown closes.
    connections.close_all()


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture
def workers(live_server: Any, request: pytest.FixtureRequest) -> Iterator[harness.Cluster]:
    """Real Celery workers for a browser test, stopped before the live server's tables are flushed.

    This run's broker keys (its key prefix) are cleared before and after.
    """
    prefix = getattr(settings, "CELERY_BROKER_KEYPREFIX", "")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    group = harness.Cluster(harness.ARTIFACTS / "browser" / request.node.name / "logs")
    yield group
    group.stop()
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
