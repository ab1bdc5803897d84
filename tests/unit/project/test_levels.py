"""The test levels hold what they promise: unit tests touch no service and start no process, e2e tests live in e2e."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import conftest


def test_a_unit_test_using_the_database_is_refused() -> None:
    """A test under tests/unit asking for ``db`` (or carrying django_db) is named as misplaced."""
    assert "db" in (conftest.misplaced("unit", set(), {"db", "settings"}) or "")
    assert "django_db" in (conftest.misplaced("unit", {"django_db"}, set()) or "")
    assert "broker" in (conftest.misplaced("unit", set(), {"broker"}) or "")
    assert conftest.misplaced("unit", {"parametrize"}, {"tmp_path", "monkeypatch"}) is None
    assert conftest.misplaced("integration", {"django_db"}, {"db"}) is None


def test_an_e2e_test_outside_tests_e2e_is_refused() -> None:
    """A test marked e2e is misplaced anywhere but tests/e2e; one marked browser anywhere but tests/browser."""
    assert "tests/e2e/" in (conftest.misplaced("integration", {"e2e"}, set()) or "")
    assert conftest.misplaced("e2e", {"e2e", "django_db"}, {"transactional_db"}) is None
    assert "tests/browser/" in (conftest.misplaced("e2e", {"browser"}, set()) or "")


def test_a_conformance_test_using_the_tables_or_redis_directly_is_refused() -> None:
    """tests/conformance speaks Django's Tasks API: run_sql, raw_connect and broker are named as misplaced there."""
    assert "run_sql" in (conftest.misplaced("conformance", {"django_db"}, {"run_sql", "db"}) or "")
    assert "broker" in (conftest.misplaced("conformance", set(), {"broker"}) or "")
    assert conftest.misplaced("conformance", {"django_db"}, {"transactional_db", "caplog"}) is None
    assert "tests/e2e/" in (conftest.misplaced("conformance", {"e2e"}, set()) or "")


def test_a_unit_test_cannot_start_a_process() -> None:
    """``subprocess.run`` inside a unit test fails with a message saying where the test belongs."""
    with pytest.raises(AssertionError, match="starts no process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
