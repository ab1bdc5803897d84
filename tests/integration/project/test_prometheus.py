"""deploy/prometheus: the alert rules pass promtool's check and unit tests; rules and dashboard name real metrics."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from scheduling.web import metrics
from tests import system_packages
from tests.support import ROOT

PROMETHEUS = ROOT / "deploy" / "prometheus"
METRIC_NAME = re.compile(r"\btimekeeper_[a-z0-9_]+\b")
REQUIRED_ALERTS = {  # paged on: backlog, oldest overdue, stuck, dead rate, no beat leader, no control leader
    "TimekeeperBacklogHigh",
    "TimekeeperOldestOverdue",
    "TimekeeperStuckJobs",
    "TimekeeperDeadRateHigh",
    "TimekeeperNoBeatLeader",
    "TimekeeperNoControlLeader",
    "TimekeeperRefusedMessages",  # issue #22: forged broker messages
}


@pytest.fixture(scope="module")
def promtool() -> Path:
    """Debian's promtool (package prometheus), installed with apt-get when missing."""
    return system_packages.ensure("prometheus", "/usr/bin/promtool")


def exposed_names() -> set[str]:
    """Every sample name /metrics can expose, read from the collector's source and its counter table."""
    source = Path(metrics.__file__).read_text()
    names = set(re.findall(r'"(timekeeper_[a-z0-9_]+)"', source))
    names |= {f"{name}_total" for name, _, _ in metrics.COUNTERS.values()}
    names |= {f"timekeeper_due_to_start_lag_seconds_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names


def alert_rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((PROMETHEUS / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules_accepts_the_alert_rules(promtool):
    """`promtool check rules alerts.yml` succeeds."""
    done = run(promtool, "check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass(promtool):
    """`promtool test rules alerts.test.yml`: each alert fires on its series, at its time, and not before."""
    done = run(promtool, "test", "rules", "alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_required_alert_is_there_and_fires_in_a_test():
    """The required alerts exist, and each has a firing case in alerts.test.yml."""
    alerts = {rule["alert"] for rule in alert_rules()}
    assert alerts >= REQUIRED_ALERTS
    tests = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert fired == alerts, "every alert has a case where it fires"


def test_rules_and_dashboard_name_only_metrics_that_metrics_exposes():
    """Every timekeeper_* name in an alert expression or a dashboard query is one /metrics can expose."""
    exposed = exposed_names()
    used = {name for rule in alert_rules() for name in METRIC_NAME.findall(rule["expr"])}
    used |= {name for expr in dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    assert used, "the files name metrics at all"
    assert used - exposed == set()
    assert {"timekeeper_jobs_finished_total", "timekeeper_control_heartbeat_age_seconds"} <= used


def test_the_dashboard_is_valid_json_with_a_query_in_every_panel():
    """The Grafana dashboard parses, has unique panel ids, and every panel has at least one expression."""
    dashboard = json.loads((PROMETHEUS / "grafana-dashboard.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    assert all(panel["targets"] and all(t["expr"].strip() for t in panel["targets"]) for panel in dashboard["panels"])
