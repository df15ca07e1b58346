"""Alerts and dashboard, checked by the real tools.

* promtool (Debian's prometheus 2.42, from scripts/setup-tools.sh): `check rules` on the alert
  source and on the rendered PrometheusRule (helm template), `test rules` on
  deploy/prometheus/tests/ where each alert fires on a series that should fire it and stays
  silent on one that should not, and fails when none fires.
* Every dashboard query parses (promtool check rules on them as recording rules), and the
  decisions annotation marks a reason's first count.
* The dashboard is what scripts/gen-dashboard.py writes.

The metric names the alerts and the dashboard query, and their structure:
tests/unit/test_ship_observability.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from tests.support.dashboard import dashboard, dashboard_queries
from tests.support.observability import ALERTS, PROMTOOL_TESTS, alert_rules
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules_on_the_source_and_the_rendered_prometheusrule(tmp_path):
    p = promtool("check", "rules", str(ALERTS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in p.stdout
    helm = subprocess.run([tool("helm"), "template", "kc", str(CHART), "--show-only", "templates/prometheusrule.yaml",
                           "--api-versions", "monitoring.coreos.com/v1"],
                          capture_output=True, text=True, timeout=60)
    assert helm.returncode == 0, helm.stderr
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump(yaml.safe_load(helm.stdout)["spec"]))
    p = promtool("check", "rules", str(rendered))
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_rejects_a_broken_rule(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups: [{name: x, rules: [{alert: X, expr: 'sum by (x (y)'}]}]\n")
    assert promtool("check", "rules", str(bad)).returncode != 0


def test_promtool_unit_tests_pass():
    assert PROMTOOL_TESTS
    p = promtool("test", "rules", *map(str, PROMTOOL_TESTS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_promtool_unit_tests_fail_when_no_alert_fires(tmp_path):
    """The unit tests demand firing: with every expression made silent they fail, per alert."""
    doc = yaml.safe_load(ALERTS.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            r["expr"] = "vector(1) < 0"
    silent = tmp_path / "charts" / "kneecap" / "files"
    silent.mkdir(parents=True)
    (silent / "alerts.yaml").write_text(yaml.safe_dump(doc))
    tests_dir = tmp_path / "deploy" / "prometheus" / "tests"
    tests_dir.mkdir(parents=True)
    for t in PROMTOOL_TESTS:
        shutil.copy(t, tests_dir / t.name)
    p = promtool("test", "rules", *[str(tests_dir / t.name) for t in PROMTOOL_TESTS])
    assert p.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time:", p.stdout + p.stderr))
    assert failed == set(alert_rules()), failed


def test_dashboard_queries_parse_as_promql(tmp_path):
    subst = {"$__rate_interval": "5m", "$namespace": "demo", "$name": "llama", "$pool": ".*"}
    rules = []
    for i, (where, expr) in enumerate(dashboard_queries(dashboard(), subst)):
        rules.append({"record": f"kneecap:dashboard_query:{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = promtool("check", "rules", str(path))
    assert p.returncode == 0, p.stdout + p.stderr


def test_decisions_annotation_marks_a_reasons_first_count(tmp_path):
    """prometheus_client exports a labelled counter first at 1 (no 0 before it): the annotation marks
    that first decision, then only later increments, and never a guard's reason (promtool)."""
    ann = {a["name"]: a["expr"] for a in dashboard()["annotations"]["list"] if "expr" in a}
    expr = ann["kneecap decisions"].replace("$namespace", "demo").replace("$name", "llama")
    assert "$" not in expr
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "t", "rules": [{"record": "annotation", "expr": f"count({expr})"}]}]}))
    series = 'kneecap_decisions_total{namespace="demo", name="llama", reason="%s"}'
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": series % "Applied", "values": "_x5 1x10 2x10"},
                                    {"series": series % "Cooldown", "values": "1+1x25"}],
                   "promql_expr_test": [
                       {"expr": "annotation", "eval_time": "4m", "exp_samples": []},
                       {"expr": "annotation", "eval_time": "6m", "exp_samples": [{"labels": "annotation", "value": 1}]},
                       {"expr": "annotation", "eval_time": "10m", "exp_samples": []},
                       {"expr": "annotation", "eval_time": "17m", "exp_samples": [{"labels": "annotation", "value": 1}]},
                       {"expr": "annotation", "eval_time": "24m", "exp_samples": []}]}]}))
    p = promtool("test", "rules", str(tmp_path / "test.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_dashboard_is_what_the_generator_writes():
    p = subprocess.run(["python3", str(ROOT / "scripts" / "gen-dashboard.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
