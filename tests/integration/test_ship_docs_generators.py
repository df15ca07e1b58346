"""The docs and the CRD checked by running what writes or reads them: the CRD field reference
is what scripts/gen-crd-docs.py writes, spec.engine's Kubernetes types what
scripts/gen-pod-schema.py writes, and kubernetes-validate has no schema for the examples' CRD
type (why tests/unit/test_ship_docs.py validates them against the CRD's own schema)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "llmdeployment.yaml").read_text())


def test_kubernetes_validate_has_no_schema_for_the_crd_type(tmp_path):
    """Why the examples go through the CRD schema instead of kubernetes-validate."""
    exe = Path(sys.executable).parent / "kubernetes-validate"
    if not exe.exists():
        pytest.fail("kubernetes-validate is not installed in the venv: run `bash scripts/setup.sh` (test extra)")
    p = subprocess.run([str(exe), "--strict", "-k", "1.37.0", *map(str, EXAMPLES)], capture_output=True, text=True,
                       timeout=60)
    assert "Couldn't find schema for kind LLMDeployment" in p.stdout + p.stderr


def test_crd_reference_is_generated_from_the_schema():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-crd-docs.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = (ROOT / "docs" / "crd-reference.md").read_text()
    # every spec field of the schema has a row
    (version,) = [v for v in CRD["spec"]["versions"] if v["storage"]]

    def paths(schema, prefix):
        yield prefix
        if schema.get("description", "").startswith("core/v1 "):
            return  # an embedded Kubernetes type (scripts/gen-pod-schema.py): one row, the API reference's fields
        for k, v in (schema.get("properties") or {}).items():
            yield from paths(v, f"{prefix}.{k}")

    for p_ in paths(version["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec"):
        assert f"| `{p_}` |" in text, p_
    assert "`30s`" in text and "one of `advise`, `enforce`" in text
    # every table row keeps its 6 cells (a | in a pattern is escaped)
    for line in text.splitlines():
        if line.startswith("| `spec") or line.startswith("| `status"):
            assert len(re.split(r"(?<!\\)\|", line.strip())) - 2 == 6, line


def test_the_pod_schema_is_generated_from_the_kubernetes_openapi():
    """spec.engine's Kubernetes types in the CRD are scripts/gen-pod-schema.py's output (Kubernetes
    1.37's OpenAPI, structural), and the chart and the package carry the same CRD."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-pod-schema.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    engine = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"]

    def preserved(schema, path):
        """Nodes a structural schema may not have: unknown fields kept, no type, properties and
        additionalProperties together."""
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            yield path
        if "type" not in schema and not schema.get("x-kubernetes-int-or-string"):
            yield path + " (no type)"
        if "properties" in schema and "additionalProperties" in schema:
            yield path + " (properties and additionalProperties)"
        for k, v in (schema.get("properties") or {}).items():
            yield from preserved(v, f"{path}.{k}")
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                yield from preserved(schema[key], f"{path}[]")

    assert list(preserved(engine, "spec.engine")) == []  # structural all the way down
    toleration = engine["properties"]["podTemplate"]["properties"]["spec"]["properties"]["tolerations"]["items"]
    assert toleration["properties"]["tolerationSeconds"] == {"type": "integer", "format": "int64"}
    text = (ROOT / "crds" / "llmdeployment.yaml").read_text()
    for copy_ in ("charts/kneecap/crds/llmdeployment.yaml", "operator/kneecap/crds/llmdeployment.yaml"):
        assert (ROOT / copy_).read_text() == text, copy_
