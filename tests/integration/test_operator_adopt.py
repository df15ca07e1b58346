"""spec.targetRef against the faithful emulated API with the real operator: a target another
controller owns is advised only (Advisory condition naming it, its pods scraped through its own
ReplicaSets, not one write to it), a missing target is reported (Ready=False TargetMissing and a
Warning Event) and nothing is created for it; deleting the LLMDeployment leaves the target."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from kneecap.control import manifests as M, plan as P, reconcile as R, status as St, target as T, vllm_args as V
from kneecap.control.kube import KubeClient
from kneecap.control.spec import parse_spec
from kneecap.demo.kubelet import add_owned_pod
from tests.integration.test_operator_ownership import CountingServer
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, SERVICE, condition, events, operator, status, wait_for
from tests.unit.test_control_decide import curve, observation  # noqa: F401 (curve: the fixture)

RUNTIME = {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime", "name": "llama",
           "uid": "5d1a0c6e-0000-4000-8000-00000000beef", "controller": True, "blockOwnerDeletion": True}


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


def user_deployment(name: str, owner_refs: list | None = None, cap: int = 256) -> dict:
    labels = {"app.kubernetes.io/name": "vllm", "model": "llama"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": labels,
                         **({"ownerReferences": owner_refs} if owner_refs else {})},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                         "command": ["vllm", "serve"],
                                         "args": ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", str(cap),
                                                  "--enable-prefix-caching"]}]}}}}


def adopting(name: str, target: str) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
                     "targetRef": {"name": target},
                     "control": {"mode": "enforce", "interval": "1s", "window": "1s"}}}


def test_a_target_another_controller_owns_is_advised_only_and_never_written(kube):
    before = kube.create(DEPLOY, user_deployment("llama-runtime", [RUNTIME]))
    pods, impostor = CountingServer(), CountingServer()
    try:
        add_owned_pod(kube, before, "llama-runtime-0", annotations={M.METRICS_URL_ANNOTATION: pods.url()})
        kube.add_pod(NS, "llama-lookalike", before["spec"]["selector"]["matchLabels"],  # its labels, no owner
                     annotations={M.METRICS_URL_ANNOTATION: impostor.url()})
        with operator(kube) as runner:
            kube.create(LLMD, adopting("llama", "llama-runtime"))
            st = wait_for(lambda: (s := status(kube, "llama")) and condition(s, "Advisory") and len(pods.hits) >= 3
                          and s, what="Advisory condition and scrapes of the target's pod")
            time.sleep(1.5)  # more control ticks against the target
            kube.delete(LLMD, NS, "llama")
            wait_for(lambda: kube.get(LLMD, NS, "llama") is None, what="the LLMDeployment gone")
    finally:
        pods.close()
        impostor.close()
    assert runner.exit_code == 0, runner.output
    a = condition(st, "Advisory")
    assert (a["status"], a["reason"]) == ("True", "TargetControlled")
    assert "VLLMRuntime/llama" in a["message"] and "llama-runtime" in a["message"]
    assert st["ownership"]["server"]["target"] == {"deployment": "llama-runtime", "container": "vllm",
                                                  "controller": "VLLMRuntime/llama", "adviseOnly": True,
                                                  "tensorParallelSize": 1}
    # not one write: the target is stored once, as its owner made it; kneecap made nothing
    assert kube.history(DEPLOY, NS, "llama-runtime") == [before]
    assert [d["metadata"]["name"] for d in kube.list(DEPLOY, NS)] == ["llama-runtime"]
    assert kube.list(SERVICE, NS) == []
    assert set(pods.hits) == {"/metrics"}  # its pod found through the ReplicaSet → Deployment chain
    assert impostor.hits == []  # a pod that only carries the labels is not the Deployment's


def test_a_missing_target_is_reported_and_nothing_is_created(kube):
    with operator(kube) as runner:
        kube.create(LLMD, adopting("llama", "llama-serving"))
        st = wait_for(lambda: (s := status(kube, "llama")) and condition(s, "Ready").get("reason") == "TargetMissing"
                      and (s.get("lastDecision") or {}).get("reason") == "TargetMissing" and s,
                      what="Ready=False TargetMissing")
        warned = wait_for(lambda: events(kube, "TargetMissing", "llama"), what="a TargetMissing Event")
        time.sleep(1.0)
        made = (kube.list(DEPLOY, NS), kube.list(SERVICE, NS))
        # the Deployment appears (the user's chart installs it): kneecap picks it up, still writes nothing
        dep = kube.create(DEPLOY, user_deployment("llama-serving"))
        later = wait_for(lambda: (s := status(kube, "llama")) and condition(s, "Ready").get("reason") != "TargetMissing"
                         and s, what="the target found")
        kube.delete(LLMD, NS, "llama")
        wait_for(lambda: kube.get(LLMD, NS, "llama") is None, what="the LLMDeployment gone")
        time.sleep(0.5)
    assert runner.exit_code == 0, runner.output
    r = condition(st, "Ready")
    assert r["status"] == "False" and "llama-serving" in r["message"] and "not found" in r["message"]
    assert warned[0]["type"] == "Warning" and "serving/llama-serving" in warned[0]["message"]
    assert made == ([], [])
    assert condition(later, "Advisory")["status"] == "False"
    stored = kube.get(DEPLOY, NS, "llama-serving")
    assert stored is not None and stored["spec"] == dep["spec"] and "ownerReferences" not in stored["metadata"]
    assert kube.history(DEPLOY, NS, "llama-serving") == [dep]  # not one write


# ---------------------------------------------------------------- a decision on seeded windows

def seeded_status(curve, now_s: float) -> dict:
    """Three real H100 windows (Llama-2-7B at caps 8, 16, 32) that just closed, as the ring would
    hold them: the next tick decides on them (the target has no pod, so no window of its own)."""
    obs = [replace(observation(curve[c]), t_end_s=now_s - 5.0 * (2 - i)) for i, c in enumerate((8, 16, 32))]
    return {"observations": [{"pool": "server", **St.ring_entry(o)} for o in obs],
            "workload": {"pool": "server", **St.rounded(P.obs_pool.to_status(obs[-1]))},
            "lastWindow": {"pool": "server", "outcome": P.OBSERVED, "time": St.iso(now_s),
                           "usableTime": St.iso(now_s)}}


def decide_on_seeded_windows(kube, curve, owner_refs) -> tuple[dict, dict, dict]:
    """(the target as created, the LLMDeployment's status once it decided, the target after)."""
    before = kube.create(DEPLOY, user_deployment("llama-7b", owner_refs, cap=32))
    spec = {"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
            "targetRef": {"name": "llama-7b"},
            "control": {"mode": "enforce", "interval": "1s", "window": "20s", "cooldown": "600s"}}
    with operator(kube) as runner:
        kube.create(LLMD, {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                           "metadata": {"name": "llama", "namespace": NS}, "spec": spec})
        wait_for(lambda: "observations" in status(kube, "llama"), what="the first tick's status")
        kube.patch(LLMD, NS, "llama", {"status": seeded_status(curve, time.time())}, "status")
        st = wait_for(lambda: (s := status(kube, "llama")) and (s.get("lastDecision") or {}).get("reason")
                      in ("Advised", "Applied") and s, what="a decision on the seeded windows")
        time.sleep(1.5)  # more ticks: the cooldown (or advise-only) holds, nothing more is written
    assert runner.exit_code == 0, runner.output
    return before, st, kube.get(DEPLOY, NS, "llama-7b")


def test_a_decision_for_a_controlled_target_is_reported_not_applied(kube, curve):
    before, st, _ = decide_on_seeded_windows(kube, curve, [RUNTIME])
    d = st["lastDecision"]
    assert d["reason"] == "Advised" and d["target"]["maxNumSeqs"] == 64 and "VLLMRuntime/llama" in d["message"]
    assert st["recommendation"]["maxNumSeqs"] >= 64
    assert condition(st, "Advisory")["reason"] == "TargetControlled"
    assert kube.history(DEPLOY, NS, "llama-7b") == [before]  # zero PATCHes
    assert not events(kube, "Applied")


def test_a_decision_for_a_free_target_patches_only_its_flag(kube, curve):
    before, st, after = decide_on_seeded_windows(kube, curve, None)
    assert st["lastDecision"]["reason"] == "Applied" and condition(st, "Advisory")["status"] == "False"
    assert len(kube.history(DEPLOY, NS, "llama-7b")) == 2  # one PATCH
    c = T.find_container(after, "vllm")
    assert V.container_flag(c, "--max-num-seqs") == "64"
    assert c["args"][:3] == ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"]  # spelling and place kept
    assert T.changed_paths(T.without_tuned_flags(before["spec"]["template"], "vllm"),
                           T.without_tuned_flags(after["spec"]["template"], "vllm")) == []
    for key in ("replicas", "selector"):
        assert after["spec"][key] == before["spec"][key]
    assert after["metadata"]["labels"] == before["metadata"]["labels"] and "ownerReferences" not in after["metadata"]
    assert set(after["metadata"]["annotations"]) == {"kneecap.io/applied"}


async def test_a_flag_value_only_the_kubelet_expands_is_advised_and_a_missing_container_reported(kube):
    """`--max-num-seqs $(SEQS)` (expanded from env by the kubelet) is no number kneecap can
    move: the pool is advise-only; a targetRef.container the Deployment lacks is reported."""
    d = user_deployment("llama-env")
    d["spec"]["template"]["spec"]["containers"][0]["args"][2] = "$(SEQS)"
    kube.create(DEPLOY, d)
    client = KubeClient(kube.url)
    try:
        owner = {**adopting("llama", "llama-env"), "metadata": {"name": "llama", "namespace": NS, "uid": "u"}}
        (pool,) = (await R.reconcile(client, owner, parse_spec(owner["spec"]))).pools
        assert pool.adoption.advise_only and "$(SEQS)" in pool.adoption.unpatchable
        assert pool.settings.max_num_seqs == 1024  # vLLM's default on an 80 GB H100 stands in
        wrong = {**owner["spec"], "targetRef": {"name": "llama-env", "container": "engine"}}
        res = await R.reconcile(client, owner, parse_spec(wrong))
        assert res.pools == [] and res.missing == [
            "Deployment serving/llama-env has no container 'engine' (spec.targetRef.container)"]
    finally:
        await client.close()
    assert kube.history(DEPLOY, NS, "llama-env")[1:] == []  # read only
