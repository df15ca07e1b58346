"""SLIM equations (paper 000 eqs 5–12) and the kneecap form's fixes."""

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import slim
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu

GPU = get_gpu("h100-64gb")
P = slim.SlimParams(eta_c=0.6, eta_m=0.8, alpha_s=3e-5, gamma_s=5e-8, b0=20.0, t_fixed_s=0.01,
                    t_step_s=1e-4, t_layer_s=8e-5, eta_w=0.95)


def test_c_closed_form_equals_the_sum():
    rng = np.random.default_rng(1)
    il = rng.integers(1, 4000, 200)
    ol = rng.integers(1, 2000, 200)
    brute = np.array([sum(i + j for j in range(1, o + 1)) for i, o in zip(il, ol)], dtype=float)
    np.testing.assert_array_equal(slim.c_tokens(il, ol), brute)
    assert slim.c_tokens(10, 1) == 11  # one step reads IL + 1 positions


def test_expected_c_reduces_to_c_without_variance_and_grows_with_it():
    np.testing.assert_allclose(slim.expected_c_tokens(242, 226, 0.0), slim.c_tokens(242, 226))
    # E[OL²]/2 term: OL²·cv²/2 extra tokens
    assert slim.expected_c_tokens(100, 300, 1.0) - slim.c_tokens(100, 300) == pytest.approx(300**2 / 2)
    # Monte Carlo check with a gamma-distributed OL of CV 0.8 (integer lengths, exact sum of eq. 12)
    rng = np.random.default_rng(0)
    ol = np.maximum(np.rint(rng.gamma(1 / 0.64, 300 * 0.64, 400_000)), 1)
    mc = slim.c_tokens(100, ol).mean()
    assert slim.expected_c_tokens(100, ol.mean(), ol.std() / ol.mean()) == pytest.approx(mc, rel=1e-3)


def test_prefill_flops_eq8_by_hand_for_opt_1_3b():
    a = get_arch("opt-1.3b")  # L=24, D=2048, Dkv=2048, r_ff=4
    d, layers = 2048, 24
    expect = layers * (8 * 100 * (4 * d * d + 4 * d * d + 16 * d * d) + 4 * 8 * 100 * 100 * d)
    assert slim.prefill_flops(slim.arch_arrays(a), 8, 100) == pytest.approx(expect)


def test_paper_readings_of_eq9_by_hand():
    a = get_arch("llama-2-7b")
    b, il, ol = 16.0, 250.0, 231.0
    t_pre = slim.prefill_flops(slim.arch_arrays(a), b, il) / (P.eta_c * GPU.peak_flops)
    t_d = P.alpha_s * ol + P.gamma_s * 32 * 16 * ol  # L·(D/1024)² = 32·16
    t_mem = a.kv_bytes_per_token * slim.c_tokens(il, ol) / (P.eta_m * GPU.mem_bw_bytes_s)
    pa = slim.predict("paper-a", P, a, GPU, b, il, ol)
    pb = slim.predict("paper-b", P, a, GPU, b, il, ol)
    e2e_a = t_pre + (b + P.b0) * (t_d + t_mem) + P.t_fixed_s
    e2e_b = t_pre + (b + P.b0) * t_d + b * t_mem + P.t_fixed_s
    assert pa.e2e_s == pytest.approx(e2e_a)
    assert pb.e2e_s == pytest.approx(e2e_b)
    assert pa.throughput_tok_s == pytest.approx(b * (il + ol) / e2e_a)  # eq. 6
    assert pb.e2e_s < pa.e2e_s  # b drops B0's share of the KV read


def test_vectorised_over_rows_and_models():
    archs = ["opt-1.3b", "opt-2.7b", "llama-2-7b"]
    b = np.array([1.0, 64.0, 200.0])
    together = slim.predict("kneecap", P, archs, GPU, b, 250.0, np.array([130.0, 260.0, 390.0]))
    for i, m in enumerate(archs):
        one = slim.predict("kneecap", P, m, GPU, b[i], 250.0, [130.0, 260.0, 390.0][i])
        assert together.throughput_tok_s[i] == pytest.approx(float(one.throughput_tok_s))
    grid = slim.predict("paper-a", P, "opt-1.3b", GPU, np.arange(1, 513.0), 242, 226)
    assert grid.throughput_tok_s.shape == (512,)
    assert np.all(np.diff(grid.throughput_tok_s) > 0)  # SLIM's throughput saturates, never falls


def test_kneecap_per_step_weight_read_makes_bigger_models_slower_at_batch_one():
    t = [float(slim.predict("kneecap", P, m, GPU, 1.0, 250, 200).e2e_s) for m in ("opt-1.3b", "opt-2.7b", "llama-2-7b")]
    assert t[0] < t[1] < t[2]
    a = get_arch("llama-2-7b")
    step = P.t_step_s + P.t_layer_s * 32 + slim.streamed_weight_bytes(a) / (P.eta_w * GPU.mem_bw_bytes_s)
    assert slim.streamed_weight_bytes(a) == a.weight_bytes - 32000 * 4096 * 2  # untied input table
    assert slim.streamed_weight_bytes(get_arch("opt-1.3b")) == get_arch("opt-1.3b").weight_bytes  # tied
    # At tiny batch the decode time is OL steps of (overhead + weight read)
    p = slim.predict("kneecap", P, a, GPU, 1e-6, 250, 200)
    assert float(p.e2e_s) == pytest.approx(200 * step + P.t_fixed_s, rel=1e-4)


def test_kv_capacity_caps_the_effective_batch_and_preemption_costs_throughput():
    a = get_arch("llama-2-7b")
    cap = 90_832
    b = np.array([64.0, 128.0, 256.0, 512.0])
    free = slim.predict("kneecap", P, a, GPU, b, 250, 391)
    capped = slim.predict("kneecap", P, a, GPU, b, 250, 391, kv_capacity_tokens=cap)
    b_kv = slim.kv_limited_batch(cap, 250, 391)
    assert 150 < b_kv < 200  # data: B saturates at ~174 on this curve
    np.testing.assert_allclose(capped.effective_batch, np.minimum(b, b_kv))
    assert capped.throughput_tok_s[0] == pytest.approx(free.throughput_tok_s[0])
    assert capped.throughput_tok_s[3] < capped.throughput_tok_s[2] < free.throughput_tok_s[2]
    budget = slim.predict("kneecap", P, a, GPU, 512.0, 250, 131, max_num_batched_tokens=512)
    assert float(budget.effective_batch) == pytest.approx(512 * 131 / 381)


@pytest.mark.parametrize("kw,field", [({"batch": 0}, "batch"), ({"input_len": -1}, "input_len"),
                                      ({"output_len": float("nan")}, "output_len")])
def test_bad_input_names_the_field(kw, field):
    args = {"batch": 4, "input_len": 100, "output_len": 100, **kw}
    with pytest.raises(InputError) as e:
        slim.predict("paper-a", P, "opt-1.3b", GPU, args["batch"], args["input_len"], args["output_len"])
    assert e.value.field == field
    with pytest.raises(InputError) as e:
        slim.predict("paper-c", P, "opt-1.3b", GPU, 1, 1, 1)
    assert e.value.field == "model_form"


def test_heterogeneous_lengths_cost_a_prefill_step_each_unless_chunked():
    a = get_arch("opt-1.3b")
    b = np.array([1.0, 300.0])
    fixed = slim.predict("kneecap", P, a, GPU, b, 110, 292, output_cv=0.0)
    het = slim.predict("kneecap", P, a, GPU, b, 110, 292, output_cv=0.9)
    het_chunked = slim.predict("kneecap", P, a, GPU, b, 110, 292, output_cv=0.9, chunked_prefill=True)
    step = P.t_step_s + P.t_layer_s * a.layers + a.weight_bytes / (P.eta_w * GPU.mem_bw_bytes_s)
    kv_extra = b * a.kv_bytes_per_token * 292**2 * 0.81 / 2 / (P.eta_m * GPU.mem_bw_bytes_s)  # E[C] − C
    np.testing.assert_allclose(het_chunked.e2e_s - fixed.e2e_s, kv_extra, rtol=1e-9)
    np.testing.assert_allclose(het.e2e_s - het_chunked.e2e_s, b * 0.9 * step, rtol=1e-9)
