"""The Helm chart's files as files: the CRD it carries is the source CRD byte for byte, and every
key of values.yaml is documented. Rendered and linted by the real tools (helm,
kubernetes-validate): tests/integration/test_ship_chart_helm.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"


def test_chart_crd_is_byte_identical_to_the_source_crd():
    src = (ROOT / "crds" / "llmdeployment.yaml").read_bytes()
    copy = (CHART / "crds" / "llmdeployment.yaml").read_bytes()
    assert copy == src, "charts/kneecap/crds/llmdeployment.yaml differs from crds/: run scripts/sync-crd.sh"


def undocumented_values(text: str) -> list[str]:
    """Keys of a values.yaml with no comment directly above them or above one of their parents."""
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    out, prev = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            prev = ""
            continue
        if s.startswith("#") or s.startswith("-") or ":" not in s:
            prev = s
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = prev.startswith("#") or any(d for _, d in stack)
        if not documented:
            out.append(s.split(":", 1)[0])
        stack.append((indent, documented))
        prev = s
    return out


def test_values_yaml_documents_every_key():
    text = (CHART / "values.yaml").read_text()
    assert undocumented_values(text) == []
    assert undocumented_values(text + "\nsneaky:\n  leaf: 1\n") == ["sneaky", "leaf"]
