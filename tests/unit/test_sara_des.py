"""SARA's stage-wise quantile predictions against a discrete-event simulation of the same queues.

The simulator (tests/support/des.py) draws lengths, serves them FCFS on k servers with an event
heap, and runs decode iteration by iteration; it shares no formula with SARA. Seeds are fixed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kneecap.model import sara
from tests.support import des

N = 200_000


def _problem(tail):
    cv = 1.25 if tail == "heavy" else 1.0
    return sara.build_problem("llama-3.1-8b", "a100-80gb", sara.make_workload(1024, cv, 256, 1.0, tail))


def _sim_ttft_p95(pb, rate, k, seed, n=N):
    """p95 TTFT pooled over independent replications (ρ = 0.9 with heavy tails mixes slowly: one
    run of 2·10⁵ requests still scatters ±5%, so those cases pool 4 seeds)."""
    reps = 4 if rate * pb.sp_mean_s / k >= 0.85 else 1
    pooled = []
    for r in range(reps):
        rng = np.random.default_rng(seed + 1000 * r)
        service = pb.prefill_service_s(pb.workload.input.sample(rng, n))
        arrival = np.cumsum(rng.exponential(1.0 / rate, n))
        pooled.append((des.mgk_fcfs(arrival, service, k) - arrival)[n // 10:])
    return float(np.quantile(np.concatenate(pooled), 0.95))


def test_des_matches_mm1_and_mmk_closed_forms():
    rng = np.random.default_rng(7)
    n = 200_000
    arrival = np.cumsum(rng.exponential(1 / 0.8, n))
    service = rng.exponential(1.0, n)
    wait = (des.mgk_fcfs(arrival, service, 1) - arrival - service)[n // 10:]
    assert wait.mean() == pytest.approx(0.8 / (1 - 0.8), rel=0.05)  # M/M/1: ρ/(μ − λ)
    arrival = np.cumsum(rng.exponential(1 / 3.2, n))
    wait = (des.mgk_fcfs(arrival, service, 4) - arrival - service)[n // 10:]
    c = float(sara.erlang_c(4, 3.2))
    assert wait.mean() == pytest.approx(c / (4 - 3.2), rel=0.05)  # M/M/k: C/(kμ − λ)
    assert (wait > 1e-8).mean() == pytest.approx(c, abs=0.01)  # (1e-8: float error at t ~ 6·10⁴ s)


@pytest.mark.parametrize("k,rho", [(1, 0.5), (1, 0.7), (1, 0.9), (4, 0.5), (4, 0.7), (4, 0.9)])
def test_ttft_p95_light_tailed(k, rho):
    pb = _problem("light")
    rate = rho * k / pb.sp_mean_s
    sim = _sim_ttft_p95(pb, rate, k, seed=11 + k)
    assert sara.ttft_quantile_s(pb, rate, k) == pytest.approx(sim, rel=0.05)


@pytest.mark.parametrize("k,rho", [(4, 0.5), (4, 0.7), (8, 0.5), (8, 0.7), (8, 0.9)])
def test_ttft_p95_heavy_tailed(k, rho):
    pb = _problem("heavy")
    rate = rho * k / pb.sp_mean_s
    sim = _sim_ttft_p95(pb, rate, k, seed=21 + k)
    assert sara.ttft_quantile_s(pb, rate, k) == pytest.approx(sim, rel=0.05)


@pytest.mark.parametrize("k,rho", [(1, 0.7), (1, 0.9), (2, 0.9)])
def test_ttft_p95_heavy_tailed_small_pool_known_gap(k, rho):
    """Known limit of the exponential waiting tail (SARA (21)): with log-normal prompts on 1–2
    replicas at ρ ≥ 0.7 the true waiting tail is heavier, and SARA under-predicts p95 TTFT by
    5–20%. Pinned so a change in either direction is noticed."""
    pb = _problem("heavy")
    rate = rho * k / pb.sp_mean_s
    sim = _sim_ttft_p95(pb, rate, k, seed=31 + k)
    ratio = sara.ttft_quantile_s(pb, rate, k) / sim
    assert 0.80 <= ratio <= 0.97


def _sim_tpot_p95(pb, rate, k_d, seed, n=100_000, reps=1):
    """Token-weighted p95 step time, pooled over ``reps`` replications (first quarter dropped)."""
    steps, batches = [], []
    for r in range(reps):
        rng = np.random.default_rng(seed + 1000 * r)
        il = pb.workload.input.sample(rng, n)
        ol = np.maximum(1.0, np.round(pb.workload.output.sample(rng, n)))
        arrival = np.cumsum(rng.exponential(1.0 / rate, n))
        res = des.continuous_batching(arrival, il, ol, omega_bytes=pb.omega_bytes,
                                      kv_bytes_per_token=pb.kv_bytes_per_token,
                                      pool_bw_bytes_s=k_d * pb.hbm_bw_bytes_s, max_num_seqs=10**6)
        w = res.step_s.size // 4
        steps.append(res.step_s[w:])
        batches.append(res.batch[w:])
    res = des.DecodeResult(np.concatenate(steps), np.concatenate(batches), 0)
    return res.token_quantile_s(0.95), res


@pytest.mark.parametrize("tail", ["light", "heavy"])
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_tpot_p95(tail, rho):
    pb = _problem(tail)
    k_d = 3
    # ρ_d = q: the share of decode bandwidth the KV reads take at the mean context (C3)
    rate = rho * k_d * pb.hbm_bw_bytes_s / (pb.workload.output.mean_tok * pb.kv_bytes_per_token * pb.ctx_mean_tok)
    # near saturation one run scatters ±5% (slow mixing of a ~900-request batch): pool 4 runs
    sim, res = _sim_tpot_p95(pb, rate, k_d, seed=5, n=200_000 if rho > 0.8 else 100_000, reps=4 if rho > 0.8 else 1)
    assert sara.tpot_quantile_s(pb, rate, k_d) == pytest.approx(sim, rel=0.05)
    mu, _ = sara.decode_batch_stats(pb, rate, k_d)
    assert np.average(res.batch, weights=res.step_s) == pytest.approx(mu, rel=0.05)


def test_kv_link_p95_against_mg1():
    for tail in ("light", "heavy"):
        pb = _problem(tail)
        bw = 10.0
        per_tok_s = pb.kv_bytes_per_token / (bw * sara.GIB)
        rate = 0.7 / (per_tok_s * pb.il_mean_tok)
        rng = np.random.default_rng(3)
        tr = per_tok_s * pb.workload.input.sample(rng, N)
        arrival = np.cumsum(rng.exponential(1.0 / rate, N))
        sim = float(np.quantile((des.mgk_fcfs(arrival, tr, 1) - arrival)[N // 10:], 0.95))
        assert sara.kv_quantile_s(pb, rate, bw) == pytest.approx(sim, rel=0.10)


def test_planned_allocation_meets_slos_in_tandem_simulation():
    """End to end: simulate the planned pools at 95% of the planned goodput; each stage's p95 must
    be within its threshold (small slack for sampling)."""
    pb = _problem("heavy")
    plan = sara.plan(pb, 20.0)
    a = plan.allocation
    rate = 0.95 * plan.goodput_rps
    rng = np.random.default_rng(9)
    n = 60_000
    il = pb.workload.input.sample(rng, n)
    ol = np.maximum(1.0, np.round(pb.workload.output.sample(rng, n)))
    res = des.simulate(rng, rate, n, il, ol, pb.prefill_service_s, a.prefill_replicas,
                       pb.kv_bytes_per_token / (a.kv_bandwidth_gibps * sara.GIB), omega_bytes=pb.omega_bytes,
                       kv_bytes_per_token=pb.kv_bytes_per_token,
                       pool_bw_bytes_s=a.decode_replicas * pb.hbm_bw_bytes_s, max_num_seqs=a.max_num_seqs)
    assert np.quantile(res.ttft_s, 0.95) <= pb.slo.ttft_s * 1.05
    assert np.quantile(res.kv_s, 0.95) <= pb.slo.kv_s * 1.05
    assert res.decode.token_quantile_s(0.95) <= pb.slo.tpot_s * 1.05
    assert math.isfinite(res.decode.step_s.sum())
