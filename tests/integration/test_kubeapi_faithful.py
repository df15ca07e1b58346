"""Two things the demo's emulated API (kneecap.emulation.kubeapi) does as kube-apiserver does, which
the operator meets there: the Warning header of a default (Warn) field validation, and validation
ratcheting under a stricter schema.
"""

from __future__ import annotations

import copy
import json
import urllib.request

import pytest

from kneecap.control import spec as spec_module
from kneecap.emulation.kubeapi import LLMD, KubeAPIThread
from tests.support.specs import MINIMAL_SPEC as SPEC

NS = "faithful"


@pytest.fixture(scope="module")
def kube():
    with KubeAPIThread() as k:
        yield k


def llmd(name: str, spec: dict | None = None, **top) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": copy.deepcopy(spec or SPEC), **top}


def post(kube, resource, obj, query=""):
    return kube.request("POST", kube.path(resource, NS) + query, obj)


def test_unknown_fields_are_warned_about_by_default(kube):
    obj = llmd("warned")
    obj["spec"]["engine"]["maxNumSeq"] = 64  # a typo
    req = urllib.request.Request(kube.url + kube.path(LLMD, NS), data=json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201
        assert resp.headers.get_all("Warning") == ['299 - "unknown field \\"spec.engine.maxNumSeq\\""']


def test_validation_ratchets_fields_an_update_leaves_alone(kube, monkeypatch):
    """An object made invalid by a stricter CRD still takes writes that do not touch the bad field."""
    post(kube, LLMD, llmd("ratchet", {**SPEC, "engine": {**SPEC["engine"], "extraArgs": ["--legacy-flag"]}}))
    stricter = copy.deepcopy(spec_module.resource_schema())
    stricter["properties"]["spec"]["properties"]["engine"]["properties"]["extraArgs"]["maxItems"] = 0
    monkeypatch.setattr(spec_module, "resource_schema", lambda: stricter)
    ok = kube.patch(LLMD, NS, "ratchet", {"metadata": {"finalizers": ["kneecap.io/cleanup"]}})
    assert ok["metadata"]["finalizers"] == ["kneecap.io/cleanup"]
    code, body = kube.request("PATCH", kube.path(LLMD, NS, "ratchet"),
                              {"spec": {"engine": {"extraArgs": ["--legacy-flag", "--more"]}}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.engine.extraArgs"
