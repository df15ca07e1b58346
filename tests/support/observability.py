"""The alert rules and the metric names the alerts and the dashboard may query: what
kneecap.control.metrics' registry exports, the names in the real vLLM 0.32 captures, the series
Prometheus writes itself, and the old vLLM names the operator still reads as fallbacks (shared by
tests/unit/test_ship_observability.py, tests/integration/test_ship_observability_promtool.py and
tests/kube/test_live_metrics.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.data import VLLM_CAPTURES

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts" / "kneecap" / "files" / "alerts.yaml"
PROMTOOL_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yaml"))
# Series Prometheus itself writes for every target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

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
    (kneecap.observe.vllm_metric_names' name tuples: current first, then the names older vLLMs
    export)."""
    from kneecap.observe import vllm_metric_names

    out: dict[str, set[str]] = {}
    for names in vars(vllm_metric_names).values():
        if isinstance(names, tuple) and len(names) > 1 and all(isinstance(n, str) and n.startswith("vllm:") for n in names):
            current, *old = names
            for suffix in ("", "_bucket", "_sum", "_count"):
                out.setdefault(current + suffix, set()).update(o + suffix for o in old)
    return out


def exported_metric_names() -> dict[str, set[str]]:
    """The names each source serves: the operator, vLLM, Prometheus itself."""
    return {"operator": operator_metric_names(), "vllm": vllm_metric_names(), "prometheus": PROMETHEUS_SYNTHETIC}


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


def alert_rules() -> dict[str, dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
