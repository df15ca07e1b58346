"""The virtual-time cluster: in-memory API semantics, the Deployment → ReplicaSet → Pod chain,
the kubelet's model-load delay, what happens to requests when a pod is replaced, and the
operator it runs (the kopf handlers' own lifecycle functions)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kneecap.control import lifecycle, manifests
from kneecap.control.kube import ApiError, deployments_path, pods_path, replicasets_path
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.cluster import DONE, LOST, OperatorDriver, VirtualCluster, llmd_path
from kneecap.emulation.store import Store
from kneecap.emulation.merge_patch import merge_patch
from kneecap.emulation.workloads import HASH_LABEL
from kneecap.sim.engine_node import KubeletConfig
from kneecap.sim.replay import ReplayConfig, llmd_spec, static_deployment

ARCH, GPU = get_arch("llama-3.1-8b"), get_gpu("h100-80gb")


def test_merge_patch_rfc7386():
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None, "e": 3}, "d": [2]}) == \
        {"a": {"c": 2, "e": 3}, "d": [2]}
    assert merge_patch({"a": 1}, {"a": {"x": None}}) == {"a": {}}


def test_api_versions_generation_status_subresource_and_conflicts():
    api = Store(lambda: 1_700_000_000.0)
    run = asyncio.new_event_loop().run_until_complete
    path = deployments_path("ns")
    obj, created = run(api.create(path, {"kind": "Deployment", "metadata": {"name": "d", "labels": {"a": "1"}},
                                         "spec": {"replicas": 1}}))
    assert created and obj["metadata"]["generation"] == 1 and obj["metadata"]["uid"]
    again, created = run(api.create(path, {"metadata": {"name": "d"}, "spec": {"replicas": 9}}))
    assert not created and again["spec"]["replicas"] == 1  # 409: the live object comes back
    rv = obj["metadata"]["resourceVersion"]
    same = run(api.patch(f"{path}/d", {"spec": {"replicas": 1}}))
    assert same["metadata"]["resourceVersion"] == rv  # a no-op changes nothing
    p = run(api.patch(f"{path}/d", {"spec": {"replicas": 2}, "status": {"x": 1}}))
    assert p["metadata"]["generation"] == 2 and "status" not in p  # status is a subresource
    run(api.patch_status(f"{path}/d", {"readyReplicas": 2}))
    live = run(api.get(f"{path}/d"))
    assert live["status"] == {"readyReplicas": 2} and live["metadata"]["generation"] == 2
    assert int(live["metadata"]["resourceVersion"]) > int(p["metadata"]["resourceVersion"])
    live["spec"]["replicas"] = 99  # a caller's copy
    assert run(api.get(f"{path}/d"))["spec"]["replicas"] == 2
    assert run(api.list(path, "a=1")) and not run(api.list(path, "a=2"))
    with pytest.raises(ApiError) as e:
        run(api.patch(f"{path}/nope", {"spec": {}}))
    assert e.value.status == 404
    assert run(api.get(f"{path}/nope")) is None


def _cluster(kubelet: KubeletConfig, replicas: int = 1, strategy: dict | None = None, cap: int = 256):
    cl = VirtualCluster(ARCH, GPU, kubelet)
    d = static_deployment(ReplayConfig(), cl, cap, 0.9, replicas)
    if strategy:
        d["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": strategy}
    else:  # no strategy: Kubernetes' defaults (25% surge, 25% unavailable)
        d["spec"].pop("strategy")
    cl.create(deployments_path(cl.namespace), d)
    cl.prewarm()
    return cl


def test_ownership_chain_and_unique_pod_ips():
    cl = _cluster(KubeletConfig(), replicas=3)
    api, ns = cl.api, cl.namespace
    d = api.peek(deployments_path(ns, "llm"))
    (rs,) = api.list_now(replicasets_path(ns))
    assert rs["metadata"]["ownerReferences"][0]["uid"] == d["metadata"]["uid"]
    assert rs["metadata"]["ownerReferences"][0]["controller"] is True
    pods = api.list_now(pods_path(ns), manifests.pool_selector("llm", "server"))
    assert len(pods) == 3
    for p in pods:
        ref = p["metadata"]["ownerReferences"][0]
        assert ref["uid"] == rs["metadata"]["uid"] and ref["kind"] == "ReplicaSet" and ref["controller"]
        assert p["metadata"]["labels"][HASH_LABEL] == rs["metadata"]["labels"][HASH_LABEL]
        assert {"type": "Ready", "status": "True"} in p["status"]["conditions"]
    assert len({p["status"]["podIP"] for p in pods}) == 3
    assert d["status"]["readyReplicas"] == 3 and d["status"]["updatedReplicas"] == 3
    api.delete_now(deployments_path(ns, "llm"))  # garbage collection follows ownerReferences
    assert api.list_now(replicasets_path(ns)) == [] and api.list_now(pods_path(ns)) == []


def _rollout(cl: VirtualCluster, at_s: float, cap: int, watch: list):
    """Change the template at ``at_s``; record (t, ready pods, their caps) every second."""
    def change(t):
        d = cl.api.peek(deployments_path(cl.namespace, "llm"))
        cl.api.patch_now(deployments_path(cl.namespace, "llm"),
                         manifests.with_settings(d, manifests.EngineSettings(cap, 0.9, None, d["spec"]["replicas"])))
        cl.settle()
    cl.at(at_s, change)
    cl.every(1.0, lambda t: watch.append((t, [p.config.max_num_seqs for p in cl.ready_pods()])), start_s=0.0)


def _requests(n: int, every_s: float, out_tokens: int):
    return np.arange(n) * every_s, np.full(n, 500), np.full(n, out_tokens)


@pytest.mark.parametrize("interrupted", ["lost", "retried"])
def test_recreate_like_rollout_pod_not_ready_while_loading(interrupted):
    """maxSurge 0: the old pod goes at once; no pod is Ready for the load delay; what the old pod
    held is lost or retried, as configured."""
    k = KubeletConfig(load_gib_s=2.0, startup_s=20.0, termination_grace_s=0.0, interrupted=interrupted)
    delay = k.load_delay_s(ARCH)
    assert delay == pytest.approx(ARCH.weight_bytes / 2**30 / 2.0 + 20.0)
    cl = _cluster(k, strategy={"maxSurge": 0, "maxUnavailable": 1})
    watch: list = []
    _rollout(cl, 10.0, 64, watch)
    rq = cl.run(*_requests(100, 0.2, 2000), drain_limit_s=400)
    ready = {round(t): caps for t, caps in watch}
    assert ready[9] == [256]
    down = [t for t, caps in ready.items() if not caps]
    assert min(down) == 10 and max(down) == int(np.ceil(10 + delay)) - 1  # not Ready while loading
    assert ready[int(np.ceil(10 + delay))] == [64]
    st = cl.node.stats
    assert st.restarts == 1 and st.interrupted_restart > 0
    cut = rq.attempts > 0  # every request reached a pod
    assert cut.all()
    if interrupted == "lost":
        assert (rq.state == LOST).sum() == st.interrupted_restart
    else:
        assert (rq.state == DONE).all() and (rq.attempts == 2).sum() == st.interrupted_restart
    # requests sent while no pod was Ready waited at the router: their first token comes after the load
    waited = (rq.arrival_s > 10.0) & (rq.arrival_s < 10 + delay - 1) & (rq.state == DONE)
    assert waited.any() and np.all(rq.first_token_s[waited] >= 10 + delay)


def test_default_rolling_update_keeps_serving_and_drains():
    """Kubernetes' defaults (25% surge) on one replica: the new pod loads beside the old one, the
    old one leaves only when the new one is Ready, finishes its requests within the grace period."""
    k = KubeletConfig(load_gib_s=2.0, startup_s=20.0, termination_grace_s=30.0, interrupted="lost")
    cl = _cluster(k)
    watch: list = []
    _rollout(cl, 10.0, 64, watch)
    rq = cl.run(*_requests(200, 0.25, 50))
    assert all(caps for _, caps in watch if _ < 50)  # a Ready pod at every second
    assert cl.node.stats.restarts == 1 and cl.node.stats.interrupted_restart == 0
    assert (rq.state == DONE).all()
    assert [caps for t, caps in watch if t == 49.0] == [[64]]
    assert cl.gpu_s > 50.0 + 0.9 * k.load_delay_s(ARCH)  # the surge pod held a GPU while loading


def test_buffered_itl_histogram_renders_the_same_buckets_as_observing_each_token():
    from kneecap.observe.scrape import parse_metrics
    from kneecap.sim.engine import Engine, engine_config
    from kneecap.sim.metrics import buffered_metrics, render_metrics
    from kneecap.sim.metrics import TwinMetrics

    cfg = engine_config(ARCH, GPU, max_num_seqs=32)
    pages = []
    for buffered in (False, True):
        eng, m = Engine(cfg), TwinMetrics("m", cfg)
        if buffered:
            m = buffered_metrics(m)
        for i in range(120):
            eng.add_request(100 + i, 20 + i % 17, arrival_s=0.03 * i)
        while eng.has_work():
            m.on_step(eng.step())
        pages.append(parse_metrics(render_metrics(m, eng), t_s=0.0))
    name = "vllm:inter_token_latency_seconds"
    plain, buf = pages
    assert dict(plain.get(name + "_bucket")) == dict(buf.get(name + "_bucket"))
    assert plain.value(name + "_count") == buf.value(name + "_count") > 1000
    assert buf.value(name + "_sum") == pytest.approx(plain.value(name + "_sum"), rel=1e-12)


def test_a_run_stops_once_its_slo_quantile_cannot_be_met():
    from kneecap.sim.cluster import MissBudget

    arrival, inp, out = np.arange(4000) * 0.01, np.full(4000, 2000), np.full(4000, 300)  # 100 req/s on one pod
    whole = _cluster(KubeletConfig()).run(arrival, inp, out, drain_limit_s=60)
    cl = _cluster(KubeletConfig())
    budget = MissBudget(ttft_s=1.0, tpot_s=0.05, max_misses=200)
    cut = cl.run(arrival, inp, out, drain_limit_s=60, budget=budget)
    assert cl.aborted and cl.t_s < arrival[-1]
    ttft = whole.first_token_s - whole.arrival_s
    assert np.sum(~(ttft <= 1.0)) > 200  # the whole run misses far more than the budget allows
    assert max(cl.misses_ttft, cl.misses_tpot) == 201
    done = cut.state == DONE  # what finished before the stop is what the whole run did
    np.testing.assert_array_equal(cut.finish_s[done], whole.finish_s[done])


def test_a_tensor_parallel_pod_holds_tp_gpus_and_runs_a_tp_engine():
    """A pod whose vLLM flags say --tensor-parallel-size 2 runs a TP-2 twin engine and holds two
    GPUs: GPU time (what a replay prices) is twice the pod time."""
    from kneecap.control import vllm_args
    from kneecap.model.memory import memory_split

    arch70 = get_arch("llama-2-70b")
    cl = VirtualCluster(arch70, GPU, KubeletConfig())
    d = static_deployment(ReplayConfig(architecture="llama-2-70b"), cl, 64, 0.9, 2)
    d["spec"]["template"]["spec"]["containers"] = [
        vllm_args.set_container_flag(c, "--tensor-parallel-size", 2) if c["name"] == manifests.CONTAINER else c
        for c in d["spec"]["template"]["spec"]["containers"]]
    cl.create(deployments_path(cl.namespace), d)
    cl.prewarm()
    rq = cl.run(*_requests(20, 0.5, 16))
    assert (rq.state == DONE).all()
    pods = list(cl.node.pods.values())
    assert len(pods) == 2 and all(p.gpus == 2 and p.config.tensor_parallel_size == 2 for p in pods)
    assert pods[0].config.num_gpu_blocks == memory_split(arch70, GPU, 0.9, 64, pods[0].config.max_num_batched_tokens,
                                                         tensor_parallel_size=2).num_gpu_blocks
    assert cl.replica_s > 0 and cl.gpu_s == pytest.approx(2 * cl.replica_s)


def _operator(spec: dict) -> tuple[VirtualCluster, OperatorDriver]:
    """An LLMDeployment created in a virtual cluster, and the operator driving it (15 s interval)."""
    cl = VirtualCluster(ARCH, GPU, KubeletConfig(), with_metrics=True)
    cl.create(llmd_path(cl.namespace), {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                                        "metadata": {"name": "llm"}, "spec": spec})
    return cl, OperatorDriver(cl, "llm", tick_s=15.0)


def test_virtual_time_runs_the_kopf_handlers_lifecycle():
    """The create handler, then the control timer: it ticks once it is due, not on every call."""
    cfg = ReplayConfig(interval_s=15.0)
    cl, op = _operator(llmd_spec(cfg))
    try:
        op.created()
        status = cl.api.get_now(llmd_path(cl.namespace, "llm"))["status"]
        assert {c["type"] for c in status["conditions"]} == {"Ready", "Conflict"}
        assert [e["reason"] for e in op.events] == ["Reconciled"]  # the pool's Deployment created
        op.tick(0.0)
        op.tick(0.0)  # the same instant again: not due
        assert len(op.decisions) == 1
        cl.t_s = 15.0
        op.tick(15.0)
        assert len(op.decisions) == 2
    finally:
        op.close()


def test_an_invalid_spec_is_reported_once_and_never_ticks():
    spec = llmd_spec(ReplayConfig())
    spec["engine"]["maxNumSeqs"] = -1
    cl, op = _operator(spec)
    try:
        op.created()
        status = cl.api.get_now(llmd_path(cl.namespace, "llm"))["status"]
        assert status["phase"] == "Invalid" and status["invalidField"] == "spec.engine.maxNumSeqs"
        assert [e["reason"] for e in op.events] == ["InvalidSpec"]
        op.tick(0.0)
        assert not op.decisions and [e["reason"] for e in op.events] == ["InvalidSpec"]
    finally:
        op.close()


def test_a_tick_the_operator_stops_during_writes_nothing():
    """kopf stops the control timer when the operator exits or pauses for a peer; the replica's
    goodbye (or the peer's keep-alive) may already be out, so a tick under way then applies
    nothing and writes no status: another replica may lead already."""
    cl, op = _operator(llmd_spec(ReplayConfig(interval_s=15.0)))
    try:
        op.created()
        path = llmd_path(cl.namespace, "llm")
        asked: list[int] = []
        stopping = lambda: bool(asked.append(1)) or True  # noqa: E731 (stopped from the tick's first check)
        before = cl.api.get_now(path)
        deploy = cl.api.get_now(deployments_path(cl.namespace) + "/llm")
        n_events = len(op.events)
        status = op._run(lifecycle.on_timer(op.operator, before, op.mem, op.lock,
                                            lifecycle.Sink({}, op._event, op.logger), stopping=stopping))
        assert status is None and asked
        assert cl.api.get_now(path)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert cl.api.get_now(deployments_path(cl.namespace) + "/llm") == deploy
        assert len(op.events) == n_events
        # the same tick, not stopped, writes its status
        cl.t_s = 15.0
        op.tick(15.0)
        assert cl.api.get_now(path)["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
        assert op.decisions
    finally:
        op.close()
