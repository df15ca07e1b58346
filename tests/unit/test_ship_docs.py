"""Examples and docs.

The examples are LLMDeployments, a CRD type: kubernetes-validate has no schema for them (checked
below), so they are validated against the CRD's own openAPIV3Schema with jsonschema (OpenAPI
v3.0 = draft 4 semantics, boolean exclusiveMinimum), with unknown fields rejected as
`kubectl apply` (strict field validation) would, and then parsed by kneecap.control.spec, which
re-checks the CRD's CEL rules. The generated CRD reference and pod schema, and
kubernetes-validate on the examples: tests/integration/test_ship_docs_generators.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from tests.support.examples import EXAMPLES, llmdeployment, others

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "llmdeployment.yaml").read_text())


def strict(schema: dict) -> dict:
    """The schema with unknown fields rejected where the CRD does not preserve them."""
    s = copy.deepcopy(schema)
    if isinstance(s, dict):
        if s.get("properties") and not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
        for key in ("properties",):
            if key in s:
                s[key] = {k: strict(v) for k, v in s[key].items()}
        if isinstance(s.get("items"), dict):
            s["items"] = strict(s["items"])
    return s


def validator() -> jsonschema.Draft4Validator:
    (version,) = [v for v in CRD["spec"]["versions"] if v["storage"]]
    schema = strict(version["schema"]["openAPIV3Schema"])
    del schema["properties"]["metadata"]["additionalProperties"]  # ObjectMeta: the CRD restricts only name
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def errors(doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(doc)]


def test_there_are_colocated_and_disaggregated_examples():
    modes = {llmdeployment(p)["spec"].get("topology", {}).get("mode", "colocated") for p in EXAMPLES}
    assert modes == {"colocated", "disaggregated"}
    specs = [llmdeployment(p)["spec"] for p in EXAMPLES]
    adopted = {spec["topology"]["mode"] for spec in specs if "targetRef" in spec}
    assert adopted == {"colocated", "disaggregated"}  # an existing Deployment, and a P/D pair


def test_adopt_examples_carry_the_deployments_they_target():
    for p in EXAMPLES:
        spec = parse_spec(llmdeployment(p)["spec"])
        shipped = {d["metadata"]["name"] for d in others(p) if d["kind"] == "Deployment"}
        assert shipped == {t.name for t in spec.targets}, p.name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_the_crd_schema_and_parses(path):
    doc = llmdeployment(path)
    assert doc["apiVersion"] == f"{CRD['spec']['group']}/v1alpha1" and doc["kind"] == CRD["spec"]["names"]["kind"]
    assert errors(doc) == []
    spec = parse_spec(doc["spec"])
    assert spec.topology.mode == doc["spec"]["topology"]["mode"]
    assert spec.control.mode == "advise"  # examples start safe


def test_schema_validation_rejects_bad_examples():
    good = yaml.safe_load((ROOT / "examples" / "colocated.yaml").read_text())
    bad_enum = copy.deepcopy(good)
    bad_enum["spec"]["control"]["mode"] = "auto"
    assert any("control.mode" in e for e in errors(bad_enum))
    typo = copy.deepcopy(good)
    typo["spec"]["engine"]["maxNumSeq"] = 64
    assert any("maxNumSeq" in e for e in errors(typo))
    missing = copy.deepcopy(good)
    del missing["spec"]["engine"]["image"]
    assert any("image" in e for e in errors(missing))
    out_of_bounds = copy.deepcopy(good)
    out_of_bounds["spec"]["engine"]["gpuMemoryUtilization"] = 0  # exclusiveMinimum 0
    assert errors(out_of_bounds)


def test_cel_rules_of_the_crd_are_enforced_for_the_examples_by_the_operator():
    doc = yaml.safe_load((ROOT / "examples" / "disaggregated.yaml").read_text())
    del doc["spec"]["topology"]["kvTransfer"]
    assert errors(doc) == []  # CEL is not JSON schema ...
    with pytest.raises(InputError) as exc:  # ... the operator re-checks it
        parse_spec(doc["spec"])
    assert exc.value.field == "spec.topology.kvTransfer"


def test_docs_links_resolve():
    for doc in list((ROOT / "docs").glob("*.md")):
        text = re.sub(r"`[^`\n]*`", "", doc.read_text())  # code spans (CEL rules, regexes) hold no links
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith("http"):
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def test_concepts_cite_each_model_source():
    text = (ROOT / "docs" / "concepts.md").read_text()
    for model, source in (("SLIM", "arXiv:2607.29575"), ("BCA", "eq. 13"), ("SARA", "arXiv:2609.26763"),
                          ("GAUSS", "arXiv:2610.37989")):
        assert f"## {model}" in text and source in text, model
