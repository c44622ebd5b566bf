"""promtool on the shipped Prometheus config, rules and rule unit tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.promql import RULES, load_rules
from tests.deploy.tools import require, run

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def test_promtool_check_config() -> None:
    out = run([require("promtool"), "check", "config", "prometheus.yml"], cwd=PROMETHEUS_DIR)
    assert "1 rule files found" in out, out


def test_promtool_check_rules() -> None:
    out = run([require("promtool"), "check", "rules", str(RULES)])
    assert f"{len(load_rules())} rules found" in out, out


def test_promtool_rule_unit_tests() -> None:
    assert RULE_TESTS, "deploy/prometheus/tests has no promtool test files"
    run([require("promtool"), "test", "rules", *map(str, RULE_TESTS)], cwd=PROMETHEUS_DIR)


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """Each alert is expected to fire at some eval_time and to stay silent at another."""
    alerts = {rule["alert"] for rule in load_rules() if "alert" in rule}
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts, "the rules file has no alerts"
    assert alerts - fires == set(), f"alerts never expected to fire: {sorted(alerts - fires)}"
    assert alerts - quiet == set(), f"alerts never expected silent: {sorted(alerts - quiet)}"
    assert fires <= alerts, f"tests name unknown alerts: {sorted(fires - alerts)}"


def test_rules_are_labelled_and_documented() -> None:
    for rule in load_rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        else:
            level, metric, ops = rule["record"].split(":")  # level:metric:operations
            assert level and metric.startswith("kestrel_") and ops, rule["record"]
