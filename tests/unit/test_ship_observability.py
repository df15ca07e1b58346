"""Alerts and dashboard against the metrics that really exist.

* Every metric name in an alert or a dashboard query is exported: operator names from
  kneecap.control.metrics' registry, vLLM names from the real vLLM 0.32 captures in
  tests/fixtures/vllm-metrics/ (the twin serves the same names; DESIGN §6); old vLLM names only
  as the fallbacks the operator reads.
* Every alert is documented, has a firing and a silent case in deploy/prometheus/tests/; the
  dashboard is a valid Grafana dashboard showing what the operator decides.

promtool on the rules, the dashboard's queries and the promtool tests, and the dashboard
generator: tests/integration/test_ship_observability_promtool.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kneecap.control import tick
from tests.support.dashboard import dashboard, dashboard_queries
from tests.support.observability import (PROMTOOL_TESTS, alert_rules, assert_old_names_only_as_fallback,
                                         exported_metric_names, metric_names, vllm_metric_names, vllm_renamed)

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS_DOC = ROOT / "docs" / "operations.md"


# ------------------------------------------------------------------ metric names

def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                        '{namespace="$namespace", pool=~"$pool"}[$__rate_interval])))') == {
        "vllm:time_to_first_token_seconds_bucket"}
    assert metric_names("a > on (namespace, name) 1.1 * b unless on (x) sum by (y) (c{r=~\"A|B\"}) > 0") == {"a", "b", "c"}
    assert metric_names('label_values(kneecap_applied_max_num_seqs{namespace="$namespace"}, name)') == {
        "kneecap_applied_max_num_seqs"}
    assert metric_names("vector($ttft_slo)") == set()


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return exported_metric_names()


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
    """The annotation's reasons are those kneecap.control.plan (and tick.FailedWrite) counts in kneecap_decisions_total
    (the policy's "Recommended" becomes Applied or Advised there and is never counted)."""
    ann = {a["name"]: a["expr"] for a in dashboard()["annotations"]["list"] if "expr" in a}
    (alternatives,) = set(re.findall(r'reason=~"([^"]+)"', ann["kneecap decisions"]))
    plan = (ROOT / "operator" / "kneecap" / "control" / "plan.py").read_text()
    counted = set(re.findall(r't\.decision\("(\w+)"', plan)) | set(
        re.findall(r'MetricUpdate\("inc", Series\.DECISIONS, \([^)]*"(\w+)"\)', plan))
    failed_write = (ROOT / "operator" / "kneecap" / "control" / "tick.py").read_text()  # FailedWrite.outcome
    if re.search(r'MetricUpdate\("inc", Series\.DECISIONS, \(\*self\.labels, self\.reason\)', failed_write):
        counted |= {tick.APPLY_FAILED, tick.RECONCILE_FAILED}
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
