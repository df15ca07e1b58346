"""The operator's diff-base and progress storages build kopf's own essences (without copying the status)."""

import copy

import kopf
import pytest

from kneecap.control.handlers import SpecDiffBaseStorage, SpecProgressStorage

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


@pytest.mark.parametrize("body", list(_variants()))
def test_progress_clear_equals_kopfs_and_leaves_the_essence_it_got(body):
    """The progress storage's ``clear`` (kopf runs it on both essences of every watch event) gives
    kopf's result, on the essence the diff-base storage builds, and leaves that essence as it was."""
    essence = SpecDiffBaseStorage(prefix="kneecap.io", key="last-handled-configuration").build(
        body=kopf.Body(copy.deepcopy(body)), extra_fields=[("metadata", "finalizers")])
    essence["metadata"].setdefault("annotations", {})["kneecap.io/control"] = '{"started": "x"}'
    before = copy.deepcopy(essence)
    got = SpecProgressStorage(prefix="kneecap.io").clear(essence=essence)
    assert got == kopf.AnnotationsProgressStorage(prefix="kneecap.io").clear(essence=copy.deepcopy(essence))
    assert not any(k.startswith("kneecap.io/") for k in got.get("metadata", {}).get("annotations", {}))
    assert essence == before
