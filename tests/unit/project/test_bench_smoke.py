"""The benchmark package stays importable and its printing helpers work (no services, no timings)."""

from __future__ import annotations

import json
import math

import pytest

from bench import __main__ as bench_main
from bench import common


def test_table_aligns_numbers_and_text():
    """The table prints a title, a header, a rule and one line per row, numbers with separators."""
    text = common.table("Title", ["system", "jobs/s"], [["timekeeper", 3456.7], ["celery", 12.5], ["none", math.nan]])
    lines = text.splitlines()
    assert lines[0] == "Title"
    assert lines[1].split() == ["system", "jobs/s"]
    assert "3,457" in lines[3]
    assert lines[4].rstrip().endswith("12.50")
    assert lines[5].rstrip().endswith("-")


def test_summary_and_percentiles_on_tiny_inputs():
    """Percentiles interpolate; an empty list gives NaN rather than an error."""
    assert common.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(common.percentile([], 99))
    summary = common.summary_ms([1.0, 2.0, 3.0])
    assert summary["n"] == 3
    assert summary["p50_ms"] == 2.0
    assert summary["max_ms"] == 3.0
    assert common.ratio(6.0, 2.0) == 3.0


def test_emit_writes_the_json_file_and_prints_it_last(tmp_path, monkeypatch, capsys):
    """emit() writes results/<scenario>.json and prints the same object as its last line (NaN as null)."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "git_commit", lambda: "abc1234")
    result = common.emit("smoke", {"jobs_per_s": 1.5, "p99_ms": math.nan}, quick=True)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == result == json.loads((tmp_path / "smoke.json").read_text())
    assert result["jobs_per_s"] == 1.5
    assert result["p99_ms"] is None
    assert result["quick"] is True


def test_cli_lists_every_scenario():
    """The command line knows every scenario and refuses an unknown one."""
    assert set(bench_main.SCENARIOS) == {
        "throughput",
        "realistic",
        "failures",
        "burst",
        "lag",
        "rescue",
        "scale",
        "sweep",
        "memory",
        "beat",
        "recurring",
        "flow",
    }
    with pytest.raises(SystemExit):
        bench_main.main(["no-such-scenario"])


def test_report_renders_a_markdown_table_even_without_results(tmp_path, monkeypatch):
    """The bench/README.md table renders; a scenario with no results file says so instead of failing."""
    from bench import report

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    (tmp_path / "sweep.json").write_text(
        json.dumps(
            {
                "rows": 10,
                "stranded_claims": 2,
                "past_retention": 3,
                "reclaim_s": 0.1,
                "prune_s": 0.2,
                "max_statement_ms": 12.5,
                "reclaim_batch_size": 200,
                "prune_batch_size": 200,
                "target_met": True,
            }
        )
    )
    text = report.markdown()
    assert text.startswith("| scenario |")
    assert "| throughput | not measured |" in text
    assert "longest statement 12.5 ms" in text


def test_report_write_replaces_only_the_table_between_the_markers(tmp_path):
    """--write swaps the text between the markers of bench/README.md and keeps the rest; no markers is an error."""
    from bench import report

    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\nbefore\n{report.START}\nold table\n{report.END}\n\nafter\n")
    assert report.write(readme) is True
    text = readme.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n")
    assert text.endswith(f"{report.END}\n\nafter\n")
    assert "old table" not in text
    assert report.markdown() in text
    assert report.write(readme) is False  # already up to date
    readme.write_text("no markers here\n")
    with pytest.raises(ValueError, match="markers"):
        report.write(readme)


@pytest.mark.parametrize("name", ["realistic", "failures", "burst", "rescue", "lag", "throughput"])
def test_scenarios_import_and_take_quick(name):
    """Each of these scenarios imports without services; its main takes ``quick`` (what run passes)."""
    import importlib
    import inspect

    module = importlib.import_module(f"bench.{name}")
    assert name == module.SCENARIO
    assert list(inspect.signature(module.main).parameters) == ["quick"]


def test_scenario_targets():
    """The targets printed beside the figures: issue 32's (3,500 jobs/s, 4x Celery, 0.75x floor; 10,000, 0.6x raw)."""
    from bench import burst, lag, realistic, rescue, throughput

    assert (realistic.TARGET_JOBS_PER_S, realistic.TARGET_RATIO_VS_CELERY) == (3500, 4.0)
    assert realistic.TARGET_RATIO_VS_FLOOR == 0.75
    assert (throughput.TARGET_JOBS_PER_S, throughput.TARGET_RATIO_VS_RAW_BATCH_50) == (10_000, 0.6)
    assert burst.TARGET_DRAIN_S == 25.0  # issue 32
    assert (burst.SMALL_JOBS, burst.TARGET_SMALL_DRAIN_S) == (30_000, 10.0)  # issue 32: 1 worker x 2 + beat
    assert rescue.TARGET_S == 45.0
    assert (lag.RATE_PER_S, lag.HIGH_RATE_PER_S, lag.TARGET_P99_MS) == (200, 1000, 50)


def test_report_renders_the_realistic_burst_and_rescue_rows(tmp_path, monkeypatch):
    """The report renders realistic, burst and rescue rows from their result files."""
    from bench import report

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    (tmp_path / "rescue.json").write_text(
        json.dumps(
            {
                "rounds": 3,
                "lease_seconds": 30,
                "heartbeat_seconds": 5.0,
                "sweep_interval_seconds": 5.0,
                "rescue_s_median": 33.1,
                "rescue_s_max": 34.0,
                "duplicate_effects": 0,
                "target_met": True,
            }
        )
    )
    text = report.markdown()
    assert "| realistic | not measured |" in text
    assert "| burst | not measured |" in text
    assert "started again 33.1 s after the kill" in text


def test_failures_mix_and_targets():
    """The failures mix: 2% raising, 1% past the timeout, 1% on_commit raising; 1 call per attempt, 0.9x clean."""
    from bench import failures

    fates = [failures._fate(i) for i in range(10_000)]
    assert (fates.count("raise"), fates.count("timeout"), fates.count("callback")) == (200, 100, 100)
    assert (failures.TARGET_CALLS_PER_ATTEMPT, failures.TARGET_RATIO_VS_CLEAN) == (1.0, 0.9)  # issue 32


def test_recurring_scenario_imports_and_takes_quick():
    """The recurring scenario imports without services, takes ``quick``, and keeps its targets."""
    import inspect

    from bench import recurring

    assert recurring.SCENARIO == "recurring"
    assert list(inspect.signature(recurring.main).parameters) == ["quick"]
    assert (recurring.TARGET_RATIO, recurring.TARGET_SPIKE_S, len(recurring.ZONES)) == (1.2, 40.0, 30)  # issue 32: 40 s


def test_flow_counts_the_most_starts_in_any_half_open_second():
    """bench flow's window: starts at 0.0, 0.5, 0.99 and 1.0 hold 3 in [0, 1), and 3 in [0.5, 1.5)."""
    from bench import flow

    assert flow.max_in_window([0.0, 0.5, 0.99, 1.0]) == 3
    assert flow.max_in_window([]) == 0


def test_flow_time_series_are_per_ten_seconds_of_the_run():
    """The detail's series: the other kind's lag p99 per 10 s of due times, the limited kind's starts per 10 s."""
    from bench import flow

    lags = [(100.0 + i, 10.0) for i in range(10)] + [(110.0, 500.0), (125.0, 20.0)]
    assert flow.by_window(lags) == [10.0, 500.0, 20.0]
    assert flow.by_window([]) == []
    assert flow._counts_by_window([5.0, 6.0, 14.9, 15.0, 36.0]) == [3, 1, 0, 1]
    assert flow._counts_by_window([]) == []


def test_ab_needs_a_base_and_carries_issue_36s_target():
    """bench ab compares with a base revision (required) and judges a loss of at most 3% (issue 36)."""
    from bench import ab

    assert ab.TARGET_LOSS_PCT == 3.0
    with pytest.raises(SystemExit):
        ab.main([])


def test_report_renders_the_chaos_row_from_several_seeds(tmp_path, monkeypatch):
    """The chaos row shows the seeds, the worst case of issue 34's figures across runs, and the verdict."""
    from bench import chaos, report

    run = {
        "seed": 1, "seconds": 180.0, "settings": {"lease_s": 10}, "faults": {"host_loss": 1}, "jobs": 100,
        "lost_jobs": 0, "duplicate_atomic_effects": 0, "self_exits": 0, "duplicate_ticks": 0,
        "parked_deferrals": 0, "lost_deferrals": 0, "deferral_max_late_s": 3.0, "rescue_s_max": 12.0,
        "drain_s": 4.0, "countdown_max_late_after_worker_kill_s": 21.5, "host_loss_max_moved_s": 24.0,
        "host_loss_not_moved": 0, "ticks_missed_beyond_bound": 0, "second_leaders_after_heal": 0,
        "sentinel_promotion_s": 2.1, "sentinel_countdowns_lost": 3, "target_met": True,
    }  # fmt: skip
    second = run | {"seed": 2, "host_loss_max_moved_s": 33.0, "target_met": False}
    assert chaos.target_met(run)
    assert not chaos.target_met(second)
    summary = chaos._summary([run, second])
    assert (summary["host_loss_max_moved_s"], summary["target_met"]) == (33.0, False)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    figures = {"seeds": [1, 2], "seconds": 180.0, "settings": run["settings"], "faults": {"host_loss": 2}}
    (tmp_path / "chaos.json").write_text(json.dumps(figures | {"runs": [run, second]} | summary))
    row = next(line for line in report.markdown().splitlines() if line.startswith("| chaos |"))
    assert "x 2 seeds (1, 2)" in row
    assert "moved after max 33.0 s" in row
    assert "max 21.5 s late" in row
    assert "3 countdowns lost" in row
    assert row.endswith("| **missed** |")


def test_chaos_refuses_sentinel_with_the_plain_redis_restarts_and_all_leaves_them_out(capsys):
    """--faults: sentinel_failover with redis_kill is refused before anything starts; all = every fault but those."""
    import argparse

    from bench import chaos

    with pytest.raises(SystemExit) as refused:
        chaos.main(["--faults", "sentinel_failover,redis_kill", "--minutes", "0.1"])
    assert refused.value.code == 2
    assert "choose one or the other" in capsys.readouterr().err
    chosen = chaos._faults(argparse.ArgumentParser(), "all")
    assert {"host_loss", "sentinel_failover", "kill_worker_main"} <= set(chosen)
    assert not set(chosen) & set(chaos.PLAIN_REDIS_FAULTS)


def test_a_host_loss_answers_for_its_ticks_until_the_bound_after_the_heal_or_the_next_fault():
    """bench chaos: a host loss's tick window ends 30 s after the heal, or where the next fault was injected."""
    from bench import chaos

    loss = {"fault": "host_loss", "at": 100.0, "cut_at": 100.1, "heal_at": 140.1}
    assert chaos.host_loss_window_end(loss, [loss], until=1000.0) == 140.1 + chaos.HOST_LOSS_BOUND_S
    failover = {"fault": "sentinel_failover", "at": 160.0}
    earlier = {"fault": "kill_pool", "at": 50.0}
    assert chaos.host_loss_window_end(loss, [earlier, loss, failover], until=1000.0) == 160.0
    assert chaos.host_loss_window_end(loss, [loss], until=150.0) == 150.0


def test_report_renders_the_ab_row_against_issue_36s_target(tmp_path, monkeypatch):
    """The ab row shows the base, the loss and the medians, and judges the loss against 3%."""
    from bench import report

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    figures = {
        "base": "abc1234",
        "jobs": 20000,
        "rounds": 10,
        "base_median": 2500.0,
        "this_median": 2400.0,
        "loss_pct": 4.0,
        "target_loss_pct": 3.0,
        "exactly_once": True,
        "target_met": False,
    }
    (tmp_path / "ab.json").write_text(json.dumps(figures))
    row = next(line for line in report.markdown().splitlines() if line.startswith("| ab |"))
    assert "against abc1234" in row
    assert "loses 4.0% (median 2,400 against 2,500 jobs/s)" in row
    assert row.endswith("| **missed** |")


def test_flow_split_runs_flows_scenarios():
    """bench.flow_split splits the other kind's lag for flow's scenarios (none, rate, partitioned)."""
    from bench import flow_split

    assert flow_split.MODES == ("none", "rate", "partitioned")
    assert "claimed_at - a.due_at" in flow_split.SPLIT
