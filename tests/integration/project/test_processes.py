"""project.processes, the one supervisor of dev.py, the e2e tests and the benchmark, on real child processes."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from project import processes
from tests import support

# A parent that starts a grandchild in its own group, says both pids, then waits.
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('pids', child.pid, flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in {"Z", "X"}


def test_stop_takes_the_process_group_with_it(tmp_path: Path) -> None:
    """stop() ends the process and the grandchild it started (a worker's pool), and its log keeps what it printed."""
    proc = processes.Process("parent", [sys.executable, "-c", PARENT], cwd=tmp_path, log_path=tmp_path / "parent.log")
    proc.wait_for_text("pids", timeout=30)
    grandchild = int(proc.log().split()[1])
    assert proc.children() == [grandchild]
    proc.stop(timeout=5)
    assert not proc.alive()
    support.wait_for(lambda: gone(grandchild), 10, message="the grandchild to be stopped with its group")


def test_waiting_for_text_fails_when_the_process_exits_first(tmp_path: Path) -> None:
    """wait_for_text raises ProcessFailed naming the exit status (and the log) when the process dies first."""
    argv = [sys.executable, "-c", "print('starting', flush=True); raise SystemExit(3)"]
    proc = processes.Process("short", argv, cwd=tmp_path, log_path=tmp_path / "short.log", fresh_log=True)
    with pytest.raises(processes.ProcessFailed, match=r"short exited with 3:\nstarting"):
        proc.wait_for_text("ready.", timeout=30)
    proc.stop()


def test_stop_together_waits_for_a_warm_shutdown_then_kills_the_group(tmp_path: Path) -> None:
    """One group, one line callback: a child that exits on TERM and one that ignores it; the stubborn one is killed."""
    lines: list[str] = []
    stubborn = processes.Process(
        "stubborn", [sys.executable, "-c", STUBBORN], cwd=tmp_path, on_line=lines.append, group=0
    )
    polite = processes.Process(
        "polite", [sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path, on_line=lines.append,
        group=stubborn.pid,
    )  # fmt: skip
    support.wait_for(lambda: "ready\n" in lines, 30, message="the stubborn child to start")
    assert os.getpgid(polite.pid) == stubborn.pid
    assert processes.stop_together([stubborn, polite], grace_seconds=1) is False
    assert polite.popen.returncode == -signal.SIGTERM
    assert stubborn.popen.returncode == -signal.SIGKILL


def test_a_process_takes_a_log_or_a_line_callback_not_both(tmp_path: Path) -> None:
    """Giving both (or neither) output targets is refused before anything starts."""
    with pytest.raises(ValueError, match="exactly one"):
        processes.Process("x", ["true"], cwd=tmp_path, log_path=tmp_path / "x.log", on_line=print)
    with pytest.raises(ValueError, match="exactly one"):
        processes.Process("x", ["true"], cwd=tmp_path)
