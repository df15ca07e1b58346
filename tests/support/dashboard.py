"""The shipped Grafana dashboard and the PromQL queries it runs (panels, annotations, variables)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "kneecap" / "files" / "kneecap-dashboard.json"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(d: dict, subst: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(where, query) for every panel target, annotation and query variable. With `subst`, the
    variables are replaced and a Grafana `label_values(selector, label)` becomes its selector."""
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}" if subst is not None else p["title"], t["expr"]))
    for a in d["annotations"]["list"]:
        if "expr" in a:
            out.append((f"annotation {a['name']}", a["expr"]))
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            out.append((f"variable {v['name']}", v["query"]["query"]))
    if subst is None:
        return out
    replaced = []
    for where, expr in out:
        expr = re.sub(r"^label_values\((.*?)(,\s*\w+)?\)$", r"\1", expr.strip())
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, (where, expr)
        replaced.append((where, expr))
    return replaced
