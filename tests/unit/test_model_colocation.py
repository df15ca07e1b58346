"""Co-location of vLLM engines on one GPU (kneecap.model.colocation) against its closed cases:
one engine alone is SLIM/GAUSS unchanged, an identical pair always busy (TTFT counts the wait
once), a decode-heavy pair beside a bursty partner busy part of the time (step-average waits and a
mixture of busy and idle regimes), a pair past saturation, and the memory shares."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import colocation as co
from kneecap.model import gauss
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.model.slim import SlimParams

GPU = "h100-80gb"
ARCH = "llama-3.1-8b"
IL, OL = 64, 512
WL = gauss.Workload(gauss.FixedLength(IL), gauss.FixedLength(OL))  # decode-heavy, bandwidth-bound steps
SAMPLES = 40_000


def engine(rate, u=0.45, **kw):
    return co.EngineLoad(ARCH, WL, rate, u, **kw)


def alone(u=0.45):
    """(coef, limits, moments, σ) of one engine alone, by the public SLIM → GAUSS path."""
    arch, gpu = get_arch(ARCH), get_gpu(GPU)
    limits, budget = gauss.engine_limits_for(arch, gpu, gpu_memory_utilization=u)
    coef = gauss.coefficients_for(arch, gpu, SlimParams(), chunk_tokens=budget)
    m = gauss.workload_moments(coef, np.full(4, float(IL)), np.zeros(4), np.full(4, float(OL)))
    sigma = coef.decode_s_per_seq + coef.decode_s_per_resident_token * m.context_tokens  # r + s·c̄
    return coef, limits, m, sigma


def prefill_s(coef):
    return float(gauss.prefill_compute_s(coef, IL, 0)[0])


# ------------------------------------------------------------------ (a) one engine alone


def test_one_engine_alone_is_slim_and_gauss_unchanged_exactly():
    coef, limits, m, _ = alone()
    [t] = co.colocated_tails([engine(4.0)], GPU, seed=7, samples=SAMPLES)
    ref = gauss.simulate(WL, coef, 4.0, rng=np.random.default_rng(7), samples=SAMPLES, replications=4,
                         search_samples=SAMPLES, limits=limits)
    assert t.feasible and t.interference_s == 0.0
    assert t.ttft_s == (ref.ttft.p50, ref.ttft.p95, ref.ttft.p99)
    assert t.tpot_s == (ref.tbt.p50, ref.tbt.p95, ref.tbt.p99)
    assert t.utilisation == ref.utilisation
    assert t.step_s == gauss.operating_point(coef, m, 4.0, limits).mean_step_s
    assert co.colocated_coefficients(coef, 0.0) is coef
    b, c = np.array([1.0, 8.0, 64.0]), np.array([300.0, 2600.0, 20000.0])
    assert np.array_equal(co.colocated_step_s(coef, b, c, 0.0), gauss.decode_step_s(coef, b, c))
    # the real numbers: TPOT p50 10.56 ms, TTFT p50 27.4 ms, a 21.7-sequence batch always busy
    assert t.tpot_s[0] == pytest.approx(0.010558, rel=1e-3)
    assert t.ttft_s[0] == pytest.approx(0.027436, rel=1e-3)
    assert t.busy_probability == pytest.approx(1.0, abs=1e-9) and t.gpu_share == pytest.approx(1.0, abs=1e-9)


# ------------------------------------------------------------------ (b) two identical engines, half the load each


def test_two_identical_engines_at_half_load_each():
    """λ = 4 req/s split over two identical engines. Both are always busy (B̄ ≈ 22, a = 1 − e^{−B̄}),
    so each waits the other's whole step (A2): Δ = π = T/2, T the round. With GAUSS §3.8 (τ = T +
    σ/(1 − ρ_c), T·(1 − ρ_c) = p + Δ + σ·B̄, B̄ = λ·OL·τ at λ = 2):
        T·(1/2 − ρ_c − σ·λ·OL) = p + σ²·λ·OL/(1 − ρ_c)."""
    coef, limits, m, sigma = alone()
    p, lam = coef.decode_step_s, 2.0
    rho_c = lam * prefill_s(coef)
    T = (p + sigma * sigma * lam * OL / (1.0 - rho_c)) / (0.5 - rho_c - sigma * lam * OL)
    tau = T + sigma / (1.0 - rho_c)
    pt = co.colocation_point([engine(lam), engine(lam)], GPU)
    assert pt.infeasible is None
    # rel 1e-8: the closed form takes a = 1, the model 1 − e^{−B̄} (e^{−B̄} ≈ 1e-9 at B̄ ≈ 21)
    assert pt.interference_s[0] == pt.interference_s[1] == pytest.approx(T / 2.0, rel=1e-8)
    assert pt.operating_points[0].mean_step_s == pytest.approx(tau, rel=1e-9)
    assert sum(pt.gpu_share) == pytest.approx(1.0, abs=1e-9)  # (C5): the GPU never idles
    # one engine taking all 4 req/s: τ = (p + σ)/(1 − ρ_c − λ·OL·σ) at λ = 4
    tau_one = (p + sigma) / (1.0 - 2.0 * rho_c - 4.0 * OL * sigma)
    assert gauss.operating_point(coef, m, 4.0, limits).mean_step_s == pytest.approx(tau_one, rel=1e-9)
    # the pair reads the weights twice a round: ρ_c → 0 gives τ_pair − τ_one = p/(1 − λ_tot·OL·σ)
    assert tau - tau_one == pytest.approx(p / (1.0 - 4.0 * OL * sigma), rel=0.03)
    assert (T / 2.0, tau, tau_one) == pytest.approx((0.010440, 0.021002, 0.010583), rel=1e-3)
    # GAUSS on the slower service: identical engines, identical tails (common random numbers)
    a, b = co.colocated_tails([engine(lam), engine(lam)], GPU, samples=SAMPLES)
    assert a.feasible and a.ttft_s == b.ttft_s and a.tpot_s == b.tpot_s
    assert a.tpot_s[0] == pytest.approx(tau, rel=0.02)
    # (C6): the first token ends the engine's own step, so GAUSS's TTFT at p + Δ less one Δ: the
    # wait for the partner's step is in the residual (the wait for the engine's next step), not
    # again after the prefill step. Always-busy partners: GAUSS's quantiles shifted, up to (C11)'s
    # zero-mean spread of the partner's prefill chunks (fixed 64-token prompts: a few tenths of a %)
    ref = gauss.simulate(WL, co.colocated_coefficients(coef, T / 2.0), lam, rng=np.random.default_rng(0),
                         samples=SAMPLES, replications=4, search_samples=SAMPLES, limits=limits)
    assert a.ttft_s == pytest.approx((ref.ttft.p50 - T / 2.0, ref.ttft.p95 - T / 2.0, ref.ttft.p99 - T / 2.0),
                                     rel=5e-3)
    assert a.tpot_s == pytest.approx((ref.tbt.p50, ref.tbt.p95, ref.tbt.p99), rel=1e-3)
    assert a.ttft_s[:2] == pytest.approx((0.03257, 0.04198), rel=2e-3)  # was 43.01, 52.42 ms
    [one] = co.colocated_tails([engine(4.0)], GPU, samples=SAMPLES)
    assert a.tpot_s[0] > 1.9 * one.tpot_s[0]


# ------------------------------------------------------------------ (c) a memory-bound pair, a bursty partner


def test_memory_bound_pair_beside_a_bursty_partner():
    """Engine 1 at 4 req/s beside a light engine 2 (0.05 req/s, B̄ ≈ 0.5, busy a_2 ≈ 0.41 of the
    time). (C3) j's step when busy g_2 = π_2/a_2; (C7) its busy periods last E[BP] = a/(λ(1 − a))
    ≈ 14 s, longer than engine 1's requests decode (D_1 = 511·τ_1 ≈ 6.9 s), so (C8) w ≈ 0.67;
    (C9) engine 1 steps more slowly while engine 2 is busy, so only q_12 ≈ 0.27 < a_2 of its steps
    wait on it: Δ_1 = q_12·g_12 ≈ 2.1 ms, not the random observer's a_2·g_2 = 3.1 ms. (C10) TPOT is
    a mixture: requests that live through a busy period wait at nearly every step, the rest
    hardly ever, so p50 stays near one engine alone and p95 near the busy regime's."""
    coef, limits, m, sigma = alone()
    p = coef.decode_step_s
    pt = co.colocation_point([engine(4.0), engine(0.05)], GPU)
    assert pt.infeasible is None
    op1, op2 = pt.operating_points
    b2, f2 = op2.decode_batch, op2.chunk_step_fraction
    busy2 = 1.0 - (1.0 - f2) * math.exp(-b2)
    assert pt.busy_probability[1] == pytest.approx(busy2, rel=1e-12)
    own_dbar2 = p + sigma * b2  # E[d_2(B_2)], Poisson batch, empty = p (GAUSS's d̄ without the wait)
    pi2 = own_dbar2 + f2 * op2.mean_chunk_s - (1.0 - f2) * math.exp(-b2) * p  # (C3)
    assert pt.busy_gpu_s[1] == pytest.approx(pi2, rel=1e-9)
    g2 = pi2 / busy2
    # engine 1 sees engine 2 always busy (q_21 → 1, g_21 = g_1): engine 2 is the always-waiting one
    assert pt.busy_probability[0] == pytest.approx(1.0, abs=1e-9)
    assert pt.observed_busy[1][0] == pytest.approx(1.0, abs=1e-9)
    assert pt.observed_step_s[0][1] == pytest.approx(g2, rel=1e-9)  # (C9'): w_21·(1 − q_21) → 0
    # (C7)–(C9) by hand from the fixed point's own terms
    period = busy2 / (0.05 * (1.0 - busy2))  # (C7)
    w = period / (period + (OL - 1) * op1.mean_step_s)  # (C8)
    dtau = g2 * (w * pt.step_slope[0] + 1.0 - w)
    tau = op1.mean_step_s
    q = 2 * busy2 * tau / (tau + dtau + math.sqrt((tau + dtau) ** 2 - 4 * dtau * busy2 * tau))  # (C9)
    assert pt.observed_busy[0][1] == pytest.approx(q, rel=1e-9) and q < busy2
    tau0 = tau - q * dtau  # and q is the step average at the regimes' step times
    assert q == pytest.approx(busy2 / (tau0 + dtau) / (busy2 / (tau0 + dtau) + (1.0 - busy2) / tau0), rel=1e-9)
    assert pt.interference_s[0] == pytest.approx(q * g2, rel=1e-9)  # (C2)
    assert pt.interference_s[0] < pi2  # below the random observer's a_2·g_2
    # ∂τ/∂Δ is GAUSS §3.8's 1/(1 − ρ_c − λ·OL·σ) for this decode-heavy engine
    rho_c = 4.0 * prefill_s(coef)
    assert pt.step_slope[0] == pytest.approx(1.0 / (1.0 - rho_c - 4.0 * OL * sigma), rel=1e-3)
    # the real numbers: a_2 = 0.408, g_2 = 7.9 ms, E[BP] = 13.8 s, w = 0.668, q = 0.267, Δ_1 = 2.11 ms
    assert (busy2, g2, period, w, q, pt.interference_s[0]) == pytest.approx(
        (0.4083, 0.007895, 13.80, 0.6681, 0.2666, 0.0021056), rel=2e-3)
    # (C5): the GPU is never idle (engine 1 always busy): the shares sum to 1 to within C9's shift
    assert sum(pt.gpu_share) == pytest.approx(1.0, abs=1e-3)
    # (C10): the mixture. p50 near engine 1 alone, p95 near the busy regime's τ (Δτ above τ_0)
    pair = co.colocated_tails([engine(4.0), engine(0.05)], GPU, samples=SAMPLES)
    [one] = co.colocated_tails([engine(4.0)], GPU, samples=SAMPLES)
    assert pair[0].interference_s == pt.interference_s[0] and pair[0].step_s == tau
    assert pair[0].tpot_s[0] < tau < pair[0].tpot_s[1]  # the mean field sits between them
    assert pair[0].tpot_s[0] - one.tpot_s[0] < 0.5 * (tau - one.step_s)  # 1.17 of 2.84 ms
    assert pair[0].tpot_s[1] == pytest.approx(tau0 + dtau, rel=0.05)
    # (the twin, verify_placement seed 0, 8000 requests: 12.26, 21.08, 30.39, 42.65 ms)
    assert pair[0].tpot_s[:2] + pair[0].ttft_s[:2] == pytest.approx((0.01173, 0.02074, 0.02935, 0.04225), rel=5e-3)
    assert pair[0].ttft_s[0] > one.ttft_s[0]
    assert pair[1].busy_probability == pytest.approx(busy2)


def test_three_engines_each_wait_for_the_other_two():
    pt = co.colocation_point([engine(1.0, 0.3), engine(0.5, 0.3), engine(0.05, 0.3)], GPU)
    assert pt.infeasible is None
    q, g = np.array(pt.observed_busy), np.array(pt.observed_step_s)
    assert np.allclose(pt.interference_s, np.sum(q * g, axis=1), rtol=1e-9)  # (C2)
    assert np.all(np.diag(q) == 0.0) and np.all(q <= np.array(pt.busy_probability)[None, :] + 1e-12)  # (C9)
    pi = np.array(pt.busy_gpu_s)
    # the two busier engines wait less than the random observer's Σπ (C9); the light one, whose
    # steps come while the others' batches have grown (C9'), a little more (+1.7%)
    assert np.all(np.array(pt.interference_s[:2]) < (pi.sum() - pi)[:2])
    assert pt.interference_s[2] == pytest.approx(pi.sum() - pi[2], rel=0.03)
    assert sum(pt.gpu_share) <= 1.0 + 1e-3
    tails = co.colocated_tails([engine(1.0, 0.3), engine(0.5, 0.3), engine(0.05, 0.3)], GPU, samples=SAMPLES)
    assert all(t.feasible and t.tpot_s[0] <= t.tpot_s[1] <= t.tpot_s[2] for t in tails)


# ------------------------------------------------------------------ near saturation


def test_a_pair_past_saturation_is_reported_infeasible_not_nan():
    # 8 req/s is feasible alone (its limit on this share is 13.2 req/s, the KV cache)...
    [one] = co.colocated_tails([engine(8.0)], GPU, samples=SAMPLES)
    assert one.feasible and all(math.isfinite(x) for x in one.tpot_s + one.ttft_s)
    # ...the pair holds 6 req/s each (its limit is 6.6)...
    assert co.colocation_point([engine(6.0), engine(6.0)], GPU).infeasible is None
    # ...and not 8: the waits grow each batch until its KV cache cannot hold it
    tails = co.colocated_tails([engine(8.0, name="a"), engine(8.0, name="b")], GPU, samples=SAMPLES)
    assert [t.name for t in tails] == ["a", "b"]
    for t in tails:
        assert not t.feasible and t.note.startswith("infeasible: kv stage: engines[0]")
        assert (t.ttft_s, t.tpot_s, t.utilisation, t.busy_probability, t.gpu_share, t.interference_s, t.step_s) == (
            None,) * 7
    assert co.colocation_point([engine(8.0), engine(8.0)], GPU).infeasible.stage == "kv"


# ------------------------------------------------------------------ memory and input checks


@pytest.mark.parametrize("engines, field", [
    ([], "engines"),
    ([engine(1.0, 0.5), engine(1.0, 0.5)], "engines.gpu_memory_utilization"),  # no headroom
    ([engine(1.0, 0.6), engine(1.0, 0.4)], "engines.gpu_memory_utilization"),
    ([engine(1.0, 0.45), engine(1.0, 0.1)], "engines[1].gpu_memory_utilization"),  # 7.9 GiB < its 15 GiB of weights
    # 23.8 GiB holds the weights and buffers, not one 128K-token request
    ([engine(1.0, 0.45), engine(1.0, 0.3, max_model_len=131072)], "engines[1].gpu_memory_utilization"),
    ([engine(1.0, 1.5)], "engines[0].gpu_memory_utilization"),
    ([engine(0.0)], "engines[0].rate_rps"),
    ([engine(float("nan"))], "engines[0].rate_rps"),
    ([co.EngineLoad("no-such-model", WL, 1.0, 0.45)], "engines[0].arch"),
    ([engine(1.0, form="paper-c")], "engines[0].model_form"),
    ([engine(1.0, max_num_seqs=0)], "engines[0].max_num_seqs"),
    ([engine(1.0, max_model_len=0)], "engines[0].max_model_len"),
    (["not an engine"], "engines[0]"),
])
def test_bad_input_names_the_field(engines, field):
    with pytest.raises(InputError) as exc:
        co.colocated_tails(engines, GPU, samples=SAMPLES)
    assert exc.value.field == field


def test_shares_within_headroom_that_hold_weights_and_a_request_pass():
    assert co.MAX_TOTAL_UTILIZATION == 0.95
    pt = co.colocation_point([engine(1.0, 0.5), engine(1.0, 0.45, max_model_len=32768)], GPU)
    assert pt.infeasible is None
