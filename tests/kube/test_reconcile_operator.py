"""The operator (`kneecap run`, the chart's arguments and ServiceAccount) reconciling on the real
control plane: the objects it makes for each topology, an invalid spec refused in status and an
Event with nothing made, a spec change that keeps what the loop and an HPA own (managedFields
say who owns `spec.replicas`), and drift of its Deployment repaired in one PATCH (audit log)."""

from __future__ import annotations

import json

from kneecap.control import vllm_args
from kneecap.control.kube import FIELD_MANAGER
from tests.kube.conftest import OPERATOR_USER, wait_ticks
from tests.support.control_plane import ControlPlane, audit_writes
from tests.support.examples import colocated, condition, status_of

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
HPA = "autoscaling/v2/horizontalpodautoscalers"
NS = "reconcile-operator"


def _llmd(name: str, **spec) -> dict:
    return colocated(name, NS, window="1s", **spec)


def _status(admin, name: str) -> dict:
    return status_of(admin, LLMD, NS, name)



def _writes(plane: ControlPlane, since: int, resources=("deployments", "services")) -> list[tuple]:
    """(verb, resource, name) of the operator's writes to `resources` since the audit mark."""
    return [(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("name"))
            for e in audit_writes(plane.audit(OPERATOR_USER, since_line=since))
            if e["objectRef"].get("resource") in resources and e["objectRef"].get("namespace") == NS]


def _events(admin, name: str, reason: str) -> list[dict]:
    return [e for e in admin.list("v1/events", NS) if e.get("reason") == reason and e["involvedObject"]["name"] == name]


def _container(d: dict) -> dict:
    return d["spec"]["template"]["spec"]["containers"][0]


def test_colocated_objects_are_created_once_with_owner_labels_and_flags(control_plane, operator):
    admin = control_plane.admin
    mark = control_plane.audit_mark()
    owner = admin.create(LLMD, _llmd("llama"))
    d = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, "llama"), 60, "the Deployment")
    svc = control_plane.wait_for(lambda: admin.get(SERVICE, NS, "llama"), 60, "the Service")
    wait_ticks(control_plane, mark, 10, [(NS, "llama")])
    for obj in (d, svc):
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
        assert obj["metadata"]["labels"]["kneecap.io/role"] == "server"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kneecap"
    c = _container(d)
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == ["meta-llama/Llama-3.1-8B-Instruct", "--port=8000", "--max-num-seqs=256",
                         "--gpu-memory-utilization=0.9", "--max-model-len=8192"]
    # created once each; ten ticks later nothing more written
    assert sorted(_writes(control_plane, mark)) == [("create", "deployments", "llama"), ("create", "services", "llama")]
    assert [e["type"] for e in _events(admin, "llama", "Reconciled")] == ["Normal"]


def test_disaggregated_pools_carry_their_kv_transfer_roles(control_plane, operator):
    admin = control_plane.admin
    mark = control_plane.audit_mark()
    admin.create(LLMD, _llmd("big", topology={"mode": "disaggregated", "prefill": {"min": 2, "max": 4},
                                              "decode": {"min": 1, "max": 4},
                                              "kvTransfer": {"connector": "NixlConnector"}}))
    pre = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, "big-prefill"), 60, "prefill")
    dec = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, "big-decode"), 60, "decode")
    control_plane.wait_for(lambda: admin.get(SERVICE, NS, "big-prefill") and admin.get(SERVICE, NS, "big-decode"),
                           60, "both Services")
    assert admin.get(DEPLOY, NS, "big") is None
    assert pre["spec"]["replicas"] == 2 and dec["spec"]["replicas"] == 1
    for d, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        assert json.loads(vllm_args.container_flag(_container(d), "--kv-transfer-config")) == {
            "kv_connector": "NixlConnector", "kv_role": role}
    assert sorted(_writes(control_plane, mark)) == [(v, r, n) for r in ("deployments", "services")
                                                    for v, n in (("create", "big-decode"), ("create", "big-prefill"))]


def test_an_invalid_spec_is_refused_in_status_and_an_event_and_nothing_is_made(control_plane, operator):
    admin = control_plane.admin
    mark = control_plane.audit_mark()
    # valid for the API server (the CRD cannot know the accelerator catalog), invalid for the operator
    admin.create(LLMD, _llmd("bad", accelerator={"type": "tpu-v9"}))
    st = control_plane.wait_for(lambda: (s := _status(admin, "bad")) and condition(s, "Ready") and s, 60,
                                "the Ready condition")
    ev = control_plane.wait_for(lambda: _events(admin, "bad", "InvalidSpec"), 30, "an InvalidSpec Event")
    wait_ticks(control_plane, mark, 1, [(NS, "bad")])
    ready = condition(st, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec") and "spec.accelerator.type" in ready["message"]
    assert st["phase"] == "Invalid"
    assert ev[0]["type"] == "Warning" and "spec.accelerator.type" in ev[0]["message"]
    assert _writes(control_plane, mark) == []
    assert admin.list(DEPLOY, NS, selector="app.kubernetes.io/instance=bad") == []


def _managers_of_replicas(d: dict) -> set[str]:
    return {m["manager"] for m in d["metadata"].get("managedFields") or []
            if "f:replicas" in ((m.get("fieldsV1") or {}).get("f:spec") or {})}


def test_a_spec_change_follows_the_spec_keeps_the_loops_flags_and_leaves_an_hpa_the_replicas(control_plane, operator):
    admin = control_plane.admin
    admin.create(LLMD, _llmd("scaled"))
    d = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, "scaled"), 60, "the Deployment")
    assert _managers_of_replicas(d) == {FIELD_MANAGER}
    admin.create(HPA, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                       "metadata": {"name": "scaled-hpa", "namespace": NS},
                       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"},
                                "minReplicas": 1, "maxReplicas": 20}})
    control_plane.wait_for(lambda: (_status(admin, "scaled").get("ownership") or {}).get("server", {}).get("replicas")
                           == "hpa/scaled-hpa", 60, "the HPA seen as the replicas' owner")
    # a decision the loop made lives in the Deployment; replicas above the spec's max 4, as an HPA would set them
    c = vllm_args.set_container_flag(_container(d), "--max-num-seqs", 32)
    admin.patch(DEPLOY, NS, "scaled", {"spec": {"replicas": 6, "template": {"spec": {"containers": [c]}}}})
    mark = control_plane.audit_mark()
    admin.patch(LLMD, NS, "scaled", {"spec": {"engine": {"image": "vllm/vllm-openai:v0.12.0"}}})
    d = control_plane.wait_for(lambda: (x := admin.get(DEPLOY, NS, "scaled"))
                               and _container(x)["image"].endswith("v0.12.0") and x, 60, "the image change")
    # the real HPA controller has looked at it (no metrics server here: it cannot scale) ...
    hpa = control_plane.wait_for(lambda: (h := admin.get(HPA, NS, "scaled-hpa")) and
                                 (h.get("status") or {}).get("conditions") and h, 90, "the HPA controller's status")
    wait_ticks(control_plane, mark, 5, [(NS, "scaled")])
    d = admin.get(DEPLOY, NS, "scaled")
    st = _status(admin, "scaled")
    assert vllm_args.container_flag(_container(d), "--max-num-seqs") == "32"  # a spec change does not undo a decision
    assert d["spec"]["replicas"] == 6  # not clamped to the spec's max 4: the HPA owns it
    assert FIELD_MANAGER not in _managers_of_replicas(d)  # kneecap's patch did not claim spec.replicas
    assert st["ownership"]["server"]["replicas"] == "hpa/scaled-hpa" and "only recommends" in st["ownership"]["server"]["message"]
    assert {c["type"] for c in hpa["status"]["conditions"]} >= {"AbleToScale"}
    assert _writes(control_plane, mark) == [("patch", "deployments", "scaled")]  # the image, once


def test_drift_of_its_deployment_is_repaired_in_one_patch_and_a_managed_flag_is_kept(control_plane, operator):
    admin = control_plane.admin
    mark0 = control_plane.audit_mark()
    admin.create(LLMD, _llmd("drift"))
    d = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, "drift"), 60, "the Deployment")
    wait_ticks(control_plane, mark0, 3, [(NS, "drift")])
    # a user edits the image (a field the spec owns) and --max-num-seqs (a flag the loop manages)
    c = vllm_args.set_container_flag({**_container(d), "image": "example.com/vllm:patched"}, "--max-num-seqs", 64)
    mark = control_plane.audit_mark()
    edited = admin.patch(DEPLOY, NS, "drift", {"spec": {"template": {"spec": {"containers": [c]}}}})
    repaired = control_plane.wait_for(lambda: (x := admin.get(DEPLOY, NS, "drift"))
                                      and _container(x)["image"] == "vllm/vllm-openai:v0.11.0" and x, 60,
                                      "the image repaired")
    wait_ticks(control_plane, mark, 5, [(NS, "drift")])
    after = admin.get(DEPLOY, NS, "drift")
    # one spec change since the user's (the repair), none after it (the Deployment controller's status aside)
    assert after["metadata"]["generation"] == repaired["metadata"]["generation"] == edited["metadata"]["generation"] + 1
    assert vllm_args.container_flag(_container(after), "--max-num-seqs") == "64"  # read back as the live setting
    assert _writes(control_plane, mark) == [("patch", "deployments", "drift")]
    reconciled = [e["message"] for e in _events(admin, "drift", "Reconciled")]
    assert any("drift patched" in m for m in reconciled), reconciled
