"""Alerts and dashboard, checked by the real tools and against the metrics that really exist.

* promtool (Debian's prometheus 2.42, from scripts/setup-tools.sh): `check rules` on the alert
  source and on the rendered PrometheusRule, `test rules` on deploy/prometheus/tests/ where each
  alert fires on a series that should fire it and stays silent on one that should not.
* Every metric name in an alert or a dashboard query is exported: operator names from
  kneecap.control.metrics' registry, vLLM names from the real vLLM 0.32 captures in
  tests/fixtures/vllm-metrics/ (the twin serves the same names; DESIGN §6).
* Every dashboard query parses (promtool check rules on them as recording rules).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.support.dashboard import dashboard, dashboard_queries
from tests.support.data import VLLM_CAPTURES
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
ALERTS = CHART / "files" / "alerts.yaml"
PROMTOOL_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yaml"))
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
# Series Prometheus itself writes for every target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}




def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ metric names

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
             "offset", "inf", "nan", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL (or Grafana label_values) query selects."""
    e = re.sub(r"^label_values\((.*?)(,\s*\w+)?\)$", r"\1", expr.strip())  # Grafana: label_values(metric{..}, label)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers (with their strings)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges
    e = re.sub(r'"[^"]*"', " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        tok, call = m.group(1), m.group(2)
        if call or tok in _KEYWORDS:
            continue
        names.add(tok)
    return names


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                        '{namespace="$namespace", pool=~"$pool"}[$__rate_interval])))') == {
        "vllm:time_to_first_token_seconds_bucket"}
    assert metric_names("a > on (namespace, name) 1.1 * b unless on (x) sum by (y) (c{r=~\"A|B\"}) > 0") == {"a", "b", "c"}
    assert metric_names('label_values(kneecap_applied_max_num_seqs{namespace="$namespace"}, name)') == {
        "kneecap_applied_max_num_seqs"}
    assert metric_names("vector($ttft_slo)") == set()


def operator_metric_names() -> set[str]:
    """Series names kneecap.control.metrics exports, from its registry's metric families."""
    from kneecap.control.metrics import OperatorMetrics

    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
    out = set()
    for family in OperatorMetrics().registry.collect():
        out |= {family.name + s for s in suffixes[family.type]}
    return out


def vllm_metric_names() -> set[str]:
    """Sample names in the real vLLM /metrics captures (vLLM 0.32, CPU)."""
    names = set()
    captures = sorted(VLLM_CAPTURES.glob("*.txt"))
    assert captures, f"no vLLM metric captures in {VLLM_CAPTURES}"
    for path in captures:
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def vllm_renamed() -> dict[str, set[str]]:
    """Old vLLM series names the operator still reads, by the current name that replaced them
    (kneecap.observe.window's name tuples: current first, then the names older vLLMs export)."""
    from kneecap.observe import window as W

    out: dict[str, set[str]] = {}
    for names in vars(W).values():
        if isinstance(names, tuple) and len(names) > 1 and all(isinstance(n, str) and n.startswith("vllm:") for n in names):
            current, *old = names
            for suffix in ("", "_bucket", "_sum", "_count"):
                out.setdefault(current + suffix, set()).update(o + suffix for o in old)
    return out


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return {"operator": operator_metric_names(), "vllm": vllm_metric_names(),
            "prometheus": PROMETHEUS_SYNTHETIC}


def assert_old_names_only_as_fallback(where: str, expr: str, exported: dict[str, set[str]]) -> set[str]:
    """Old vLLM names may appear only as the `or` fallback of their current name, which vLLM 0.32
    exports; returns the names of `expr` with those fallbacks removed."""
    names = metric_names(expr)
    for current, old in vllm_renamed().items():
        for o in names & old:
            assert current in names and current in exported["vllm"], f"{where}: {o} without {current}"
            assert " or " in expr and expr.index(current) < expr.index(o), f"{where}: {o} is not a fallback of {current}"
        names -= old
    return names


def test_old_vllm_names_are_the_fallbacks_the_operator_reads():
    renamed = vllm_renamed()
    assert renamed["vllm:kv_cache_usage_perc"] == {"vllm:gpu_cache_usage_perc"}
    assert renamed["vllm:inter_token_latency_seconds_bucket"] == {"vllm:time_per_output_token_seconds_bucket"}
    assert not set().union(*renamed.values()) & vllm_metric_names()  # vLLM 0.32 no longer exports them


def test_exported_names_are_what_the_operator_and_vllm_serve(exported):
    assert {"kneecap_recommended_max_num_seqs", "kneecap_scrape_failures_total", "kneecap_decisions_total",
            "kneecap_batching_efficiency_ratio", "kneecap_efficiency_floor_ratio",
            "kneecap_calibration_timestamp_seconds", "kneecap_slo_target_seconds", "kneecap_slo_quantile_ratio",
            "kneecap_predicted_curve_throughput_tokens_per_second",
            "kneecap_knee_throughput_tokens_per_second"} <= exported["operator"]
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket"} <= exported["vllm"]


# ------------------------------------------------------------------ alerts

def alert_rules() -> dict[str, dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


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


def _identity(labels: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k in ("namespace", "name", "pool", "job", "instance", "verb", "resource", "code")))


def _series_labels(series: str) -> dict:
    inner = series[series.index("{") + 1:series.rindex("}")]
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', inner))


def test_every_alert_has_a_firing_and_a_silent_case():
    rules = alert_rules()
    fired_with_silent_neighbour = set()
    for path in PROMTOOL_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            series_ids = {_identity(_series_labels(s["series"])) for s in case["input_series"]}
            for art in case.get("alert_rule_test", []):
                expected = art.get("exp_alerts") or []
                if not expected:
                    continue
                fired = {_identity(a["exp_labels"]) for a in expected}
                # some input series identifies an object that is not among the expected alerts
                silent = {s for s in series_ids if not any(set(s) <= set(f) or set(f) <= set(s) for f in fired)}
                if silent:
                    fired_with_silent_neighbour.add(art["alertname"])
                for a in expected:
                    assert a["exp_labels"]["severity"] == rules[art["alertname"]]["labels"]["severity"]
    assert fired_with_silent_neighbour == set(rules)


def test_every_alert_is_documented_and_names_exported_metrics(exported):
    allowed = set().union(*exported.values())
    doc = OPERATIONS_DOC.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+\s+(.*)$", doc, flags=re.M)}
    for name, r in alert_rules().items():
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], name
        base, anchor = ann["runbook_url"].split("#")
        assert base == "https://github.com/kneecap/kneecap/blob/main/docs/operations.md"
        assert anchor == name.lower() and anchor in anchors, f"{name}: no '{name}' heading in docs/operations.md"
        names = assert_old_names_only_as_fallback(name, r["expr"], exported)
        assert names, name
        assert names <= allowed, f"{name} uses metrics nobody exports: {names - allowed}"


# ------------------------------------------------------------------ dashboard

def test_dashboard_is_what_the_generator_writes():
    p = subprocess.run(["python3", str(ROOT / "scripts" / "gen-dashboard.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_dashboard_json_is_a_valid_grafana_dashboard():
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "namespace", "name", "pool"} <= names
    for _, expr in dashboard_queries(d):
        used = set(re.findall(r"\$\{?(\w+)", expr)) - {"__rate_interval"}
        assert used <= names, used - names


def test_dashboard_shows_the_knee_decisions_memory_latency_and_calibration():
    d = dashboard()
    by_title = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in d["panels"]}
    def panel_with(*needles):
        return [t for t, e in by_title.items() if all(n in e for n in needles)]
    assert panel_with("kneecap_observed_throughput_tokens_per_second", "kneecap_predicted_throughput_tokens_per_second",
                      "kneecap_recommended_throughput_tokens_per_second")
    assert panel_with("kneecap_knee_batch", "vllm:num_requests_running")
    assert panel_with("kneecap_recommended_max_num_seqs", "kneecap_applied_max_num_seqs")
    assert panel_with("kneecap_recommended_gpu_memory_utilization", "kneecap_applied_gpu_memory_utilization")
    assert panel_with("kneecap_memory_released_bytes")
    assert panel_with("vllm:time_to_first_token_seconds_bucket", "0.95", 'kneecap_slo_target_seconds', 'kind="ttft"')
    assert panel_with("vllm:inter_token_latency_seconds_bucket", "0.99", 'kneecap_slo_target_seconds', 'kind="tpot"')
    assert panel_with("kneecap_calibration_error_ratio", "time() - kneecap_calibration_timestamp_seconds")
    assert panel_with("kneecap_slo_attainment_ratio", "kneecap_slo_quantile_ratio")
    # SLIM's curve with its knee and the cap on it; the efficiency at the observed batch against ε
    assert panel_with("kneecap_predicted_curve_throughput_tokens_per_second", "kneecap_knee_batch",
                      "kneecap_knee_throughput_tokens_per_second", "kneecap_recommended_max_num_seqs")
    assert panel_with("kneecap_batching_efficiency_ratio", "kneecap_efficiency_floor_ratio")
    assert not any("$ttft_slo" in e or "$tpot_slo" in e for e in by_title.values())  # targets come from spec.slo
    ann = {a["name"]: a.get("expr", "") for a in d["annotations"]["list"]}
    assert "kneecap_decisions_total" in ann["kneecap decisions"]
    # old and new vLLM names: the panels read both
    assert panel_with("vllm:kv_cache_usage_perc", " or vllm:gpu_cache_usage_perc")
    assert panel_with("vllm:inter_token_latency_seconds_bucket", " or sum by (le) (rate(vllm:time_per_output_token_seconds_bucket")


def test_decisions_annotation_asks_for_reasons_the_operator_records():
    """The annotation's reasons are those kneecap.control.plan counts in kneecap_decisions_total
    (the policy's "Recommended" becomes Applied or Advised there and is never counted)."""
    ann = {a["name"]: a["expr"] for a in dashboard()["annotations"]["list"] if "expr" in a}
    (alternatives,) = set(re.findall(r'reason=~"([^"]+)"', ann["kneecap decisions"]))
    plan = (ROOT / "operator" / "kneecap" / "control" / "plan.py").read_text()
    counted = set(re.findall(r't\.decision\("(\w+)"', plan)) | set(
        re.findall(r'MetricUpdate\("inc", "decisions", \([^)]*"(\w+)"\)', plan))
    assert {"Applied", "Advised", "ApplyFailed"} <= counted and "Recommended" not in counted
    assert set(alternatives.split("|")) <= counted


def test_dashboard_queries_name_only_exported_metrics(exported):
    allowed = set().union(*exported.values())
    seen = set()
    for where, expr in dashboard_queries(dashboard()):
        names = assert_old_names_only_as_fallback(where, expr, exported)
        assert names <= allowed, f"{where}: {names - allowed} is exported by neither the operator nor vLLM"
        seen |= names
    # the dashboard uses both sources
    assert seen & exported["operator"] and seen & exported["vllm"]


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
