"""``python -m bench`` stops cleanly on SIGTERM: a real process, signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.support import ROOT


def test_sigterm_unwinds_a_scenario_like_ctrl_c(tmp_path):
    """SIGTERM to ``python -m bench`` raises SystemExit in its main thread: the scenario's ``with`` and
    ``finally`` blocks run (its processes stopped, autovacuum given back) and it exits 143."""
    marker = tmp_path / "unwound"
    code = (
        "import signal, sys, time\n"
        "from bench import __main__ as m\n"
        "signal.signal(signal.SIGTERM, m._stop_on_sigterm)\n"
        "try:\n"
        "    print('ready', flush=True)\n"  # inside the try: a signal right after it still unwinds through it
        "    time.sleep(60)\n"
        "finally:\n"
        f"    with open({str(marker)!r}, 'w') as f:\n"
        "        f.write('yes')\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    assert marker.read_text() == "yes", "the finally block ran"
    assert time.monotonic() - started < 60, "it stopped at the signal, not after its sleep"
