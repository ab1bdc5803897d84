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
    assert set(bench_main.SCENARIOS) == {"throughput", "lag", "scale", "sweep", "memory", "beat"}
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
