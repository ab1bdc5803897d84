"""Debian packages a test drives (pgbouncer, promtool): installed with apt-get when missing, as dev.py does.

The suite installs what it uses: a fixture calls ``ensure("pgbouncer", "/usr/sbin/pgbouncer")``; as
root with apt-get the package is installed once, otherwise the test fails saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

_lock = threading.Lock()


def ensure(package: str, executable: str) -> Path:
    """The path of ``executable``, installing Debian's ``package`` first if it is missing."""
    path = Path(executable)
    with _lock:
        if path.exists():
            return path
        if not shutil.which("apt-get") or os.geteuid() != 0:
            pytest.fail(f"{executable} is missing: install Debian's {package} (apt-get install -y {package})")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.fail(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        if not path.exists():
            pytest.fail(f"apt-get installed {package} but {executable} is still missing")
        return path
