"""SARA model: Table I, queueing pieces against closed forms, planning, exhaustive gap, infeasibility."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import sara
from kneecap.model.arch import get_arch
from kneecap.model.queueing import (
    LengthDist, erlang_c, mg1_wait_tail_table, mgk_conditional_wait_mean_s, moment_matched_cdf, moment_matched_ppf,
)

# SARA Table I: g, γ (GiB/token, MHA), Ω_LLM (GiB)
TABLE_I = {
    "llama-3.1-8b": (0.25, 4.883e-4, 14.90),
    "qwen2.5-32b": (0.2, 1.221e-3, 59.60),
    "gpt-3-175b": (1.0, 4.395e-3, 325.96),
}


@pytest.mark.parametrize("key", sorted(TABLE_I))
def test_table_i_reproduced(key):
    g, gamma, omega = TABLE_I[key]
    arch = get_arch(key)
    assert arch.gqa_factor == pytest.approx(g, rel=1e-12)
    assert sara.gamma_gib_per_token(arch) == pytest.approx(gamma, rel=0.01)
    assert sara.omega_llm_gib(arch) == pytest.approx(omega, rel=0.01)


def test_prefill_multiplications_match_sara_ratio():
    # SARA §IV-A: N_layer·N_mod·IL²/N_mul(IL) = 0.0256 — check the formula's quadratic share is
    # in that range for LLaMA 3.1 8B at a 1k–2k prompt.
    arch = get_arch("llama-3.1-8b")
    il = np.array([1024.0, 2048.0])
    share = arch.layers * arch.hidden * il**2 / sara.n_mul(arch, il)
    assert np.all((share > 0.01) & (share < 0.06))


def test_erlang_c_textbook_values():
    assert float(erlang_c(1, 0.7)) == pytest.approx(0.7, rel=1e-12)  # M/M/1: C = ρ
    assert float(erlang_c(2, 1.0)) == pytest.approx(1 / 3, rel=1e-12)
    # k=3, A=2: C = (A^k/k! · k/(k−A)) / (Σ_{j<k} A^j/j! + A^k/k! · k/(k−A)) = 4/9
    assert float(erlang_c(3, 2.0)) == pytest.approx(4 / 9, rel=1e-12)
    big = erlang_c(np.array([500, 1000]), np.array([480.0, 990.0]))  # stable at large k
    assert np.all((big > 0) & (big < 1))
    assert float(erlang_c(4, 4.0)) == 1.0 and float(erlang_c(4, 0.0)) == 0.0


def test_length_dist_moments_and_quadrature():
    for fam in ("lognormal", "gamma"):
        d = LengthDist(1024.0, 1.25, fam)
        assert d.raw_moment(1) == pytest.approx(1024.0, rel=1e-9)
        assert d.raw_moment(2) == pytest.approx(1024.0**2 * (1 + 1.25**2), rel=1e-9)
        assert d.expect(lambda x: x**2) == pytest.approx(d.raw_moment(2), rel=1e-6)
        assert float(d.cdf(d.ppf(0.95))) == pytest.approx(0.95, abs=1e-12)
    assert float(moment_matched_cdf(moment_matched_ppf(0.9, 10.0, 30.0, "gamma"), 10.0, 30.0, "gamma")) == pytest.approx(0.9)


def test_mm1_ttft_exact_in_light_tailed_case():
    # With an exponential service time (M/M/1) the heavy-traffic tail is exact: TTFT ~ Exp(μ − λ).
    w = sara.make_workload(1000, 1.0, 256, 1.0, "light")
    pb = sara.build_problem("llama-3.1-8b", "a100-80gb", w, prefill_service_s=lambda il: 1e-4 * np.asarray(il),
                            nodes=4096)
    rate = 0.7 / pb.sp_mean_s
    t = sara.ttft_quantile_s(pb, rate, 1, 0.95)
    exact = -math.log(0.05) / (1 / pb.sp_mean_s - rate)
    assert t == pytest.approx(exact, rel=0.01)


def _problem(key="llama-3.1-8b", tail="heavy"):
    cv = 1.25 if tail == "heavy" else 1.0
    return sara.build_problem(key, "a100-80gb", sara.make_workload(1024, cv, 256, 1.0, tail), sara.SLO(), sara.Costs())


def test_plan_meets_every_slo_and_budget():
    pb = _problem()
    res = sara.plan(pb, 40.0)
    assert res.feasible and res.goodput_rps > 0
    a = res.allocation
    assert res.cost_per_hour <= 40.0 + 1e-9
    assert res.cost_per_hour == pytest.approx(a.cost_per_hour(pb.costs))
    lam, q = res.goodput_rps, pb.slo.quantile
    assert float(sara.prefill_attainment(pb, lam, a.prefill_replicas)) >= q
    assert float(sara.kv_attainment(pb, lam, a.kv_bandwidth_gibps)) >= q
    assert bool(sara.decode_ok(pb, lam, a.decode_replicas, a.max_num_seqs))
    # one fewer prefill replica or decode GPU breaks an SLO at this rate (minimality)
    assert float(sara.prefill_attainment(pb, lam, a.prefill_replicas - 1)) < q or a.prefill_replicas == 1
    assert not bool(sara.decode_ok(pb, lam, a.decode_replicas - 1, a.max_num_seqs))
    assert set(res.binding) >= {"prefill", "kv", "decode"}
    # a 2% higher rate does not fit the budget
    alloc, _ = sara.min_resources(pb, lam * 1.02)
    assert alloc.cost_per_hour(pb.costs) > 40.0


def test_goodput_grows_with_budget():
    pb = _problem()
    g = [sara.plan(pb, b).goodput_rps for b in (20, 40, 80)]
    assert g[0] < g[1] < g[2]


@pytest.mark.parametrize("tail", ["light", "heavy"])
def test_sara_matches_exhaustive(tail):
    pb = _problem("qwen2.5-32b", tail)
    s = sara.plan(pb, 60.0)
    e = sara.exhaustive(pb, 60.0, kv_grid_points=1500)
    assert s.feasible and e.feasible
    assert s.goodput_rps == pytest.approx(e.goodput_rps, rel=0.05)
    assert e.cost_per_hour <= 60.0 + 1e-9
    # the exhaustive optimum is itself SLO-feasible
    a = e.allocation
    assert bool(sara.decode_ok(pb, e.goodput_rps * (1 - 1e-9), a.decode_replicas, a.max_num_seqs))


def test_infeasible_budget_below_stability_floor():
    pb = _problem("gpt-3-175b")
    res = sara.plan(pb, 30.0)  # weights alone need 5 + 5 A100s = 50 $/h
    assert not res.feasible and res.goodput_rps == 0.0 and res.allocation is None
    assert res.message.startswith("infeasible: ") and "stability floor" in res.message
    assert res.binding["stage"] in ("prefill", "decode")
    ex = sara.exhaustive(pb, 30.0)
    assert not ex.feasible and ex.message.startswith("infeasible: ")


def test_infeasible_slo_below_service_time():
    pb = sara.build_problem("llama-3.1-8b", "a100-80gb", sara.make_workload(1024, 1.25, 256, 1.0, "heavy"),
                            sara.SLO(ttft_s=0.01))
    res = sara.plan(pb, 100.0)
    assert not res.feasible
    assert res.message.startswith("infeasible: prefill: TTFT SLO 0.01 s is below")


def test_unstable_rates_give_zero_attainment_and_infinite_quantiles_not_nan():
    pb = _problem()
    rate = 2.0 / pb.sp_mean_s  # ρ_p = 2 on one replica
    assert float(sara.prefill_attainment(pb, rate, 1)) == 0.0
    assert sara.ttft_quantile_s(pb, rate, 1) == math.inf
    assert float(sara.kv_attainment(pb, 1e6, 1.0)) == 0.0
    assert sara.kv_quantile_s(pb, 1e6, 1.0) == math.inf
    assert float(sara.tpot_attainment(pb, 1e6, 1)) == 0.0
    assert sara.tpot_quantile_s(pb, 1e6, 1) == math.inf
    assert float(sara.decode_batch_mean(pb, 1e6, 1)) == math.inf
    for v in (sara.prefill_attainment(pb, np.array([0.0, rate]), 1), sara.kv_attainment(pb, np.array([1.0, 1e6]), 1.0)):
        assert not np.any(np.isnan(v))


def test_bad_inputs_name_the_field():
    with pytest.raises(InputError, match="tail"):
        sara.make_workload(1024, 1.0, 256, 1.0, "medium")
    with pytest.raises(InputError, match="input_cv"):
        sara.make_workload(1024, -1.0, 256)
    with pytest.raises(InputError, match="quantile"):
        sara.SLO(quantile=1.0)
    with pytest.raises(InputError, match="slo_tpot_s"):
        sara.SLO(tpot_s=0)
    with pytest.raises(InputError, match="budget_per_hour"):
        sara.plan(_problem(), 0.0)


def test_colocated_plan():
    c = sara.plan_colocated(2.5, 1, 5.0, rate_rps=12.0)
    assert (c.replicas, c.goodput_rps, c.cost_per_hour, c.binding) == (5, 12.5, 25.0, "rate")
    c = sara.plan_colocated(2.5, 2, 5.0, rate_rps=100.0, budget_per_hour=42.0)
    assert (c.replicas, c.goodput_rps, c.binding) == (4, 10.0, "budget")
    c = sara.plan_colocated(2.5, 2, 5.0, budget_per_hour=5.0)
    assert not c.feasible and c.message.startswith("infeasible: colocated")
    with pytest.raises(InputError):
        sara.plan_colocated(2.5, 0, 5.0, rate_rps=1.0)


def test_wait_tail_table_exponential_and_md1_exact():
    """The tabulated M/G/1 waiting law against closed forms: exponential service gives
    Pr(W > x | W > 0) = e^{−x(1−ρ)/E[S]}; deterministic service (D = 1) Erlang's M/D/1 formula
    Pr(W ≤ t) = (1 − ρ)·Σ_{j ≤ t} (ρ(j − t))^j/j!·e^{−ρ(j − t)}."""
    u = (np.arange(8192) + 0.5) / 8192
    table = mg1_wait_tail_table(-np.log1p(-u))
    y = np.array([0.25, 1.0, 2.0, 3.0, 5.0])
    for rho in (0.0, 0.3, 0.7, 0.9, 0.95, 0.985):
        np.testing.assert_allclose(table(rho, y), np.exp(-y), rtol=0.01)
    table = mg1_wait_tail_table(np.ones(16))
    assert table.mean_residual_s == pytest.approx(0.5)
    for rho in (0.5, 0.8):
        for t in (0.5, 1.5, 3.0, 4.5):
            j = np.arange(int(math.floor(t)) + 1)
            exact = (1 - rho) * np.sum((rho * (j - t)) ** j / np.array([math.factorial(i) for i in j]) * np.exp(-rho * (j - t)))
            w_c = table.mean_residual_s / (1 - rho)  # E[W | W > 0] = E[R]/(1 − ρ)
            model = 1 - rho * float(table(rho, t / w_c))
            assert model == pytest.approx(exact, abs=2e-3)


def test_mgk_wait_mean_limits():
    """E[W | W > 0]: Erlang's M/M/k value 1/(kμ − λ) for exponential service at any k; for the
    heavy-tailed prefill law it tends to the heavy-traffic E[R]/(k − A) as ρ → 1 and to the
    light-traffic k·E[min of k residuals] below it."""
    u = (np.arange(8192) + 0.5) / 8192
    table = mg1_wait_tail_table(-np.log1p(-u))
    for k, a in ((1, 0.5), (4, 2.0), (8, 7.2)):
        assert float(mgk_conditional_wait_mean_s(table, k, a)) == pytest.approx(1 / (k - a), rel=0.01)
    pb = _problem()
    t = pb.prefill_wait_tail
    heavy = t.mean_residual_s / (4 - 4 * 0.999)
    assert float(mgk_conditional_wait_mean_s(t, 4, 4 * 0.999)) == pytest.approx(heavy, rel=0.01)
    light = float(mgk_conditional_wait_mean_s(t, 4, 0.04)) * (4 - 0.04) / t.mean_residual_s
    assert light == pytest.approx(t.light_traffic_factor[3], rel=0.01)
    assert 0.5 < t.light_traffic_factor[3] < 0.8  # 2/(1 + c²) ≈ 0.70 at large k, c² = 1.84
    assert math.isinf(float(mgk_conditional_wait_mean_s(t, 4, 4.0)))


def test_near_deterministic_prompts_build_and_light_traffic_factor():
    """CV 0.05 (gamma shape 400: Γ overflows the Laguerre rule) still builds with finite moments;
    with near-constant service the residual is uniform and k·E[min of k]/E[R] = 2k/(k + 1)."""
    pb = sara.build_problem("llama-3.1-8b", "a100-80gb", sara.make_workload(1024, 0.05, 256, 1.0, "light"))
    assert math.isfinite(pb.sp_mean_s) and pb.sp_scv < 0.05
    phi0 = pb.prefill_wait_tail.light_traffic_factor
    for k in (2, 4, 8):
        assert phi0[k - 1] == pytest.approx(2 * k / (k + 1), rel=0.03)
    assert math.isfinite(sara.ttft_quantile_s(pb, 3.0 / pb.sp_mean_s, 4))
