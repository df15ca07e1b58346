"""spec.targetRef, pure half: reading an adopted Deployment's vLLM argv in any shape, the patch
that moves only the managed flags (applied with the emulated API's strategic merge, the same code
that serves PATCH), and the tick's plan for adopted pools (advise-only when another controller
owns the target, nothing for a missing one)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from kneecap.control import applied as applied_record, manifests, plan, reconcile, status as status_helpers
from kneecap.control import status_codec, target, vllm_args
from kneecap.control.metric_series import Series
from kneecap.control.spec import parse_spec
from kneecap.emulation.admission import strategic_merge
from tests.support.plan_inputs import LABELS, NOW, cond, ring_status
from tests.support.profile_observations import observation

SIDECAR = {"name": "log-shipper", "image": "fluent-bit:3", "args": ["--max-num-seqs", "7"]}  # not vLLM


def user_deployment(container: dict, owner_refs: list | None = None) -> dict:
    """A Deployment as a Helm chart writes it: its own labels, a toleration, a volume, a sidecar."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llama-serving", "namespace": "serving", "uid": "d1", "generation": 3,
                     "labels": {"app": "llama", "helm.sh/chart": "vllm-stack-0.1.5"},
                     **({"ownerReferences": owner_refs} if owner_refs else {})},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}},
                 "template": {"metadata": {"labels": {"app": "llama"}},
                              "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                        "effect": "NoSchedule"}],
                                       "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf"}}],
                                       "containers": [copy.deepcopy(SIDECAR), container]}}},
        "status": {"observedGeneration": 3, "readyReplicas": 2, "updatedReplicas": 2, "replicas": 2}}


# (container, the max-num-seqs it serves with, the port it listens on)
SHAPES = {
    "vllm serve in command": ({"name": "vllm", "command": ["vllm", "serve", "meta-llama/Llama-2-7b-hf",
                                                           "--max-num-seqs", "64", "--dtype", "bfloat16"]}, 64, 8000),
    "command/args split": ({"name": "engine", "command": ["vllm", "serve"],
                            "args": ["meta-llama/Llama-2-7b-hf", "--port", "8080", "--max_num_seqs=48",
                                     "--enable-prefix-caching"]}, 48, 8080),
    "python -m api_server": ({"name": "server", "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                              "args": ["--model", "meta-llama/Llama-2-7b-hf", "--gpu-memory-utilization=0.85",
                                       "--port=9000"]}, None, 9000),
    "flag in command, more in args": ({"name": "vllm", "command": ["vllm", "serve", "m", "--max-num-seqs", "32"],
                                       "args": ["--gpu-memory-utilization", "0.8", "--swap-space", "4"]}, 32, 8000),
    "all in args, no command": ({"name": "vllm", "image": "vllm/vllm-openai",
                                 "args": ["--model", "m", "--max-num-seqs=16", "--max-model-len", "4096"]}, 16, 8000),
}


def _without_managed(tokens: list[str]) -> list[str]:
    for flag in target.TUNED_FLAGS:
        tokens = vllm_args.remove_flag(tokens, flag)
    return tokens


@pytest.mark.parametrize("shape", SHAPES)
def test_the_patch_moves_only_the_managed_flags_in_every_argv_shape(shape):
    container, cap, port = SHAPES[shape]
    deploy = user_deployment(copy.deepcopy(container))
    c = target.find_container(deploy, None)
    assert c["name"] == container["name"]  # not the sidecar, whatever the vLLM container is called
    assert target.port_of(c) == port
    live = manifests.live_settings(deploy, manifests.EngineSettings(999, 0.9), c)
    assert live.max_num_seqs == (cap if cap is not None else 999) and live.replicas == 2

    settings = manifests.EngineSettings(96, 0.72, None, 5)
    patch = target.settings_patch(deploy, c["name"], settings, set_replicas=False)
    assert "replicas" not in patch["spec"]
    (sent,) = patch["spec"]["template"]["spec"]["containers"]
    assert set(sent) - {"name"} <= {"args", "command"} and sent["name"] == c["name"]
    after = strategic_merge(deploy, patch)

    a = target.find_container(after, c["name"])
    assert manifests.live_settings(after, manifests.EngineSettings(999, 0.9), a) == manifests.EngineSettings(
        96, 0.72, None, 2)
    # every other argument as written, in order, on its side of the command/args split
    for key in ("command", "args"):
        assert _without_managed(list(a.get(key) or [])) == _without_managed(list(c.get(key) or []))
    assert after["spec"]["template"]["spec"]["containers"][0] == SIDECAR  # its look-alike flag untouched
    assert target.changed_paths(target.without_tuned_flags(deploy["spec"]["template"], c["name"]),
                                target.without_tuned_flags(after["spec"]["template"], c["name"])) == []
    assert {k: v for k, v in after.items() if k != "spec"} == {k: v for k, v in deploy.items() if k != "spec"}


def test_a_flag_keeps_its_spelling_and_place_and_duplicates_collapse_to_the_first():
    argv = ["vllm", "serve", "m", "--max_num_seqs", "64", "--dtype", "half", "--max-num-seqs=8"]
    assert vllm_args.set_flag(argv, "--max-num-seqs", 96, keep_spelling=True) == [
        "vllm", "serve", "m", "--max_num_seqs", "96", "--dtype", "half"]
    assert vllm_args.set_flag(["vllm", "serve", "m"], "--max-num-seqs", 96, keep_spelling=True) == [
        "vllm", "serve", "m", "--max-num-seqs=96"]
    assert vllm_args.set_flag(argv, "--max-num-seqs", 96) == [
        "vllm", "serve", "m", "--max-num-seqs=96", "--dtype", "half"]


def test_who_controls_a_target_and_what_cannot_be_written():
    ref = {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime", "name": "llama",
           "uid": "r1", "controller": True}
    owned = user_deployment(SHAPES["vllm serve in command"][0], [ref])
    c = target.find_container(owned, None)
    assert target.adoption(owned, c) == target.Adoption("vllm", 8000, "VLLMRuntime/llama", tensor_parallel_size=1)
    assert target.adoption(owned, c).advise_only
    merely_owned = user_deployment(c, [{**ref, "controller": False}])  # an owner that does not reconcile it
    assert not target.adoption(merely_owned, c).advise_only
    shell = user_deployment({"name": "vllm", "command": ["sh", "-c", "vllm serve m --max-num-seqs 8 && sleep 1"]})
    a = target.adoption(shell, target.find_container(shell, None))
    assert a.advise_only and a.controller is None and "shell script" in a.unpatchable
    assert target.find_container(owned, "nope") is None
    assert target.find_container(owned, "log-shipper")["name"] == "log-shipper"


# ---------------------------------------------------------------- the tick's plan for adopted pools

RAW = {"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
       "targetRef": {"name": "llama-serving"},
       "control": {"mode": "enforce", "interval": "30s", "window": "60s", "cooldown": "600s", "minObservations": 3}}
SPEC = parse_spec(RAW)
USER = {"name": "vllm", "command": ["vllm", "serve"],
        "args": ["meta-llama/Llama-2-7b-hf", "--max-num-seqs", "32", "--gpu-memory-utilization", "0.9",
                 "--disable-log-requests"]}


def adopted(owner_refs=None, container=USER, external=True) -> reconcile.PoolState:
    deploy = user_deployment(copy.deepcopy(container), owner_refs)
    (pool,) = manifests.pools("llm", SPEC)
    c = target.find_container(deploy, None)
    live = manifests.live_settings(deploy, manifests.initial_settings(SPEC, "server"), c)
    return reconcile.PoolState(pool, deploy, live, reconcile.Ownership("manager/helm" if external else "kneecap"),
                               adoption=target.adoption(deploy, c))


def plan_for(state: reconcile.PoolState, curve, spec=SPEC, **kw) -> plan.Plan:
    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    g = plan.TickInput("serving", "llm", 2, (plan.PoolWindow("server", state, plan.OBSERVED, observation=obs),), ring,
                       full_pass=True, **kw)
    return plan.plan(g, status, spec, NOW)


def test_an_adopted_writable_target_gets_one_strategic_patch_of_its_flags_and_the_record(curve):
    assert manifests.pools("llm", SPEC) == [manifests.Pool("server", "llama-serving")]
    p = plan_for(adopted(), curve)
    (patch,) = p.patches
    assert patch.name == "llama-serving" and patch.content_type == target.STRATEGIC
    (sent,) = patch.body["spec"]["template"]["spec"]["containers"]
    assert sent == {"name": "vllm", "args": ["meta-llama/Llama-2-7b-hf", "--max-num-seqs", "64",
                                             "--gpu-memory-utilization", sent["args"][4], "--disable-log-requests"]}
    assert "replicas" not in patch.body["spec"]  # helm owns them
    record = json.loads(patch.body["metadata"]["annotations"][applied_record.APPLIED_ANNOTATION])
    assert record["maxNumSeqs"] == 64 and set(patch.body["metadata"]) == {"annotations"}
    assert cond(p.status, status_helpers.ADVISORY)["status"] == "False"
    assert p.status["ownership"]["server"]["target"] == {"deployment": "llama-serving", "container": "vllm",
                                                         "adviseOnly": False, "tensorParallelSize": 1}


@pytest.mark.parametrize("refs, container, reason, needle", [
    ([{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "llama", "uid": "k",
       "controller": True}], USER, "TargetControlled", "InferenceService/llama"),
    ([{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "llama", "uid": "l",
       "controller": True}], USER, "TargetControlled", "LeaderWorkerSet/llama"),
    (None, {"name": "vllm", "command": ["sh", "-c", "vllm serve m --max-num-seqs 32"]}, "ArgvNotWritable",
     "shell script"),
])
def test_a_target_kneecap_may_not_write_is_advised_only(curve, refs, container, reason, needle):
    p = plan_for(adopted(refs, container, external=False), curve)
    assert p.patches == ()
    a = cond(p.status, status_helpers.ADVISORY)
    assert a["status"] == "True" and a["reason"] == reason and needle in a["message"]
    d = p.status["lastDecision"]
    assert d["reason"] == "Advised" and d["target"]["maxNumSeqs"] == 64 and needle in d["message"]
    assert p.status["recommendation"]["maxNumSeqs"] >= 64  # still computed and reported
    assert plan.MetricUpdate("inc", Series.DECISIONS, (*LABELS, "Advised"), 1.0) in p.metrics


def test_a_missing_target_creates_nothing_and_says_so(curve):
    status, ring = ring_status(curve)
    msg = "Deployment serving/llama-serving (spec.targetRef, server) not found; kneecap creates nothing for it"
    p = plan.plan(plan.TickInput("serving", "llm", 2, (), ring, full_pass=True, missing_targets=(msg,)), status,
                  SPEC, NOW)
    assert p.patches == ()
    r = cond(p.status, status_helpers.READY)
    assert r["status"] == "False" and r["reason"] == "TargetMissing" and r["message"] == msg
    assert p.status["lastDecision"]["reason"] == "TargetMissing"
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "TargetMissing")]


def test_an_adopted_argv_sized_in_bytes_is_moved_in_bytes(curve):
    """vLLM's --kv-cache-memory-bytes overrides the utilisation: kneecap moves the flag the user set."""
    user = {**USER, "args": ["meta-llama/Llama-2-7b-hf", "--max-num-seqs", "32", "--kv-cache-memory-bytes",
                             str(40 * 1024**3)]}
    p = plan_for(adopted(container=user), curve)
    (patch,) = p.patches
    (sent,) = patch.body["spec"]["template"]["spec"]["containers"]
    assert sent["args"][:4] == ["meta-llama/Llama-2-7b-hf", "--max-num-seqs", "64", "--kv-cache-memory-bytes"]
    kv = int(sent["args"][4])
    assert 0 < kv < 40 * 1024**3 and len(sent["args"]) == 5  # no --gpu-memory-utilization added
    record = json.loads(patch.body["metadata"]["annotations"][applied_record.APPLIED_ANNOTATION])
    assert record["kvCacheMemoryBytes"] == kv


PD_RAW = {**RAW, "targetRef": {"prefill": {"name": "llama-prefill"}, "decode": {"name": "llama-decode"}},
          "topology": {"mode": "disaggregated", "kvTransfer": {}, "prefill": {"min": 1, "max": 4},
                       "decode": {"min": 1, "max": 4}}}


def test_an_adopted_pair_with_a_controlled_prefill_pool_patches_only_the_decode_pool(curve):
    spec = parse_spec(PD_RAW)
    lws = [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "llama-prefill",
            "uid": "l", "controller": True}]
    states = {}
    for pool, refs in zip(manifests.pools("llm", spec), (lws, None)):
        deploy = user_deployment(copy.deepcopy(USER), refs)
        deploy["metadata"]["name"] = pool.name
        c = target.find_container(deploy, None)
        live = manifests.live_settings(deploy, manifests.initial_settings(spec, pool.role), c)
        states[pool.role] = reconcile.PoolState(pool, deploy, live, reconcile.Ownership("kneecap"),
                                                adoption=target.adoption(deploy, c))
    status, _ = ring_status(curve)
    for e in status["observations"]:
        e["pool"] = "decode"
    status["workload"]["pool"] = status["lastWindow"]["pool"] = "decode"
    obs = replace(observation(curve[32]), t_end_s=NOW)
    g = plan.TickInput("serving", "llm", 2, (plan.PoolWindow("prefill", states["prefill"], plan.IDLE),
                                         plan.PoolWindow("decode", states["decode"], plan.OBSERVED, observation=obs)),
                   status_codec.parse_ring(status["observations"], "decode"), full_pass=True)
    p = plan.plan(g, status, spec, NOW)
    assert [(x.name, x.content_type) for x in p.patches] == [("llama-decode", target.STRATEGIC)]
    (sent,) = p.patches[0].body["spec"]["template"]["spec"]["containers"]
    assert sent["name"] == "vllm" and sent["args"][1:3] == ["--max-num-seqs", "64"]
    a = cond(p.status, status_helpers.ADVISORY)
    assert (a["status"], a["reason"]) == ("True", "TargetControlled")
    assert "llama-prefill" in a["message"] and "LeaderWorkerSet/llama-prefill" in a["message"]
    assert "llama-decode" not in a["message"]
    assert p.status["ownership"]["prefill"]["target"]["adviseOnly"] is True
    assert p.status["ownership"]["decode"]["target"]["adviseOnly"] is False
    alloc = p.status["allocation"]  # SARA still sizes the pool it may not write: 2 -> 1, advised only
    assert alloc["prefillReplicas"] == alloc["prefillDecision"]["replicas"] == 1
    assert alloc["prefillDecision"]["reason"] == "Advised" and states["prefill"].settings.replicas == 2
    assert "LeaderWorkerSet/llama-prefill" in alloc["prefillDecision"]["message"]


@pytest.mark.parametrize("tail, tp", [
    (["--tensor-parallel-size", "4"], 4), (["--tensor-parallel-size=2"], 2), (["-tp", "8"], 8), (["-tp=2"], 2),
    (["--tensor_parallel_size", "4"], 4), ([], 1), (["--tensor-parallel-size", "$(TP)"], None),
    (["-tp", "2", "--tensor-parallel-size", "4"], 4),  # the last one wins, as in argparse
])
def test_adoption_reads_the_tensor_parallel_size_from_the_argv(tail, tp):
    c = {**USER, "args": USER["args"] + tail}
    assert target.tensor_parallel_of(c) == tp
    shell = {"name": "vllm", "command": ["sh", "-c", " ".join(["vllm", "serve", *USER["args"], *tail])]}
    assert target.adoption(user_deployment(shell), shell).tensor_parallel_size == tp


def test_an_adopted_tensor_parallel_target_is_costed_per_gpu_and_keeps_its_argv(curve):
    """TP 4 read from the target's `-tp 4`: status names it, a replica costs 4 GPUs, the patch
    leaves the flag as the user wrote it."""
    user = {**USER, "args": USER["args"] + ["-tp", "4"]}
    p = plan_for(adopted(container=user), curve, parse_spec({**RAW, "accelerator": {"type": "h100-64gb", "costPerHour": 5.0}}))
    assert p.status["ownership"]["server"]["target"]["tensorParallelSize"] == 4
    alloc = p.status["allocation"]
    assert alloc["gpusPerReplica"] == 4 and alloc["costPerHour"] == pytest.approx(4 * 5.0 * alloc["replicas"])
    (patch,) = p.patches
    (sent,) = patch.body["spec"]["template"]["spec"]["containers"]
    assert sent["args"][-2:] == ["-tp", "4"] and sent["args"][2] == "64"
