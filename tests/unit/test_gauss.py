"""GAUSS Monte-Carlo queueing against closed forms (fixed seeds), and the service model."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
from scipy.optimize import brentq

from kneecap.errors import InputError
from kneecap.model import gauss
from kneecap.model.gauss import search as gauss_search
from kneecap.model.gauss.queues import _layout
from tests.support.gauss_reference import COEF, WL, erlang_c, rng


# ------------------------------------------------------------------ recurrences are exact


def naive_lindley(S, A, w0=0.0):
    W = np.empty_like(S)
    W[0] = w0
    for n in range(1, len(S)):
        W[n] = max(0.0, W[n - 1] + S[n - 1] - A[n])
    return W


def naive_fcfs_k(S, A, k):
    """Event-style FCFS with k servers: each request starts when the earliest server frees."""
    free = [0.0] * k
    t = 0.0
    waits = []
    for n in range(len(S)):
        t += A[n] if n else 0.0
        i = int(np.argmin(free))
        start = max(t, free[i])
        waits.append(start - t)
        free[i] = start + S[n]
    return np.array(waits)


def test_lindley_matches_the_recurrence_across_blocks():
    r = rng(3)
    S, A = r.exponential(1.0, 1000), r.exponential(1.1, 1000)
    ref = naive_lindley(S, A, w0=2.5)
    np.testing.assert_allclose(gauss.lindley_waits(S, A, initial_wait_s=2.5, block=7), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(gauss.lindley_waits(S, A, initial_wait_s=2.5), ref, rtol=0, atol=1e-12)
    # rows are independent chains
    W2 = gauss.lindley_waits(np.stack([S, S[::-1]]), np.stack([A, A[::-1]]), block=64)
    np.testing.assert_allclose(W2[1], naive_lindley(S[::-1], A[::-1]), atol=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_kiefer_wolfowitz_matches_event_simulation(k):
    r = rng(5)
    S, A = r.exponential(k * 0.9, (4, 500)), r.exponential(1.0, (4, 500))
    W = gauss.kiefer_wolfowitz_waits(S, A, k)
    for c in range(4):
        np.testing.assert_allclose(W[c], naive_fcfs_k(S[c], A[c], k), atol=1e-9)
    if k == 1:
        np.testing.assert_allclose(W, gauss.lindley_waits(S, A), atol=1e-9)


# ------------------------------------------------------------------ textbook queues, 10^6 samples


@pytest.mark.parametrize("rho, samples", [(0.5, 4 * 10**6), (0.8, 4 * 10**6)])
def test_mm1_mean_wait_and_tail(rho, samples):
    r = gauss.simulate_queue(rho, 1.0, rng=rng(1), service_dist="exp", samples=samples, replications=4)
    mu_minus_lam = 1.0 - rho
    assert r.wait.mean == pytest.approx(rho / mu_minus_lam, rel=0.02)  # E[W] = ρ/(μ − λ)
    assert r.ttft.mean == pytest.approx(1.0 / mu_minus_lam, rel=0.02)  # sojourn = 1/(μ − λ)
    # P(W > t) = ρ·e^{−(μ−λ)t}, checked on the raw waits of the same configuration
    chains, kept, warm = _layout(samples, 4, 1)
    gen = rng(1)
    inter = gauss.unit_interarrivals((chains, kept + warm), gen) / rho
    S = gen.standard_exponential((chains, kept + warm))
    W = gauss.lindley_waits(S, inter)[:, warm:]
    for t in (0.0, 1.0 / mu_minus_lam, 2.0 / mu_minus_lam):
        expected = rho * math.exp(-mu_minus_lam * t)
        assert np.mean(W > t) == pytest.approx(expected, rel=0.02), t
    assert r.utilisation == pytest.approx(rho)
    assert r.service_rate_rps == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_pollaczek_khinchine(rho):
    r = gauss.simulate_queue(rho / 2.0, 2.0, rng=rng(2), service_dist="det", samples=10**6, replications=4)
    lam = rho / 2.0
    pk = lam * 2.0**2 / (2.0 * (1.0 - rho))  # P–K: E[W] = λ·E[S²]/(2(1 − ρ))
    assert r.wait.mean == pytest.approx(pk, rel=0.02)


def test_mg1_lognormal_pollaczek_khinchine():
    # heavy-ish tail (CV 2): slower convergence, 5% band
    rho, cv = 0.5, 2.0
    r = gauss.simulate_queue(rho, 1.0, rng=rng(4), service_dist="lognormal", service_cv=cv, samples=2 * 10**6,
                             replications=4)
    assert r.wait.mean == pytest.approx(rho * (1 + cv * cv) / (2 * (1 - rho)), rel=0.05)


@pytest.mark.parametrize("k, rho", [(2, 0.5), (4, 0.8)])
def test_mmk_mean_wait_erlang_c(k, rho):
    lam = k * rho
    r = gauss.simulate_queue(lam, 1.0, rng=rng(6), servers=k, samples=10**6, replications=4)
    wq = erlang_c(k, lam) / (k - lam)  # E[W] = C(k, a)/(kμ − λ)
    assert r.wait.mean == pytest.approx(wq, rel=0.03)
    assert r.utilisation == pytest.approx(rho)


def test_gamma_bursts_match_gi_m1():
    # GI/M/1 exact: P(W > 0) = σ with σ = A*(μ(1 − σ)); E[W] = σ/(μ(1 − σ)).
    rho, cv = 0.5, 2.0
    shape = 1.0 / cv**2
    lst = lambda s: (shape * rho / (shape * rho + s)) ** shape  # Gamma inter-arrivals, mean 1/λ
    sigma = brentq(lambda x: x - lst(1.0 - x), 1e-9, 1 - 1e-9)
    r = gauss.simulate_queue(rho, 1.0, rng=rng(7), burst_cv=cv, samples=2 * 10**6, replications=4)
    assert r.wait.mean == pytest.approx(sigma / (1 - sigma), rel=0.03)
    assert r.wait.mean > 1.5 * rho / (1 - rho)  # burstier than Poisson waits longer


def test_sustainable_rate_mm1_sojourn_quantile():
    # M/M/1 sojourn ~ Exp(μ − λ): p95 = ln 20/(μ − λ) ⇒ λ* = μ − ln 20/SLO.
    slo = 20.0
    r = gauss.simulate_queue(0.3, 1.0, rng=rng(8), samples=10**6, replications=4, slo_s=slo, quantile=0.95,
                             search_samples=10**6, sweep_points=6)
    assert r.sustainable_rate_rps == pytest.approx(1.0 - math.log(20) / slo, rel=0.02)
    assert r.sustainable_binding == "ttft_slo"
    p95 = [p.ttft_s[1] for p in r.sweep]
    assert all(b >= a for a, b in zip(p95, p95[1:]))  # common random numbers: monotone in λ


def test_same_seed_same_result_and_ci_covers():
    a = gauss.simulate_queue(0.7, 1.0, rng=rng(11), samples=200_000, replications=8)
    b = gauss.simulate_queue(0.7, 1.0, rng=rng(11), samples=200_000, replications=8)
    c = gauss.simulate_queue(0.7, 1.0, rng=rng(12), samples=200_000, replications=8)
    assert asdict(a.wait) == asdict(b.wait) and a.sustainable_rate_rps == b.sustainable_rate_rps
    assert a.wait.mean != c.wait.mean
    assert a.samples == 200_000 and a.replications == 8
    assert 0 < a.wait.mean_ci < 0.2 * a.wait.mean


# ------------------------------------------------------------------ workload sampling


def test_lognormal_lengths_have_the_requested_moments():
    x = gauss.sample_lengths(gauss.LogNormalLength(1000.0, 1.5), 10**6, rng(1))
    assert x.mean() == pytest.approx(1000.0, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(1.5, rel=0.05)


def test_histogram_lengths_follow_vllm_cumulative_buckets():
    # vLLM/Prometheus style: le bounds with cumulative counts and a +Inf bucket
    bounds = (10.0, 50.0, 100.0, 200.0, float("inf"))
    cum = (0.0, 300.0, 800.0, 1000.0, 1000.0)
    x = gauss.sample_lengths(gauss.HistogramLength(bounds, cum), 200_000, rng(2))
    assert np.mean(x <= 10) == pytest.approx(0.0, abs=1e-9)
    assert np.mean(x <= 50) == pytest.approx(0.3, abs=0.005)
    assert np.mean(x <= 100) == pytest.approx(0.8, abs=0.005)
    assert x.max() <= 200.0
    with pytest.raises(InputError, match="cumulative_counts"):
        gauss.sample_lengths(gauss.HistogramLength((1.0, 2.0), (5.0, 3.0)), 10, rng())


def test_bucket_workload_weights_and_cached_prefix():
    wl = gauss.BucketWorkload(input_tokens=(100, 4000), cached_tokens=(0, 3000), output_tokens=(50, 10),
                              weights=(3.0, 1.0))
    inp, cached, out = gauss.sample_workload(wl, 100_000, rng(3))
    assert np.mean(inp == 4000) == pytest.approx(0.25, abs=0.01)
    assert np.all(cached[inp == 4000] == 3000) and np.all(cached[inp == 100] == 0)
    with pytest.raises(InputError, match="weights"):
        gauss.sample_workload(gauss.BucketWorkload((1,), (0,), (1,), (-1.0,)), 5, rng())


# ------------------------------------------------------------------ service model


def test_prefill_closed_form_matches_chunk_by_chunk_sum():
    for inp, cached in ((1, 0), (512, 0), (513, 0), (5000, 1200), (3000, 2999)):
        s, c, total, n = inp - cached, cached, 0.0, 0
        done = 0
        while done < s:
            m = min(512, s - done)
            done += m
            # causal: the chunk's token k attends the prefix before the chunk and the chunk's tokens 1..k
            total += 2e-3 + 3e-5 * m + 1e-9 * (m * (c + done - m) + m * (m + 1) / 2)
            n += 1
        compute, chunks = gauss.prefill_compute_s(COEF, inp, cached)
        assert chunks == n
        assert compute == pytest.approx(total, rel=1e-12)


def test_slim_mapping_reproduces_slim_equations():
    L, D, Dkv, rff, bkv, F, BW = 32, 4096, 1024, 5.25, 2, 989e12, 3.35e12
    th = dict(eta_c=0.55, eta_m=0.8, alpha=2e-4, gamma=1e-6, b0=12.0, t_fixed_s=0.02)
    coef = gauss.coefficients_from_slim(**th, layers=L, hidden=D, kv_dim=Dkv, ff_ratio=rff, kv_bytes=bkv,
                                        peak_flops=F, bandwidth_bytes_s=BW, chunk_tokens=8192)
    IL, OL, B = 3000, 400, 16
    f_pre = L * (IL * (4 * D**2 + 4 * D * Dkv + 4 * rff * D**2) + 4 * IL**2 * D)  # eq. 8, B = 1
    compute, n = gauss.prefill_compute_s(coef, IL, 0)
    # eq. 8 counts all IL² query–key pairs, GAUSS the causal IL·(IL+1)/2 (prefill_compute_s)
    square = coef.prefill_s_per_attended_token * (IL * IL - IL * (IL + 1) / 2)
    assert n == 1 and compute + square == pytest.approx(f_pre / (th["eta_c"] * F), rel=1e-12)  # eq. 7
    c_tokens = OL * (IL + 1) + OL * (OL - 1) / 2  # eq. 12
    m_dec = 2 * L * Dkv * bkv * c_tokens  # eq. 11
    t_d = th["alpha"] * OL + th["gamma"] * L * (D / 1024) ** 2 * OL  # eq. 10
    t_dec = (B + th["b0"]) * (t_d + m_dec / (th["eta_m"] * BW))  # eq. 9
    per_step = gauss.decode_step_s(coef, B, B * c_tokens / OL)
    assert OL * per_step == pytest.approx(t_dec, rel=1e-12)
    assert coef.request_overhead_s == 0.02


@pytest.mark.parametrize("form", ["paper-a", "paper-b", "kneecap"])
def test_coefficients_reproduce_the_slim_module(form):
    # E2E of a batch of B requests from kneecap.model.slim (written independently) equals
    # B·prefill(IL) + OL·d(B, B·C(IL, OL)/OL) + t_fixed with GAUSS coefficients.
    from kneecap.model import slim
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu

    arch, gpu = get_arch("llama-3.1-8b"), get_gpu("h100-80gb")
    params = slim.SlimParams(eta_c=0.45, eta_m=0.7, alpha_s=6e-5, gamma_s=2e-7, b0=25.0, t_fixed_s=0.02,
                             t_step_s=3e-4, t_layer_s=5e-5, eta_w=0.85)
    coef = gauss.coefficients_for(arch, gpu, params, form=form, chunk_tokens=10**6)
    B, IL, OL = np.array([1.0, 8.0, 64.0]), np.array([500.0, 2000.0, 128.0]), np.array([300.0, 50.0, 900.0])
    e2e = slim.predict(form, params, arch, gpu, B, IL, OL).e2e_s
    compute, _ = gauss.prefill_compute_s(coef, IL, 0.0)
    # SLIM's eq. 8 counts all IL² query–key pairs; GAUSS's causal attention IL·(IL+1)/2 of them
    hidden = coef.prefill_s_per_attended_token * (IL * IL - IL * (IL + 1) / 2)
    ours = (B * (compute + hidden) + OL * gauss.decode_step_s(coef, B, B * slim.c_tokens(IL, OL) / OL)
            + coef.request_overhead_s)
    np.testing.assert_allclose(ours, e2e, rtol=1e-10)


def test_operating_point_obeys_littles_law():
    wl = gauss.Workload(gauss.LogNormalLength(800, 1.0), gauss.LogNormalLength(150, 1.0))
    inp, cached, out = gauss.sample_workload(wl, 200_000, rng(9))
    m = gauss.workload_moments(COEF, inp, cached, out)
    op = gauss.operating_point(COEF, m, 2.0)
    assert op.decode_batch == pytest.approx(2.0 * m.output_tokens * op.mean_step_s, rel=1e-9)
    # the running decodes take their budget tokens first: chunks of Δ = 512 − ⌊B̄⌋ (B̄ ≈ 5)
    assert op.chunk_tokens == 512 - math.floor(op.decode_batch) < 512
    compute, chunks = gauss.prefill_compute_s(COEF, inp, cached, op.chunk_tokens)
    assert (op.prefill_compute_s, op.chunks) == pytest.approx((compute.mean(), chunks.mean()), rel=1e-12)
    assert op.chunks > m.chunks
    # a decoding request sees itself plus B̄ others: τ = d(1 + B̄, (1 + B̄)·c̄)/(1 − ρ_c)
    tagged = gauss.decode_step_s(COEF, 1 + op.decode_batch, (1 + op.decode_batch) * m.context_tokens)
    assert op.mean_step_s == pytest.approx(tagged / (1 - 2.0 * op.prefill_compute_s), rel=1e-12)
    assert op.utilisation == pytest.approx(2.0 * op.mean_service_s)
    tau_sys = op.decode_step_s / (1 - 2.0 * op.prefill_compute_s)  # engine steps, empty batches cost p
    assert op.chunk_step_fraction == pytest.approx(op.utilisation * tau_sys / (op.mean_chunk_s + op.decode_step_s),
                                                   rel=1e-9)


def test_decode_without_a_fixed_step_cost_has_a_batch_and_finite_tbt():
    # SLIM forms can give p = q = 0 (no per-step floor): the tagged request's own cost keeps
    # B̄ and τ positive, so TBT is finite even at a tiny rate
    coef = gauss.ServiceCoefficients(prefill_s_per_token=3e-5, decode_s_per_seq=2e-3, decode_s_per_resident_token=1e-7)
    r = gauss.simulate(WL, coef, 1e-3, rng=rng(14), samples=20_000, replications=4, slo_ttft_s=1.0, slo_tbt_s=0.01)
    assert r.decode_batch > 0 and math.isfinite(r.tbt.p99)
    assert r.tbt.p50 == pytest.approx(float(gauss.decode_step_s(coef, 1.0, 876.0)), rel=0.05)
    assert 0 < r.sustainable_rate_rps < r.stable_rate_rps


def test_engine_simulation_light_load_is_service_time():
    r = gauss.simulate(WL, COEF, 0.05, rng=rng(10), samples=200_000, replications=4)
    assert r.wait.mean < 0.01 * r.service.mean
    assert r.ttft.mean == pytest.approx(r.service.mean + COEF.request_overhead_s, rel=0.02)
    # nearly alone in the batch: TBT ≈ d(1, own context) with a context ≈ 800 + 75
    assert r.tbt.p50 == pytest.approx(float(gauss.decode_step_s(COEF, 1.0, 876.0)), rel=0.05)
    assert r.decode_batch < 0.2


def test_engine_simulation_tail_grows_with_load_and_finds_lambda_star():
    r = gauss.simulate(WL, COEF, 3.0, rng=rng(10), samples=400_000, replications=4, slo_ttft_s=0.6, slo_tbt_s=0.06,
                       sweep_points=8)
    assert 0 < r.sustainable_rate_rps < r.stable_rate_rps
    assert r.sustainable_binding in ("ttft_slo", "tbt_slo")
    ttft95 = [p.ttft_s[1] for p in r.sweep]
    tbt95 = [p.tbt_s[1] for p in r.sweep]
    assert all(b >= a for a, b in zip(ttft95, ttft95[1:])) and all(b >= a for a, b in zip(tbt95, tbt95[1:]))
    assert r.ttft.p50 <= r.ttft.p95 <= r.ttft.p99 and r.tbt.p50 <= r.tbt.p95 <= r.tbt.p99
    # at λ* the binding quantile sits at the SLO (evaluated on fresh samples: 5% band)
    at = gauss.simulate(WL, COEF, r.sustainable_rate_rps, rng=rng(10), samples=400_000, replications=4)
    value = at.ttft.p95 if r.sustainable_binding == "ttft_slo" else at.tbt.p95
    slo = 0.6 if r.sustainable_binding == "ttft_slo" else 0.06
    assert value == pytest.approx(slo, rel=0.05)
    k2 = gauss.simulate(WL, COEF, 3.0, rng=rng(10), samples=400_000, replications=4, servers=2)
    assert k2.stable_rate_rps == pytest.approx(2 * r.stable_rate_rps, rel=0.01)  # other samples, same law
    assert k2.wait.mean < r.wait.mean


def _counting_evaluations(monkeypatch):
    calls = []
    real = gauss_search._evaluate  # the λ search's evaluations, where _sustainable looks them up
    monkeypatch.setattr(gauss_search, "_evaluate", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    return calls


def test_sustainable_rate_alone_is_simulates_lambda_star_and_a_hint_only_saves_evaluations(monkeypatch):
    kw = dict(samples=20_000, replications=4, slo_ttft_s=0.6, slo_tbt_s=0.06)
    full = gauss.simulate(WL, COEF, 1e-3, rng=rng(3), search_samples=20_000, **kw)
    calls = _counting_evaluations(monkeypatch)
    cold = gauss.sustainable_rate(WL, COEF, rng=rng(3), **kw)
    cold_calls = len(calls)
    # the same draws and bisection: simulate's λ* exactly (both to 0.1%)
    assert cold.rate_rps == full.sustainable_rate_rps and cold.binding == full.sustainable_binding
    assert cold.stable_rate_rps == full.stable_rate_rps and cold.note is None
    for hint in (0.98 * cold.rate_rps, 1.03 * cold.rate_rps, 0.7 * cold.rate_rps, 1.4 * cold.rate_rps):
        calls.clear()
        warm = gauss.sustainable_rate(WL, COEF, rng=rng(3), hint_rps=hint, **kw)
        assert warm.rate_rps == pytest.approx(cold.rate_rps, rel=2e-3) and warm.binding == cold.binding
        assert len(calls) <= cold_calls
    calls.clear()
    gauss.sustainable_rate(WL, COEF, rng=rng(3), hint_rps=1.02 * cold.rate_rps, **kw)
    assert len(calls) <= cold_calls - 4  # inside ±5%: a 10% bracket, not [0, stability limit]
    coarse = gauss.sustainable_rate(WL, COEF, rng=rng(3), rel_tol=0.01, **kw)
    assert coarse.rate_rps == pytest.approx(cold.rate_rps, rel=0.011)
    # a hint past the stability limit, or an SLO no load meets, still gives the cold answers
    past = gauss.sustainable_rate(WL, COEF, rng=rng(3), hint_rps=10 * cold.stable_rate_rps, **kw)
    assert past.rate_rps == cold.rate_rps
    none = gauss.sustainable_rate(WL, COEF, rng=rng(3), samples=20_000, slo_ttft_s=0.001, hint_rps=cold.rate_rps)
    assert none.rate_rps == 0.0 and none.note.startswith("infeasible: prefill stage: ")


@pytest.mark.parametrize("kwargs, field", [(dict(rel_tol=0.0), "rel_tol"), (dict(hint_rps=-1.0), "hint_rps"),
                                           (dict(slo_tbt_s=0.0), "slo_tbt_s"), (dict(samples=10), "samples")])
def test_bad_sustainable_rate_arguments_name_the_field(kwargs, field):
    with pytest.raises(InputError) as exc:
        gauss.sustainable_rate(WL, COEF, rng=rng(), **{"samples": 20_000, "slo_ttft_s": 0.6, **kwargs})
    assert exc.value.field == field


# ------------------------------------------------------------------ infeasible inputs


def test_unstable_queue_is_infeasible_not_nan():
    with pytest.raises(gauss.Infeasible, match=r"^infeasible: queue stage: ρ") as exc:
        gauss.simulate_queue(1.0, 1.0, rng=rng())
    assert exc.value.stage == "queue"
    with pytest.raises(gauss.Infeasible, match="infeasible: queue stage"):
        gauss.simulate_queue(5.0, 1.0, servers=4, rng=rng())


def test_engine_rate_past_stability_names_the_stage():
    r = gauss.simulate(WL, COEF, 1.0, rng=rng(), samples=20_000, replications=4)
    with pytest.raises(gauss.Infeasible, match=r"^infeasible: (prefill|decode) stage: ") as exc:
        gauss.simulate(WL, COEF, r.stable_rate_rps * 1.01, rng=rng(), samples=20_000, replications=4)
    assert exc.value.stage == r.stable_binding
    # prefill compute alone saturating the slot
    slow = gauss.ServiceCoefficients(prefill_s_per_token=1e-3, decode_step_s=1e-4)
    with pytest.raises(gauss.Infeasible, match="infeasible: prefill stage"):
        gauss.simulate(WL, slow, 2.0, rng=rng(), samples=20_000, replications=4)


def test_slo_below_service_time_is_infeasible():
    r = gauss.simulate(WL, COEF, 1.0, rng=rng(), samples=50_000, replications=4, slo_ttft_s=0.001)
    assert r.sustainable_rate_rps == 0.0
    assert r.sustainable_note.startswith("infeasible: prefill stage: ") and "below the service time" in r.sustainable_note
    r = gauss.simulate(WL, COEF, 1.0, rng=rng(), samples=50_000, replications=4, slo_tbt_s=0.005)
    assert r.sustainable_rate_rps == 0.0 and r.sustainable_note.startswith("infeasible: decode stage: ")
    assert r.ttft.q is None  # p95: no extra quantile
    for stats in (r.ttft, r.tbt, r.wait):
        for value in (v for k, v in asdict(stats).items() if k not in ("q", "pq", "pq_ci")):
            assert math.isfinite(value)


@pytest.mark.parametrize("kwargs, field", [
    (dict(rate_rps=-1.0), "rate_rps"), (dict(servers=0), "servers"), (dict(replications=1), "replications"),
    (dict(samples=10), "samples"), (dict(quantile=1.0), "quantile"), (dict(service_mean_s=0.0), "service_mean_s"),
])
def test_bad_queue_arguments_name_the_field(kwargs, field):
    args = dict(rate_rps=0.5, service_mean_s=1.0, rng=rng(), samples=10_000)
    args.update(kwargs)
    rate, mean = args.pop("rate_rps"), args.pop("service_mean_s")
    with pytest.raises(InputError) as exc:
        gauss.simulate_queue(rate, mean, **args)
    assert exc.value.field == field


def test_bad_coefficients_are_rejected():
    with pytest.raises(InputError, match="chunk_tokens"):
        gauss.ServiceCoefficients(prefill_s_per_token=1e-5, decode_step_s=0.01, chunk_tokens=0)
    with pytest.raises(InputError, match="decode"):
        gauss.ServiceCoefficients(prefill_s_per_token=1e-5)
    with pytest.raises(InputError, match="eta_c"):
        gauss.coefficients_from_slim(eta_c=0, eta_m=1, alpha=0, gamma=0, b0=0, t_fixed_s=0, layers=1, hidden=1,
                                     kv_dim=1, ff_ratio=1, kv_bytes=2, peak_flops=1, bandwidth_bytes_s=1)


def test_bursty_arrivals_raise_the_engine_tail():
    poisson = gauss.simulate(WL, COEF, 3.0, rng=rng(13), samples=200_000, replications=4)
    bursty = gauss.simulate(WL, COEF, 3.0, rng=rng(13), samples=200_000, replications=4, burst_cv=3.0)
    assert bursty.ttft.p95 > 1.5 * poisson.ttft.p95
    assert bursty.tbt.p95 > poisson.tbt.p95  # bursts of prefill chunks stretch the decode steps
    assert bursty.stable_rate_rps == pytest.approx(poisson.stable_rate_rps, rel=0.01)  # same means
