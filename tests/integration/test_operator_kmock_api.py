"""Pins what the operator relies on in the kmock-based API emulator (tests/support/kmock_api.py)."""

from __future__ import annotations

import pytest

from tests.support.kmock_api import LLMD, KubeAPIThread, json_patch, merge_patch, selector_matches
from tests.support.operator_harness import MINIMAL_SPEC as SPEC



@pytest.fixture(scope="module")
def kube():
    with KubeAPIThread() as k:
        yield k


def test_discovery_serves_the_crd_with_status_subresource(kube):
    code, body = kube.request("GET", "/apis/kneecap.io/v1alpha1")
    assert code == 200
    names = {r["name"] for r in body["resources"]}
    assert {"llmdeployments", "llmdeployments/status"} <= names
    code, body = kube.request("GET", "/api/v1/namespaces")
    assert code == 200 and body["items"] == []


def test_identity_fields_conflict_and_generation(kube):
    obj = kube.create(LLMD, {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                             "metadata": {"name": "a", "namespace": "t1"}, "spec": SPEC})
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    rv1 = int(meta["resourceVersion"])
    code, _ = kube.request("POST", kube.path(LLMD, "t1"), obj)
    assert code == 409
    # status via main endpoint is ignored; via /status it is applied and does not bump generation
    new = kube.patch(LLMD, "t1", "a", {"status": {"phase": "X"}, "metadata": {"labels": {"l": "v"}}})
    assert "status" not in new and new["metadata"]["labels"] == {"l": "v"} and new["metadata"]["generation"] == 1
    new = kube.patch(LLMD, "t1", "a", {"status": {"phase": "Y"}}, sub="status")
    assert new["status"] == {"phase": "Y"} and new["metadata"]["generation"] == 1
    assert int(new["metadata"]["resourceVersion"]) > rv1
    new = kube.patch(LLMD, "t1", "a", {"spec": {"engine": {"maxNumSeqs": 128}}})
    assert new["metadata"]["generation"] == 2 and new["status"] == {"phase": "Y"}


def test_json_patch_with_resource_version_test(kube):
    obj = kube.create(LLMD, {"metadata": {"name": "b", "namespace": "t1"}, "spec": SPEC})
    rv = obj["metadata"]["resourceVersion"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
           {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]
    ok = kube.patch(LLMD, "t1", "b", ops, content_type="application/json-patch+json")
    assert ok["metadata"]["finalizers"] == ["f"]
    code, _ = kube.request("PATCH", kube.path(LLMD, "t1", "b"), ops, "application/json-patch+json")
    assert code == 422  # stale resourceVersion
    # deletion with a finalizer only marks; removing the finalizer deletes
    assert kube.delete(LLMD, "t1", "b") == 200
    assert kube.get(LLMD, "t1", "b")["metadata"]["deletionTimestamp"]
    kube.patch(LLMD, "t1", "b", {"metadata": {"finalizers": None}})
    assert kube.get(LLMD, "t1", "b") is None


def test_label_selector_and_gc_and_rollout(kube):
    owner = kube.create(LLMD, {"metadata": {"name": "c", "namespace": "t2"}, "spec": SPEC})
    ref = [{"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "name": "c",
            "uid": owner["metadata"]["uid"], "controller": True}]
    d = kube.create("apps/v1/deployments", {"metadata": {"name": "c", "namespace": "t2", "ownerReferences": ref,
                                                         "labels": {"role": "x"}},
                                            "spec": {"replicas": 3, "selector": {"matchLabels": {"role": "x"}},
                                                     "template": {"metadata": {"labels": {"role": "x"}},
                                                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
    assert d["status"]["observedGeneration"] == 1 and d["status"]["updatedReplicas"] == 3
    kube.add_pod("t2", "p1", {"role": "x"})
    kube.add_pod("t2", "p2", {"role": "y"})
    assert [p["metadata"]["name"] for p in kube.list("v1/pods", "t2", "role=x")] == ["p1"]
    assert len(kube.list("v1/pods", "t2")) == 2
    kube.delete(LLMD, "t2", "c")
    assert kube.get("apps/v1/deployments", "t2", "c") is None  # cascaded
    assert len(kube.history("apps/v1/deployments", "t2", "c")) == 2


def test_pure_patch_helpers():
    assert merge_patch({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2], "b": None}}) == {"a": {"c": [2]}}
    assert json_patch({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3},
                                      {"op": "remove", "path": "/a/0"}]) == {"a": [2, 3]}
    assert selector_matches("a=1,b!=2,c,!d", {"a": "1", "b": "3", "c": ""})
    assert not selector_matches("a=1", {"a": "2"})
