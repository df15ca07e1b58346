#!/usr/bin/env python3
"""Writes the kneecap Grafana dashboard (charts/kneecap/files/kneecap-dashboard.json).

One dashboard, one LLMDeployment at a time (variables: data source, namespace, name, pool).
Queries use only series the operator exports (kneecap.control.metrics) and vLLM exports
(DESIGN §6); tests/unit/test_ship_observability.py checks every name, and
tests/integration/test_ship_observability_promtool.py that the committed JSON is what this script writes. Labels on vllm:* series (name, pool) come from the chart's vLLM
ServiceMonitor relabelling.

Usage: .venv/bin/python scripts/gen-dashboard.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "charts" / "kneecap" / "files" / "kneecap-dashboard.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
K = 'namespace="$namespace", name="$name"'  # operator series of one LLMDeployment
KP = K + ', pool=~"$pool"'  # ... of its selected pools
V = 'namespace="$namespace", name="$name", pool=~"$pool"'  # vLLM series (relabelled by the chart)
# vLLM renamed two series the dashboard reads; the current name is asked first, the old one is the
# `or` fallback (as kneecap.observe.window reads them): vllm:gpu_cache_usage_perc before vLLM 0.10
# (vllm-project/vllm#18354), vllm:time_per_output_token_seconds before 0.11 (#24110).
RENAMED = {"kv_cache_usage_perc": "gpu_cache_usage_perc",
           "inter_token_latency_seconds": "time_per_output_token_seconds"}


def target(expr: str, legend: str, ref: str, **extra) -> dict:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, **extra}


def panel(pid: int, title: str, description: str, targets: list[dict], grid: tuple[int, int, int, int],
          kind: str = "timeseries", unit: str = "short", thresholds: list[tuple[str, float | None]] | None = None,
          overrides: list[dict] | None = None, options: dict | None = None, min_: float | None = None,
          max_: float | None = None, transformations: list[dict] | None = None) -> dict:
    x, y, w, h = grid
    steps = [{"color": c, "value": v} for c, v in (thresholds or [("green", None)])]
    defaults: dict = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if kind == "timeseries" and thresholds:
        defaults["custom"] = {"thresholdsStyle": {"mode": "line+area" if len(steps) > 1 else "off"}}
    p = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    if transformations:
        p["transformations"] = transformations
    return p


def row(pid: int, title: str, y: int) -> dict:
    return {"id": pid, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def query_var(name: str, label: str, query: str, multi: bool = False, include_all: bool = False) -> dict:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"var_{name}"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all,
        **({"allValue": ".*"} if include_all else {}),
        "current": {}, "options": [],
    }


def counted_in(selector: str, window: str, by: str) -> str:
    """Series of a counter that counted in the last `window`, by `by`. prometheus_client exports a
    labelled counter first at 1, so a label set's first count is no increase (nothing before it):
    a series absent `window` ago counts too."""
    return (f"sum by ({by}) (increase({selector}[{window}])) > 0"
            f" or sum by ({by}) ({selector} unless {selector} offset {window})")


def dashboard() -> dict:
    def q(p: float, metric: str) -> str:  # percentile from a vLLM histogram over the selected pools
        buckets = [f"sum by (le) (rate(vllm:{m}_bucket{{{V}}}[$__rate_interval]))"
                   for m in (metric, RENAMED.get(metric)) if m]
        return f"histogram_quantile({p}, {' or '.join(buckets)})"

    panels = [
        row(1, "The knee", 0),
        panel(2, "Throughput per pod: observed, predicted, and at the recommended cap (tokens/s)",
              "Observed: the operator's window measurement and vLLM's own token counters (prompt + generation), "
              "per pod. Predicted: SLIM (paper 000, eqs. 5-12) at the same window's batch and lengths; the gap "
              "to observed is the calibration error. At the recommended cap: what SLIM predicts once BCA's cap "
              "is live.",
              [target(f"avg(kneecap_observed_throughput_tokens_per_second{{{KP}}})", "observed (kneecap window)", "A"),
               target(f"avg(kneecap_predicted_throughput_tokens_per_second{{{KP}}})", "predicted (SLIM, same window)", "B"),
               target(f"avg(kneecap_recommended_throughput_tokens_per_second{{{KP}}})",
                      "predicted at the recommended cap", "C"),
               target(f"(sum(rate(vllm:prompt_tokens_total{{{V}}}[$__rate_interval])) "
                      f"+ sum(rate(vllm:generation_tokens_total{{{V}}}[$__rate_interval]))) "
                      f"/ count(vllm:num_requests_running{{{V}}})",
                      "vLLM counters per pod", "D")],
              (0, 1, 12, 9), unit="short", min_=0,
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "C"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}]),
        panel(3, "Throughput vs running batch (where the knee is)",
              "Each point is one scrape: mean running batch (x) against total token throughput (y). The "
              "curve flattens at the knee; past it, batch (latency, KV memory) grows and throughput does not.",
              [target(f"sum(vllm:num_requests_running{{{V}}})", "running batch", "A"),
               target(f"sum(rate(vllm:prompt_tokens_total{{{V}}}[$__rate_interval])) "
                      f"+ sum(rate(vllm:generation_tokens_total{{{V}}}[$__rate_interval]))", "tokens/s", "B")],
              (12, 1, 12, 9), kind="xychart",
              options={"seriesMapping": "auto", "series": [], "dims": {"x": "running batch"},
                       "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"}},
              transformations=[{"id": "joinByField", "options": {"byField": "Time", "mode": "inner"}}]),
        panel(19, "SLIM throughput curve with the knee and the cap (tokens/s per pod)",
              "The calibrated SLIM curve (paper 000, eqs. 5-12) at the last window's lengths, at batch sizes "
              "1, 2, 4, ... up to spec.batching.maxMaxNumSeqs (x, log scale), with its knee (the batch past "
              "which one more sequence adds less than ε·T(1)) and BCA's recommended cap (eq. 13) as points "
              "on it. Past the knee the curve is flat: more batch buys latency and KV memory, not throughput.",
              [target(f"kneecap_predicted_curve_throughput_tokens_per_second{{{KP}}}", "SLIM {{pool}}", "A",
                      instant=True, format="table"),
               target(f"kneecap_knee_batch{{{KP}}}", "knee batch", "B", instant=True, format="table"),
               target(f"kneecap_knee_throughput_tokens_per_second{{{KP}}}", "knee", "C", instant=True,
                      format="table"),
               target(f"kneecap_recommended_max_num_seqs{{{KP}}}", "cap", "D", instant=True, format="table"),
               target(f"kneecap_recommended_throughput_tokens_per_second{{{KP}}}", "cap throughput", "E",
                      instant=True, format="table")],
              (0, 10, 12, 9), kind="xychart", min_=0,
              transformations=[
                  {"id": "convertFieldType", "filter": {"id": "byRefId", "options": "A"},
                   "options": {"conversions": [{"targetField": "batch", "destinationType": "number"}]}},
                  {"id": "joinByField", "filter": {"id": "byRefId", "options": "/^[BC]$/"},
                   "options": {"byField": "pool", "mode": "inner"}},
                  {"id": "joinByField", "filter": {"id": "byRefId", "options": "/^[DE]$/"},
                   "options": {"byField": "pool", "mode": "inner"}}],
              options={"mapping": "manual", "seriesMapping": "manual",
                       "series": [
                           {"name": "SLIM curve", "frame": {"matcher": {"id": "byIndex", "options": 0}},
                            "x": {"matcher": {"id": "byName", "options": "batch"}},
                            "y": {"matcher": {"id": "byName", "options": "Value"}},
                            "showPoints": "always", "pointSize": {"fixed": 5}},
                           {"name": "knee", "frame": {"matcher": {"id": "byIndex", "options": 1}},
                            "x": {"matcher": {"id": "byName", "options": "Value #B"}},
                            "y": {"matcher": {"id": "byName", "options": "Value #C"}},
                            "pointSize": {"fixed": 12}, "pointColor": {"fixed": "orange"}},
                           {"name": "recommended cap", "frame": {"matcher": {"id": "byIndex", "options": 2}},
                            "x": {"matcher": {"id": "byName", "options": "Value #D"}},
                            "y": {"matcher": {"id": "byName", "options": "Value #E"}},
                            "pointSize": {"fixed": 12}, "pointColor": {"fixed": "green"}}],
                       "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"}},
              overrides=[{"matcher": {"id": "byName", "options": "batch"},
                          "properties": [{"id": "custom.scaleDistribution", "value": {"type": "log", "log": 2}}]}]),
        panel(20, "Batching efficiency at the observed batch against ε",
              "T(B)/(B·T(1)) of the calibrated SLIM curve at the window's mean running batch B (paper 000, "
              "eq. 13), and ε = spec.batching.efficiencyFloor. Below ε the pool is past the knee "
              "(alert KneecapPastKnee).",
              [target(f"kneecap_batching_efficiency_ratio{{{KP}}}", "efficiency {{pool}}", "A"),
               target(f"kneecap_efficiency_floor_ratio{{{K}}}", "ε (efficiencyFloor)", "B")],
              (12, 10, 12, 9), unit="percentunit", min_=0, max_=1,
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                         {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]),
        panel(4, "Running batch against the knee and the cap",
              "Mean running batch (vLLM), the knee of the SLIM curve, BCA's recommended --max-num-seqs "
              "(paper 000, eq. 13) and the cap live in the pods.",
              [target(f"sum by (pool) (vllm:num_requests_running{{{V}}})", "running {{pool}}", "A"),
               target(f"kneecap_knee_batch{{{KP}}}", "knee {{pool}}", "B"),
               target(f"kneecap_recommended_max_num_seqs{{{KP}}}", "recommended cap {{pool}}", "C"),
               target(f"kneecap_applied_max_num_seqs{{{KP}}}", "applied cap {{pool}}", "D"),
               target(f"sum by (pool) (vllm:num_requests_waiting{{{V}}})", "waiting {{pool}}", "E")],
              (0, 10, 12, 8), min_=0),
        panel(5, "Recommended vs applied --max-num-seqs",
              "Advise mode only recommends; enforce applies after the guards (cooldown, hysteresis, "
              "minImprovement).",
              [target(f"kneecap_recommended_max_num_seqs{{{KP}}}", "recommended {{pool}}", "A", instant=True),
               target(f"kneecap_applied_max_num_seqs{{{KP}}}", "applied {{pool}}", "B", instant=True)],
              (12, 10, 6, 8), kind="stat", options={"reduceOptions": {"calcs": ["lastNotNull"]},
                                                     "textMode": "value_and_name", "colorMode": "none"}),
        panel(6, "GPU memory released per replica",
              "Default reservation minus the reservation the recommended memory setting needs.",
              [target(f"kneecap_memory_released_bytes{{{KP}}}", "{{pool}}", "A", instant=True)],
              (18, 10, 6, 8), kind="stat", unit="bytes",
              options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}),
        row(7, "Memory", 18),
        panel(8, "GPU memory utilisation: recommended vs applied",
              "--gpu-memory-utilization the KV cache for the cap needs (recommended) and the live one.",
              [target(f"kneecap_recommended_gpu_memory_utilization{{{KP}}}", "recommended {{pool}}", "A"),
               target(f"kneecap_applied_gpu_memory_utilization{{{KP}}}", "applied {{pool}}", "B")],
              (0, 19, 8, 8), unit="percentunit", min_=0, max_=1),
        panel(9, "KV cache usage and preemptions",
              "vLLM KV cache usage (0-1) and preemptions per second. Usage near 1 with preemptions means the "
              "batch is KV-bound (alert KneecapKVCacheSaturated).",
              [target(f"max by (pool) (vllm:kv_cache_usage_perc{{{V}}} or vllm:gpu_cache_usage_perc{{{V}}})",
                      "KV usage {{pool}}", "A"),
               target(f"sum by (pool) (rate(vllm:num_preemptions_total{{{V}}}[$__rate_interval]))",
                      "preemptions/s {{pool}}", "B")],
              (8, 19, 8, 8), unit="percentunit", min_=0,
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"},
                          "properties": [{"id": "unit", "value": "ops"},
                                         {"id": "custom.axisPlacement", "value": "right"}]}]),
        panel(10, "GPU memory released over time (per replica)",
              "How much of the default KV reservation the recommendation gives back.",
              [target(f"kneecap_memory_released_bytes{{{KP}}}", "{{pool}}", "A")],
              (16, 19, 8, 8), unit="bytes", min_=0),
        row(11, "Latency against the SLO", 27),
        panel(12, "TTFT percentiles",
              "Time to first token from vLLM's histogram; the dashed line is spec.slo.ttftSeconds.",
              [target(q(0.5, "time_to_first_token_seconds"), "p50", "A"),
               target(q(0.95, "time_to_first_token_seconds"), "p95", "B"),
               target(q(0.99, "time_to_first_token_seconds"), "p99", "C"),
               target(f'kneecap_slo_target_seconds{{{K}, kind="ttft"}}', "SLO", "D")],
              (0, 28, 8, 8), unit="s", min_=0,
              overrides=[{"matcher": {"id": "byName", "options": "SLO"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                         {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]),
        panel(13, "TPOT (inter-token latency) percentiles",
              "Inter-token latency from vLLM's histogram; the dashed line is spec.slo.tpotSeconds.",
              [target(q(0.5, "inter_token_latency_seconds"), "p50", "A"),
               target(q(0.95, "inter_token_latency_seconds"), "p95", "B"),
               target(q(0.99, "inter_token_latency_seconds"), "p99", "C"),
               target(f'kneecap_slo_target_seconds{{{K}, kind="tpot"}}', "SLO", "D")],
              (8, 28, 8, 8), unit="s", min_=0,
              overrides=[{"matcher": {"id": "byName", "options": "SLO"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                         {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]),
        panel(14, "SLO attainment against the target quantile",
              "Fraction of the windows in the operator's observation ring whose p95 TTFT/TPOT/E2E met every "
              "declared spec.slo, against spec.slo.quantile (alert KneecapSLOAttainmentLow below it).",
              [target(f"kneecap_slo_attainment_ratio{{{K}}}", "windows meeting the SLO", "A"),
               target(f"kneecap_slo_quantile_ratio{{{K}}}", "target (spec.slo.quantile)", "B")],
              (16, 28, 8, 8), unit="percentunit", min_=0, max_=1,
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                         {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]),
        row(15, "Calibration and control", 36),
        panel(16, "Calibration error and age",
              "SLIM fit error (MAPE on throughput; above spec.control.maxFitError, default 0.3, the operator "
              "holds the last good state) and the age of the last accepted fit (right axis; alert "
              "KneecapCalibrationStale over 2 h while traffic flows).",
              [target(f"kneecap_calibration_error_ratio{{{K}}}", "fit error", "A"),
               target(f"time() - kneecap_calibration_timestamp_seconds{{{K}}}", "age of the fit", "B")],
              (0, 37, 8, 8), unit="percentunit", min_=0,
              thresholds=[("green", None), ("red", 0.3)],
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"},
                          "properties": [{"id": "unit", "value": "s"},
                                         {"id": "custom.axisPlacement", "value": "right"}]}]),
        panel(17, "Decisions by reason",
              "Control decisions per interval, by reason (Applied in enforce mode, Advised in advise mode; "
              "the rest are guards holding: NoChange, Cooldown, WithinHysteresis, BelowMinImprovement, ...).",
              [target(f"sum by (reason) (increase(kneecap_decisions_total{{{K}}}[$__rate_interval]))", "{{reason}}", "A")],
              (8, 37, 8, 8), min_=0,
              options={"legend": {"showLegend": True, "displayMode": "table", "placement": "right"}}),
        panel(18, "Replicas, restarts and failures",
              "Live replicas per pool, operator-caused pod rollouts in the last hour, failed scrapes, failed "
              "observations in a row (the operator holds while > 0; alert KneecapObservationsFailing) and the "
              "operator's failed API calls (all resources; alert KneecapApiErrors).",
              [target(f"kneecap_replicas{{{KP}}}", "replicas {{pool}}", "A"),
               target(f"sum(increase(kneecap_restarts_total{{{K}}}[1h]))", "restarts in the last hour", "B"),
               target(f"sum(rate(kneecap_scrape_failures_total{{{K}}}[$__rate_interval]))", "scrape failures/s", "C"),
               target(f"max(kneecap_observation_consecutive_failures{{{K}}})", "failed observations in a row", "D"),
               target("sum by (verb, resource, code) (rate(kneecap_api_errors_total[$__rate_interval])) or on() vector(0)",
                      "API errors/s {{verb}} {{resource}} {{code}}", "E")],
              (16, 37, 8, 8), min_=0),
        row(21, "Fleet: what packing would return (every LLMDeployment of the operator)", 45),
        panel(22, "GPUs today vs packed",
              "GPUs the LLMDeployments in the fleet advice hold today (one engine per GPU) and would hold packed "
              "with their SLOs kept (status.placement; docs/placement.md). Advice only unless spec.placement "
              "names a sharing mechanism. Summed over operator shards (each advises its own).",
              [target("sum(kneecap_fleet_gpus_current)", "today", "A"),
               target("sum(kneecap_fleet_gpus_recommended)", "packed", "B"),
               target("sum(kneecap_fleet_deployments)", "deployments in the advice", "C")],
              (0, 46, 12, 8), min_=0),
        panel(23, "GPU cost today vs packed ($/h)",
              "The catalog price of the GPUs above (spec.gpu prices where set).",
              [target("sum(kneecap_fleet_cost_current_dollars_per_hour)", "today", "A"),
               target("sum(kneecap_fleet_cost_recommended_dollars_per_hour)", "packed", "B"),
               target("sum(kneecap_fleet_cost_current_dollars_per_hour) - "
                      "sum(kneecap_fleet_cost_recommended_dollars_per_hour)", "would be saved", "C")],
              (12, 46, 12, 8), unit="currencyUSD", min_=0),
    ]
    for p in panels:
        if p["gridPos"]["y"] >= 10 and p["id"] not in (19, 20):
            p["gridPos"]["y"] += 9
    annotations = [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "kneecap decisions", "datasource": DS, "enable": True, "iconColor": "orange",
         "expr": counted_in(f'kneecap_decisions_total{{{K}, reason=~"Applied|Advised|ApplyFailed"}}', "2m", "reason"),
         "step": "1m", "titleFormat": "kneecap decision", "textFormat": "{{reason}}", "useValueForTime": False},
        {"name": "cap changed", "datasource": DS, "enable": True, "iconColor": "purple",
         "expr": f"changes(kneecap_applied_max_num_seqs{{{KP}}}[2m]) > 0",
         "step": "1m", "titleFormat": "--max-num-seqs changed", "textFormat": "pool {{pool}}"},
        {"name": "operator restarts", "datasource": DS, "enable": True, "iconColor": "red",
         "expr": counted_in(f"kneecap_restarts_total{{{K}}}", "2m", "reason"),
         "step": "1m", "titleFormat": "pods restarted by kneecap", "textFormat": "{{reason}}"},
    ]
    templating = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "options": [], "refresh": 1},
        query_var("namespace", "Namespace", "label_values(kneecap_applied_max_num_seqs, namespace)"),
        query_var("name", "LLMDeployment", 'label_values(kneecap_applied_max_num_seqs{namespace="$namespace"}, name)'),
        query_var("pool", "Pool", 'label_values(kneecap_applied_max_num_seqs{namespace="$namespace", name="$name"}, pool)',
                  multi=True, include_all=True),
    ]
    return {
        "uid": "kneecap-llmdeployment", "title": "kneecap / LLMDeployment",
        "description": "One LLMDeployment at the knee of its throughput curve: throughput, batch, memory, "
                       "latency against SLO, calibration and decisions.",
        "tags": ["kneecap", "vllm", "llm"], "timezone": "browser", "editable": True,
        "graphTooltip": 1, "refresh": "30s", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-6h", "to": "now"}, "timepicker": {},
        "links": [{"title": "Alerts runbook", "type": "link", "targetBlank": True,
                   "url": "https://github.com/kneecap/kneecap/blob/main/docs/operations.md#alerts-runbook"}],
        "annotations": {"list": annotations}, "templating": {"list": templating},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/gen-dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
