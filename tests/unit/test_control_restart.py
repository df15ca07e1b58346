"""Restarts that need no spare GPU and pay for themselves (issue 13 item 3): the owned
Deployment's RollingUpdate, the restart cost measured from the pods (or modelled), the guard
that weighs it against the predicted gain, the one-replica downtime hold, and caps rounded
to vLLM's CUDA-graph capture sizes."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from kneecap.control import (cudagraph, manifests, plan, policy, reconcile, restart, status as status_helpers,
                             status_codec)
from kneecap.control.manifests import EngineSettings
from kneecap.control.spec import parse_spec
from kneecap.model.arch import get_arch
from tests.support.plan_inputs import NOW, OWNER, RAW, gathered, ring_status
from tests.support.profile_observations import observation

CUR = EngineSettings(256, 0.9, None, 4)
OK = policy.GuardState(now_s=10_000.0, last_applied_s=None, rollout_in_progress=False, n_observations=5,
                       fit_ok=True)


def _spec(replicas: int = 2, **control):
    """The plan tables' spec with the pool held at ``replicas`` (GAUSS's count cannot move it)."""
    return parse_spec({**RAW, "topology": {"replicas": {"min": replicas, "max": replicas}},
                       "control": {**RAW["control"], **control}})


def _cost(restart_s=40.0, pool_tok_s=8000.0, pods=4, horizon_s=300.0, downtime=False, memory_value=1.0):
    return restart.RestartCost(restart_s, restart.MEASURED, pool_tok_s, pods, horizon_s, downtime, memory_value)


def _guard(target, gain, mem=0.0, cost=None, spec=None, cur=CUR):
    spec = spec or _spec(allowDowntime=False)
    return policy.guard(cur, policy.Proposal(target, gain, mem), spec.control, spec.batching,
                        replace(spec.topology.replicas, min=1, max=8), replace(OK, restart=cost))


# ---------------------------------------------------------------- the guard's table

# 4 pods × 40 s at 8000 tok/s (2000 per pod) lose 320,000 tokens; over a 300 s horizon a
# throughput gain g adds g × 8000 × 300 = g × 2.4 M tokens: the break-even is g = 13.3%.
@pytest.mark.parametrize("gain,mem,memory_value,action,reason,gain_tokens", [
    (0.10, 0.0, 1.0, policy.HOLD, "RestartNotWorthIt", 240_000),  # 240k < 320k
    (0.20, 0.0, 1.0, policy.APPLY, "Recommended", 480_000),  # 480k > 320k
    (-0.05, 0.30, 1.0, policy.APPLY, "Recommended", 600_000),  # 25% net at memory value 1
    (-0.05, 0.30, 0.0, policy.HOLD, "RestartNotWorthIt", 0),  # released memory worth nothing
])
def test_a_restart_is_applied_only_when_its_gain_over_the_horizon_exceeds_the_tokens_it_loses(
        gain, mem, memory_value, action, reason, gain_tokens):
    d = _guard(EngineSettings(192, 0.7, None, 4), gain, mem, _cost(memory_value=memory_value))
    assert (d.action, d.reason) == (action, reason)
    assert d.restart["costTokens"] == 320_000 and d.restart["gainTokens"] == gain_tokens
    assert d.restart["restartSeconds"] == 40.0 and d.restart["podsRestarted"] == 4
    assert f"{gain_tokens} tokens gained over the 300s horizon (Default) vs 320000 lost" in d.message


def test_a_capacity_gain_pays_only_where_the_pool_turns_work_away(curve):  # noqa: F811
    """20% more capacity at the cap pays the restart (480k > 320k) only while the cap or the KV
    cache limits the pool (batch at the cap, cache full, preemptions); elsewhere it adds no
    tokens (a loss still counts, and so does released memory at its value)."""
    idle = replace(_cost(), saturated=False)
    d = _guard(EngineSettings(192, 0.7, None, 4), 0.20, 0.0, idle)
    assert (d.action, d.reason) == (policy.HOLD, "RestartNotWorthIt") and d.restart["gainTokens"] == 0
    assert d.restart["saturated"] is False and "neither the cap nor the KV cache" in d.message
    assert idle.gain_tokens(-0.05, 0.30) == pytest.approx(0.25 * 8000 * 300)
    assert _guard(EngineSettings(192, 0.7, None, 4), 0.20, 0.0, _cost()).action == policy.APPLY
    light = replace(observation(curve[32]), max_batch=20.0, kv_usage_max=0.3, preemptions=0.0, queue_len=5.0)
    assert not restart.saturated(light, 256)  # prompts waiting for prefill: the cap does not bind
    assert restart.saturated(replace(light, max_batch=256.0), 256)
    assert restart.saturated(replace(light, kv_usage_max=0.95), 256)
    assert restart.saturated(replace(light, preemptions=2.0), 256)


def test_a_replica_change_still_applies_alone_when_the_flags_are_held():
    d = _guard(EngineSettings(192, 0.7, None, 6), 0.05, cost=_cost())
    assert d.action == policy.APPLY and d.target == EngineSettings(256, 0.9, None, 6)
    assert "flags held (RestartNotWorthIt)" in d.message


def test_one_replica_without_surge_is_downtime_held_unless_the_spec_allows_it():
    one = replace(CUR, replicas=1)
    cost = _cost(pods=1, downtime=True, horizon_s=3000.0)
    held = _guard(EngineSettings(192, 0.9, None, 1), 0.5, cost=cost, cur=one)
    assert (held.action, held.reason) == (policy.HOLD, "RestartNeedsDowntime")
    assert "no pod serves for ~40s" in held.message and held.restart["downtime"] is True
    allowed = _guard(EngineSettings(192, 0.9, None, 1), 0.5, cost=cost, cur=one, spec=_spec(allowDowntime=True))
    assert allowed.action == policy.APPLY and "downtime ~40s (allowDowntime)" in allowed.message


# ---------------------------------------------------------------- restart cost from the API

def _pod(created: float | None, ready: float | None, status="True"):
    cond = {"type": "Ready", "status": status, **({"lastTransitionTime": status_helpers.iso(ready)} if ready else {})}
    meta = {"name": "p", **({"creationTimestamp": status_helpers.iso(created)} if created else {})}
    return {"metadata": meta, "status": {"conditions": [cond]}}


def test_start_to_ready_is_read_from_creation_and_the_ready_transition():
    pods = [_pod(NOW, NOW + 52), _pod(NOW, NOW + 68), _pod(NOW, None), _pod(None, NOW),
            _pod(NOW, NOW + 30, status="False"), _pod(NOW, NOW),
            {"metadata": {"creationTimestamp": "yesterday"}, "status": {"conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "soon"}]}}]
    assert restart.start_to_ready_s(pods) == [52.0, 68.0]
    assert restart.pool_restart_s([52.0, 68.0, 300.0]) == 68.0 and restart.pool_restart_s([]) is None


def test_modelled_restart_is_weights_over_bandwidth_plus_startup():
    w = get_arch("llama-3.1-8b").weight_bytes
    assert restart.modelled_restart_s(w) == pytest.approx(w / 2**30 / 2.0 + 30.0)
    assert 35.0 < restart.modelled_restart_s(w) < 40.0  # 16 GB of weights


@pytest.mark.parametrize("replicas,strategy,surge_unavailable,no_ready", [
    (4, None, (1, 1), False),  # Kubernetes' defaults 25%/25%
    (1, None, (1, 0), False),  # 25% of 1: surge rounds up, unavailable down
    (1, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, (0, 1), True),
    (3, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, (0, 1), False),
    (2, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "0%"}}, (0, 1), False),
    (2, {"type": "Recreate"}, (0, 2), True),
    (0, None, (0, 1), False),  # scaled to 0: no pod to stop, no downtime
    (0, {"type": "Recreate"}, (0, 1), False),
])
def test_rolling_update_is_resolved_as_the_deployment_controller_does(replicas, strategy, surge_unavailable,
                                                                      no_ready):
    d = {"spec": {"replicas": replicas, **({"strategy": strategy} if strategy else {})}}
    assert restart.rolling_update(d) == surge_unavailable
    assert restart.leaves_no_ready_pod(d) is no_ready


def test_owned_deployments_roll_without_a_spare_gpu_by_default_and_as_the_spec_says():
    for rollout, want in ((None, {"maxSurge": 0, "maxUnavailable": 1}),
                          ({"maxSurge": "25%", "maxUnavailable": 0}, {"maxSurge": "25%", "maxUnavailable": 0})):
        spec = parse_spec({**RAW, **({"rollout": rollout} if rollout else {})})
        (pool,) = manifests.pools("llm", spec)
        d = manifests.deployment(OWNER, spec, pool, EngineSettings(32, 0.9, None, 3))
        assert d["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": want}


# ---------------------------------------------------------------- the plan: status, Event, measurement

def _live(replicas: int, spec):
    (pool,) = manifests.pools("llm", spec)
    settings = EngineSettings(32, 0.9, None, replicas)
    deploy = manifests.deployment(OWNER, spec, pool, settings)
    deploy["metadata"]["generation"] = 1
    deploy["status"] = {"observedGeneration": 1, "readyReplicas": replicas, "updatedReplicas": replicas}
    return reconcile.PoolState(pool, deploy, settings, reconcile.Ownership("kneecap"))


def _plan(curve, spec, replicas=2, measured=(), status_extra=None):
    status, ring = ring_status(curve)
    status.update(status_extra or {})
    obs = replace(observation(curve[32]), t_end_s=NOW)
    window = plan.PoolWindow("server", _live(replicas, spec), plan.OBSERVED, observation=obs, start_to_ready_s=measured)
    return plan.plan(gathered(window, ring), status, spec, NOW)


def _plan_with_history(curve, spec, history, measured=(90.0,)):
    """The plan on this tick's window (cap 32) after ``history`` (oldest first), 60 s windows."""
    obs = [replace(o, t_end_s=NOW - 60.0 * (len(history) - i)) for i, o in enumerate(history)]
    entries = [{"pool": "server", **status_helpers.ring_entry(o)} for o in obs]
    window = plan.PoolWindow("server", _live(2, spec), plan.OBSERVED,
                             observation=replace(observation(curve[32]), t_end_s=NOW), start_to_ready_s=measured)
    return plan.plan(gathered(window, status_codec.parse_ring(entries, "server")), {"observations": entries}, spec,
                     NOW)


def _steady(curve, n_32: int = 0):
    """Windows at caps 8 and 16 (the fit needs two batch levels) then ``n_32`` at cap 32, all under
    the cap-32 window's workload (its rate and lengths)."""
    rate = observation(curve[32]).request_rate_rps
    return [replace(observation(curve[c]), request_rate_rps=rate) for c in (8, 16)] + [observation(curve[32])] * n_32


def test_plan_holds_a_gain_smaller_than_the_restart_and_applies_a_larger_one(curve):
    # the same recommendation (cap 32 -> 64) after a workload that just changed (one 60 s window
    # of it: the gain over 60 s does not pay the 90 s restart) and after one steady for 3 windows;
    # no cooldown, so the history alone sets the horizon
    changed = [observation(curve[c]) for c in (8, 16)]  # their rates are not the cap-32 window's
    short = _plan_with_history(curve, _spec(cooldown="0s"), changed)
    d = short.status["lastDecision"]
    assert d["reason"] == "RestartNotWorthIt" and short.patches == ()
    assert d["restart"]["gainTokens"] < d["restart"]["costTokens"]
    assert d["restart"]["restartSeconds"] == 90.0 and d["restart"]["restartSource"] == "Measured"
    assert (d["restart"]["horizonSeconds"], d["restart"]["horizonSource"]) == (60.0, restart.WINDOW_HISTORY)
    (event,) = [e for e in short.events if e.reason == "RestartNotWorthIt"]
    assert f"{d['restart']['gainTokens']} tokens gained over the 60s horizon (the workload held for 1 window(s)" \
        in event.message
    assert f"vs {d['restart']['costTokens']} lost" in event.message
    long = _plan_with_history(curve, _spec(cooldown="0s"), _steady(curve))
    d = long.status["lastDecision"]
    assert d["reason"] == "Applied" and len(long.patches) == 1
    assert d["restart"]["gainTokens"] > d["restart"]["costTokens"]
    assert (d["restart"]["horizonSeconds"], d["restart"]["horizonSource"]) == (180.0, restart.WINDOW_HISTORY)


def test_the_cooldown_is_a_floor_under_the_horizon(curve):
    """A change is kept at least the cooldown (the operator does not revisit it sooner): after a
    workload that just changed, a 600 s cooldown is the horizon, and the change pays over it."""
    changed = [observation(curve[c]) for c in (8, 16)]
    d = _plan_with_history(curve, _spec(cooldown="600s"), changed).status["lastDecision"]
    assert (d["restart"]["horizonSeconds"], d["restart"]["horizonSource"]) == (600.0, restart.COOLDOWN)
    assert d["reason"] == "Applied" and d["restart"]["gainTokens"] > d["restart"]["costTokens"]
    h = restart.workload_horizon([], 60.0, 300.0, cooldown_s=900.0)
    assert (h.seconds, h.source) == (900.0, restart.COOLDOWN) and "no readable window" in h.note
    assert restart.workload_horizon([], 60.0, 300.0, cooldown_s=7200.0).seconds == restart.MAX_HORIZON_S


def test_a_zero_cooldown_still_applies_a_change_that_pays_over_a_steady_workload(curve):
    """Issue 23 item 7 (b): ``cooldown: 0s`` used to make the horizon 0, so no restart could pay;
    the horizon is the workload's, the cooldown only spaces changes."""
    d = _plan_with_history(curve, _spec(cooldown="0s"), _steady(curve, 2)).status["lastDecision"]
    assert d["reason"] == "Applied" and d["restart"]["horizonSeconds"] == 300.0  # 5 windows of 60 s
    assert d["restart"]["gainTokens"] > d["restart"]["costTokens"] > 0
    d = _plan_with_history(curve, _spec(cooldown="0s"), [observation(curve[c]) for c in (8, 16)]).status[
        "lastDecision"]
    assert d["reason"] == "RestartNotWorthIt" and d["restart"]["horizonSeconds"] == 60.0  # the workload just changed


def test_the_horizon_grows_with_a_longer_steady_history_and_is_capped(curve):
    spec = _spec(cooldown="0s", observationHistory=100)
    horizons = [_plan_with_history(curve, spec, _steady(curve, n)).status["lastDecision"]["restart"]
                for n in (0, 3, 10, 80)]
    assert [h["horizonSeconds"] for h in horizons] == [180.0, 360.0, 780.0, restart.MAX_HORIZON_S]
    assert {h["horizonSource"] for h in horizons} == {restart.WINDOW_HISTORY}


def _window(rate=10.0, il=250.0, ol=100.0, window_s=60.0):
    return SimpleNamespace(request_rate_rps=rate, input_len_mean=il, output_len_mean=ol, window_s=window_s)


def test_workload_horizon_is_the_current_workloads_run_in_window_seconds():
    h = restart.workload_horizon([_window()] * 5, interval_s=30.0, window_s=60.0)
    assert (h.seconds, h.source, h.windows, h.steady_s) == (300.0, restart.WINDOW_HISTORY, 5, 300.0)
    assert h.note == "the workload held for 5 window(s), 300s"
    # a change beyond 25% in the rate or either mean length ends the run; within it, not
    for older in (_window(rate=7.0), _window(il=400.0), _window(ol=50.0), _window(rate=float("nan"))):
        assert restart.workload_horizon([_window()] * 3 + [older] + [_window()] * 2, 30.0, 60.0).seconds == 120.0
    assert restart.workload_horizon([_window(rate=8.0, il=300.0, ol=80.0), _window()], 30.0, 60.0).seconds == 120.0
    # a light window's rate varies by counting alone: 18 vs 30 requests in 60 s may be the same workload, 6 not
    assert restart.workload_horizon([_window(rate=0.3), _window(rate=0.5)], 30.0, 60.0).seconds == 120.0
    assert restart.workload_horizon([_window(rate=0.1), _window(rate=0.5)], 30.0, 60.0).seconds == 60.0
    # bounded: one control interval below (a short window), MAX_HORIZON_S above
    assert restart.workload_horizon([_window(window_s=10.0)], 30.0, 10.0).seconds == 30.0
    capped = restart.workload_horizon([_window()] * 100, 30.0, 60.0)
    assert (capped.seconds, capped.steady_s) == (restart.MAX_HORIZON_S, 6000.0) and "capped at 3600s" in capped.note
    # no history (or a current window that cannot be read): the stated default, one window
    for ring in ([], [_window(rate=float("nan"))], [_window(window_s=0.0)]):
        d = restart.workload_horizon(ring, 30.0, 60.0)
        assert (d.seconds, d.source, d.windows) == (60.0, restart.DEFAULT, 0) and "default" in d.note
    # a pure function of the ring: the same ring, the same horizon
    ring = [_window(rate=r) for r in (5.0, 9.0, 10.0, 11.0, 10.5)]
    assert restart.workload_horizon(ring, 30.0, 60.0) == restart.workload_horizon(list(ring), 30.0, 60.0)


def test_plan_keeps_the_last_measured_restart_and_models_one_before_any(curve):
    spec = _spec(cooldown="600s")
    first = _plan(curve, spec, measured=(61.0, 75.0, 80.0))
    assert first.status["restartCost"]["server"]["seconds"] == 75.0
    kept = _plan(curve, spec, status_extra={"restartCost": first.status["restartCost"]})
    assert kept.status["lastDecision"]["restart"]["restartSeconds"] == 75.0
    assert "restartCost" not in kept.status  # unchanged, not re-sent
    modelled = _plan(curve, spec, status_extra={"restartCost": {"server": {"seconds": "garbage"}}})
    r = modelled.status["lastDecision"]["restart"]
    assert r["restartSource"] == "Modelled"
    assert r["restartSeconds"] == pytest.approx(restart.modelled_restart_s(get_arch("llama-2-7b").weight_bytes), abs=0.1)


def test_plan_with_one_replica_says_a_restart_is_downtime(curve):
    p = _plan(curve, _spec(replicas=1, allowDowntime=False), replicas=1)
    assert p.status["lastDecision"]["reason"] == "RestartNeedsDowntime" and p.patches == ()


# ---------------------------------------------------------------- CUDA-graph capture sizes

def test_capture_sizes_are_vllms_default_list():
    sizes = cudagraph.capture_sizes()
    assert sizes[:6] == (1, 2, 4, 8, 16, 24) and sizes[-1] == 512
    assert 248 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes
    assert len(sizes) == 3 + 31 + 17  # [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)


@pytest.mark.parametrize("cap,lo,hi,want", [
    (189, 1, None, 184), (256, 1, None, 256), (250, 1, None, 248), (300, 1, None, 288), (3, 1, None, 2),
    (7, 5, None, 8),  # rounding down leaves [5, ...]: the smallest capture size above the floor
    (7, 5, 7, 7),  # no capture size in [5, 7]: unrounded
    (900, 1, None, 900),  # beyond the largest graph every cap runs eager
])
def test_caps_round_down_to_a_capture_size(cap, lo, hi, want):
    assert cudagraph.round_cap(cap, lo, hi) == want


@pytest.mark.parametrize("args,eager", [
    (["m", "--enforce-eager"], True), (["m", "--enforce_eager"], True), (["m", "--enforce-eager=false"], False),
    (["m", "--enforce-eager", "--no-enforce-eager"], False), (["m", "--max-model-len", "4096"], False),
])
def test_enforce_eager_is_read_from_the_containers_argv(args, eager):
    assert cudagraph.eager({"command": ["vllm", "serve"], "args": args}) is eager


def test_the_guard_rounds_the_applied_cap_and_sizes_memory_for_it():
    spec = _spec()
    sized = []

    def memory_for(cap):
        sized.append(cap)
        return 0.5, None

    d = policy.guard(CUR, policy.Proposal(EngineSettings(189, 0.6, None, 4), 0.3), spec.control, spec.batching,
                     replace(spec.topology.replicas, max=8), OK, memory_for,
                     round_cap=lambda c: cudagraph.round_cap(c, 1, 1024))
    assert d.target.max_num_seqs == 184 and sized == [184] and d.target.gpu_memory_utilization == 0.5


def test_plan_rounds_unless_the_engine_runs_eager(curve):
    graphs = _plan(curve, _spec(cooldown="600s"))
    eager = _plan(curve, parse_spec({**RAW, "engine": {**RAW["engine"], "extraArgs": ["--enforce-eager"]},
                                     "topology": {"replicas": {"min": 2, "max": 2}},
                                     "control": {**RAW["control"], "cooldown": "600s"}}))
    cap_graphs = graphs.status["lastDecision"]["target"]["maxNumSeqs"]
    cap_eager = eager.status["lastDecision"]["target"]["maxNumSeqs"]
    assert cap_graphs in cudagraph.capture_sizes()
    assert cap_graphs <= cap_eager


# ---------------------------------------------------------------- replicas the SLO no longer needs

def test_replicas_the_slo_no_longer_needs_pay_a_restart_the_cap_alone_would_not():
    """4 pods × 40 s at 8000 tok/s lose 320,000 tokens. A change that gains 30% at the cap in a
    pool neither the cap nor the KV cache limits adds no tokens, but where GAUSS sizes one replica
    fewer at the new flags, that pod's 2000 tok/s over the 300 s horizon (600,000) pays; a change
    that needs a replica more nets it against the gain."""
    spec = _spec(allowDowntime=False)
    idle = replace(_cost(), saturated=False)
    target = EngineSettings(256, 0.95, None, 3)
    bounds = replace(spec.topology.replicas, min=1, max=8)
    asked = []

    def saved(settings):
        asked.append(settings)
        return 1

    d = policy.guard(CUR, policy.Proposal(target, 0.30, 0.0), spec.control, spec.batching, bounds,
                     replace(OK, restart=idle), replicas_saved_for=saved)
    assert (d.action, d.reason, d.target) == (policy.APPLY, "Recommended", target)
    assert d.restart["gainTokens"] == 600_000 and d.restart["replicasSaved"] == 1 and d.restart["costTokens"] == 320_000
    assert "600000 tokens gained over the 300s horizon (Default) (+1 replica(s) for the SLO at the new flags)" in d.message
    assert asked == [target]  # asked for the settings weighed only
    held = policy.guard(CUR, policy.Proposal(EngineSettings(192, 0.95, None, 4), 0.30, 0.0), spec.control,
                        spec.batching, bounds, replace(OK, restart=idle), replicas_saved_for=lambda s: 0)
    assert (held.action, held.reason) == (policy.HOLD, "RestartNotWorthIt") and held.restart["gainTokens"] == 0
    # 0.9 -> 0.95 is inside the 10% band as a fraction, not when it saves a replica
    same_pods = replace(target, replicas=4)
    noise = policy.guard(CUR, policy.Proposal(same_pods, 0.30, 0.0), spec.control, spec.batching, bounds,
                         replace(OK, restart=idle), replicas_saved_for=lambda s: 0)
    assert (noise.action, noise.reason) == (policy.HOLD, "WithinHysteresis")
    worth = policy.guard(CUR, policy.Proposal(same_pods, 0.30, 0.0), spec.control, spec.batching, bounds,
                         replace(OK, restart=idle), replicas_saved_for=lambda s: 1)
    assert (worth.action, worth.target) == (policy.APPLY, same_pods)
    busy = _cost()  # saturated: 30% at the cap is 720,000 tokens
    assert busy.gain_tokens(0.30, 0.0, 1) == pytest.approx(720_000)  # the larger of the two, not their sum
    assert busy.gain_tokens(0.30, 0.0, -1) == pytest.approx(120_000)  # a replica more nets against it
    assert busy.gain_tokens(0.10, 0.0, -1) == 0.0
