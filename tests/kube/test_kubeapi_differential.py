"""The emulated API the embedded demo and the virtual-time replay use (`kneecap.demo.kubeapi`)
judged against kube-apiserver: each request goes to both, and
the emulation must answer as the real apiserver did (status code, Status reason, message and
causes; the stored object with its defaults, pruning, canonical quantities, generation and
managedFields). The real apiserver is the oracle: nothing here is typed by hand.

Where the emulation is known to answer otherwise, `KNOWN_DIFFERENCES` says so with a reason,
and the test asserts that the two still differ there (a fix makes it fail until the entry goes).
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request

import pytest
import yaml

from kneecap.control import spec as S
from kneecap.demo.kubeapi import KubeAPIThread
from tests.support.control_plane import ControlPlane, KubeClient
from tests.support.examples import ROOT
from tests.support.specs import MINIMAL_SPEC as SPEC

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
NS = "differential"
SMP = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
# what the apiserver assigns (identity, time, addresses): compared for presence, not value
ASSIGNED = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")

CAUSES = ("[1].details.causes", "[1].message")
SKIPPED_CEL = ("with schema errors kube-apiserver adds a '<nil>: some validation rules were not checked' cause "
               "(its CEL rules skipped); the emulation lists the schema errors only")
# "case/step": (where the answers may differ, "" for anywhere; why). The test asserts they
# differ there and nowhere else.
KNOWN_DIFFERENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "managed-fields/encoding": (("",), "the emulation's fieldsV1 has no '.' set markers nor k:{...} list items; "
                                       "what the operator reads of it (who owns spec.replicas) is compared everywhere"),
    "svc/digit": (("",), "kube-apiserver 1.37 accepts a Service name that starts with a digit "
                         "(RelaxedServiceNameValidation); the emulation still asks for a DNS-1035 label"),
    "svc/dot": (CAUSES, "the same relaxed Service names: kube-apiserver 1.37 says only 'must not contain dots'"),
    "q/requests-over-limits": (("",), "the emulation does not check that a container's requests are <= its limits"),
    "svc/create": (("[1].metadata.generation",), "a Service has no metadata.generation on kube-apiserver; "
                                                 "the emulation gives it one"),
    "bad-types/create": (CAUSES, SKIPPED_CEL),
    "name/long": (CAUSES, SKIPPED_CEL),
    "st/bad": (CAUSES, SKIPPED_CEL),
    "noimage/create": (CAUSES, SKIPPED_CEL),
    "nospec/create": (CAUSES, SKIPPED_CEL),
    "gen/annotation": (("[1].metadata.generation",), "kube-apiserver bumps a Deployment's generation when its "
                                                     "annotations change; the emulation only on a spec change "
                                                     "(its stand-in Deployment controller would roll the demo's pods)"),
    "gen/same-replicas": (("[1].metadata.generation",), "the generation the annotation bumped, one behind"),
    "gen/replicas": (("[1].metadata.generation",), "the generation the annotation bumped, one behind"),
    "gc/delete": (("",), "a custom resource deleted at once is answered with a Status (Success) by kube-apiserver, "
                         "with the deleted object by the emulation"),
}


def llmd(name: str, spec: dict | None = None, **top) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": copy.deepcopy(spec or SPEC), **top}


def deployment(name: str, container: dict | None = None, **meta) -> dict:
    c = container or {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS, **meta},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [c]}}}}


def normalised(code: int, body) -> tuple[int, object]:
    """What must agree: a Status whole (its causes as a set), an object with what the server
    assigns reduced to its presence and managedFields without their times."""
    if not isinstance(body, dict):
        return code, body
    body = copy.deepcopy(body)
    if body.get("kind") == "Status":
        body.pop("metadata", None)
        (body.get("details") or {}).pop("traceback", None)  # kmock's debugging aid
        if body.get("details") == {}:
            del body["details"]
        causes = (body.get("details") or {}).pop("causes", None)
        if causes is not None:
            body["details"]["causes"] = sorted(tuple(sorted(c.items())) for c in causes)
        return code, body
    meta = body.get("metadata") or {}
    for key in ASSIGNED:
        if key in meta:
            meta[key] = "<assigned>"
    # managedFields as the operator reads them: each manager, its operation, whether it owns spec.replicas
    # (the Deployment controller's status writes are each side's own: left out)
    if "managedFields" in meta:
        meta["managedFields"] = sorted((m["manager"], m["operation"], m.get("subresource", ""),
                                        "f:replicas" in ((m.get("fieldsV1") or {}).get("f:spec") or {}))
                                       for m in meta["managedFields"] if m["manager"] != "kube-controller-manager")
    spec = body.get("spec") or {}
    for key in ("clusterIP", "clusterIPs"):
        if key in spec:
            spec[key] = "<assigned>"
    if body.get("kind") == "Deployment":
        # written by each side's Deployment controller, asynchronously on the real one
        body.pop("status", None)
        (meta.get("annotations") or {}).pop("deployment.kubernetes.io/revision", None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
    return code, body


def differences(emulated, real, at: str = "") -> list[str]:
    """Where two answers differ, path by path (for messages)."""
    if isinstance(emulated, dict) and isinstance(real, dict):
        return [d for k in sorted(set(emulated) | set(real), key=str)
                for d in differences(emulated.get(k, "<absent>"), real.get(k, "<absent>"), f"{at}.{k}")]
    if isinstance(emulated, (list, tuple)) and isinstance(real, (list, tuple)) and len(emulated) == len(real):
        return [d for i, (e, r) in enumerate(zip(emulated, real)) for d in differences(e, r, f"{at}[{i}]")]
    return [] if emulated == real else [f"{at}: emulation {emulated!r} != real {real!r}"]


def assert_same(step: str, emulated: tuple[int, object], real: tuple[int, object]) -> None:
    diff = differences(normalised(*emulated), normalised(*real))
    where = KNOWN_DIFFERENCES.get(step, ((),))[0]
    if where:
        assert diff, f"{step}: no longer differs; drop it from KNOWN_DIFFERENCES"
    unexpected = [d for d in diff if not any(d.startswith(p) for p in where)]
    assert not unexpected, f"{step}: the emulation answered otherwise:\n" + "\n".join(d[:1500] for d in unexpected)


class Both:
    """The same requests to the real apiserver and to the emulation."""

    def __init__(self, real: KubeClient, emulated: KubeAPIThread):
        self.real, self.emulated = real, emulated

    def send(self, step: str, method: str, resource: str, name: str | None = None, body=None, *,
             sub: str | None = None, query: str = "", content_type: str = "application/merge-patch+json"):
        """Send to both; assert the emulation answered as the real apiserver did (or, for a
        known difference, that it still does not). The real answer."""
        path = KubeClient.path(resource, NS, name, sub) + (f"?{query}" if query else "")
        payload = yaml.safe_dump(body) if content_type == APPLY else body
        real = self.real.request(method, path, payload, content_type)
        if content_type == APPLY:
            emulated = self._apply(path, payload)
        else:
            emulated = self.emulated.request(method, path, body, content_type)
        assert_same(step, emulated, real)
        return real

    def _apply(self, path: str, payload: str):
        req = urllib.request.Request(self.emulated.url + path, data=payload.encode(), method="PATCH",
                                     headers={"Content-Type": APPLY})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def both(control_plane: ControlPlane, crd_applied: dict):
    control_plane.admin.add_namespace(NS)
    with KubeAPIThread() as emulated:
        emulated.add_namespace(NS)
        yield Both(control_plane.admin, emulated)


# ---------------------------------------------------------------- the CRD's schema


def test_llmdeployment_is_pruned_and_defaulted(both):
    obj = llmd("pruned", bogusTop=1)
    obj["spec"]["engine"]["bogus"] = "x"
    body = both.send("pruned/create", "POST", LLMD, body=obj)[1]
    assert "bogusTop" not in body and body["spec"]["engine"]["maxNumSeqs"] == 256


def test_strict_field_validation(both):
    obj = llmd("strict")
    obj["spec"]["engine"]["bogus"] = "x"
    assert both.send("strict/unknown", "POST", LLMD, body=obj, query="fieldValidation=Strict")[0] == 400
    assert both.send("strict/clean", "POST", LLMD, body=llmd("strict"), query="fieldValidation=Strict")[0] == 201


def test_invalid_spec_is_422_with_causes(both):
    obj = llmd("bad-types")
    obj["spec"]["engine"].update(maxNumSeqs="lots", port=70000)
    obj["spec"]["topology"] = {"mode": "split"}
    assert both.send("bad-types/create", "POST", LLMD, body=obj)[0] == 422
    assert both.send("bad-types/get", "GET", LLMD, "bad-types")[0] == 404
    assert both.send("nospec/create", "POST", LLMD, body={"apiVersion": "kneecap.io/v1alpha1",
                                                          "kind": "LLMDeployment", "metadata": {"name": "nospec"}})[0] == 422
    spec = copy.deepcopy(SPEC)
    del spec["engine"]["image"]
    assert both.send("noimage/create", "POST", LLMD, body=llmd("noimage", spec))[0] == 422


def test_cel_rules_on_create_and_patch(both):
    spec = copy.deepcopy(SPEC)
    spec["engine"]["extraArgs"] = ["--max-model-len=8192", "--max_num_seqs=4"]
    assert both.send("cel/managed-flag", "POST", LLMD, body=llmd("cel", spec))[0] == 422
    assert both.send("cel/create", "POST", LLMD, body=llmd("cel"))[0] == 201
    assert both.send("cel/min-over-max", "PATCH", LLMD, "cel", {"spec": {"topology": {"replicas": {"min": 9}}}})[0] == 422
    ops = [{"op": "add", "path": "/spec/control/minObservations", "value": 30}]
    assert both.send("cel/json-patch", "PATCH", LLMD, "cel", ops, content_type=JSON_PATCH)[0] == 422
    ok = both.send("cel/ok", "PATCH", LLMD, "cel", {"spec": {"control": {"minObservations": 20}}})[1]
    assert ok["metadata"]["generation"] == 2


def test_status_writes_are_validated_and_do_not_bump_generation(both):
    both.send("st/create", "POST", LLMD, body=llmd("st"))
    bad = {"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}}
    assert both.send("st/bad", "PATCH", LLMD, "st", bad, sub="status")[0] == 422
    good = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "R", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}], "phase": "Ready"}}
    body = both.send("st/good", "PATCH", LLMD, "st", good, sub="status")[1]
    assert body["metadata"]["generation"] == 1
    # status through the main endpoint is ignored
    body = both.send("st/main", "PATCH", LLMD, "st", {"status": {"phase": "X"}, "metadata": {"labels": {"l": "v"}}})[1]
    assert body["status"]["phase"] == "Ready"


def test_llmdeployment_names(both):
    assert both.send("name/long", "POST", LLMD, body=llmd("a" * 56))[0] == 422
    assert both.send("name/dot", "POST", LLMD, body=llmd("has.dot"))[0] == 422
    assert both.send("name/55", "POST", LLMD, body=llmd("a" * 55))[0] == 201


# ---------------------------------------------------------------- built-in kinds


def test_names_and_labels_of_built_in_kinds(both):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "9lives"}, "spec": {"ports": [{"port": 80}]}}
    assert both.send("svc/digit", "POST", "v1/services", body=svc)[0] == 201
    assert both.send("svc/dot", "POST", "v1/services", body={**svc, "metadata": {"name": "svc.dotted"}})[0] == 422
    assert both.send("deploy/dotted", "POST", DEPLOY, body=deployment("dotted.name"))[0] == 201
    assert both.send("deploy/upper", "POST", DEPLOY, body=deployment("Upper"))[0] == 422
    assert both.send("deploy/long-label", "POST", DEPLOY, body=deployment("lab", labels={"ok": "v" * 64}))[0] == 422
    assert both.send("deploy/bad-key", "POST", DEPLOY, body=deployment("lab", labels={"bad key!": "v"}))[0] == 422
    assert both.send("deploy/label", "POST", DEPLOY,
                     body=deployment("lab", labels={"example.com/ok_key": "A.b-c_9"}))[0] == 201


def test_discovery_and_label_selectors(both):
    names = [{r["name"] for r in side.request("GET", "/apis/kneecap.io/v1alpha1")[1]["resources"]}
             for side in (both.emulated, both.real)]
    assert names[0] == names[1] == {"llmdeployments", "llmdeployments/status"}
    for selector in ("app=lab", "app!=lab", "example.com/ok_key", "!example.com/ok_key"):
        listed = [sorted(d["metadata"]["name"] for d in side.list(DEPLOY, NS, selector=selector))
                  for side in (both.emulated, both.real)]
        assert listed[0] == listed[1], selector


def test_deployment_selector(both):
    d = deployment("sel")
    d["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    assert both.send("sel/mismatch", "POST", DEPLOY, body=d)[0] == 422
    assert both.send("sel/create", "POST", DEPLOY, body=deployment("sel"))[0] == 201
    change = {"spec": {"selector": {"matchLabels": {"x": "y"}}, "template": {"metadata": {"labels": {"x": "y"}}}}}
    assert both.send("sel/immutable", "PATCH", DEPLOY, "sel", change)[0] == 422
    assert both.send("sel/more-labels", "PATCH", DEPLOY, "sel",
                     {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}})[0] == 200


def test_quantities_defaults_and_empty_fields(both):
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "env": [],
         "ports": [{"name": "http", "containerPort": 8000}],
         "resources": {"limits": {"cpu": 1, "memory": "1.5Gi", "nvidia.com/gpu": "1"},
                       "requests": {"cpu": 0.5, "memory": "1024Mi"}}}
    body = both.send("q/create", "POST", DEPLOY, body=deployment("q", c, annotations={}))[1]
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", "memory": "1536Mi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "500m", "memory": "1Gi"}}
    over = copy.deepcopy(c)
    over["resources"]["requests"]["memory"] = "2Gi"
    assert both.send("q/requests-over-limits", "POST", DEPLOY, body=deployment("q-over", over))[0] == 422
    bad = copy.deepcopy(c)
    bad["resources"]["limits"]["cpu"] = "two"
    assert both.send("q/bad", "POST", DEPLOY, body=deployment("q-bad", bad))[0] == 400


def test_service_defaults(both):
    body = both.send("svc/create", "POST", "v1/services", body={
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": NS},
        "spec": {"selector": {"a": "b"}, "ports": [{"name": "http", "port": 80}]}})[1]
    assert body["spec"]["ports"] == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]


# ---------------------------------------------------------------- concurrency, patches, generation


def test_stale_resource_version_is_a_conflict(both):
    """On an LLMDeployment: no controller writes it between the reads and the writes here."""
    path = KubeClient.path(LLMD, NS, "rv")
    created = {side: side.request("POST", KubeClient.path(LLMD, NS), llmd("rv"))[1] for side in (both.real, both.emulated)}
    both.send("rv/label", "PATCH", LLMD, "rv", {"metadata": {"labels": {"x": "1"}}})
    # each side's own resourceVersions: the created one is stale now, the live one is not
    for step, version in (("rv/stale-put", lambda side: created[side]),
                          ("rv/fresh-put", lambda side: side.get(LLMD, NS, "rv"))):
        answers = []
        for side in (both.real, both.emulated):
            obj = copy.deepcopy(version(side))
            obj["spec"]["engine"]["maxNumSeqs"] = 64
            answers.append(side.request("PUT", path, obj))
        assert_same(step, answers[1], answers[0])
        assert answers[0][0] == (409 if step == "rv/stale-put" else 200)
    patches = [{"metadata": {"resourceVersion": created[side]["metadata"]["resourceVersion"]},
                "spec": {"engine": {"maxNumSeqs": 32}}} for side in (both.real, both.emulated)]
    assert_same("rv/stale-patch", both.emulated.request("PATCH", path, patches[1]),
                both.real.request("PATCH", path, patches[0]))
    body = both.send("rv/unconditional", "PATCH", LLMD, "rv", {"spec": {"engine": {"maxNumSeqs": 16}}})[1]
    assert body["spec"]["engine"]["maxNumSeqs"] == 16


def test_strategic_merge_patch_merges_lists_by_key(both):
    two = deployment("smp")
    two["spec"]["template"]["spec"]["containers"] = [
        {"name": "vllm", "image": "a", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "sidecar", "image": "s"}]
    both.send("smp/create", "POST", DEPLOY, body=two)
    patch = {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "b", "env": [{"name": "B", "value": "3"}, {"name": "A", "$patch": "delete"}]}]}}}}
    body = both.send("smp/by-key", "PATCH", DEPLOY, "smp", patch, content_type=SMP)[1]
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["vllm", "sidecar"]
    merge = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "image": "b"}]}}}}
    assert both.send("smp/merge-replaces", "PATCH", DEPLOY, "smp", merge)[0] == 200
    assert both.send("smp/custom-resource", "PATCH", LLMD, "pruned", {"spec": {}}, content_type=SMP)[0] == 415


def test_managed_fields_encoding(both):
    real = both.real.request("POST", KubeClient.path(DEPLOY, NS) + "?fieldManager=kneecap", deployment("enc"))[1]
    emu = both.emulated.request("POST", KubeClient.path(DEPLOY, NS) + "?fieldManager=kneecap", deployment("enc"))[1]
    fields = [[m["fieldsV1"] for m in side["metadata"]["managedFields"]] for side in (emu, real)]
    assert "managed-fields/encoding" in KNOWN_DIFFERENCES and fields[0] != fields[1]
    assert ['.' in str(f) for f in fields] == [False, True]


def test_generation_bumps_on_spec_changes_only(both):
    both.send("gen/create", "POST", DEPLOY, body=deployment("gen"))
    both.send("gen/annotation", "PATCH", DEPLOY, "gen", {"metadata": {"annotations": {"a": "b"}}})
    both.send("gen/same-replicas", "PATCH", DEPLOY, "gen", {"spec": {"replicas": 1}})
    # a Deployment's annotations bump its generation (they are copied to its ReplicaSets), the same replicas do not
    assert both.send("gen/replicas", "PATCH", DEPLOY, "gen", {"spec": {"replicas": 2}})[1]["metadata"]["generation"] == 3


def test_managed_fields_follow_the_last_writer(both):
    both.send("mf/create", "POST", DEPLOY, body=deployment("mf"), query="fieldManager=kneecap")
    both.send("mf/scale", "PATCH", DEPLOY, "mf", {"spec": {"replicas": 5}}, query="fieldManager=kubectl-scale")
    body = both.send("mf/back", "PATCH", DEPLOY, "mf", {"spec": {"replicas": 1}}, query="fieldManager=kneecap")
    owners = {m["manager"] for m in body[1]["metadata"]["managedFields"] if "f:replicas" in m["fieldsV1"].get("f:spec", {})}
    assert owners == {"kneecap"}


def test_json_patch_test_op_and_finalizers(both):
    both.send("jp/create", "POST", LLMD, body=llmd("jp"))
    real_rv = both.real.get(LLMD, NS, "jp")["metadata"]["resourceVersion"]
    emu_rv = both.emulated.get(LLMD, NS, "jp")["metadata"]["resourceVersion"]
    for step, (r_rv, e_rv) in (("jp/test-ok", (real_rv, emu_rv)), ("jp/test-stale", (real_rv, emu_rv))):
        ops = lambda rv: [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},  # noqa: E731
                          {"op": "add", "path": "/metadata/finalizers", "value": ["kneecap.io/test"]}]
        real = both.real.request("PATCH", KubeClient.path(LLMD, NS, "jp"), ops(r_rv), JSON_PATCH)
        emu = both.emulated.request("PATCH", KubeClient.path(LLMD, NS, "jp"), ops(e_rv), JSON_PATCH)
        assert_same(step, emu, real)
    assert both.send("jp/delete", "DELETE", LLMD, "jp")[0] == 200
    assert both.send("jp/marked", "GET", LLMD, "jp")[1]["metadata"]["deletionTimestamp"]
    both.send("jp/unfinalise", "PATCH", LLMD, "jp", {"metadata": {"finalizers": None}})
    assert both.send("jp/gone", "GET", LLMD, "jp")[0] == 404


# ---------------------------------------------------------------- server-side apply


def test_server_side_apply_ownership_conflicts_and_removal(both):
    d = deployment("ssa")
    d["spec"]["replicas"] = 2
    assert both.send("ssa/create", "PATCH", DEPLOY, "ssa", d, query="fieldManager=kneecap", content_type=APPLY)[0] == 201
    assert both.send("ssa/no-manager", "PATCH", DEPLOY, "ssa", d, content_type=APPLY)[0] == 422
    both.send("ssa/scale", "PATCH", DEPLOY, "ssa", {"spec": {"replicas": 5}}, query="fieldManager=kubectl-scale")
    d["spec"]["replicas"] = 3
    assert both.send("ssa/conflict", "PATCH", DEPLOY, "ssa", d, query="fieldManager=kneecap",
                     content_type=APPLY)[0] == 409
    del d["spec"]["replicas"]
    assert both.send("ssa/give-up", "PATCH", DEPLOY, "ssa", d, query="fieldManager=kneecap",
                     content_type=APPLY)[1]["spec"]["replicas"] == 5
    d["spec"]["replicas"] = 3
    assert both.send("ssa/force", "PATCH", DEPLOY, "ssa", d, query="fieldManager=kneecap&force=true",
                     content_type=APPLY)[1]["spec"]["replicas"] == 3
    r = deployment("ssa-rm", labels={"a": "1", "b": "2"})
    both.send("ssa-rm/create", "PATCH", DEPLOY, "ssa-rm", r, query="fieldManager=tool", content_type=APPLY)
    r["metadata"]["labels"] = {"a": "1"}
    assert both.send("ssa-rm/removed", "PATCH", DEPLOY, "ssa-rm", r, query="fieldManager=tool",
                     content_type=APPLY)[1]["metadata"]["labels"] == {"a": "1"}
    assert both.send("ssa-rm/force-not-apply", "PATCH", DEPLOY, "ssa-rm", {"spec": {}}, query="force=true")[0] == 422


# ---------------------------------------------------------------- garbage collection


def test_owner_deletion_collects_dependents(both, control_plane: ControlPlane):
    real_owner = both.send("gc/owner", "POST", LLMD, body=llmd("gc"))[1]
    emu_owner = both.emulated.get(LLMD, NS, "gc")
    for side, owner in ((both.real, real_owner), (both.emulated, emu_owner)):
        ref = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "name": "gc",
               "uid": owner["metadata"]["uid"]}
        assert side.request("POST", KubeClient.path(DEPLOY, NS), deployment("gc", ownerReferences=[ref]))[0] == 201
    both.send("gc/unowned", "POST", DEPLOY, body=deployment("gc-unowned"))
    both.send("gc/delete", "DELETE", LLMD, "gc")
    # the real garbage collector works in the background: wait for its verdict, then compare
    control_plane.wait_for(lambda: both.real.get(DEPLOY, NS, "gc") is None, 60, "the real GC")
    assert both.send("gc/dependent", "GET", DEPLOY, "gc")[0] == 404
    assert both.send("gc/left-alone", "GET", DEPLOY, "gc-unowned")[0] == 200


# ---------------------------------------------------------------- what the operator reads back


@pytest.mark.parametrize("engine", [
    {},
    {"podAnnotations": {"a": "b"}, "env": [{"name": "X", "value": "1"}]},
    {"resources": {"limits": {"cpu": 1, "memory": "1024Mi"}, "requests": {"cpu": "0.5"}}},
    {k: v for k, v in yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())["spec"]["engine"].items()
     if k != "image"},
], ids=["plain", "annotations-env", "resources", "shaped-pods"])
def test_the_operators_deployment_reads_back_in_sync(both, control_plane: ControlPlane, engine):
    """The stored form of the operator's own Deployment (defaults, canonical quantities, omitted
    empties) reads as in sync with what it wants, on the real apiserver, and the emulation
    stores the same."""
    from kneecap.control import manifests as M
    from kneecap.control.drift import in_sync

    name = f"rb{len(engine)}{sorted(engine)[0][:3].lower() if engine else ''}"
    spec = copy.deepcopy(SPEC)
    spec["engine"].update(engine)
    owner = both.send(f"{name}/owner", "POST", LLMD, body=llmd(name, spec))[1]
    parsed = S.parse_spec(owner["spec"])
    (pool,) = M.pools(name, parsed)
    desired = M.deployment(owner, parsed, pool, M.initial_settings(parsed, pool.role))
    if "serviceAccountName" in str(desired):
        control_plane.admin.request("POST", KubeClient.path("v1/serviceaccounts", NS), {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": desired["spec"]["template"]["spec"]["serviceAccountName"]}})
    # the owner's uid differs between the two: each side gets its own owner's
    real = both.real.request("POST", KubeClient.path(DEPLOY, NS), desired)
    emu_owner = both.emulated.get(LLMD, NS, name)
    emu_desired = M.deployment(emu_owner, parsed, pool, M.initial_settings(parsed, pool.role))
    emu = both.emulated.request("POST", KubeClient.path(DEPLOY, NS), emu_desired)
    for r in (real, emu):
        r[1]["metadata"]["ownerReferences"][0]["uid"] = "<owner>"
    assert_same(f"{name}/deployment", emu, real)
    assert real[0] == 201
    want = {"metadata": {"labels": desired["metadata"]["labels"]},
            "spec": {"template": desired["spec"]["template"], "replicas": desired["spec"]["replicas"]}}
    assert in_sync(want, real[1])
