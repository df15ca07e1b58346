"""The spec cases of tests/support/spec_cases.py on the real kube-apiserver: each malformed spec
refused on the field the operator's parser names (tests/unit/test_control_spec.py), each
well-formed one stored, names judged alike."""

from __future__ import annotations

import copy

import pytest

from tests.support.control_plane import KubeClient
from tests.support.spec_cases import BASE, MALFORMED, NAMES, TARGET_BASE, TARGET_SPECS, WELL_FORMED, edit

LLMD = "kneecap.io/v1alpha1/llmdeployments"
NS = "specs"


def _post(admin: KubeClient, name: str, spec: dict) -> tuple[int, dict]:
    obj = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name, "namespace": NS},
           "spec": spec}
    return admin.request("POST", admin.path(LLMD, NS) + "?dryRun=All", obj)


@pytest.mark.parametrize("i", range(len(MALFORMED)))
def test_malformed_spec_is_refused_on_the_parsers_field(admin, ns, i):
    edits, field = MALFORMED[i]
    code, body = _post(admin, f"bad-{i}", edit(edits))
    assert code == 422, body
    assert field in [c["field"] for c in body["details"]["causes"]], body["message"]


@pytest.mark.parametrize("i", range(len(WELL_FORMED)))
def test_well_formed_spec_is_stored(admin, ns, i):
    code, body = _post(admin, f"good-{i}", edit(WELL_FORMED[i]))
    assert code == 201, body


@pytest.mark.parametrize("i", range(len(TARGET_SPECS)))
def test_target_ref_spec_is_judged_as_the_parser_judges_it(admin, ns, i):
    edits, field = TARGET_SPECS[i]
    code, body = _post(admin, f"target-{i}", {**copy.deepcopy(TARGET_BASE), **copy.deepcopy(edits)})
    if field is None:
        assert code == 201, body
    else:
        assert code == 422, body
        assert field in [c["field"] for c in body["details"]["causes"]], body["message"]


@pytest.mark.parametrize("name,ok", NAMES)
def test_names_are_judged_as_the_parser_judges_them(admin, ns, name, ok):
    code, body = _post(admin, name, BASE)
    assert (code == 201) == ok, body
    if not ok:
        assert body["details"]["causes"][0]["field"] == "metadata.name"
