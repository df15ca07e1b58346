"""Guards of DESIGN §4.5, status conditions and the observation ring, operator metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kneecap.control import policy, status
from kneecap.control.manifests import EngineSettings
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import parse_spec

SPEC = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                   "engine": {"image": "vllm", "maxNumSeqs": 64},
                   "control": {"mode": "enforce", "cooldown": "10m", "minObservations": 3}})
CUR = EngineSettings(64, 0.9, None, 2)
OK = policy.GuardState(now_s=10_000.0, last_applied_s=None, rollout_in_progress=False, n_observations=5,
                       fit_ok=True)


def run(settings, gain=0.2, mem=0.0, state=OK, cur=CUR, memfn=None):
    return policy.guard(cur, policy.Proposal(settings, gain, mem), SPEC.control, SPEC.batching,
                        SPEC.topology.replicas, state, memfn)


def test_apply_when_all_guards_pass():
    d = run(EngineSettings(96, 0.5, None, 2))
    assert d.action == policy.APPLY and d.reason == "Recommended"
    assert d.target == EngineSettings(96, 0.5, None, 2)
    assert "64->96" in d.message


@pytest.mark.parametrize("state,reason", [
    (replace(OK, fit_ok=False, fit_message="MAPE 45%"), "BadFit"),
    (replace(OK, n_observations=2), "TooFewObservations"),
    (replace(OK, rollout_in_progress=True), "RolloutInProgress"),
    (replace(OK, last_applied_s=OK.now_s - 599), "Cooldown"),
])
def test_each_guard_holds(state, reason):
    d = run(EngineSettings(128, 0.5, None, 2), state=state)
    assert (d.action, d.reason) == (policy.HOLD, reason)
    if reason in ("ScrapeFailed", "BadFit", "TooFewObservations"):
        assert d.target == CUR  # never act, not even a computed target
    if reason == "BadFit":
        assert "MAPE 45%" in d.message


def test_cooldown_elapsed_allows():
    d = run(EngineSettings(128, 0.5, None, 2), state=replace(OK, last_applied_s=OK.now_s - 600))
    assert d.action == policy.APPLY
    assert "1s left" in run(EngineSettings(128, 0.5, None, 2),
                            state=replace(OK, last_applied_s=OK.now_s - 599)).message


def test_min_improvement_counts_memory_too():
    assert run(EngineSettings(128, 0.9, None, 2), gain=0.01).reason == "BelowMinImprovement"
    d = run(EngineSettings(32, 0.3, None, 2), gain=0.0, mem=0.6)  # same throughput, 60% memory back
    assert d.action == policy.APPLY


def test_step_limit_x2_and_memory_recomputed():
    mem = {128: (0.4, None), 32: (0.2, None)}
    d = run(EngineSettings(1000, 0.95, None, 2), memfn=lambda cap: mem[cap])
    assert d.target.max_num_seqs == 128 and d.step_limited
    assert d.target.gpu_memory_utilization == 0.4  # KV sized for the cap actually applied
    d = run(EngineSettings(2, 0.1, None, 2), mem=0.9, memfn=lambda cap: mem[cap])
    assert d.target.max_num_seqs == 32
    assert policy.step_limit(64, 1000, 2) == 128 and policy.step_limit(64, 10, 2) == 32
    assert policy.step_limit(64, 100, 2) == 100
    assert policy.step_limit(3, 100, 2) == 6 and policy.step_limit(3, 1, 2) == 2


def test_a_step_limited_restart_is_weighed_on_the_step_it_takes():
    """A step-limited change is weighed on the smaller gain of the step it takes and of the
    recommendation it leads to: the step (cap 32) gains 1% where the recommendation (cap 8)
    would gain 30%, so the 1% is weighed (and held)."""
    from kneecap.control.restart import RestartCost

    rc = RestartCost(restart_s=40.0, source="Modelled", pool_tok_s=10_000.0, pods=2, horizon_s=600.0,
                     memory_value=0.0)
    state = replace(OK, restart=rc)
    seen = []

    def gains_for(target):
        seen.append(target)
        return (0.01, 0.5) if target.max_num_seqs == 32 else (0.3, 0.8)

    d = policy.guard(CUR, policy.Proposal(EngineSettings(8, 0.2, None, 2), 0.3, 0.8), SPEC.control, SPEC.batching,
                     SPEC.topology.replicas, state, lambda cap: (0.4, None), gains_for=gains_for)
    assert seen == [EngineSettings(32, 0.4, None, 2)]
    assert (d.action, d.reason) == (policy.HOLD, "RestartNotWorthIt")
    assert d.restart["gainTokens"] == round(0.01 * 10_000 * 600) < d.restart["costTokens"] == 400_000
    assert "+1.0%" in d.message
    # a step that pays by itself toward a recommendation that does not (cap 8 loses half the
    # throughput): held on the recommendation's gain
    d = policy.guard(CUR, policy.Proposal(EngineSettings(8, 0.2, None, 2), -0.5, 0.8), SPEC.control, SPEC.batching,
                     SPEC.topology.replicas, state, lambda cap: (0.4, None), gains_for=lambda target: (0.3, 0.5))
    assert (d.action, d.reason) == (policy.HOLD, "RestartNotWorthIt") and d.restart["gainTokens"] == 0
    assert "steps toward (cap 8) predicts throughput -50.0%" in d.message
    # not step limited: the proposal's own gains are weighed (gains_for is not asked)
    seen.clear()
    d = policy.guard(CUR, policy.Proposal(EngineSettings(48, 0.4, None, 2), 0.3, 0.8), SPEC.control, SPEC.batching,
                     SPEC.topology.replicas, state, lambda cap: (0.4, None), gains_for=gains_for)
    assert seen == [] and d.action == policy.APPLY and d.restart["gainTokens"] == round(0.3 * 10_000 * 600)


def test_clamp_to_bounds():
    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm", "maxNumSeqs": 64},
                       "batching": {"minMaxNumSeqs": 8, "maxMaxNumSeqs": 100},
                       "topology": {"replicas": {"min": 1, "max": 3}}})
    d = policy.guard(CUR, policy.Proposal(EngineSettings(1000, 0.9, None, 50), 0.5), spec.control, spec.batching,
                     spec.topology.replicas, OK)
    assert d.target.max_num_seqs == 100 and d.target.replicas == 3 and d.clamped


def test_hysteresis_and_no_change():
    assert run(EngineSettings(64, 0.9, None, 2)).reason == "NoChange"
    assert run(EngineSettings(68, 0.88, None, 2)).reason == "WithinHysteresis"  # 6% < 10%
    assert run(EngineSettings(72, 0.9, None, 2)).reason == "Recommended"  # 12.5% > 10%


def test_external_replicas_are_not_touched():
    d = run(EngineSettings(128, 0.5, None, 7), state=replace(OK, replicas_external=True))
    assert d.target.replicas == CUR.replicas
    assert policy.only_replicas_changed(CUR, EngineSettings(64, 0.9, None, 5))
    assert not policy.only_replicas_changed(CUR, EngineSettings(65, 0.9, None, 2))


def test_conditions_transition_time_moves_only_on_flip():
    c = status.set_condition(None, status.READY, False, "Creating", "m", 1, 1000.0)
    assert c == [{"type": "Ready", "status": "False", "reason": "Creating", "message": "m",
                  "observedGeneration": 1, "lastTransitionTime": "1970-01-01T00:16:40Z"}]
    c = status.set_condition(c, status.READY, False, "StillCreating", "m2", 2, 2000.0)
    assert c[0]["lastTransitionTime"] == "1970-01-01T00:16:40Z" and c[0]["reason"] == "StillCreating"
    assert c[0]["observedGeneration"] == 2
    c = status.set_condition(c, status.READY, True, "Ready", "ok", 2, 3000.0)
    assert c[0]["lastTransitionTime"] == status.iso(3000.0) and c[0]["status"] == "True"
    c = status.set_condition(c, status.DEGRADED, True, "ScrapeFailed", "x", 2, 3000.0)
    c = status.set_condition(c, status.CALIBRATED, None, "NotYet", "x", 2, 3000.0)
    assert [x["type"] for x in c] == ["Ready", "Calibrated", "Degraded"]
    assert status.get_condition(c, "Calibrated")["status"] == "Unknown"
    assert status.phase_of(c) == "Degraded"
    assert status.parse_iso(status.iso(3000.0)) == 3000.0
    with pytest.raises(ValueError):
        status.set_condition(c, status.READY, "yes", "r", "m", 1, 0.0)


def test_observation_ring_is_bounded():
    ring = None
    for i in range(7):
        ring = status.push_observation(ring, {"i": i}, 5)
    assert [o["i"] for o in ring] == [2, 3, 4, 5, 6]


def test_ring_entries_are_rounded_to_six_significant_digits_and_times_to_the_millisecond():
    r = status.rounded({"requestsPerSecond": 12.345678901234, "ttftP95Seconds": 0.000123456789,
                        "windowEndUnixSeconds": 1764486123.456789, "pods": 4, "pool": "server"})
    assert r == {"requestsPerSecond": 12.3457, "ttftP95Seconds": 0.000123457,
                 "windowEndUnixSeconds": 1764486123.457, "pods": 4, "pool": "server"}


def test_ring_entries_keep_what_the_fit_and_slo_attainment_read():
    from kneecap.observe import pool as obs_pool
    from kneecap.observe.observation import OBSERVATION_FIELDS, Observation

    obs = Observation(**{f: 1.2345678 + i for i, f in enumerate(OBSERVATION_FIELDS)} | {"pods": 4, "batch_samples": 3})
    entry = status.ring_entry(obs)
    assert len(entry) == 21 and entry["pods"] == 4 and entry["inputLengthMean"] == 14.2346  # 6 significant digits
    assert entry["tpotP95Seconds"] == pytest.approx(obs.tpot_p95_s, rel=5e-6)  # the TPOT SLO reads it
    assert entry["tpotP95FloorSeconds"] == pytest.approx(obs.tpot_p95_floor_s, rel=5e-6)  # ... and a sure miss
    assert "ttftMeanSeconds" not in entry and "queueLength" not in entry  # the rest is in status.workload
    back = status.ring_entry_from_status(entry)
    for name in status.RING_FIELDS:
        assert getattr(back, name) == pytest.approx(getattr(obs, name), rel=5e-6)  # 6 significant digits
    # an entry written by an earlier version (every Observation field) still reads
    old = status.ring_entry_from_status({"pool": "server", "engine": {"maxNumSeqs": 8}, **obs_pool.to_status(obs)})
    assert all(getattr(old, name) == getattr(obs, name) for name in status.RING_FIELDS)
    # ... and one with the abbreviated key of an earlier version (outputLengthCV)
    key = "outputLengthCoefficientOfVariation"
    abbreviated = {("outputLengthCV" if k == key else k): v for k, v in entry.items()}
    assert key not in abbreviated and status.ring_entry_from_status(abbreviated) == back
    with pytest.raises(ValueError, match=f"observation.{key}: missing"):
        status.ring_entry_from_status({k: v for k, v in entry.items() if k != key})
    with pytest.raises(ValueError, match="observation.ttftP95Seconds: expected a finite number"):
        status.ring_entry_from_status({**entry, "ttftP95Seconds": float("nan")})


def test_metrics_exposition_and_forget():
    m = OperatorMetrics()
    m.set(m.recommended_max_num_seqs, 96, "ns", "a", "server")
    m.set(m.memory_released_bytes, 31.5 * 2**30, "ns", "a", "server")
    m.inc(m.decisions, "ns", "a", "Cooldown")
    m.inc(m.decisions, "ns", "a", "Cooldown")
    m.inc(m.scrape_failures, "ns", "b")
    text = m.exposition().decode()
    assert 'kneecap_recommended_max_num_seqs{name="a",namespace="ns",pool="server"} 96.0' in text
    assert 'kneecap_memory_released_bytes{name="a",namespace="ns",pool="server"} 3.3822867456e+10' in text
    assert 'kneecap_decisions_total{name="a",namespace="ns",reason="Cooldown"} 2.0' in text
    m.forget("ns", "a")
    text = m.exposition().decode()
    assert 'name="a"' not in text and 'kneecap_scrape_failures_total{name="b",namespace="ns"} 1.0' in text


def test_a_small_cap_can_rise_through_capture_size_rounding():
    """×1.25 from 8 is 10, which rounds down to 8: the step is widened to the next capture size
    (16), never undone; a decrease still rounds down; a destination below the next capture size
    leaves the cap where it is."""
    from kneecap.control import cudagraph

    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm", "maxNumSeqs": 8},
                       "batching": {"minMaxNumSeqs": 1, "maxMaxNumSeqs": 256},
                       "control": {"mode": "enforce", "cooldown": "10m", "minObservations": 3, "maxStepFactor": 1.25}})
    rounding = lambda cap: cudagraph.round_cap(cap, 1, 256)  # noqa: E731

    def step(cur: int, want: int) -> policy.Decision:
        return policy.guard(EngineSettings(cur, 0.9, None, 2), policy.Proposal(EngineSettings(want, 0.9, None, 2), 0.3),
                            spec.control, spec.batching, spec.topology.replicas, OK, round_cap=rounding)

    assert step(8, 64).target.max_num_seqs == 16 and step(8, 64).action == policy.APPLY
    assert step(16, 64).target.max_num_seqs == 24  # 20 rounds back to 16: widened to 24
    assert step(64, 8).target.max_num_seqs == 48  # a decrease: ⌈64/1.25⌉ = 52, rounded down to 48
    assert step(8, 12).target.max_num_seqs == 8 and step(8, 12).reason == "NoChange"  # no capture size in (8, 12]
    climb, seen = 8, [8]
    while climb < 64:  # the cap reaches its destination in steps, never stuck
        climb = step(climb, 64).target.max_num_seqs
        seen.append(climb)
    assert seen == [8, 16, 24, 32, 40, 48, 56, 64]
