"""spec.targetRef on the real control plane, the operator run as the chart's ServiceAccount: a
target another controller owns (a real VLLMRuntime object holding the controller ownerReference)
is advised only (Advisory condition naming it, its pod scraped on its kwok IP through its real
ReplicaSet, a pod that only carries its labels never), and not one write of the operator's user
to it in the audit log; a missing target is reported (Ready=False TargetMissing, a Warning
Event) and nothing is created; a decision for a controlled target is reported, for a free one
applied as one PATCH of its flag only; a flag value only the kubelet expands is advised."""

from __future__ import annotations

import ssl
import time
from dataclasses import replace

import pytest

from kneecap.control import plan, reconcile, status as status_helpers, target, vllm_args
from kneecap.control.kube import KubeClient
from kneecap.control.spec import parse_spec
from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT, tick_writes, wait_ticks
from tests.support.control_plane import ControlPlane, audit_writes, free_port
from tests.support.counting_server import CountingServer
from tests.support.profile_observations import observation

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
RUNTIMES = "production-stack.vllm.ai/v1alpha1/vllmruntimes"
NS = "adopt"
VLLM_PORT = free_port()  # the adopted containers' --port (not 8000: other planes' twins may use it)


@pytest.fixture(scope="module")
def runtime_crd(control_plane: ControlPlane) -> None:
    """A minimal VLLMRuntime CRD: the foreign controller's kind, so its objects (and the garbage
    collector's view of their ownerReferences) are real."""
    admin = control_plane.admin
    admin.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "vllmruntimes.production-stack.vllm.ai"},
        "spec": {"group": "production-stack.vllm.ai", "scope": "Namespaced",
                 "names": {"plural": "vllmruntimes", "singular": "vllmruntime", "kind": "VLLMRuntime"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})

    def established():
        crd = admin.get("apiextensions.k8s.io/v1/customresourcedefinitions", None, "vllmruntimes.production-stack.vllm.ai")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in ((crd or {}).get("status") or {}).get("conditions") or [])

    control_plane.wait_for(established, 60, "the VLLMRuntime CRD Established")


def runtime_owner(plane: ControlPlane, name: str) -> list[dict]:
    """A VLLMRuntime `name` created, as the controller ownerReference of what it runs."""
    rt = plane.admin.create(RUNTIMES, {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime",
                                       "metadata": {"name": name, "namespace": NS}, "spec": {"model": "llama"}})
    return [{"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime", "name": name,
             "uid": rt["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def user_deployment(name: str, owner_refs: list | None = None, cap: int = 256, replicas: int = 1) -> dict:
    labels = {"app.kubernetes.io/name": "vllm", "model": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": labels,
                         **({"ownerReferences": owner_refs} if owner_refs else {})},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                         "command": ["vllm", "serve"],
                                         "args": ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", str(cap),
                                                  "--enable-prefix-caching", f"--port={VLLM_PORT}"]}]}}}}


def adopting(name: str, target_name: str, **control) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
                     "targetRef": {"name": target_name},
                     "control": {"mode": "enforce", "interval": "1s", "window": "1s", **control}}}


def status(admin, name: str) -> dict:
    return (admin.get(LLMD, NS, name) or {}).get("status") or {}


def condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def operator_writes(plane: ControlPlane, since: int, resource: str, name: str | None = None) -> list[tuple]:
    """(verb, name) of every write of the operator's user to `resource` since the audit mark."""
    return [(e["verb"], e["objectRef"].get("name")) for e in audit_writes(plane.audit(OPERATOR_USER, since_line=since))
            if e["objectRef"].get("resource") == resource and e["objectRef"].get("namespace") == NS
            and (name is None or e["objectRef"].get("name") == name)]


def status_writes(plane: ControlPlane, since: int, name: str) -> int:
    return len(tick_writes(plane.audit(OPERATOR_USER, since_line=since), NS, name))


def running_pods(admin, selector: dict) -> list[dict]:
    sel = ",".join(f"{k}={v}" for k, v in selector.items())
    pods = admin.list("v1/pods", NS, selector=sel)
    return pods if pods and all(p["status"].get("phase") == "Running" and p["status"].get("podIP")
                                for p in pods) else []


def delete_and_wait(plane: ControlPlane, name: str) -> None:
    plane.admin.delete(LLMD, NS, name)
    plane.wait_for(lambda: plane.admin.get(LLMD, NS, name) is None, 60, f"{name} deleted")


def test_a_target_another_controller_owns_is_advised_only_and_never_written(control_plane, operator, runtime_crd):
    admin = control_plane.admin
    before = admin.create(DEPLOY, user_deployment("llama-runtime", runtime_owner(control_plane, "llama")))
    labels = before["spec"]["selector"]["matchLabels"]
    (pod,) = control_plane.wait_for(lambda: running_pods(admin, labels), 60, "the target's pod Running")
    # a pod with the target's labels and no owner, on a kwok IP of its own
    admin.create("v1/pods", {"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": "llama-lookalike", "namespace": NS, "labels": labels},
                             "spec": before["spec"]["template"]["spec"]})
    pods = control_plane.wait_for(lambda: (p := running_pods(admin, labels)) and len(p) == 2 and p, 60,
                                  "the lookalike Running")
    (lookalike,) = [p for p in pods if p["metadata"]["name"] == "llama-lookalike"]
    own, impostor = CountingServer(pod["status"]["podIP"], VLLM_PORT), CountingServer(lookalike["status"]["podIP"],
                                                                                      VLLM_PORT)
    mark = control_plane.audit_mark()
    try:
        admin.create(LLMD, adopting("llama", "llama-runtime"))
        st = control_plane.wait_for(lambda: (s := status(admin, "llama")) and condition(s, "Advisory")
                                    and len(own.hits) >= 3 and s, 60, "Advisory and scrapes of the target's pod")
        wait_ticks(control_plane, mark, 5, [(NS, "llama")])
        delete_and_wait(control_plane, "llama")
    finally:
        own.close()
        impostor.close()
    a = condition(st, "Advisory")
    assert (a["status"], a["reason"]) == ("True", "TargetControlled")
    assert "VLLMRuntime/llama" in a["message"] and "llama-runtime" in a["message"]
    assert st["ownership"]["server"]["target"] == {"deployment": "llama-runtime", "container": "vllm",
                                                  "controller": "VLLMRuntime/llama", "adviseOnly": True,
                                                  "tensorParallelSize": 1}
    # not one write: the target as its owner made it (only the Deployment controller's status since)
    assert operator_writes(control_plane, mark, "deployments") == []
    assert operator_writes(control_plane, mark, "services") == []
    after = admin.get(DEPLOY, NS, "llama-runtime")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
    assert after["spec"]["template"] == before["spec"]["template"]
    assert [d["metadata"]["name"] for d in admin.list(DEPLOY, NS)] == ["llama-runtime"]
    assert admin.list(SERVICE, NS) == []
    assert set(own.hits) == {"/metrics"}  # its pod found through the ReplicaSet → Deployment chain
    assert impostor.hits == []  # a pod that only carries the labels is not the Deployment's


def test_a_missing_target_is_reported_and_nothing_is_created(control_plane, operator):
    admin = control_plane.admin
    mark = control_plane.audit_mark()
    admin.create(LLMD, adopting("waiting", "llama-serving"))
    st = control_plane.wait_for(
        lambda: (s := status(admin, "waiting")) and condition(s, "Ready").get("reason") == "TargetMissing"
        and (s.get("lastDecision") or {}).get("reason") == "TargetMissing" and s, 60, "Ready=False TargetMissing")
    warned = control_plane.wait_for(lambda: [e for e in admin.list("v1/events", NS) if e.get("reason") == "TargetMissing"
                                             and e["involvedObject"]["name"] == "waiting"], 30, "a TargetMissing Event")
    wait_ticks(control_plane, mark, 3, [(NS, "waiting")])
    made = operator_writes(control_plane, mark, "deployments") + operator_writes(control_plane, mark, "services")
    # the Deployment appears (the user's chart installs it): kneecap picks it up, still writes nothing
    dep = admin.create(DEPLOY, user_deployment("llama-serving"))
    later = control_plane.wait_for(lambda: (s := status(admin, "waiting"))
                                   and condition(s, "Ready").get("reason") != "TargetMissing" and s, 60, "the target found")
    delete_and_wait(control_plane, "waiting")
    r = condition(st, "Ready")
    assert r["status"] == "False" and "llama-serving" in r["message"] and "not found" in r["message"]
    assert warned[0]["type"] == "Warning" and f"{NS}/llama-serving" in warned[0]["message"]
    assert made == []
    assert condition(later, "Advisory")["status"] == "False"
    stored = admin.get(DEPLOY, NS, "llama-serving")
    assert stored["spec"]["template"] == dep["spec"]["template"] and "ownerReferences" not in stored["metadata"]
    assert stored["metadata"]["generation"] == dep["metadata"]["generation"]
    assert operator_writes(control_plane, mark, "deployments") == []  # not one write


# ---------------------------------------------------------------- a decision on seeded windows

def seeded_status(curve, now_s: float) -> dict:
    """Three real H100 windows (Llama-2-7B at caps 8, 16, 32) that just closed, as the ring would
    hold them: the next tick decides on them (the target is scaled to 0: no pod, no window of
    its own; a pod that served nothing would hold the decision, ScrapeFailed)."""
    obs = [replace(observation(curve[c]), t_end_s=now_s - 5.0 * (2 - i)) for i, c in enumerate((8, 16, 32))]
    return {"observations": [{"pool": "server", **status_helpers.ring_entry(o)} for o in obs],
            "workload": {"pool": "server", **status_helpers.rounded(plan.obs_pool.to_status(obs[-1]))},
            "lastWindow": {"pool": "server", "outcome": plan.OBSERVED, "time": status_helpers.iso(now_s),
                           "usableTime": status_helpers.iso(now_s)}}


def decide_on_seeded_windows(plane: ControlPlane, curve, name: str, owner_refs) -> tuple[dict, dict, int]:
    """(the target as created, the LLMDeployment's status once it decided, the audit mark taken
    before the LLMDeployment was created)."""
    admin = plane.admin
    before = admin.create(DEPLOY, user_deployment(name, owner_refs, cap=32, replicas=0))
    spec = {"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
            "targetRef": {"name": name},
            "control": {"mode": "enforce", "interval": "1s", "window": "20s", "cooldown": "600s"}}
    mark = plane.audit_mark()
    admin.create(LLMD, {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                        "metadata": {"name": name, "namespace": NS}, "spec": spec})
    plane.wait_for(lambda: "observations" in status(admin, name), 60, "the first tick's status")
    admin.patch(LLMD, NS, name, {"status": seeded_status(curve, time.time())}, "status")
    try:
        st = plane.wait_for(lambda: (s := status(admin, name)) and (s.get("lastDecision") or {}).get("reason")
                            in ("Advised", "Applied") and s, 60, "a decision on the seeded windows")
    except Exception:
        raise AssertionError(f"no decision; status: {status(admin, name)}") from None
    decided = status_writes(plane, mark, name)
    # more ticks: the cooldown (or advise-only) holds, nothing more is written
    plane.wait_for(lambda: status_writes(plane, mark, name) >= decided + 4, 60, "4 more ticks")
    return before, st, mark


def test_a_decision_for_a_controlled_target_is_reported_not_applied(control_plane, operator, runtime_crd, curve):
    before, st, mark = decide_on_seeded_windows(control_plane, curve, "llama-7b-owned",
                                                runtime_owner(control_plane, "llama-7b"))
    d = st["lastDecision"]
    assert d["reason"] == "Advised" and d["target"]["maxNumSeqs"] == 64 and "VLLMRuntime/llama-7b" in d["message"]
    assert st["recommendation"]["maxNumSeqs"] >= 64
    assert condition(st, "Advisory")["reason"] == "TargetControlled"
    assert operator_writes(control_plane, mark, "deployments") == []  # zero PATCHes
    after = control_plane.admin.get(DEPLOY, NS, "llama-7b-owned")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert not [e for e in control_plane.admin.list("v1/events", NS) if e.get("reason") == "Applied"
                and e["involvedObject"]["name"] == "llama-7b-owned"]
    delete_and_wait(control_plane, "llama-7b-owned")


def test_a_decision_for_a_free_target_patches_only_its_flag(control_plane, operator, curve):
    before, st, mark = decide_on_seeded_windows(control_plane, curve, "llama-7b-free", None)
    after = control_plane.admin.get(DEPLOY, NS, "llama-7b-free")
    assert st["lastDecision"]["reason"] == "Applied" and condition(st, "Advisory")["status"] == "False"
    assert operator_writes(control_plane, mark, "deployments") == [("patch", "llama-7b-free")]  # one PATCH
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    c = target.find_container(after, "vllm")
    assert vllm_args.container_flag(c, "--max-num-seqs") == "64"
    assert c["args"][:3] == ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"]  # spelling and place kept
    assert target.changed_paths(target.without_tuned_flags(before["spec"]["template"], "vllm"),
                                target.without_tuned_flags(after["spec"]["template"], "vllm")) == []
    for key in ("replicas", "selector"):
        assert after["spec"][key] == before["spec"][key]
    assert after["metadata"]["labels"] == before["metadata"]["labels"] and "ownerReferences" not in after["metadata"]
    # kneecap's one annotation beside the Deployment controller's revision count
    assert set(after["metadata"]["annotations"]) == {"kneecap.io/applied", "deployment.kubernetes.io/revision"}
    delete_and_wait(control_plane, "llama-7b-free")
    assert control_plane.admin.get(DEPLOY, NS, "llama-7b-free")["metadata"]["uid"] == before["metadata"]["uid"]


async def test_a_flag_value_only_the_kubelet_expands_is_advised_and_a_missing_container_reported(
        control_plane, chart_installed, ns):
    """`--max-num-seqs $(SEQS)` (expanded from env by the kubelet) is no number kneecap can
    move: the pool is advise-only; a targetRef.container the Deployment lacks is reported."""
    d = user_deployment("llama-env", replicas=0)
    d["spec"]["template"]["spec"]["containers"][0]["args"][2] = "$(SEQS)"
    control_plane.admin.create(DEPLOY, d)
    ctx = ssl.create_default_context(cafile=str(control_plane.pki.ca))
    client = KubeClient(control_plane.url, token=control_plane.token(RELEASE_NS, SERVICE_ACCOUNT), ssl_context=ctx)
    mark = control_plane.audit_mark()
    try:
        owner = {**adopting("llama", "llama-env"), "metadata": {"name": "llama", "namespace": NS, "uid": "u"}}
        (pool,) = (await reconcile.reconcile(client, owner, parse_spec(owner["spec"]))).pools
        assert pool.adoption.advise_only and "$(SEQS)" in pool.adoption.unpatchable
        assert pool.settings.max_num_seqs == 1024  # vLLM's default on an 80 GB H100 stands in
        wrong = {**owner["spec"], "targetRef": {"name": "llama-env", "container": "engine"}}
        res = await reconcile.reconcile(client, owner, parse_spec(wrong))
        assert res.pools == [] and res.missing == [
            f"Deployment {NS}/llama-env has no container 'engine' (spec.targetRef.container)"]
    finally:
        await client.close()
    assert operator_writes(control_plane, mark, "deployments") == []  # read only
