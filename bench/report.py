"""``python -m bench.report [--write]``: the table of figures against targets, from ``bench/results/*.json``.

Without ``--write`` it prints the table. With ``--write`` it replaces the table in ``bench/README.md``
(its "Performance" section), between the ``<!-- bench-report:start -->`` and
``<!-- bench-report:end -->`` markers, leaving the rest of the file as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import burst, common, failures, recurring

README = common.ROOT / "bench" / "README.md"
START = "<!-- bench-report:start -->"
END = "<!-- bench-report:end -->"


def _load(name: str) -> dict[str, Any] | None:
    path = common.RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
    elif isinstance(value, int):
        value = f"{value:,}"
    return f"{value}{unit}"


Row = tuple[str, str, str, str, str]


def _chaos_row(d: dict[str, Any]) -> Row:
    """bench chaos: one run or several seeds (``runs``), judged on the worst case across them (issue 34)."""
    runs = d.get("runs") or [d]
    seeds = d.get("seeds") or [d.get("seed")]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(d["faults"].items()))
    setup = (
        f"{d['seconds'] / 60:g} min mixed load x {len(seeds)} seed{'s' if len(seeds) > 1 else ''} "
        f"({', '.join(map(str, seeds))}), {sum(d['faults'].values())} faults: {faults} "
        f"(lease {d['settings']['lease_s']} s)"
    )

    def worst(key: str) -> Any:
        return max((r[key] for r in runs if isinstance(r.get(key), int | float)), default=None)

    measured = (
        f"worst run: {_fmt(d.get('lost', d.get('lost_jobs')))} lost of {_fmt(sum(r['jobs'] for r in runs))} jobs, "
        f"{d['duplicate_atomic_effects']} duplicate atomic effects, {d['self_exits']} self-exits, "
        f"{d['duplicate_ticks']} duplicate ticks, {d.get('parked_deferrals', 0)} parked deferrals; "
        f"countdowns after a worker kill max {_fmt(d.get('countdown_max_late_after_worker_kill_s'))} s late; "
        f"host loss: leads/locks moved after max {_fmt(d.get('host_loss_max_moved_s'))} s, "
        f"{_fmt(d.get('ticks_missed_beyond_bound'))} ticks missed beyond the bound; "
        f"Sentinel: promoted after max {_fmt(d.get('sentinel_promotion_s'))} s, "
        f"{_fmt(d.get('sentinel_countdowns_lost'))} countdowns lost; "
        f"deferrals {_fmt(worst('lost_deferrals'))} lost (max late {_fmt(worst('deferral_max_late_s'))} s); "
        f"rescue max {_fmt(worst('rescue_s_max'))} s; drain max {_fmt(worst('drain_s'))} s"
    )
    target = (
        "0 lost, 0 duplicate atomic effects, 0 self-exits, 0 duplicate ticks, 0 parked; countdowns <= 45 s late "
        "after a worker kill; host loss: moved <= 30 s, 0 ticks missed beyond it"
    )
    if "host_loss_max_moved_s" not in d:
        return ("chaos", setup, measured, target, "older run, before issue 34's targets")
    return ("chaos", setup, measured, target, "met" if d["target_met"] else "**missed**")


def _rows() -> list[Row]:
    rows: list[Row] = []

    def add(name: str, build: Callable[[dict[str, Any]], list[Row]]) -> None:
        data = _load(name)
        if data is None:
            rows.append((name, "not measured", "", "", ""))
            return
        rows.extend(build(data))

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    def older(d: dict[str, Any]) -> bool:
        """A result from before issue 32's targets and floor: its "met" answered older targets."""
        return "floor_jobs_per_s" not in d

    def floor_text(d: dict[str, Any]) -> str:
        if older(d):
            return ""
        return f"; {d['ratio_vs_floor']}x the floor ({_fmt(d['floor_jobs_per_s'])}/s)"

    def against(d: dict[str, Any]) -> str:
        return "older run, before these targets" if older(d) else verdict(bool(d["target_met"]))

    add(
        "throughput",
        lambda d: [
            (
                "throughput",
                f"{_fmt(d['jobs'])} no-op jobs, {d['worker_processes']} worker processes, median of {d['runs']}",
                f"{_fmt(d['jobs_per_s'])} jobs/s = {d['ratio_vs_celery']}x Celery ({_fmt(d['celery_jobs_per_s'])}/s), "
                f"{d['ratio_vs_procrastinate']}x Procrastinate ({_fmt(d['procrastinate_jobs_per_s'])}/s); "
                f"raw SQL batch 50: {_fmt(d['raw_batch_50_rows_per_s'])}/s ({d['ratio_vs_raw_batch_50']}x), "
                f"row per txn: {_fmt(d['raw_row_per_txn_rows_per_s'])}/s" + floor_text(d),
                ">= 10,000 jobs/s, >= 0.6x raw batch 50",
                against(d),
            )
        ],
    )
    add(
        "realistic",
        lambda d: [
            (
                "realistic",
                f"{_fmt(d['jobs'])} jobs inserting one row (ORM), {d['worker_processes']} worker processes",
                f"{_fmt(d['jobs_per_s'])} jobs/s = {d['ratio_vs_celery']}x Celery reliable "
                f"({_fmt(d['celery_jobs_per_s'])}/s), {d['ratio_vs_celery_default']}x Celery default "
                f"({_fmt(d['celery_default_jobs_per_s'])}/s), {d['ratio_vs_procrastinate']}x Procrastinate "
                f"({_fmt(d['procrastinate_jobs_per_s'])}/s){floor_text(d)}; {d['duplicate_effects']} duplicate effects",
                ">= 3,500 jobs/s, >= 4x Celery reliable, >= 0.75x floor, 0 duplicates",
                against(d),
            )
        ],
    )
    add(
        "failures",
        lambda d: [
            (
                "failures",
                f"{_fmt(d['jobs'])} realistic jobs: 2% raising, 1% past a 1 s timeout, 1% on_commit raising; "
                f"{d['worker_processes']} worker processes",
                f"{d['calls_per_attempt']:.2f} handler calls per attempt; {d['duplicate_direct_effects']} duplicate "
                f"direct, {d['duplicate_db_effects']} duplicate database effects; {_fmt(d['callbacks_run'])} of "
                f"{_fmt(d['callbacks_expected'])} callbacks run; {_fmt(d['mixed_jobs_per_s'])} jobs/s = "
                f"{d['ratio_vs_clean']}x the clean run ({_fmt(d['clean_jobs_per_s'])}/s), "
                f"{d['ratio_vs_clean_net_of_timeouts']}x net of the {_fmt(d['timeout_floor_s'])} s the timeouts cost",
                f"1.00 calls per attempt, 0 duplicates, all callbacks but the raising ones, "
                f">= {failures.TARGET_RATIO_VS_CLEAN:g}x clean (net)",
                verdict(  # today's target, not the one stored with an older run
                    bool(d["target_met"]) and d["ratio_vs_clean_net_of_timeouts"] >= failures.TARGET_RATIO_VS_CLEAN
                ),
            )
        ],
    )
    add(
        "burst",
        lambda d: [
            (
                "burst",
                f"{_fmt(d['jobs'])} ORM-insert jobs due at one instant, 2 worker processes",
                f"drained {_fmt(d['drain_s'])} s after the due instant; start lag p50 {_fmt(d['lag_p50_ms'])} / p99 "
                f"{_fmt(d['lag_p99_ms'])} ms; at most {_fmt(d['max_claimed_not_started'])} claimed not started, "
                f"{_fmt(d['max_queued_messages'])} queued messages (bound {d['queued_bound']}); {d['sweeps']} sweeps "
                f"(~{d['sweeps_expected']} expected); {d['duplicate_effects']} duplicate effects",
                f"<= {burst.TARGET_DRAIN_S:g} s, exactly once, queue within its bound, sweeps on schedule",
                verdict(bool(d["target_met"]) and d["drain_s"] <= burst.TARGET_DRAIN_S),  # today's target
            ),
            *(
                [
                    (
                        "burst (30k)",
                        f"{_fmt(d['small']['jobs'])} ORM-insert jobs due at one instant, 1 worker x 2 + beat",
                        f"drained {_fmt(d['small']['drain_s'])} s after the due instant; start lag p99 "
                        f"{_fmt(d['small']['lag_p99_ms'])} ms; {d['small']['duplicate_effects']} duplicate, "
                        f"{d['small']['missing_effects']} missing effects",
                        f"<= {burst.TARGET_SMALL_DRAIN_S:g} s, exactly once",
                        verdict(
                            bool(d.get("small_target_met"))
                            and d["small"]["drain_s"] is not None
                            and d["small"]["drain_s"] <= burst.TARGET_SMALL_DRAIN_S
                        ),
                    )
                ]
                if "small" in d
                else []
            ),
        ],
    )
    add(
        "rescue",
        lambda d: [
            (
                "rescue",
                f"kill -9 of the pool process mid-job (lease {d['lease_seconds']} s, heartbeat "
                f"{d['heartbeat_seconds']} s, sweep {d['sweep_interval_seconds']} s), median of {d['rounds']}",
                f"started again {_fmt(d['rescue_s_median'])} s after the kill (max {_fmt(d['rescue_s_max'])} s); "
                f"{d['duplicate_effects']} duplicate effects",
                "<= 45 s",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "lag",
        lambda d: [
            (
                "lag",
                f"{d['rate_per_s']} jobs/s due 0.5-5 s ahead for {d['seconds']:.0f} s",
                f"p50 {_fmt(d['p50_ms'])} / p95 {_fmt(d['p95_ms'])} / p99 {_fmt(d['p99_ms'])} / max "
                f"{_fmt(d['max_ms'])} ms; idle p99 {_fmt(d['idle_p99_ms'])} ms; bare Celery countdown p99 "
                f"{_fmt(d['celery_p99_ms'])} ms (idle {_fmt(d['celery_idle_p99_ms'])} ms)"
                + (
                    f"; at {d['high_rate_per_s']}/s: p50 {_fmt(d['high_p50_ms'])} / p99 {_fmt(d['high_p99_ms'])} ms "
                    f"(Celery p99 {_fmt(d['celery_high_p99_ms'])} ms)"
                    if "high_rate_per_s" in d
                    else ""
                ),
                "p99 <= 50 ms at 200/s",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "scale",
        lambda d: [
            (
                "scale",
                f"claim of {d['claim_limit']} on {_fmt(d['finished_rows'])} finished rows",
                f"claim p50 ratio {d['ratio_claim_top_vs_10k']} ({_fmt(d['levels'][-1]['pending'])} vs 10,000 "
                f"pending); status {_fmt(d['status_ms_at_top'])} ms at {_fmt(d['levels'][-1]['pending'])} pending; "
                "partial index used: " + ("yes" if all(lv["uses_partial_index"] for lv in d["levels"]) else "NO"),
                "ratio <= 1.2, status < 50 ms",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "beat",
        lambda d: [
            (
                "beat",
                f"every {d['every_seconds']} s for {d['seconds']} s, 2 beats, 2 workers",
                f"tick to run start p50 {_fmt(d['p50_ms'])} / p99 {_fmt(d['p99_ms'])} ms; "
                f"{d['duplicate_runs']} duplicate runs, {d['missing_ticks']} missing ticks",
                "p99 <= 500 ms, zero duplicates",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "memory",
        lambda d: [
            (
                "memory",
                "a deferral worker holding 600 s countdowns",
                f"peak RSS {_fmt(d['peak_rss_mb_limited_10k'])} MB with 10,000 vs {_fmt(d['peak_rss_mb_limited_1k'])}"
                f" MB with 1,000 (ETA limit {_fmt(d['eta_task_limit'])}); without the limit "
                f"{_fmt(d['peak_rss_mb_unlimited_10k'])} MB",
                "bounded: the same with 10,000 as with 1,000",
                verdict(d["ratio_10k_vs_1k_limited"] is not None and d["ratio_10k_vs_1k_limited"] <= 1.05),
            )
        ],
    )
    add(
        "sweep",
        lambda d: [
            (
                "sweep",
                f"{_fmt(d['rows'])} rows, {_fmt(d['stranded_claims'])} stranded claims, "
                f"{_fmt(d['past_retention'])} past retention",
                f"reclaim {d['reclaim_s']} s, prune {d['prune_s']} s; longest statement "
                f"{_fmt(d['max_statement_ms'])} ms (batches {d['reclaim_batch_size']} / {d['prune_batch_size']})",
                "no statement holds locks over 100 ms",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add("chaos", lambda d: [_chaos_row(d)])
    add(
        "recurring",
        lambda d: [
            (
                "recurring",
                f"{_fmt(d['recurrences'])} recurrences (daily 09:00, {d['zones']} zones)"
                + (" (--quick)" if d.get("quick") else ""),
                f"created {_fmt(d['create_per_s'])}/s; claim p50 ratio {d['ratio_claim']} "
                f"({_fmt(d['recurrences'])} vs {_fmt(d['claim_low_pending'])} pending); spike of {_fmt(d['spike'])}: "
                f"all run in {d['spike_run_s']} s, {d['spike_duplicate_runs']} duplicates, next created once for "
                f"{_fmt(d['spike_next_once'])}; beat tick {d['baseline'][0]['beat_tick_ms']} -> "
                f"{d['baseline'][-1]['beat_tick_ms']} ms, RSS {d['baseline'][0]['beat_rss_mib']} -> "
                f"{d['baseline'][-1]['beat_rss_mib']} MiB ({_fmt(d['baseline'][0]['entities'])} -> "
                f"{_fmt(d['baseline'][-1]['entities'])} entities); Timekeeper RSS "
                f"{d['baseline'][0]['timekeeper_rss_mib']} -> {d['baseline'][-1]['timekeeper_rss_mib']} MiB",
                f"claim ratio <= 1.2; spike all once within {recurring.TARGET_SPIKE_S:g} s, next once each",
                verdict(bool(d["target_met"]) and d["spike_run_s"] <= recurring.TARGET_SPIKE_S),  # today's target
            )
        ],
    )
    add(
        "flow",
        lambda d: [
            (
                "flow",
                f"{d['limit_per_s']}/s on a 5,000 backlog, then {d['partition_limit_per_s']}/s x 20 partitions, "
                f"beside {d['other_rate_per_s']} jobs/s of another kind, {d['seconds']:.0f} s each"
                + (" (--quick)" if d.get("quick") else ""),
                f"rate error {d['rate_error_pct']}% (max {d['max_starts_in_1s']} in 1 s); partitions worst "
                f"{d['partition_rate_error_pct_max']}% (max {d['partition_max_starts_in_1s']} in 1 s); other kind "
                f"lag p99 {d['other_kind_lag_p99_ms']} ms",
                "rate within 2%, never above it in 1 s; other lag p99 <= 50 ms",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "ab",
        lambda d: [
            (
                "ab",
                f"realistic ({_fmt(d['jobs'])} jobs), this tree against {d['base']} (issue 36's features absent), "
                f"{d['rounds']} rounds each, interleaved",
                f"loses {d['loss_pct']}% (median {_fmt(d['this_median'])} against {_fmt(d['base_median'])} jobs/s); "
                f"exactly once: {'yes' if d['exactly_once'] else 'no'}",
                f"loses <= {d['target_loss_pct']:g}% with the features present and unused",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    add(
        "soak",
        lambda d: [
            (
                "soak",
                f"{d['minutes']} min at {_fmt(d['rate_per_s'])} jobs/s ({d['kind']}), retention pruning on, "
                f"autovacuum {d.get('server_autovacuum', 'not recorded')}",
                f"claim p99 {d['claim_p99_first_ms']} -> {d['claim_p99_last_ms']} ms (ratio {d['claim_p99_ratio']}); "
                f"size {_fmt(d['size_settled_bytes'] / 1e6)} -> {_fmt(d['size_last_bytes'] / 1e6)} MB "
                f"(ratio {d['size_ratio']}); lag p99 worst {_fmt(d['lag_p99_worst_ms'])} ms; "
                f"{d['duplicate_effects']} duplicate effects",
                "claim p99 and size within 1.2x; lag p99 <= 100 ms; 0 duplicates",
                verdict(bool(d["target_met"])),
            )
        ],
    )
    return rows


def markdown() -> str:
    lines = [
        "| scenario | setup | measured | target | |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows()]
    loads = {
        name: (_load(name) or {}).get("load_average_1_5_15")
        for name in (
            "throughput",
            "realistic",
            "failures",
            "burst",
            "rescue",
            "lag",
            "scale",
            "beat",
            "chaos",
            "recurring",
            "flow",
            "ab",
            "soak",
        )
    }
    lines.append("")
    lines.append(
        "Load average (1/5/15 min) when each scenario ended: "
        + "; ".join(f"{name} {load}" for name, load in loads.items() if load)
        + "."
    )
    return "\n".join(lines)


def replace_table(text: str, table: str) -> str:
    """``text`` with the part between the markers replaced by ``table``; ValueError when a marker is missing."""
    head, start, rest = text.partition(START)
    _old, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the file has no {START} ... {END} markers around the table")
    return f"{head}{START}\n{table.rstrip()}\n{END}{tail}"


def write(path: Path = README) -> bool:
    """Put the current table into ``path`` (bench/README.md); True when the file changed."""
    text = path.read_text()
    updated = replace_table(text, markdown())
    if updated == text:
        return False
    path.write_text(updated)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    where = README.relative_to(common.ROOT)
    parser.add_argument("--write", action="store_true", help=f"replace the table in {where} instead of printing it")
    args = parser.parse_args(argv)
    if not args.write:
        print(markdown())
        return 0
    changed = write()
    common.say(f"{README.relative_to(common.ROOT)} {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
