"""bench soak's verdict and its command line (no services, no timings)."""

from __future__ import annotations

import pytest

from bench import __main__ as bench_main
from bench import soak


def minute(n: int, claim_p99: float, size: int, lag_p99: float = 20.0) -> dict:
    return {"minute": n, "claim_p99_ms": claim_p99, "table_and_index_bytes": size, "lag_p99_ms": lag_p99,
            "lag_samples": 10}  # fmt: skip


def test_verdict_compares_the_last_window_with_the_first_and_the_settled_size():
    """Claim p99 of the last window over the first; size over minutes 2..window+1; the worst lag of any minute."""
    per_minute = [minute(1, 2.0, 100)] + [minute(n, 2.0, 1_000) for n in range(2, 8)] + [minute(8, 3.0, 1_300, 150.0)]
    figures = soak.verdict(per_minute, window=2)
    assert figures["claim_p99_first_ms"] == 2.0
    assert figures["claim_p99_last_ms"] == 3.0
    assert figures["claim_p99_ratio"] == 1.5
    assert figures["size_settled_bytes"] == 1_000, "minute 1 (before the first prune) is left out"
    assert figures["size_ratio"] == 1.15
    assert figures["lag_p99_worst_ms"] == 150.0


def test_soak_is_its_own_scenario_and_takes_minutes_but_others_refuse_unknown_options():
    """`bench lag --minutes 2` is a usage error (only soak takes it); `all` leaves soak out."""
    assert "soak" not in bench_main.SCENARIOS
    assert "soak" in bench_main.ALONE
    with pytest.raises(SystemExit):
        bench_main.main(["lag", "--minutes", "2"])


def test_main_installs_the_sigterm_handler(monkeypatch):
    installed = {}
    monkeypatch.setattr("signal.signal", lambda signum, handler: installed.setdefault(signum, handler))
    with pytest.raises(SystemExit):
        bench_main.main(["no-such-scenario"])
    import signal

    assert installed[signal.SIGTERM] is bench_main._stop_on_sigterm
