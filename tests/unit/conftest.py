"""Unit tests start no process and touch no service (tests/conftest.py refuses the database fixtures here)."""

from __future__ import annotations

import subprocess
from typing import Any, NoReturn

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``subprocess.Popen`` (behind ``run``, ``check_output`` ...) refuse to start anything in a unit test."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"a unit test starts no process ({args[0] if args else kwargs.get('args')!r}): "
                             "move it to tests/integration or tests/e2e")  # fmt: skip

    monkeypatch.setattr(subprocess, "Popen", refuse)
