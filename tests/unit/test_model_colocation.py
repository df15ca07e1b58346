"""Co-location of vLLM engines on one GPU (kneecap.model.colocation) against its closed cases:
one engine alone is SLIM/GAUSS unchanged, an identical pair always busy, a decode-heavy pair with
a partner busy part of the time, a pair past saturation, and the memory shares."""

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
    assert pt.interference_s[0] == pt.interference_s[1] == pytest.approx(T / 2.0, rel=1e-9)
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
    [one] = co.colocated_tails([engine(4.0)], GPU, samples=SAMPLES)
    assert a.tpot_s[0] > 1.9 * one.tpot_s[0]


# ------------------------------------------------------------------ (c) a memory-bound pair, a partner busy part of the time


def test_memory_bound_pair_tpot_rises_by_the_partners_step_times_its_busy_probability():
    """Engine 1 at 4 req/s beside a light engine 2 (0.05 req/s, B̄ ≈ 0.5). A2 (round robin: a
    queued partner step runs whole before i's next) and A3 (i's step boundaries see j's
    stationary state) give Δ_1 = P(2 busy)·E[d_2 | busy], and in the decode-heavy limit
    (f_2 → 0) P(busy) = 1 − e^{−B̄_2}, E[d_2 | busy] = p + σ·B̄_2/(1 − e^{−B̄_2}). At a fixed batch
    engine 1's step rises by Δ_1 (C2); through Little's law TPOT by Δ_1/(1 − ρ_c − λ_1·OL·σ)."""
    coef, limits, m, sigma = alone()
    p = coef.decode_step_s
    pt = co.colocation_point([engine(4.0), engine(0.05)], GPU)
    assert pt.infeasible is None
    op1, op2 = pt.operating_points
    b2, f2 = op2.decode_batch, op2.chunk_step_fraction
    busy2 = 1.0 - (1.0 - f2) * math.exp(-b2)
    assert pt.busy_probability[1] == pytest.approx(busy2, rel=1e-12)
    own_dbar2 = p + sigma * b2  # E[d_2(B_2)], Poisson batch, empty = p (GAUSS's d̄ without the wait)
    exact = own_dbar2 + f2 * op2.mean_chunk_s - (1.0 - f2) * math.exp(-b2) * p  # (C3)
    assert pt.interference_s[0] == pytest.approx(exact, rel=1e-9)
    decode_heavy = (1.0 - math.exp(-b2)) * (p + sigma * b2 / (1.0 - math.exp(-b2)))
    assert pt.interference_s[0] == pytest.approx(decode_heavy, rel=0.01)
    # engine 2 sees engine 1 always busy: it waits engine 1's whole GPU step
    assert pt.busy_probability[0] == pytest.approx(1.0, abs=1e-9)
    # the step-time function at a fixed batch: exactly Δ more
    b, c = np.array([1.0, 30.0]), np.array([320.0, 9600.0])
    assert np.allclose(co.colocated_step_s(coef, b, c, pt.interference_s[0]) - gauss.decode_step_s(coef, b, c),
                       pt.interference_s[0], rtol=0, atol=1e-15)
    # TPOT through Little's law (GAUSS §3.8): exact in the mean field
    rho_c = 4.0 * prefill_s(coef)
    tau_alone = gauss.operating_point(coef, m, 4.0, limits).mean_step_s
    assert op1.mean_step_s - tau_alone == pytest.approx(pt.interference_s[0] / (1.0 - rho_c - 4.0 * OL * sigma),
                                                        rel=1e-9)
    # the real numbers: a_2 = 0.393, Δ_1 = 3.10 ms, τ_1 10.58 → 14.76 ms
    assert (busy2, pt.interference_s[0], op1.mean_step_s) == pytest.approx((0.3929, 0.0031031, 0.014762), rel=1e-3)
    # GAUSS: the simulated TPOT p50 rises by what the mean field says (4.18 ms) within 3%
    pair = co.colocated_tails([engine(4.0), engine(0.05)], GPU, samples=SAMPLES)
    [one] = co.colocated_tails([engine(4.0)], GPU, samples=SAMPLES)
    assert pair[0].tpot_s[0] - one.tpot_s[0] == pytest.approx(op1.mean_step_s - tau_alone, rel=0.03)
    assert pair[0].ttft_s[0] > one.ttft_s[0]
    assert pair[1].busy_probability == pytest.approx(busy2) and pair[0].gpu_share + pair[1].gpu_share <= 1.0


def test_three_engines_each_wait_for_the_other_two():
    pt = co.colocation_point([engine(1.0, 0.3), engine(0.5, 0.3), engine(0.05, 0.3)], GPU)
    assert pt.infeasible is None
    pi = np.array(pt.busy_gpu_s)
    assert np.allclose(pt.interference_s, pi.sum() - pi, rtol=1e-9)
    assert sum(pt.gpu_share) <= 1.0


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
