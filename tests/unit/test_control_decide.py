"""The decision seam on real H100 measurements (data/real-h100/profiles.csv)."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from datetime import datetime

import numpy as np
import pytest

from kneecap.control import decide
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.manifests import EngineSettings
from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from kneecap.control.status_codec import calibration_from_status, calibration_to_status
from tests.support.profile_observations import observation

SPEC = parse_spec({"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
                   "engine": {"image": "vllm", "maxNumSeqs": 8}})


def test_fit_rows_are_per_pod_total_token_throughput(curve):
    obs = [observation(curve[c]) for c in (8, 16)]
    obs[1] = replace(obs[1], pods=2, prompt_tok_s=2 * obs[1].prompt_tok_s, generation_tok_s=2 * obs[1].generation_tok_s)
    rows = decide.fit_rows(obs)
    assert rows.throughput_tok_s == pytest.approx([1889.0143, 3377.3357])
    assert rows.batch_levels == 2


def test_one_batch_level_is_not_enough(curve):
    out = decide.recalibrate("llama-2-7b", "h100-64gb", [observation(curve[8])] * 3, None, 0.3)
    assert (out.calibration, out.ok, out.reason) == (None, False, "TooFewBatchLevels")


def test_calibrate_then_recommend_on_the_measured_curve(curve):
    # the operator has seen the pool run at caps 8..32 (B only reaches the live cap)
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    out = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3)
    assert out.ok and out.refit and out.reason == "Fitted"
    assert out.error < 0.05  # in-sample MAPE on three real points
    rec = decide.recommend(SPEC, "server", out.calibration, obs[-1], EngineSettings(32, 0.9, None, 1))
    # BCA moves up the curve: the measured curve keeps rising past 32 (5618 -> 8470 tok/s at 64)
    assert rec.max_num_seqs > 32 and rec.throughput_gain > 0.05
    measured = {c: float(curve[c]["throughput_tok_s"]) for c in curve}
    caps = np.array(sorted(measured))
    nearest = caps[np.argmin(np.abs(caps - rec.max_num_seqs))]
    assert measured[nearest] >= 0.6 * max(measured.values())
    # Llama-2-7B's 512 KiB/token KV fills the cache first (the data plateaus at ~238 sequences
    # = 90832 tokens / 381): the cap is KV-bound and the KV is sized to hold exactly it.
    assert rec.binding == "kv_capacity"
    assert rec.kv_bytes >= rec.max_num_seqs * (250 + 131) * 524288 * 0.99
    st = rec.to_status()  # quantities in bytes, integers (API conventions: base units)
    assert st["maxNumSeqs"] == rec.max_num_seqs and st["releasedBytes"] == rec.released_bytes
    assert isinstance(st["kvBytes"], int) and isinstance(st["releasedBytes"], int)


def test_small_model_releases_memory(profiles_csv):
    rows = {int(r["max_num_seqs"]): r for r in csv.DictReader(open(profiles_csv))
            if r["curve"] == "advisor_output_length/opt-1.3b/ol260/n2000/mem0.9"}
    obs = [observation(rows[c]) for c in (8, 16, 32, 64)]
    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm", "maxNumSeqs": 64}})
    out = decide.recalibrate("opt-1.3b", "h100-64gb", obs, None, 0.3)
    assert out.ok
    rec = decide.recommend(spec, "server", out.calibration, obs[-1], EngineSettings(64, 0.9, None, 1))
    # OPT-1.3B needs 192 KiB/token: the cap's KV is a fraction of the default 0.9 reservation
    assert rec.max_num_seqs > 64
    assert rec.gpu_memory_utilization < 0.9 and rec.released_bytes > 5 * 2**30 and rec.memory_gain > 0.1
    measured = {c: float(rows[c]["throughput_tok_s"]) for c in rows}
    caps = np.array(sorted(measured))
    nearest = caps[np.argmin(np.abs(caps - rec.max_num_seqs))]
    assert measured[nearest] >= 0.75 * max(measured.values())
    # TP 2: each GPU holds half the weights and KV (the model's per-rank split), and the replica
    # releases what each of its two GPUs does
    tp2 = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                      "engine": {"image": "vllm", "maxNumSeqs": 64, "tensorParallelSize": 2}})
    rec2 = decide.recommend(tp2, "server", out.calibration, obs[-1], EngineSettings(64, 0.9, None, 1))
    per_gpu = tp2.accelerator.gpu.memory_bytes * (0.9 - rec2.gpu_memory_utilization)
    assert rec2.released_bytes == pytest.approx(2 * per_gpu, rel=1e-6)
    assert rec2.memory_gain == pytest.approx(1 - rec2.gpu_memory_utilization / 0.9, rel=1e-6)
    assert rec2.kv_bytes < rec.kv_bytes  # one rank's KV for the same cap


def test_a_fit_that_no_longer_explains_the_pool_is_rejected(curve):
    good = decide.recalibrate("llama-2-7b", "h100-64gb", [observation(curve[c]) for c in (8, 16, 32)], None, 0.3)
    # the same batches now deliver a third of the throughput (e.g. the pods moved to a slower GPU)
    slow = [replace(o, prompt_tok_s=o.prompt_tok_s / 3, generation_tok_s=o.generation_tok_s / 3)
            for o in (observation(curve[c]) for c in (8, 16, 32))]
    ring = [observation(curve[c]) for c in (8, 16, 32)] + slow
    out = decide.recalibrate("llama-2-7b", "h100-64gb", ring, good.calibration, 0.1)
    assert out.calibration is good.calibration and not out.ok and out.reason == "FitRejected"
    assert "maxFitError 10%" in out.message


def test_worse_fit_keeps_the_previous_calibration(curve):
    good = decide.recalibrate("llama-2-7b", "h100-64gb", [observation(curve[c]) for c in (8, 16, 32)], None, 0.3)
    noisy = [observation(curve[c]) for c in (8, 16, 32)]
    noisy += [replace(observation(curve[16]), prompt_tok_s=o.prompt_tok_s * 3, generation_tok_s=o.generation_tok_s * 3)
              for o in [observation(curve[16])]]
    now_s = datetime.fromisoformat(good.calibration.created).timestamp()
    out = decide.recalibrate("llama-2-7b", "h100-64gb", noisy, good.calibration, 0.3, now_s=now_s + 30)
    assert out.calibration.params == good.calibration.params and out.calibration.created == good.calibration.created
    assert not out.refit and out.reason == "KeptPrevious" and out.revalidated and out.ok
    # it remembers what the refit was tried on: the same ring next window is not refitted again
    assert out.calibration.notes["ringErrorPct"] == pytest.approx(100 * out.error, abs=1e-3)
    assert out.calibration.notes["ringN"] == 4 and out.calibration.notes["checkedS"] == pytest.approx(now_s + 30)
    again = decide.recalibrate("llama-2-7b", "h100-64gb", noisy, out.calibration, 0.3, now_s=now_s + 60)
    assert again.calibration is out.calibration and "not refitted" in again.message and not again.revalidated
    # ... until the ring moves on: a batch beyond the range tried, that the fit misses, refits
    o128 = observation(curve[128])
    missed = replace(o128, prompt_tok_s=o128.prompt_tok_s / 2, generation_tok_s=o128.generation_tok_s / 2)
    moved = decide.recalibrate("llama-2-7b", "h100-64gb", noisy + [missed], out.calibration, 0.3, now_s=now_s + 90)
    assert "not refitted" not in moved.message and "(refitted: " in moved.message


def test_calibration_roundtrips_through_status(curve):
    out = decide.recalibrate("llama-2-7b", "h100-64gb", [observation(curve[c]) for c in (8, 16, 32)], None, 0.3)
    st = calibration_to_status(out.calibration, out.error, "2026-11-30T05:00:00Z")
    back = calibration_from_status(st)
    assert back == out.calibration and st["points"] == 3 and st["acceptedTime"] == "2026-11-30T05:00:00Z"
    # camelCase throughout: SLIM's parameters, the fit's metrics and notes
    assert st["parameters"]["tFixedSeconds"] == out.calibration.params["t_fixed_s"] > 0
    assert {"meanErrorPercent", "maxErrorPercent", "fitCost", "fitErrorPercent", "createdTime"} <= set(st)
    assert set(st["notes"]) == {"batchMin", "batchMax"}
    assert all("_" not in k for k in [*st, *st["parameters"], *st["parameterStandardDeviations"], *st["notes"]])
    assert calibration_from_status({**st, "parameters": {"etaC": "x"}}) is None
    assert calibration_from_status({k: v for k, v in st.items() if k != "form"}) is None
    assert calibration_from_status(None) is None


def test_a_calibration_an_earlier_version_wrote_is_read(curve):
    """An operator upgraded in place reads the status.calibration its predecessor wrote
    (abbreviated keys: mapePct, maxErrorPct, nPoints, parameterStd, fitErrorPct, ringErrorPct)."""
    out = decide.recalibrate("llama-2-7b", "h100-64gb", [observation(curve[c]) for c in (8, 16, 32)], None, 0.3)
    cal = replace(out.calibration, notes={**out.calibration.notes, "ringErrorPct": 2.5, "ringN": 3})
    st = calibration_to_status(cal, out.error, "2026-11-30T05:00:00Z")
    renamed = {"meanErrorPercent": "mapePct", "maxErrorPercent": "maxErrorPct", "points": "nPoints",
               "parameterStandardDeviations": "parameterStd", "fitErrorPercent": "fitErrorPct"}
    old = {renamed.get(k, k): v for k, v in st.items()}
    old["notes"] = {{"ringErrorPercent": "ringErrorPct"}.get(k, k): v for k, v in st["notes"].items()}
    assert "points" not in old and old["nPoints"] == 3 and old["notes"]["ringErrorPct"] == 2.5
    assert calibration_from_status(old) == cal
    # written again, it has the current keys only
    assert calibration_to_status(calibration_from_status(old), out.error, "2026-11-30T05:00:00Z") == st


def _opt_fit(profiles_csv):
    rows = {int(r["max_num_seqs"]): r for r in csv.DictReader(open(profiles_csv))
            if r["curve"] == "advisor_output_length/opt-1.3b/ol260/n2000/mem0.9"}
    obs = [observation(rows[c]) for c in (8, 16, 32, 64)]
    return decide.recalibrate("opt-1.3b", "h100-64gb", obs, None, 0.3).calibration, obs[-1]


def _opt_spec(max_num_seqs: int = 64, **control):
    """OPT-1.3B on an H100 at $4/h with TTFT ≤ 1 s and TPOT ≤ 50 ms: the spec _opt_fit's windows are decided for."""
    return parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb", "costPerHour": 4},
                       "engine": {"image": "vllm", "maxNumSeqs": max_num_seqs},
                       "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05}, **({"control": control} if control else {})})


def test_colocated_replicas_follow_the_rate_through_gauss(profiles_csv):
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    n1, bind1, a1 = decide.colocated_replicas(spec, cal, obs)
    lam = a1["sustainableRequestsPerSecondPerReplica"]
    assert lam > 0 and n1 == max(1, math.ceil(spec.control.rate_headroom * obs.request_rate_rps / lam - 1e-12))
    n10, _, a10 = decide.colocated_replicas(spec, cal, replace(obs, request_rate_rps=10 * obs.request_rate_rps))
    assert n10 > n1 and a10["costPerHour"] == pytest.approx(4.0 * n10)
    # spec.control.rateHeadroom: the multiple of the rate the pool is sized for (default 1.1)
    busy = replace(obs, request_rate_rps=10 * obs.request_rate_rps)
    tight, _, _ = decide.colocated_replicas(_opt_spec(rateHeadroom=1.0), cal, busy)
    roomy, _, _ = decide.colocated_replicas(_opt_spec(rateHeadroom=2.0), cal, busy)
    assert spec.control.rate_headroom == 1.1
    assert tight == max(1, math.ceil(busy.request_rate_rps / lam - 1e-12)) < n10 < roomy
    with pytest.raises(InputError, match="rateHeadroom"):
        _opt_spec(rateHeadroom=0.8)


def test_a_rate_served_within_the_slo_is_a_floor_under_gauss(profiles_csv):
    """A ring window that met the SLO at a per-pod rate above GAUSS's λ* sets λ* (binding
    "served"); one that missed, one with shorter requests, or one below λ* leaves GAUSS's."""
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    n0, _, a0 = decide.colocated_replicas(spec, cal, obs)
    lam = a0["sustainableRequestsPerSecondPerReplica"]
    fast = replace(obs, pods=2, request_rate_rps=2 * 3 * lam, ttft_p95_s=0.4, itl_p95_s=0.02, e2e_p95_s=5.0)
    assert decide.served_rate_per_replica(spec, [fast], obs) == pytest.approx(3 * lam)
    for other in (replace(fast, itl_p95_s=0.06), replace(fast, ttft_p95_s=1.5),
                  replace(fast, input_len_mean=0.7 * obs.input_len_mean),
                  replace(fast, output_len_mean=0.7 * obs.output_len_mean)):
        assert decide.served_rate_per_replica(spec, [other], obs) is None
    served = decide.served_rate_per_replica(spec, [fast, obs], obs)
    big = replace(obs, request_rate_rps=12 * lam)
    n_model, bind_model, _ = decide.colocated_replicas(spec, cal, big)
    n, bind, a = decide.colocated_replicas(spec, cal, big, served_rps=served)
    assert bind == "served" and a["sustainableRequestsPerSecondPerReplica"] == pytest.approx(3 * lam, rel=1e-5)
    assert a["servedRequestsPerSecondPerReplica"] == pytest.approx(3 * lam, rel=1e-5)
    assert n < n_model and bind_model != "served"
    low, low_bind, _ = decide.colocated_replicas(spec, cal, big, served_rps=0.5 * lam)
    assert (low, low_bind) == (n_model, bind_model)


def test_a_rate_that_missed_the_slo_is_a_ceiling_over_gauss(profiles_csv):
    """A ring window that missed the SLO at a per-pod rate below GAUSS's λ* sets λ* (binding
    "missed") and so adds pods; the highest such rate counts, one with longer requests, one
    that met the SLO, or one below a rate served leaves GAUSS's."""
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    n0, bind0, a0 = decide.colocated_replicas(spec, cal, obs)
    lam = a0["sustainableRequestsPerSecondPerReplica"]
    slow = replace(obs, pods=2, request_rate_rps=2 * 0.5 * lam, ttft_p95_s=3.0, itl_p95_s=0.02, e2e_p95_s=5.0)
    backlog = replace(slow, request_rate_rps=2 * 0.3 * lam)  # the next window, draining the queue
    assert decide.missed_rate_per_replica(spec, [backlog, slow], obs) == pytest.approx(0.5 * lam)
    for other in (replace(slow, ttft_p95_s=0.4), replace(slow, input_len_mean=1.5 * obs.input_len_mean),
                  replace(slow, output_len_mean=1.5 * obs.output_len_mean)):
        assert decide.missed_rate_per_replica(spec, [other], obs) is None
    missed = decide.missed_rate_per_replica(spec, [slow], obs)
    n, bind, a = decide.colocated_replicas(spec, cal, obs, missed_rps=missed)
    assert bind == "missed" and a["sustainableRequestsPerSecondPerReplica"] == pytest.approx(0.5 * lam, rel=1e-5)
    assert a["missedRequestsPerSecondPerReplica"] == pytest.approx(0.5 * lam, rel=1e-5)
    assert n == max(1, math.ceil(spec.control.rate_headroom * obs.request_rate_rps / (0.5 * lam) - 1e-12)) > n0
    # a higher rate served within the SLO: the evidence conflicts, GAUSS's λ* (raised to it) stands
    n_s, bind_s, _ = decide.colocated_replicas(spec, cal, obs, served_rps=0.6 * lam, missed_rps=missed)
    assert (n_s, bind_s) == (n0, bind0)


def test_a_length_mix_never_served_scales_up_past_the_pods_that_missed(profiles_csv):
    """The missed-rate bound makes λ* the very per-pod rate that missed, so the scale-up band
    (the rate 1/(1+hysteresis) lower, sized with headroom 1+hysteresis) rounds back to the pods
    that missed. Where no window of this length mix met the SLO, the pool goes strictly below
    that rate; where one did at a lower rate, a miss is the quantile's spread and the band holds."""
    from kneecap.control import plan

    cal, base = _opt_fit(profiles_csv)
    spec = _opt_spec()
    longer = replace(base, input_len_mean=1.5 * base.input_len_mean)
    lam = decide.colocated_replicas(spec, cal, longer)[2]["sustainableRequestsPerSecondPerReplica"]
    # two pods missing the TTFT SLO at half GAUSS's λ* each, after a mix shift to longer prompts
    missing = replace(longer, pods=2, request_rate_rps=2 * 0.5 * lam, ttft_p95_s=3.0, itl_p95_s=0.02)
    before = replace(base, pods=2, request_rate_rps=2 * 0.5 * lam, ttft_p95_s=0.3, itl_p95_s=0.02)

    def replicas(ring):
        t = plan._Tick(g=None, spec=spec, status={}, now_s=1000.0, out={}, conds=[])
        n, binding, alloc = plan._replicas(t, cal, missing, 2, 60.0, ring)
        return n, binding, alloc["missedRequestsPerSecondPerReplica"], alloc["servedRequestsPerSecondPerReplica"]

    # the shorter windows before the shift served, but not this mix: three pods, at 1/3·λ* each
    assert replicas([before, missing]) == (3, "gauss:missed", pytest.approx(0.5 * lam, rel=1e-5), None)
    assert plan.unserved_scale_up(2 * 0.5 * lam, 0.5 * lam) == 3 and plan.unserved_scale_up(9.0, 4.0) == 3
    # this mix met the SLO at 0.4·λ* per pod: the band keeps the two pods that missed at 0.5·λ*
    served = replace(missing, request_rate_rps=2 * 0.4 * lam, ttft_p95_s=0.5)
    assert replicas([served, missing]) == (2, "gauss:missed", pytest.approx(0.5 * lam, rel=1e-5),
                                           pytest.approx(0.4 * lam, rel=1e-5))


def test_replicas_are_sized_at_the_cap_and_memory_they_apply(profiles_csv):
    """GAUSS's λ* per replica is found with the engine's own limits at the settings the pool
    would run: a tight cap queues requests for a seat (TTFT) and a small reservation fills the
    KV cache, each lowering λ* and raising the replica count."""
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu
    from kneecap.model.memory import memory_split

    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    runs = {s: decide.colocated_replicas(spec, cal, obs, settings=s) for s in (
        EngineSettings(256, 0.9, None, 1), EngineSettings(16, 0.9, None, 1), EngineSettings(256, 0.06, None, 1),
        EngineSettings(256, 0.9, 2 * 2**30, 1))}
    (wide, tight, small, sized) = runs.values()
    lam = lambda run: run[2]["sustainableRequestsPerSecondPerReplica"]  # noqa: E731
    arch, gpu = get_arch("opt-1.3b"), get_gpu("h100-64gb")  # the pod's measured non-KV memory (§5.3)
    kv_0_9 = memory_split(arch, gpu, 0.9, 256, measured_non_kv_bytes=decide.measured_non_kv_bytes(arch, gpu, obs))
    kv_0_9 = kv_0_9.kv_capacity_tokens
    assert wide[2]["gaussMaxNumSeqs"] == 256 and wide[2]["gaussKvCacheTokens"] == kv_0_9
    assert tight[2]["gaussMaxNumSeqs"] == 16 and lam(tight) < 0.5 * lam(wide) and tight[0] > wide[0]
    assert small[1] == "kv" and lam(small) < 0.5 * lam(wide) and small[0] > wide[0]
    assert sized[2]["gaussKvCacheTokens"] == 2 * 2**30 // arch.kv_bytes_per_token // 16 * 16


def test_the_tpot_slo_reads_the_per_request_tpot_and_falls_back_to_itl(profiles_csv):
    """vLLM's per-request TPOT p95 is what a TPOT SLO means (and what GAUSS predicts); ITL p95
    (every token's gap, stalls included) is read only where the engine does not export it."""
    from kneecap.control.slo import slo_met

    _, obs = _opt_fit(profiles_csv)
    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm", "maxNumSeqs": 64}, "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05}})
    stalls = replace(obs, ttft_p95_s=0.2, itl_p95_s=0.11, tpot_p95_s=0.03)
    assert slo_met(spec, stalls) == (True, "TTFT p95 0.2s ≤ 1s, TPOT p95 0.03s ≤ 0.05s")
    assert slo_met(spec, replace(stalls, tpot_p95_s=None))[0] is False  # only ITL: the stricter read
    # a miss names the share of the window's requests that surely missed, where it was measured
    assert slo_met(spec, replace(stalls, ttft_p95_s=1.3, slo_missed_fraction=0.062)) == (
        False, "TTFT p95 1.3s > 1s (6.2% of the window's requests surely missed)")
    assert slo_met(spec, replace(stalls, ttft_p95_s=1.3)) == (False, "TTFT p95 1.3s > 1s")
    assert decide.served_rate_per_replica(spec, [stalls], obs) == pytest.approx(obs.request_rate_rps)
    assert decide.served_rate_per_replica(spec, [replace(stalls, tpot_p95_s=None)], obs) is None


def test_disaggregated_allocation_from_sara(profiles_csv):
    cal, obs = _opt_fit(profiles_csv)
    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb", "costPerHour": 4},
                       "engine": {"image": "vllm", "maxNumSeqs": 64}, "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05},
                       "topology": {"mode": "disaggregated", "kvTransfer": {}}, "budget": {"maxCostPerHour": 40}})
    a = decide.disaggregated_allocation(spec, cal, obs)
    assert a["prefillReplicas"] >= 1 and a["decodeReplicas"] >= 1 and a["kvBandwidthBytesPerSecond"] > 0
    assert set(a["binding"]) == {"prefill", "kv", "decode"} and a["budgetFeasible"] and a["goodputRequestsPerSecond"] > 0
    big = decide.disaggregated_allocation(spec, cal, replace(obs, request_rate_rps=20 * obs.request_rate_rps))
    assert big["decodeReplicas"] + big["prefillReplicas"] > a["decodeReplicas"] + a["prefillReplicas"]
    assert big["costPerHour"] > a["costPerHour"]


def test_batching_efficiency_and_curve_the_loop_exports(curve):
    """The series behind KneecapPastKnee and the dashboard's curve, from a fit on real H100 points."""
    from kneecap.control.plan_metrics import batching_efficiency, slim_curve
    from kneecap.control.metrics import CURVE_BATCHES

    obs = [observation(curve[c]) for c in (8, 16, 32)]
    cal = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3).calibration
    b = np.array(CURVE_BATCHES, float)
    thr = slim_curve(cal, SPEC, obs[-1], b)
    assert np.all(np.isfinite(thr)) and np.all(np.diff(thr) >= -1e-6 * thr[1:])  # T(B) never falls with B
    # at the measured batches the curve is the fit: within 10 % of the measured throughput
    for o in obs:
        t = slim_curve(cal, SPEC, o, np.array([o.mean_batch]))[0]
        assert t == pytest.approx(o.prompt_tok_s + o.generation_tok_s, rel=0.1)
    eff = [batching_efficiency(cal, SPEC, o) for o in obs]
    t1 = slim_curve(cal, SPEC, obs[0], np.array([1.0]))[0]
    tb = slim_curve(cal, SPEC, obs[0], np.array([obs[0].mean_batch]))[0]
    assert eff[0] == pytest.approx(tb / (obs[0].mean_batch * t1))  # eq. 13: T(B)/(B·T(1))
    assert 1.0 >= eff[0] > eff[1] > eff[2] > 0  # efficiency falls as the batch grows
    # far past the knee (B = 4096) the efficiency drops below the default ε = 0.1
    assert batching_efficiency(cal, SPEC, replace(obs[-1], mean_batch=4096.0)) < SPEC.batching.efficiency_floor


def test_slo_attainment_is_the_fraction_of_ring_windows_meeting_every_slo(curve):
    from kneecap.control.slo import slo_attainment

    o = observation(curve[8])
    spec = parse_spec({"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm", "maxNumSeqs": 8},
                       "slo": {"ttftSeconds": 0.5, "e2eSeconds": 10.0}})
    ring = [replace(o, ttft_p95_s=0.2, e2e_p95_s=8.0), replace(o, ttft_p95_s=0.6, e2e_p95_s=8.0),
            replace(o, ttft_p95_s=0.2, e2e_p95_s=12.0), replace(o, ttft_p95_s=0.4, e2e_p95_s=9.9)]
    assert slo_attainment(spec, ring) == 0.5  # the second misses TTFT, the third E2E
    assert slo_attainment(spec, ring[:1]) == 1.0 and slo_attainment(spec, []) is None
    assert slo_attainment(SPEC, ring) is None  # no SLO declared: nothing to attain


def test_a_fit_that_still_explains_the_ring_is_not_refitted(curve):
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    good = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3)
    now_s = datetime.fromisoformat(good.calibration.created).timestamp()  # fits carry the wall clock
    assert good.reason == "Fitted" and good.calibration.notes["batchMax"] == pytest.approx(float(curve[32]["batch"]))
    # another window at a batch the fit has seen: kept as is, and still trusted
    out = decide.recalibrate("llama-2-7b", "h100-64gb", obs + [observation(curve[16])], good.calibration, 0.3,
                             now_s=now_s + 30)
    assert out.calibration is good.calibration and out.ok and not out.refit and out.reason == "KeptPrevious"
    assert "not refitted" in out.message and out.error == pytest.approx(good.error, rel=0.5)
    # the same ring after REFIT_MAX_AGE_S: refitted (warm), the new fit no worse than the old
    old = decide.recalibrate("llama-2-7b", "h100-64gb", obs + [observation(curve[16])], good.calibration, 0.3,
                             now_s=now_s + decide.REFIT_MAX_AGE_S + 2)
    assert "not refitted" not in old.message and old.ok
    assert old.error <= out.error + 1e-9


def test_a_batch_beyond_the_fitted_range_refits_only_when_the_fit_misses_it(curve):
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    good = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3)
    b128 = float(curve[128]["batch"])
    # the fit on 8-32 extrapolates to the measured B = 128 within its tolerance: kept, range grows
    fine = decide.recalibrate("llama-2-7b", "h100-64gb", obs + [observation(curve[128])], good.calibration, 0.3)
    assert not fine.refit and fine.ok and "1 beyond the fitted" in fine.message and "not refitted" in fine.message
    assert fine.calibration.params == good.calibration.params
    assert fine.calibration.notes["batchMax"] == pytest.approx(b128)
    # the same batch at 80% of that throughput (the curve bends earlier than the fit says), in a
    # ring of 12 good windows: the ring's mean error stays low, the new batch alone is missed
    o = observation(curve[128])
    bent = replace(o, prompt_tok_s=0.8 * o.prompt_tok_s, generation_tok_s=0.8 * o.generation_tok_s)
    ring = obs * 4 + [bent]
    assert _mape_of(good.calibration, ring) < decide.REFIT_ERROR_FLOOR
    out = decide.recalibrate("llama-2-7b", "h100-64gb", ring, good.calibration, 0.3)
    assert "(refitted: batches 123-123 beyond the fitted range 7.88-31.3 are missed by" in out.message
    assert out.calibration.notes["batchMax"] == pytest.approx(b128)  # fitted or checked up to it
    assert out.error <= _mape_of(good.calibration, ring)


def test_a_fit_without_range_notes_is_refitted_once(curve):
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    good = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3)
    bare = replace(good.calibration, notes={})  # e.g. a status written by an older operator
    out = decide.recalibrate("llama-2-7b", "h100-64gb", obs, bare, 0.3)
    assert "not refitted" not in out.message


def test_gauss_runs_are_reused_while_their_inputs_stay_within_tolerance(profiles_csv):
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    runs = GaussRuns()
    _, _, first = decide.colocated_replicas(spec, cal, obs, gauss_runs=runs)
    assert first["gaussRunReused"] is False
    # the next window's lengths wobble by 1%: the run is reused ...
    near = replace(obs, input_len_mean=obs.input_len_mean * 1.01, output_len_mean=obs.output_len_mean * 0.99)
    _, _, again = decide.colocated_replicas(spec, cal, near, gauss_runs=runs)
    assert again["gaussRunReused"] is True
    assert again["sustainableRequestsPerSecondPerReplica"] == first["sustainableRequestsPerSecondPerReplica"]
    # ... and is within a few percent of what a fresh run at those lengths gives
    _, _, fresh = decide.colocated_replicas(spec, cal, near, gauss_runs=GaussRuns())
    assert fresh["gaussRunReused"] is False
    assert again["sustainableRequestsPerSecondPerReplica"] == pytest.approx(
        fresh["sustainableRequestsPerSecondPerReplica"], rel=0.03)
    # outputs 20% longer: GAUSS runs again and λ* falls
    far = replace(obs, output_len_mean=obs.output_len_mean * 1.2)
    _, _, longer = decide.colocated_replicas(spec, cal, far, gauss_runs=runs)
    assert longer["gaussRunReused"] is False
    assert longer["sustainableRequestsPerSecondPerReplica"] < fresh["sustainableRequestsPerSecondPerReplica"]
    # a fit whose decode step moved by 10% is not the same engine: GAUSS runs again
    slower = replace(cal, params={**cal.params, "t_step_s": cal.params["t_step_s"] * 1.5 + 1e-3})
    _, _, other = decide.colocated_replicas(spec, slower, obs, gauss_runs=runs)
    assert other["gaussRunReused"] is False
    assert runs.hits == 1 and runs.misses == 3
    # no store given: every call searches afresh
    _, _, alone = decide.colocated_replicas(spec, cal, near)
    assert alone["gaussRunReused"] is False


def test_gauss_inputs_are_the_service_times_gauss_simulates():
    from kneecap.control.gauss_reuse import GaussRuns, inputs_for
    from kneecap.model.gauss import ServiceCoefficients

    coef = ServiceCoefficients(prefill_s_per_token=1e-4, decode_step_s=0.01, decode_s_per_context_token=1e-6,
                               decode_s_per_seq=2e-4, request_overhead_s=0.003)
    x = inputs_for(coef, 200.0, 0.3, 100.0, 0.5)
    # prefill 200 and 800 tokens; d(B, B·ctx) = a + b·B with ctx = 200 + 100/2 (GAUSS §3.3)
    assert x.service_s == pytest.approx((0.02, 0.08, 0.003, 0.01 + 250e-6, 2e-4))
    assert x.lengths == (200.0, 100.0) and x.cvs == (0.3, 0.5)
    runs = GaussRuns(rel_tol=0.025, cv_tol=0.05)
    runs.add("k", x, (1.5, "ttft"))
    assert runs.find("k", inputs_for(coef, 202.0, 0.32, 101.0, 0.5)) == (1.5, "ttft")
    assert runs.find("k", inputs_for(coef, 202.0, 0.40, 101.0, 0.5)) is None  # CV moved by 0.1
    assert runs.find("other", x) is None
    # a warm start takes the closest run however far: the nearest of two, or none for a new key
    runs.add("k", inputs_for(coef, 400.0, 0.3, 100.0, 0.5), (0.9, "tbt"))
    assert runs.nearest("k", inputs_for(coef, 300.0, 0.3, 100.0, 0.5)) == (0.9, "tbt")
    assert runs.nearest("k", inputs_for(coef, 250.0, 0.3, 100.0, 0.5)) == (1.5, "ttft")
    assert runs.nearest("other", x) is None


def test_a_gauss_run_is_reused_across_a_cap_that_moved_by_a_slot_or_two(profiles_csv):
    from kneecap.control.manifests import EngineSettings

    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec(max_num_seqs=24)
    at = lambda cap: EngineSettings(max_num_seqs=cap, gpu_memory_utilization=0.9)  # noqa: E731
    runs = GaussRuns()
    _, _, first = decide.colocated_replicas(spec, cal, obs, settings=at(40), gauss_runs=runs)
    # BCA's cap moves from 40 to 41 with the window's lengths: the same engine within tolerance
    _, _, again = decide.colocated_replicas(spec, cal, obs, settings=at(41), gauss_runs=runs)
    _, _, fresh = decide.colocated_replicas(spec, cal, obs, settings=at(41), gauss_runs=GaussRuns())
    assert (first["gaussRunReused"], again["gaussRunReused"]) == (False, True)
    assert again["sustainableRequestsPerSecondPerReplica"] == pytest.approx(
        fresh["sustainableRequestsPerSecondPerReplica"], rel=0.03)
    # a cap halved binds sooner: GAUSS runs again and λ* falls
    _, _, half = decide.colocated_replicas(spec, cal, obs, settings=at(20), gauss_runs=runs)
    assert half["gaussRunReused"] is False
    assert half["sustainableRequestsPerSecondPerReplica"] < first["sustainableRequestsPerSecondPerReplica"]


def _mape_of(cal, obs):
    return decide._mape(cal, "llama-2-7b", decide.fit_rows(obs))


def test_ring_entries_parse_each_entry_once_and_forget_dropped_ones(curve):
    from kneecap.control.status_codec import ring_entries
    from kneecap.observe import pool as obs_pool

    ring = [{"pool": "server", **obs_pool.to_status(replace(observation(curve[c]), t_end_s=1000.0 + c))}
            for c in (8, 16, 32)]
    ring.append({"pool": "server", "requestsPerSecond": "x"})  # unparseable: skipped
    cache: dict = {}
    first = ring_entries({"observations": ring}, "server", cache)
    assert [o.t_end_s for o in first] == [1008.0, 1016.0, 1032.0] and len(cache) == 3
    again = ring_entries({"observations": ring[1:]}, "server", cache)
    assert again[0] is first[1] and again[1] is first[2] and len(cache) == 2  # reused, the dropped one forgotten
    assert ring_entries({"observations": ring}, "prefill", cache) == [] and len(cache) == 2
    assert ring_entries({"observations": ring}, "server") == first  # no cache: the same values


def test_tensor_parallel_replicas_are_costed_and_sized_per_gpu(profiles_csv):
    """TP 2: a colocated replica costs two GPUs; SARA's prefill replicas hold two GPUs each and
    its decode GPUs are whole 2-GPU pods, costed as such."""
    cal, obs = _opt_fit(profiles_csv)
    base = {"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb", "costPerHour": 4},
            "engine": {"image": "vllm", "maxNumSeqs": 64}, "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05}}
    tp2 = parse_spec({**base, "engine": {**base["engine"], "tensorParallelSize": 2}})
    n, _, a = decide.colocated_replicas(tp2, cal, obs)
    assert a["gpusPerReplica"] == 2 and a["costPerHour"] == pytest.approx(2 * 4.0 * n)
    pd = {**base, "topology": {"mode": "disaggregated", "kvTransfer": {"costPerGiBpsHour": 0}}}
    one = decide.disaggregated_allocation(parse_spec(pd), cal, obs)
    two = decide.disaggregated_allocation(parse_spec({**pd, "engine": {**base["engine"], "tensorParallelSize": 2}}),
                                          cal, obs)
    assert one["gpusPerReplica"] == 1 and one["decodeReplicas"] == one["decodeGpus"]
    assert two["gpusPerReplica"] == 2 and two["decodeReplicas"] == math.ceil(two["decodeGpus"] / 2)
    gpus = 2 * two["prefillReplicas"] + 2 * two["decodeReplicas"]
    assert two["costPerHour"] == pytest.approx(4.0 * gpus, abs=1e-3)


def test_a_70b_replica_is_advised_at_tp2_and_refused_at_tp1(curve):
    """Llama-3.3-70B on H100 80 GB: one GPU cannot hold its 141 GB of weights, so the operator's
    memory split refuses TP 1; at spec.engine.tensorParallelSize 2 each rank holds half and BCA's
    cap comes with a KV reservation that fits, and GAUSS sizes the replicas at TP 2."""
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    cal = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3).calibration
    live = replace(obs[-1], kv_capacity_tokens=0)  # no cache config of the 70B pod yet
    raw = {"model": {"name": "meta-llama/Llama-3.3-70B-Instruct"}, "accelerator": {"type": "h100-80gb", "costPerHour": 5},
           "engine": {"image": "vllm", "maxNumSeqs": 64, "tensorParallelSize": 2},
           "slo": {"ttftSeconds": 2.0, "tpotSeconds": 0.1}}
    tp2 = parse_spec(raw)
    rec = decide.recommend(tp2, "server", cal, live, EngineSettings(64, 0.9, None, 1))
    assert 0 < rec.gpu_memory_utilization <= 0.95 and rec.kv_bytes > 0 and rec.max_num_seqs >= 1
    n, _, alloc = decide.colocated_replicas(tp2, cal, live, settings=EngineSettings(rec.max_num_seqs, 0.9, None, 1))
    assert alloc["gpusPerReplica"] == 2 and alloc["costPerHour"] == pytest.approx(10.0 * n)
    tp1 = parse_spec({**raw, "engine": {**raw["engine"], "tensorParallelSize": 1}})
    with pytest.raises(InputError) as exc:
        decide.memory_for_cap(tp1, live, 64)
    assert "--tensor-parallel-size" in str(exc.value)


def test_on_a_shared_gpu_the_memory_recommended_keeps_to_the_share(curve):
    """spec.placement enforced by the fleet advice (kneecap.control.fleet.effective_spec): the
    recommended --gpu-memory-utilization never exceeds the shared GPU's share, and BCA's cap is
    one whose KV cache that share holds."""
    obs = [observation(curve[c]) for c in (8, 16, 32)]
    out = decide.recalibrate("llama-2-7b", "h100-64gb", obs, None, 0.3)
    whole = decide.recommend(SPEC, "server", out.calibration, obs[-1], EngineSettings(32, 0.9, None, 1))
    share = round(whole.gpu_memory_utilization / 2, 3)
    shared = decide.recommend(replace(SPEC, shared_gpu_share=share), "server", out.calibration, obs[-1],
                              EngineSettings(32, 0.9, None, 1))
    assert whole.gpu_memory_utilization > share and shared.gpu_memory_utilization <= share
    assert shared.max_num_seqs < whole.max_num_seqs
    kv_tokens = decide.gauss_limits(SPEC, obs[-1], shared.settings).kv_capacity_tokens
    assert kv_tokens >= shared.max_num_seqs * (obs[-1].input_len_mean + obs[-1].output_len_mean)


def test_tails_measured_below_the_gauss_curve_raise_lambda_star(profiles_csv):
    """A window whose p95 TTFT and TPOT lie below GAUSS's p95 curves at the per-pod rate it ran
    raises λ* (the model is pessimistic there: the pod carried rate r with the tails the model
    gives at a lower rate), by at most MEASURED_FACTOR_MAX; a tail the model predicts or worse
    on either metric, no SLO measured or no traffic leave λ* as GAUSS gives it."""
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    n0, bind0, a0 = decide.colocated_replicas(spec, cal, obs)
    lam = a0["sustainableRequestsPerSecondPerReplica"]
    ran = replace(obs, pods=2, request_rate_rps=2 * 0.7 * lam)
    worse = replace(ran, ttft_p95_s=0.99, itl_p95_s=0.049, tpot_p95_s=0.049)  # at the SLO: above the curve at 0.7 λ*
    assert decide.measured_rate_factor(spec, cal, worse, None) == (1.0, {"TTFT": 1.0, "TPOT": 1.0})
    assert decide.measured_rate_factor(spec, cal, replace(ran, request_rate_rps=0.0), None) == (1.0, {})
    unmeasured = replace(ran, ttft_p95_s=None, itl_p95_s=None, tpot_p95_s=None)
    assert decide.measured_rate_factor(spec, cal, unmeasured, None) == (1.0, {})
    floor = replace(ran, ttft_p95_s=1e-4, itl_p95_s=1e-4, tpot_p95_s=1e-4)  # below any load's tails
    top, detail = decide.measured_rate_factor(spec, cal, floor, None)
    assert top == decide.MEASURED_FACTOR_MAX and set(detail.values()) == {decide.MEASURED_FACTOR_MAX}
    # TTFT below its curve, TPOT at its SLO: loosening TTFT would let TPOT, which the fit does not
    # overestimate, bind at a rate it may not hold
    mixed, per_metric = decide.measured_rate_factor(spec, cal, replace(floor, itl_p95_s=0.049, tpot_p95_s=0.049), None)
    assert mixed == 1.0 and per_metric == {"TTFT": decide.MEASURED_FACTOR_MAX, "TPOT": 1.0}
    factors = [decide.measured_rate_factor(spec, cal, replace(ran, ttft_p95_s=y, itl_p95_s=y / 20,
                                                              tpot_p95_s=y / 20), None)[0]
               for y in (1e-3, 0.05, 0.1, 0.2, 0.4, 0.99)]
    assert all(a >= b for a, b in zip(factors, factors[1:])) and factors[0] > factors[-1] == 1.0
    big = replace(obs, request_rate_rps=12 * lam)
    n_model, _, _ = decide.colocated_replicas(spec, cal, big)
    n, bind, a = decide.colocated_replicas(spec, cal, big, measured_factor=top)
    assert a["sustainableRequestsPerSecondPerReplica"] == pytest.approx(top * lam, rel=1e-5)
    assert a["measuredRateFactor"] == top and n < n_model
    # a window that missed at a rate below the raised λ* still bounds it by measurement
    _, bind_m, a_m = decide.colocated_replicas(spec, cal, big, measured_factor=top, missed_rps=1.5 * lam)
    assert bind_m == "missed" and a_m["sustainableRequestsPerSecondPerReplica"] == pytest.approx(1.5 * lam, rel=1e-5)


def test_a_tpot_p95_the_buckets_cannot_place_against_the_curve_gives_no_verdict(profiles_csv):
    """TTFT measured below GAUSS's curve, TPOT interpolated above it: where the TPOT bucket's
    floor is below the model's p95 at that rate the measurement cannot say the model is
    optimistic (the bucket's requests may all lie under the curve), so TTFT's factor raises λ*
    up to where the model's own TPOT crosses its SLO; where the floor is at or above the curve
    the model is surely optimistic about TPOT and λ* stays as GAUSS gives it."""
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    lam = decide.colocated_replicas(spec, cal, obs)[2]["sustainableRequestsPerSecondPerReplica"]
    ran = replace(obs, pods=2, request_rate_rps=2 * 0.7 * lam, ttft_p95_s=1e-4, ttft_p95_floor_s=0.0)
    grid, curves = decide._p95_curves(spec, cal, ran, decide.gauss_limits(spec, ran, None), 0, None)
    model_tpot_s = float(np.interp(0.7 * lam, grid, np.maximum.accumulate(curves["TPOT"])))
    straddling = replace(ran, itl_p95_s=1.5 * model_tpot_s, tpot_p95_s=1.5 * model_tpot_s,
                         itl_p95_floor_s=0.5 * model_tpot_s, tpot_p95_floor_s=0.5 * model_tpot_s)
    raised, detail = decide.measured_rate_factor(spec, cal, straddling, None)
    assert detail == {"TTFT": decide.MEASURED_FACTOR_MAX, "TPOT": 1.0} and raised > 1.0
    surely = replace(straddling, itl_p95_floor_s=model_tpot_s, tpot_p95_floor_s=model_tpot_s)
    assert decide.measured_rate_factor(spec, cal, surely, None) == (1.0, detail)
    # without floors (an engine or ring entry without them) the interpolated p95 is taken as is
    unplaced = replace(straddling, itl_p95_floor_s=None, tpot_p95_floor_s=None)
    assert decide.measured_rate_factor(spec, cal, unplaced, None) == (1.0, detail)


def test_a_window_missed_the_slo_only_where_its_buckets_say_so_surely(profiles_csv):
    """A 20 ms TPOT SLO lies inside vLLM's (10, 25] ms bucket: a window whose p95 is
    interpolated to 24 ms there (floor 10 ms) may have met it, so it is no missed rate; one whose
    p95 lies in (25, 50] (floor 25 ms) surely missed; a ring entry without floors (written by an
    earlier version) is read by its p95 as before. The floors travel through the status ring."""
    from kneecap.control import status

    cal, obs = _opt_fit(profiles_csv)
    spec = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb", "costPerHour": 4},
                       "engine": {"image": "vllm", "maxNumSeqs": 64}, "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.02}})
    window = replace(obs, pods=2, request_rate_rps=8.0, ttft_p95_s=0.2, ttft_p95_floor_s=0.1,
                     itl_p95_s=0.024, itl_p95_floor_s=0.01, tpot_p95_s=0.024, tpot_p95_floor_s=0.01)
    assert decide.surely_missed(spec, window) == [] and decide.missed_rate_per_replica(spec, [window], obs) is None
    surely = replace(window, tpot_p95_s=0.03, tpot_p95_floor_s=0.025)
    assert decide.surely_missed(spec, surely) == ["TPOT"]
    assert decide.missed_rate_per_replica(spec, [window, surely], obs) == pytest.approx(4.0)
    older = replace(window, ttft_p95_floor_s=None, itl_p95_floor_s=None, tpot_p95_floor_s=None)
    assert decide.surely_missed(spec, older) == ["TPOT"]
    entry = status.ring_entry_from_status(status.ring_entry(window))
    assert (entry.tpot_p95_floor_s, entry.ttft_p95_floor_s) == (0.01, 0.1) and decide.surely_missed(spec, entry) == []
    assert decide.surely_missed(spec, status.ring_entry_from_status(status.ring_entry(surely))) == ["TPOT"]
    # with the spec's targets the ring keeps a floor only where its p95 is past the target (the
    # one case it is read): a window within its SLOs re-sends no floors with every status write
    targets = decide.p95_targets(spec)
    met = status.ring_entry(replace(window, tpot_p95_s=0.015, itl_p95_s=0.015), targets)
    assert not [k for k in met if "Floor" in k]
    kept = status.ring_entry(window, targets)
    assert sorted(k for k in kept if "Floor" in k) == ["itlP95FloorSeconds", "tpotP95FloorSeconds"]
    assert decide.surely_missed(spec, status.ring_entry_from_status(kept)) == []
    assert decide.surely_missed(spec, status.ring_entry_from_status(status.ring_entry(surely, targets))) == ["TPOT"]


def test_the_p95_sweep_is_reused_while_its_inputs_stay_within_tolerance(profiles_csv):
    """The sweep the measured tails are read against is GAUSS's at the window's lengths; a window
    whose lengths wobble by 1% reads the kept sweep with its own rate and tails (the same factor a
    fresh sweep gives, to a few percent), outputs 20% longer sweep again, and the λ searches'
    entries are neither read nor displaced by it."""
    cal, obs = _opt_fit(profiles_csv)
    spec = _opt_spec()
    lam = decide.colocated_replicas(spec, cal, obs)[2]["sustainableRequestsPerSecondPerReplica"]
    # at 0.7 λ* per pod GAUSS's p95s are ~26 ms TTFT and ~8 ms TPOT: both measured below them
    ran = replace(obs, pods=2, request_rate_rps=2 * 0.7 * lam, ttft_p95_s=0.022, itl_p95_s=0.004, tpot_p95_s=0.004)
    runs = GaussRuns()
    first = decide.measured_rate_factor(spec, cal, ran, None, gauss_runs=runs)
    assert first == decide.measured_rate_factor(spec, cal, ran, None)  # keeping it changes nothing
    assert 1.0 < first[0] < decide.MEASURED_FACTOR_MAX and (runs.hits, runs.misses) == (0, 1)
    near = replace(ran, input_len_mean=ran.input_len_mean * 1.01, output_len_mean=ran.output_len_mean * 0.99,
                   ttft_p95_s=0.025)
    again = decide.measured_rate_factor(spec, cal, near, None, gauss_runs=runs)
    assert (runs.hits, runs.misses) == (1, 1)
    assert again[0] < first[0]  # read afresh: a higher p95 at the same rate is a smaller factor
    assert again[0] == pytest.approx(decide.measured_rate_factor(spec, cal, near, None)[0], rel=0.03)
    decide.measured_rate_factor(spec, cal, replace(ran, output_len_mean=ran.output_len_mean * 1.2), None,
                                gauss_runs=runs)
    assert (runs.hits, runs.misses) == (1, 2)
    _, _, alloc = decide.colocated_replicas(spec, cal, ran, gauss_runs=runs)
    assert alloc["gaussRunReused"] is False  # a sweep is no λ search


# ---------------------------------------------------------------- where the KV cache, not the cap, bounds the batch

TP2_70B = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "accelerator": {"type": "h100-80gb"},
           "engine": {"image": "vllm", "tensorParallelSize": 2}}


def _conversation(curve, rate_rps: float = 6.0):
    """A window with the Azure conversation trace's mean lengths and no cache measurement (the
    memory split is the model's)."""
    return replace(observation(curve[32]), input_len_mean=1020.0, output_len_mean=230.0, input_len_cv=1.0,
                   output_len_cv=1.0, request_rate_rps=rate_rps, pods=4, kv_capacity_tokens=None,
                   gpu_memory_utilization=None)


def test_a_tp2_70b_at_vllms_memory_is_bound_by_its_kv_cache_and_the_most_memory_doubles_it(curve):
    """Llama-3.1-70B on two H100-80GB: vLLM's 0.9 leaves 26,032 KV tokens, twenty conversations
    for a cap of 256; 0.95 holds 51,984. An 8B on one H100 holds far more than its cap needs."""
    spec, obs, live = parse_spec(TP2_70B), _conversation(curve), EngineSettings(256, 0.9, None, 4)
    assert decide.kv_bound(spec, obs, live)
    assert not decide.kv_bound(parse_spec({**TP2_70B, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                                           "engine": {"image": "vllm"}}), obs, live)
    more = decide.most_kv_settings(spec, obs, live)
    assert more == EngineSettings(256, 0.95, None, 4)
    kv = lambda s: decide.gauss_limits(spec, obs, s).kv_capacity_tokens  # noqa: E731
    assert (kv(live), kv(more)) == (26_032, 51_984)
    assert decide.most_kv_settings(spec, obs, more) is None  # nothing more to give
    ceiling = parse_spec({**TP2_70B, "batching": {"maxGpuMemoryUtilization": 0.9}})
    assert decide.most_kv_settings(ceiling, obs, live) is None
    assert decide.memory_for_cap(ceiling, obs, 256)[0] == 0.9  # BCA's memory keeps under the ceiling too
    assert decide.memory_for_cap(spec, obs, 256)[0] == 0.95
    bytes_knob = parse_spec({**TP2_70B, "engine": {**TP2_70B["engine"], "memoryKnob": "kvCacheMemoryBytes"}})
    in_bytes = decide.most_kv_settings(bytes_knob, obs, replace(live, kv_cache_memory_bytes=4 * 2**30))
    assert in_bytes.kv_cache_memory_bytes == 51_984 * 163_840  # per GPU: 80 layers × 8 KV heads × 128 × 2 × 2 B / TP 2


# the SLIM fit the operator accepted on twin TP-2 70B pods of the conversation-trace replay
# (the first two windows, at t = 60 s)
FITTED_70B = {"eta_c": 1.0, "eta_m": 1.0, "alpha_s": 2.3808e-05, "gamma_s": 1.5397e-08, "t_step_s": 3.6665e-05,
              "t_layer_s": 1.2560e-05, "eta_w": 1.3, "t_fixed_s": 0.49124}


def test_gauss_sizes_fewer_tp2_70b_replicas_with_the_kv_cache_the_most_memory_holds(curve):
    """At 6 req/s of conversations a KV cache of twenty conversations queues requests that one
    twice as large admits: GAUSS's λ* per replica is higher at 0.95, so the SLO costs fewer
    replicas (4 against 2 here); no measured rate enters the comparison."""
    from kneecap.model import calibrate

    spec = parse_spec({**TP2_70B, "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05}})
    obs = replace(_conversation(curve), input_len_mean=1007.0, output_len_mean=264.0, input_len_cv=0.85,
                  output_len_cv=0.55)
    cal = calibrate.Calibration(form="kneecap", gpu="h100-80gb", models=("llama-3.1-70b",), params=FITTED_70B,
                                std={}, metrics={}, created="", notes={})
    at_live = decide.gauss_replicas(spec, cal, obs, EngineSettings(256, 0.9, None, 4))
    at_most = decide.gauss_replicas(spec, cal, obs, EngineSettings(256, 0.95, None, 4))
    assert (math.ceil(at_live), math.ceil(at_most)) == (4, 2), (at_live, at_most)
    assert at_live == pytest.approx(1.1 * 6.0 / decide._gauss_rate(  # headroom × rate / λ*
        "llama-3.1-70b", spec.accelerator.gpu, cal, obs, 1.0, 0.05, 0.95, 0,
        decide.gauss_limits(spec, obs, EngineSettings(256, 0.9, None, 4)), 2)[0])


def test_measured_rates_bound_only_the_caches_they_say_something_about(curve):
    """A window served at a small KV cache is served at a larger one, not the other way round; a
    window missed at a large cache is missed at a smaller one, not the other way round."""
    spec = parse_spec({"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
                       "engine": {"image": "vllm"}, "slo": {"ttftSeconds": 1.0}})
    base = replace(observation(curve[32]), pods=1, request_rate_rps=2.0, ttft_p95_s=0.5, ttft_p95_floor_s=0.25)
    small, large = replace(base, kv_capacity_tokens=26_000.0), replace(base, kv_capacity_tokens=52_000.0)
    assert decide.served_rate_per_replica(spec, [small], base, kv_tokens=52_000) == 2.0
    assert decide.served_rate_per_replica(spec, [large], base, kv_tokens=26_000) is None
    assert decide.served_rate_per_replica(spec, [large], base) == 2.0  # no cache named: every window
    missed_small = replace(small, ttft_p95_s=3.0, ttft_p95_floor_s=2.5)
    missed_large = replace(large, ttft_p95_s=3.0, ttft_p95_floor_s=2.5)
    assert decide.missed_rate_per_replica(spec, [missed_small], base, kv_tokens=52_000) is None
    assert decide.missed_rate_per_replica(spec, [missed_large], base, kv_tokens=26_000) == 2.0
    assert decide.missed_rate_per_replica(spec, [missed_small], base, kv_tokens=26_500) == 2.0  # the same cache, ±2%
