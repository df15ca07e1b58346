"""The operator's diff-base storage builds kopf's own essence (without copying the status)."""

import copy

import kopf
import pytest

from kneecap.control.handlers import SpecDiffBaseStorage

BODY = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "5", "generation": 3,
                     "labels": {"team": "ml"},
                     "annotations": {"kneecap.io/last-handled-configuration": "{}", "note": "kept",
                                     "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                     "managedFields": [{"manager": "kneecap", "fieldsV1": {"f:status": {}}}],
                     "finalizers": ["kneecap.io/finalizer"]},
        "spec": {"model": {"name": "m"}, "engine": {"extraArgs": ["--enforce-eager"]}},
        "status": {"observations": [{"t": "x", "batch": 1.0}] * 24}}


def _variants():
    yield BODY
    yield {k: v for k, v in BODY.items() if k != "status"}
    bare = copy.deepcopy(BODY)
    del bare["metadata"]["labels"], bare["metadata"]["annotations"]
    yield bare
    rs = copy.deepcopy(BODY)  # kopf marks the keys of a Deployment's ReplicaSet
    rs["kind"], rs["metadata"]["ownerReferences"] = "ReplicaSet", [{"kind": "Deployment", "name": "d"}]
    yield rs


@pytest.mark.parametrize("extra", [None, [("spec",)], [("spec", "engine")], [("status", "phase")],
                                   [("metadata", "finalizers")]])
@pytest.mark.parametrize("body", list(_variants()))
def test_essence_equals_kopfs(body, extra):
    """kopf passes the handlers' fields (the spec handler's ``field="spec"``) as extra fields."""
    ours = SpecDiffBaseStorage(prefix="kneecap.io", key="last-handled-configuration")
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix="kneecap.io", key="last-handled-configuration")
    got = ours.build(body=kopf.Body(copy.deepcopy(body)), extra_fields=extra)
    assert got == kopfs.build(body=kopf.Body(copy.deepcopy(body)), extra_fields=extra)
    if not extra or extra[0][0] == "spec":
        assert "status" not in got and "managedFields" not in got.get("metadata", {})


def test_essence_is_a_copy():
    body = copy.deepcopy(BODY)
    essence = SpecDiffBaseStorage(prefix="kneecap.io", key="last-handled-configuration").build(body=kopf.Body(body))
    essence["spec"]["engine"]["extraArgs"].append("--changed")
    assert body["spec"]["engine"]["extraArgs"] == ["--enforce-eager"]
