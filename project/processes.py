"""One supervisor for the processes this repository starts: dev.py's children, the e2e tests' Celery
processes and the benchmark's.

A :class:`Process` runs in a process group of its own (or joins the one it is given), so that
stopping it takes its children with it (a prefork worker's pool). Its output goes to a log file that
can be read and waited on, or line by line to a callback (``dev.py run`` prints each line with the
process's name). Signals go to its own pids only, never to a process found by name.

Standard library only: dev.py imports it once it runs in the virtualenv, and bench/ and tests/ import
it without importing each other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

POLL_SECONDS = 0.1  # how often waits look again at a log or a process


class ProcessFailed(AssertionError):
    """A process exited, or did not print what was awaited, in time (an AssertionError: tests fail on it)."""


class Process:
    """A started process: its Popen, its output, signals to it and its children, and a stop.

    ``log_path``: output appended to that file (``fresh_log`` empties it first, so that waits cannot
    match a past run's text). ``on_line``: each output line handed to it from a reader thread
    instead. ``group``: None makes the process lead a new session; 0 a new process group it leads;
    a pid joins that process's group (dev.py runs its children as one group).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        fresh_log: bool = False,
        on_line: Callable[[str], None] | None = None,
        group: int | None = None,
    ) -> None:
        if (log_path is None) == (on_line is None):
            raise ValueError("give a process exactly one of log_path and on_line")
        self.name = name
        self.log_path = log_path
        self._terminated = False
        self._log = None
        self._reader: threading.Thread | None = None
        placement = {"start_new_session": True} if group is None else {"process_group": group}
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            if fresh_log:
                log_path.unlink(missing_ok=True)
            self._log = log_path.open("ab")
            self.popen = subprocess.Popen(
                list(argv), cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=subprocess.STDOUT, **placement,
            )  # fmt: skip
        else:
            self.popen = subprocess.Popen(
                list(argv), cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, **placement,
            )  # fmt: skip
            self._reader = threading.Thread(target=self._pump, args=(on_line,), daemon=True)
            self._reader.start()

    def _pump(self, on_line: Callable[[str], None]) -> None:
        """Hand each output line to ``on_line`` until the process closes its output."""
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            on_line(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def children(self) -> list[int]:
        """Pids of the process's direct children (a prefork worker's pool processes)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to this process (not its group) while it runs."""
        if self.alive():
            os.kill(self.pid, sig)

    def log(self) -> str:
        """Everything the process printed so far (a process given ``on_line`` keeps no log: empty)."""
        return self.log_path.read_text(errors="replace") if self.log_path is not None else ""

    def wait_for_text(self, text: str, timeout: float = 60.0) -> None:
        """Wait until the log shows ``text``; ProcessFailed if the process exits first or time runs out."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if not self.alive():
                raise ProcessFailed(f"{self.name} exited with {self.popen.returncode}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{self.name} did not print {text!r} within {timeout}s:\n{self.log()[-4000:]}")
            time.sleep(POLL_SECONDS)

    def terminate(self) -> None:
        """TERM the process's whole group, once (Celery's warm shutdown; a second TERM changes nothing)."""
        if self.alive() and not self._terminated:
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """TERM the process's whole group (unless ``terminate`` did), wait up to ``timeout`` s, then KILL it."""
        if self.alive():
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(5)
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
        if self._reader is not None:
            self._reader.join(timeout=2)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def stop_together(processes: Iterable[Process], grace_seconds: float) -> bool:
    """TERM each process (a warm shutdown for Celery), wait up to ``grace_seconds``, then KILL their groups.

    True when all of them exited within the grace period.
    """
    started = list(processes)
    for process in started:
        if process.alive():
            process.popen.terminate()
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(process.alive() for process in started):
        time.sleep(POLL_SECONDS)
    clean = not any(process.alive() for process in started)
    if not clean:
        groups = set()
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(process.pid))
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
    for process in started:
        process.popen.wait()
        process._close()
    return clean
