"""The operator (kopf, KopfRunner) against the emulated API: owned objects and invalid specs."""

from __future__ import annotations

import json
import time

import pytest

from kneecap.control import vllm_args as V
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, events, llmd, operator, wait_for



@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


def test_colocated_objects_created_and_reconcile_is_idempotent(kube):
    with operator(kube) as runner:
        kube.create(LLMD, llmd("llama"))
        d = wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="deployment")
        svc = wait_for(lambda: kube.get("v1/services", NS, "llama"), what="service")
        owner = kube.get(LLMD, NS, "llama")
        wait_for(lambda: (kube.get(LLMD, NS, "llama").get("status") or {}).get("phase"), what="status")
        time.sleep(1.0)
    assert runner.exit_code == 0, runner.output
    uid = owner["metadata"]["uid"]
    for obj in (d, svc):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        assert obj["metadata"]["labels"]["kneecap.io/role"] == "server"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kneecap"
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == ["meta-llama/Llama-3.1-8B-Instruct", "--port=8000", "--max-num-seqs=256",
                         "--gpu-memory-utilization=0.9", "--max-model-len=8192"]
    # reconciling again (timer ticks, resume) changed nothing: one version of the deployment
    assert len(kube.history(DEPLOY, NS, "llama")) == 1
    assert any(e["reason"] == "Reconciled" for e in events(kube))


def test_disaggregated_objects_with_kv_transfer(kube):
    spec = {"topology": {"mode": "disaggregated", "prefill": {"min": 2, "max": 4}, "decode": {"min": 1, "max": 4},
                         "kvTransfer": {"connector": "NixlConnector"}}}
    with operator(kube) as runner:
        kube.create(LLMD, llmd("big", **spec))
        pre = wait_for(lambda: kube.get(DEPLOY, NS, "big-prefill"), what="prefill")
        dec = wait_for(lambda: kube.get(DEPLOY, NS, "big-decode"), what="decode")
        wait_for(lambda: kube.get("v1/services", NS, "big-decode"), what="decode service")
    assert runner.exit_code == 0, runner.output
    assert kube.get(DEPLOY, NS, "big") is None
    assert pre["spec"]["replicas"] == 2 and dec["spec"]["replicas"] == 1
    for d, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        cfg = V.container_flag(d["spec"]["template"]["spec"]["containers"][0], "--kv-transfer-config")
        assert json.loads(cfg) == {"kv_connector": "NixlConnector", "kv_role": role}


def test_invalid_spec_sets_condition_and_event_and_creates_nothing(kube):
    # valid for the API server (the CRD cannot know the accelerator catalog), invalid for the operator
    bad = llmd("bad", gpu="tpu-v9")
    with operator(kube) as runner:
        kube.create(LLMD, bad)
        st = wait_for(lambda: (kube.get(LLMD, NS, "bad").get("status") or {}).get("conditions"), what="conditions")
        ev = wait_for(lambda: events(kube, "InvalidSpec"), what="InvalidSpec event")
        time.sleep(1.0)  # timers ran too
    assert runner.exit_code == 0, runner.output
    (ready,) = [c for c in st if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.accelerator.type" in ready["message"]
    assert kube.get(LLMD, NS, "bad")["status"]["phase"] == "Invalid"
    assert "spec.accelerator.type" in ev[0]["message"] and ev[0]["type"] == "Warning"
    assert kube.list(DEPLOY, NS) == [] and kube.list("v1/services", NS) == []


def test_spec_update_follows_spec_keeps_managed_flags_and_does_not_fight_an_hpa(kube):
    with operator(kube) as runner:
        kube.create(LLMD, llmd("llama"))
        d = wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="deployment")
        # earlier decisions live in the Deployment; an HPA owns the replica count (above spec max 8)
        c = d["spec"]["template"]["spec"]["containers"][0]
        c = V.set_container_flag(c, "--max-num-seqs", 32)
        kube.create("autoscaling/v2/horizontalpodautoscalers", {
            "metadata": {"name": "llama-hpa", "namespace": NS},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                     "minReplicas": 1, "maxReplicas": 20}})
        kube.patch(DEPLOY, NS, "llama", {"spec": {"replicas": 12, "template": {"spec": {"containers": [c]}}}})
        spec = kube.get(LLMD, NS, "llama")["spec"]
        spec["engine"]["image"] = "vllm/vllm-openai:v0.12.0"
        kube.patch(LLMD, NS, "llama", {"spec": {"engine": spec["engine"]}})
        d = wait_for(lambda: (lambda x: x if x["spec"]["template"]["spec"]["containers"][0]["image"].endswith("v0.12.0")
                              else None)(kube.get(DEPLOY, NS, "llama")), what="image update")
        st = wait_for(lambda: (kube.get(LLMD, NS, "llama").get("status") or {}).get("ownership"), what="ownership")
    assert runner.exit_code == 0, runner.output
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert V.container_flag(c, "--max-num-seqs") == "32"  # a spec change does not undo a decision
    assert d["spec"]["replicas"] == 12  # not clamped to spec max 8: the HPA owns it
    assert st["server"]["replicas"] == "hpa/llama-hpa" and "only recommends" in st["server"]["message"]


async def test_light_reconcile_checks_deployments_only_and_a_full_pass_repairs_the_rest(kube):
    """Ticks between full passes touch Deployments only; a full pass recreates a deleted Service
    and prunes a pool the spec dropped (the spec handlers and every FULL_RECONCILE_TICKS-th tick)."""
    from kneecap.control import reconcile as R
    from kneecap.control.kube import KubeClient
    from kneecap.control.spec import parse_spec

    owner = kube.create(LLMD, llmd("llama"))
    spec = parse_spec(owner["spec"])
    client = KubeClient(kube.url)
    try:
        first = await R.reconcile(client, owner, spec)
        assert [p.created for p in first.pools] == [True] and kube.get("v1/services", NS, "llama")
        assert kube.delete("v1/services", NS, "llama")
        light = await R.reconcile(client, owner, spec, full=False)
        assert not light.changed and kube.get(DEPLOY, NS, "llama") and kube.get("v1/services", NS, "llama") is None
        full = await R.reconcile(client, owner, spec)
        assert not full.changed and kube.get("v1/services", NS, "llama") is not None  # Service recreated
        # a pool the spec no longer has is pruned by a full pass only
        disagg = parse_spec({**owner["spec"], "topology": {"mode": "disaggregated", "kvTransfer": {}}})
        await R.reconcile(client, owner, disagg)
        assert kube.get(DEPLOY, NS, "llama-decode") and kube.get(DEPLOY, NS, "llama") is None
        await R.reconcile(client, owner, spec, full=False)
        assert kube.get(DEPLOY, NS, "llama-decode") is not None  # a light pass deletes nothing
        gone = await R.reconcile(client, owner, spec)
        assert sorted(gone.deleted) == ["Deployment/llama-decode", "Deployment/llama-prefill",
                                        "Service/llama-decode", "Service/llama-prefill"]
    finally:
        await client.close()
