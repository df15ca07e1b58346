"""The emulated API (kneecap.demo.kubeapi) answers like kube-apiserver where the operator depends on it.

Each behaviour is pinned with an input a real API server accepts and one it rejects or rewrites.
"""

from __future__ import annotations

import copy
import decimal
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from kneecap.control import spec as S
from kneecap.control.quantity import canonical_quantity, parse_quantity
from kneecap.control.reconcile import replicas_owner
from kneecap.demo.kubeapi import LLMD, KubeAPIThread
from kneecap.errors import InputError
from tests.support.operator_harness import DEPLOY, MINIMAL_SPEC as SPEC

ROOT = Path(__file__).resolve().parents[2]

NS = "faithful"


@pytest.fixture(scope="module")
def kube():
    with KubeAPIThread() as k:
        yield k


def llmd(name: str, spec: dict | None = None, **top) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": copy.deepcopy(spec or SPEC), **top}


def deployment(name: str, container: dict | None = None, **meta) -> dict:
    c = container or {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS, **meta},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [c]}}}}


def post(kube, resource, obj, query=""):
    return kube.request("POST", kube.path(resource, NS) + query, obj)


# ---------------------------------------------------------------- the CRD's schema

def test_llmdeployment_is_pruned_and_defaulted(kube):
    obj = llmd("pruned", bogusTop=1)
    obj["spec"]["engine"]["bogus"] = "x"
    code, body = post(kube, LLMD, obj)
    assert code == 201, body
    assert "bogusTop" not in body and "bogus" not in body["spec"]["engine"]
    assert body["spec"]["engine"]["maxNumSeqs"] == 256 and body["spec"]["control"]["window"] == "5m"
    assert body["spec"]["topology"]["replicas"] == {"min": 1, "max": 8}


def test_strict_field_validation_rejects_unknown_fields(kube):
    obj = llmd("strict")
    obj["spec"]["engine"]["bogus"] = "x"
    code, body = post(kube, LLMD, obj, "?fieldValidation=Strict")
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == 'strict decoding error: unknown field "spec.engine.bogus"'
    code, _ = post(kube, LLMD, llmd("strict"), "?fieldValidation=Strict")
    assert code == 201


def test_unknown_fields_are_warned_about_by_default(kube):
    obj = llmd("warned")
    obj["spec"]["engine"]["maxNumSeq"] = 64  # a typo
    req = urllib.request.Request(kube.url + kube.path(LLMD, NS), data=json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201
        assert resp.headers.get_all("Warning") == ['299 - "unknown field \\"spec.engine.maxNumSeq\\""']


def test_invalid_spec_is_422_with_causes_worded_like_kube(kube):
    obj = llmd("bad-types")
    obj["spec"]["engine"].update(maxNumSeqs="lots", port=70000)
    obj["spec"]["topology"] = {"mode": "split"}
    code, body = post(kube, LLMD, obj)
    assert code == 422 and body["reason"] == "Invalid" and body["kind"] == "Status"
    causes = {c["field"]: c for c in body["details"]["causes"]}
    assert causes["spec.engine.maxNumSeqs"]["message"] == \
        'Invalid value: "string": spec.engine.maxNumSeqs in body must be of type integer: "string"'
    assert causes["spec.engine.port"]["message"] == \
        "Invalid value: 70000: spec.engine.port in body should be less than or equal to 65535"
    assert causes["spec.topology.mode"] == {
        "reason": "FieldValueNotSupported", "field": "spec.topology.mode",
        "message": 'Unsupported value: "split": supported values: "colocated", "disaggregated"'}
    assert body["message"].startswith('LLMDeployment.kneecap.io "bad-types" is invalid: [spec.engine.maxNumSeqs: ')
    assert kube.get(LLMD, NS, "bad-types") is None


def test_missing_spec_and_required_fields(kube):
    code, body = post(kube, LLMD, {"metadata": {"name": "nospec"}})
    assert code == 422 and [c["field"] for c in body["details"]["causes"]] == ["spec"]
    spec = copy.deepcopy(SPEC)
    del spec["engine"]["image"]
    code, body = post(kube, LLMD, llmd("noimage", spec))
    assert code == 422 and body["message"] == 'LLMDeployment.kneecap.io "noimage" is invalid: ' \
                                              "spec.engine.image: Required value"


def test_cel_rules_are_evaluated_on_create_and_patch(kube):
    spec = copy.deepcopy(SPEC)
    spec["engine"]["extraArgs"] = ["--max-model-len=8192", "--max_num_seqs=4"]
    code, body = post(kube, LLMD, llmd("cel", spec))
    assert code == 422
    (cause,) = body["details"]["causes"]
    assert cause["field"] == "spec.engine.extraArgs[1]"
    assert cause["message"].startswith('Invalid value: "string": --max_num_seqs=4 sets a vLLM flag that kneecap manages')
    code, body = post(kube, LLMD, llmd("cel"))
    assert code == 201
    # a merge patch and a JSON patch that break a cross-field rule change nothing
    code, body = kube.request("PATCH", kube.path(LLMD, NS, "cel"), {"spec": {"topology": {"replicas": {"min": 9}}}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.topology.replicas.min"
    assert "spec.topology.replicas.min must be <= max" in body["details"]["causes"][0]["message"]
    ops = [{"op": "add", "path": "/spec/control/minObservations", "value": 30}]
    code, body = kube.request("PATCH", kube.path(LLMD, NS, "cel"), ops, "application/json-patch+json")
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.control.minObservations"
    live = kube.get(LLMD, NS, "cel")
    assert live["spec"]["topology"]["replicas"]["min"] == 1 and live["metadata"]["generation"] == 1
    ok = kube.patch(LLMD, NS, "cel", {"spec": {"control": {"minObservations": 20}}})
    assert ok["spec"]["control"]["minObservations"] == 20 and ok["metadata"]["generation"] == 2


def test_status_writes_are_validated_against_the_status_schema(kube):
    post(kube, LLMD, llmd("st"))
    bad = {"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}}
    code, body = kube.request("PATCH", kube.path(LLMD, NS, "st", "status"), bad)
    assert code == 422 and body["details"]["causes"][0]["field"] == "status.conditions[0].status"
    good = {"status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}], "phase": "Ready"}}
    assert kube.patch(LLMD, NS, "st", good, sub="status")["status"]["phase"] == "Ready"


def test_llmdeployment_name_must_give_valid_service_names(kube):
    code, body = post(kube, LLMD, llmd("a" * 56))
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.name"
    code, body = post(kube, LLMD, llmd("has.dot"))
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.name"
    assert post(kube, LLMD, llmd("a" * 55))[0] == 201


# ---------------------------------------------------------------- names, labels

def test_names_per_kind_and_labels(kube):
    svc = {"metadata": {"name": "9lives"}, "spec": {"ports": [{"port": 80}]}}
    code, body = post(kube, "v1/services", svc)
    assert code == 422 and body["message"].startswith('Service "9lives" is invalid: metadata.name: Invalid value: '
                                                      '"9lives": a DNS-1035 label must consist of')
    code, _ = post(kube, "v1/services", {**svc, "metadata": {"name": "svc.dotted"}})
    assert code == 422
    assert post(kube, "v1/services", {**svc, "metadata": {"name": "lives9"}})[0] == 201
    assert post(kube, DEPLOY, deployment("dotted.name"))[0] == 201  # a subdomain is fine for a Deployment
    code, body = post(kube, DEPLOY, deployment("Upper"))
    assert code == 422 and body["message"].startswith('Deployment.apps "Upper" is invalid: metadata.name')
    code, body = post(kube, DEPLOY, deployment("lab", labels={"ok": "v" * 64}))
    assert code == 422 and body["details"]["causes"][0] == {
        "reason": "FieldValueInvalid", "field": "metadata.labels",
        "message": f'Invalid value: "{"v" * 64}": must be no more than 63 characters'}
    code, _ = post(kube, DEPLOY, deployment("lab", labels={"bad key!": "v"}))
    assert code == 422
    assert post(kube, DEPLOY, deployment("lab", labels={"example.com/ok_key": "A.b-c_9"}))[0] == 201


def test_deployment_selector_matches_the_template_and_is_immutable(kube):
    d = deployment("sel")
    d["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    code, body = post(kube, DEPLOY, d)
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.template.metadata.labels"
    assert body["details"]["causes"][0]["message"].endswith("`selector` does not match template `labels`")
    kube.create(DEPLOY, deployment("sel"))
    code, body = kube.request("PATCH", kube.path(DEPLOY, NS, "sel"), {"spec": {"selector": {"matchLabels": {"x": "y"}},
                                                                          "template": {"metadata": {"labels": {"x": "y"}}}}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.selector"
    assert body["details"]["causes"][0]["message"].endswith("field is immutable")
    code, _ = kube.request("PATCH", kube.path(DEPLOY, NS, "sel"), {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}})
    assert code == 200  # more template labels than the selector asks for are fine


def test_namespace_names_are_dns_labels(kube):
    assert kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": "Team.A"}})[0] == 422
    assert kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})[0] == 201


# ---------------------------------------------------------------- stored form of built-in kinds

def test_quantities_canonical_defaults_and_empty_fields(kube):
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "env": [],
         "ports": [{"name": "http", "containerPort": 8000}],
         "resources": {"limits": {"cpu": 1, "memory": "1024Mi", "nvidia.com/gpu": "1"},
                       "requests": {"cpu": 0.5, "memory": "1.5Gi"}}}
    body = kube.create(DEPLOY, deployment("q", c, annotations={}))
    stored = body["spec"]["template"]["spec"]
    sc = stored["containers"][0]
    assert sc["resources"] == {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                               "requests": {"cpu": "500m", "memory": "1536Mi"}}
    assert "env" not in sc and "annotations" not in body["metadata"]
    assert sc["terminationMessagePath"] == "/dev/termination-log" and sc["imagePullPolicy"] == "IfNotPresent"
    assert sc["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert stored["restartPolicy"] == "Always" and stored["dnsPolicy"] == "ClusterFirst"
    assert stored["schedulerName"] == "default-scheduler" and stored["terminationGracePeriodSeconds"] == 30
    assert stored["securityContext"] == {}
    assert body["spec"]["strategy"] == {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    assert body["spec"]["revisionHistoryLimit"] == 10 and body["spec"]["progressDeadlineSeconds"] == 600
    bad = copy.deepcopy(c)
    bad["resources"]["limits"]["cpu"] = "two"
    code, body = post(kube, DEPLOY, deployment("q-bad", bad))
    assert code == 400 and body["reason"] == "BadRequest"  # a Quantity that cannot be decoded
    assert body["message"] == ('Deployment in version "v1" cannot be handled as a Deployment: quantities must '
                               "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


def test_service_defaults(kube):
    body = kube.create("v1/services", {"metadata": {"name": "svc", "namespace": NS},
                                       "spec": {"selector": {"a": "b"}, "ports": [{"name": "http", "port": 80}]}})
    assert body["spec"]["type"] == "ClusterIP" and body["spec"]["sessionAffinity"] == "None"
    assert body["spec"]["ports"] == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]
    assert body["spec"]["clusterIP"].startswith("10.96.")


# ---------------------------------------------------------------- concurrency, patches, generation, GC

def test_stale_resource_version_is_a_conflict(kube):
    live = kube.create(DEPLOY, deployment("rv"))
    stale = copy.deepcopy(live)
    fresh = kube.patch(DEPLOY, NS, "rv", {"metadata": {"labels": {"x": "1"}}})
    stale["spec"]["replicas"] = 3
    code, body = kube.request("PUT", kube.path(DEPLOY, NS, "rv"), stale)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Operation cannot be fulfilled on deployments.apps "rv": the object has been '
                               "modified; please apply your changes to the latest version and try again")
    code, _ = kube.request("PATCH", kube.path(DEPLOY, NS, "rv"),
                           {"metadata": {"resourceVersion": live["metadata"]["resourceVersion"]}, "spec": {"replicas": 2}})
    assert code == 409
    fresh["spec"]["replicas"] = 3
    code, body = kube.request("PUT", kube.path(DEPLOY, NS, "rv"), fresh)
    assert code == 200 and body["spec"]["replicas"] == 3
    # no resourceVersion: an unconditional write, as kopf's merge patches are
    assert kube.patch(DEPLOY, NS, "rv", {"spec": {"replicas": 4}})["spec"]["replicas"] == 4


def test_strategic_merge_patch_merges_lists_by_key(kube):
    two = deployment("smp")
    two["spec"]["template"]["spec"]["containers"] = [
        {"name": "vllm", "image": "a", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "sidecar", "image": "s"}]
    kube.create(DEPLOY, two)
    patch = {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "b", "env": [{"name": "B", "value": "3"}, {"name": "A", "$patch": "delete"}]}]}}}}
    body = kube.patch(DEPLOY, NS, "smp", patch, content_type="application/strategic-merge-patch+json")
    cs = body["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in cs] == ["vllm", "sidecar"]
    assert cs[0]["image"] == "b" and cs[0]["env"] == [{"name": "B", "value": "3"}]
    # a merge patch replaces the list, as RFC 7386 says
    body = kube.patch(DEPLOY, NS, "smp", patch)
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["vllm"]
    code, _ = kube.request("PATCH", kube.path(LLMD, NS, "pruned"), {"spec": {}},
                           "application/strategic-merge-patch+json")
    assert code == 415  # custom resources have no patch strategy


def test_generation_bumps_on_spec_changes_only(kube):
    body = kube.create(DEPLOY, deployment("gen"))
    assert body["metadata"]["generation"] == 1
    assert kube.patch(DEPLOY, NS, "gen", {"metadata": {"annotations": {"a": "b"}}})["metadata"]["generation"] == 1
    assert kube.patch(DEPLOY, NS, "gen", {"spec": {"replicas": 1}})["metadata"]["generation"] == 1
    assert kube.patch(DEPLOY, NS, "gen", {"spec": {"replicas": 2}})["metadata"]["generation"] == 2


def test_managed_fields_name_the_last_writer_of_replicas(kube):
    code, _ = kube.request("POST", kube.path(DEPLOY, NS) + "?fieldManager=kneecap", deployment("mf"))
    assert code == 201
    spec = S.parse_spec(SPEC)
    live = kube.get(DEPLOY, NS, "mf")
    assert [m["manager"] for m in live["metadata"]["managedFields"]] == ["kneecap"]
    assert replicas_owner(spec, live, []).replicas_owner == "kneecap"
    code, _ = kube.request("PATCH", kube.path(DEPLOY, NS, "mf") + "?fieldManager=kubectl-scale",
                           {"spec": {"replicas": 5}})
    assert code == 200
    live = kube.get(DEPLOY, NS, "mf")
    assert replicas_owner(spec, live, []).replicas_owner == "manager/kubectl-scale"
    kneecap = [m for m in live["metadata"]["managedFields"] if m["manager"] == "kneecap"][0]
    assert "f:replicas" not in kneecap["fieldsV1"]["f:spec"] and "f:template" in kneecap["fieldsV1"]["f:spec"]
    kube.request("PATCH", kube.path(DEPLOY, NS, "mf") + "?fieldManager=kneecap", {"spec": {"replicas": 1}})
    assert replicas_owner(spec, kube.get(DEPLOY, NS, "mf"), []).replicas_owner == "kneecap"


def test_owner_deletion_collects_dependents_without_block_owner_deletion(kube):
    owner = kube.create(LLMD, llmd("gc"))
    ref = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "name": "gc",
           "uid": owner["metadata"]["uid"]}
    kube.create(DEPLOY, deployment("gc", ownerReferences=[ref]))
    kube.create(DEPLOY, deployment("gc-unowned"))
    assert kube.delete(LLMD, NS, "gc") == 200
    assert kube.get(DEPLOY, NS, "gc") is None
    assert kube.get(DEPLOY, NS, "gc-unowned") is not None


# ---------------------------------------------------------------- quantity.py

@pytest.mark.parametrize("given,canonical,value", [
    (1, "1", "1"), (0.5, "500m", "0.5"), ("1024Mi", "1Gi", "1073741824"), ("1000m", "1", "1"),
    ("1500m", "1500m", "1.5"), ("1.5Gi", "1536Mi", "1610612736"), ("0.5Gi", "512Mi", "536870912"),
    ("1.5Ki", "1536", "1536"), ("1000k", "1M", "1000000"), ("0.1m", "100u", "0.0001"),
    ("1e3", "1e3", "1000"), ("1.5e3", "1500", "1500"), ("0", "0", "0"), ("0Gi", "0", "0"),
    ("0.0000000001", "1n", "0.000000001"), ("100Gi", "100Gi", "107374182400"), ("-1", "-1", "-1"),
])
def test_canonical_quantity(given, canonical, value):
    assert canonical_quantity(given) == canonical
    assert parse_quantity(given) == decimal.Decimal(value)
    assert canonical_quantity(canonical) == canonical  # idempotent


@pytest.mark.parametrize("bad", ["two", "1K", "1.2.3", "", "1Gib", True, None, "--1"])
def test_malformed_quantities(bad):
    with pytest.raises(InputError):
        canonical_quantity(bad)


# ---------------------------------------------------------------- what the operator sees back

@pytest.mark.parametrize("engine", [
    {},
    {"podAnnotations": {"a": "b"}, "env": [{"name": "X", "value": "1"}]},
    {"resources": {"limits": {"cpu": 1, "memory": "1024Mi"}, "requests": {"cpu": "0.5"}}},
    {k: v for k, v in yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())["spec"]["engine"].items()
     if k != "image"},
])
def test_the_operators_deployment_reads_back_unchanged(kube, engine):
    """reconcile patches when its desired Deployment is not in sync with the live one: after a create
    the stored object (defaults, canonical quantities, omitted empties) must still read as in sync."""
    from kneecap.control import manifests as M
    from kneecap.control.drift import in_sync

    name = f"rb{len(engine)}{sorted(engine)[0][:3].lower() if engine else ''}"
    spec = copy.deepcopy(SPEC)
    spec["engine"].update(engine)
    owner = kube.create(LLMD, llmd(name, spec))
    parsed = S.parse_spec(owner["spec"])
    (pool,) = M.pools(name, parsed)
    desired = M.deployment(owner, parsed, pool, M.initial_settings(parsed, pool.role))
    live = kube.create(DEPLOY, desired)
    want = {"metadata": {"labels": desired["metadata"]["labels"]},
            "spec": {"template": desired["spec"]["template"], "replicas": desired["spec"]["replicas"]}}
    assert in_sync(want, live)


# ---------------------------------------------------------------- server-side apply

def apply(kube, name: str, obj: dict, manager: str | None, force: bool = False):
    import yaml

    query = "&".join(q for q in (f"fieldManager={manager}" if manager else "", "force=true" if force else "") if q)
    req = urllib.request.Request(kube.url + kube.path(DEPLOY, NS, name) + (f"?{query}" if query else ""),
                                 data=yaml.safe_dump(obj).encode(), method="PATCH",
                                 headers={"Content-Type": "application/apply-patch+yaml"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_server_side_apply_owns_fields_and_conflicts_without_force(kube):
    d = deployment("ssa")
    d["spec"]["replicas"] = 2
    code, body = apply(kube, "ssa", d, "kneecap")
    assert code == 201 and body["spec"]["replicas"] == 2
    assert [(m["manager"], m["operation"]) for m in body["metadata"]["managedFields"]] == [("kneecap", "Apply")]
    assert "f:revisionHistoryLimit" not in body["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]  # a default
    assert apply(kube, "ssa", d, None)[0] == 422  # an apply names its manager
    # someone scales by hand: the next apply of another replica count conflicts
    code, _ = kube.request("PATCH", kube.path(DEPLOY, NS, "ssa") + "?fieldManager=kubectl-scale", {"spec": {"replicas": 5}})
    assert code == 200
    d["spec"]["replicas"] = 3
    code, body = apply(kube, "ssa", d, "kneecap")
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "kubectl-scale" using apps/v1: .spec.replicas'
    assert body["details"]["causes"] == [{"reason": "FieldManagerConflict", "field": ".spec.replicas",
                                          "message": 'conflict with "kubectl-scale" using apps/v1'}]
    # applying without replicas gives the field up; forcing takes it back
    del d["spec"]["replicas"]
    code, body = apply(kube, "ssa", d, "kneecap")
    assert code == 200 and body["spec"]["replicas"] == 5
    d["spec"]["replicas"] = 3
    code, body = apply(kube, "ssa", d, "kneecap", force=True)
    assert code == 200 and body["spec"]["replicas"] == 3
    assert [m["manager"] for m in body["metadata"]["managedFields"]] == ["kneecap"]


def test_server_side_apply_removes_fields_the_manager_stopped_applying(kube):
    d = deployment("ssa-rm", labels={"a": "1", "b": "2"})
    assert apply(kube, "ssa-rm", d, "tool")[0] == 201
    d["metadata"]["labels"] = {"a": "1"}
    code, body = apply(kube, "ssa-rm", d, "tool")
    assert code == 200 and body["metadata"]["labels"] == {"a": "1"}
    assert kube.request("PATCH", kube.path(DEPLOY, NS, "ssa-rm"), {"spec": {}}, "application/merge-patch+json")[0] == 200
    code, body = kube.request("PATCH", kube.path(DEPLOY, NS, "ssa-rm") + "?force=true", {"spec": {}})
    assert code == 422  # force belongs to apply


def test_validation_ratchets_fields_an_update_leaves_alone(kube, monkeypatch):
    """An object made invalid by a stricter CRD still takes writes that do not touch the bad field."""
    post(kube, LLMD, llmd("ratchet", {**SPEC, "engine": {**SPEC["engine"], "extraArgs": ["--legacy-flag"]}}))
    stricter = copy.deepcopy(S.resource_schema())
    stricter["properties"]["spec"]["properties"]["engine"]["properties"]["extraArgs"]["maxItems"] = 0
    monkeypatch.setattr(S, "resource_schema", lambda: stricter)
    ok = kube.patch(LLMD, NS, "ratchet", {"metadata": {"finalizers": ["kneecap.io/cleanup"]}})
    assert ok["metadata"]["finalizers"] == ["kneecap.io/cleanup"]
    code, body = kube.request("PATCH", kube.path(LLMD, NS, "ratchet"),
                              {"spec": {"engine": {"extraArgs": ["--legacy-flag", "--more"]}}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.engine.extraArgs"
