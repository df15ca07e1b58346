"""SARA's stage-wise quantile predictions against a discrete-event simulation of the same queues.

The simulator (tests/support/des.py) draws lengths, serves them FCFS on k servers (an event heap,
or the equivalent earliest-free-server recursion for the long runs, checked equal here), and runs
decode iteration by iteration; it shares no formula with SARA. Seeds are fixed; near saturation
the runs are long or pooled over seeds so that sampling noise (stated per helper) stays well inside
the 5% band.
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


def _ttft_requests(tail, rho):
    """Requests simulated per case: enough that sampling noise on the p95 stays near 1.5% (from
    5 × 10⁶-request runs: one 10⁶ run scatters ±0.5% at ρ = 0.5, ±1% at 0.7, ±3.5% at 0.9 with
    heavy tails and ±2.5% with light ones)."""
    if rho <= 0.5:
        return 500_000
    if rho <= 0.7:
        return 1_000_000
    return 4_000_000 if tail == "heavy" else 2_000_000


def _sim_ttft_p95(pb, rate, k, seed, n):
    """p95 TTFT of the simulated M/G/k (prefill service S_p(IL) from the same callable SARA
    integrates), pooled over independent 10⁶-request replications, first 5% of each dropped."""
    pooled = []
    for r in range(max(1, n // 1_000_000)):
        m = min(n, 1_000_000)
        rng = np.random.default_rng(seed + 1000 * r)
        service = pb.prefill_service_s(pb.workload.input.sample(rng, m))
        arrival = np.cumsum(rng.exponential(1.0 / rate, m))
        pooled.append((des.mgk_fcfs_servers(arrival, service, k) - arrival)[m // 20:])
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


@pytest.mark.parametrize("k", [1, 2, 5])
def test_server_recursion_equals_event_simulation(k):
    """The fast FCFS recursion used for the long TTFT runs gives the event-driven departures."""
    rng = np.random.default_rng(40 + k)
    n = 50_000
    arrival = np.cumsum(rng.exponential(1.0 / (0.9 * k), n))
    service = rng.lognormal(-0.5, 1.0, n)
    np.testing.assert_allclose(des.mgk_fcfs_servers(arrival, service, k), des.mgk_fcfs(arrival, service, k),
                               rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("tail", ["light", "heavy"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_ttft_p95_within_5pct(tail, k, rho):
    """Issue 3: p95 TTFT within 5% of the simulation for ρ ≤ 0.9, light (exponential IL) and heavy
    (log-normal IL, CV 1.25) prompts, 1–8 prefill replicas."""
    pb = _problem(tail)
    rate = rho * k / pb.sp_mean_s
    sim = _sim_ttft_p95(pb, rate, k, seed=11 + k + (100 if tail == "heavy" else 0), n=_ttft_requests(tail, rho))
    assert sara.ttft_quantile_s(pb, rate, k) == pytest.approx(sim, rel=0.05)


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
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.8, 0.9])
def test_tpot_p95(tail, rho):
    """Issue 3: p95 TPOT within 5% for decode loads up to 0.9."""
    pb = _problem(tail)
    k_d = 3
    # ρ_d = q: the share of decode bandwidth the KV reads take at the mean context (C3)
    rate = rho * k_d * pb.hbm_bw_bytes_s / (pb.workload.output.mean_tok * pb.kv_bytes_per_token * pb.ctx_mean_tok)
    # at q ≥ 0.8 the ~400–900-request batch relaxes over ~80 s, and one 2·10⁵-request run scatters
    # ±5–15% (measured over seeds): pool 3 runs of 10⁶ (±1.5–2%; 3 runs of 2·10⁶ put the
    # prediction within −2.1…+2.2% of the simulation); at 0.7, 3 runs of 3·10⁵
    sim, res = _sim_tpot_p95(pb, rate, k_d, seed=5, n=1_000_000 if rho >= 0.8 else 300_000, reps=1 if rho <= 0.5 else 3)
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
