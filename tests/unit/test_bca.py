"""BCA (paper 000 eq. 13): constraints, binding constraint, knee, KV capacity."""

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import bca, calibrate, memory
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu

GPU = get_gpu("h100-64gb")


def saturating(t_max=20_000.0, t1=500.0, step_s=0.004):
    """T(B) = T_max·B/(B + T_max/T1); E2E grows linearly: a closed-form stand-in for SLIM."""
    k = t_max / t1

    def f(b):
        b = np.asarray(b, float)
        return t_max * b / (b + k - 1), 1.0 + step_s * b
    return f


def test_efficiency_floor_binds_on_a_saturating_curve():
    f = saturating()
    r = bca.advise(f, "opt-1.3b", GPU, 242, 226, epsilon=0.1, max_cap=1024, kv_capacity_tokens=10**7)
    t, _ = f(np.arange(1, 1025))
    eff = t / (np.arange(1, 1025) * t[0])
    assert r.binding == "efficiency"
    assert eff[r.cap - 1] > 0.1 >= eff[r.cap]  # the largest B above the floor
    assert r.efficiency == pytest.approx(eff[r.cap - 1])
    # knee: first B whose marginal gain falls below ε·T(1)
    gain = np.diff(t)
    assert gain[r.knee_batch - 1] < 0.1 * t[0] <= gain[r.knee_batch - 2]
    assert r.knee_batch < r.cap


def test_slo_binds_and_infeasible_slo_falls_back_to_min_cap():
    f = saturating()
    r = bca.advise(f, "opt-1.3b", GPU, 242, 226, slo_e2e_s=1.5, epsilon=0.01, kv_capacity_tokens=10**7)
    assert r.binding == "slo" and r.cap == 125 and r.pred_e2e_s <= 1.5  # 1 + 0.004·125 = 1.5
    r = bca.advise(f, "opt-1.3b", GPU, 242, 226, slo_e2e_s=0.5, min_cap=4, kv_capacity_tokens=10**7)
    assert not r.feasible and r.cap == 4 and r.binding == "slo"


def test_kv_capacity_and_max_cap_bind():
    f = saturating()
    cap_tokens = 50 * 468 + 50 * 8  # a bit more than 50 sequences of 468 tokens (+ half-block rounding)
    r = bca.advise(f, "opt-1.3b", GPU, 242, 226, epsilon=0.0, kv_capacity_tokens=cap_tokens)
    assert r.binding == "kv_capacity" and r.cap == r.kv_limit_batch
    assert memory.kv_tokens_for_cap(r.cap, 468) <= cap_tokens < memory.kv_tokens_for_cap(r.cap + 1, 468)
    r = bca.advise(f, "opt-1.3b", GPU, 242, 226, epsilon=0.0, max_cap=64, kv_capacity_tokens=10**7)
    assert r.binding == "max_cap" and r.cap == 64


def test_throughput_peak_binds_when_the_curve_turns_down():
    def peaked(b):
        b = np.asarray(b, float)
        return 1000 * b * np.exp(-b / 200), np.ones_like(b)
    r = bca.advise(peaked, "opt-1.3b", GPU, 100, 100, epsilon=0.0, kv_capacity_tokens=10**7)
    assert r.binding == "throughput" and r.cap == 200


def test_default_kv_capacity_comes_from_the_memory_model_and_calibration_works():
    params = {"eta_c": 0.6, "eta_m": 0.8, "alpha_s": 3e-5, "gamma_s": 4e-8, "t_step_s": 1e-4,
              "t_layer_s": 8e-5, "eta_w": 1.0, "t_fixed_s": 0.01}
    cal = calibrate.Calibration("kneecap", "h100-64gb", ("llama-2-7b",), params, {}, {}, "")
    arch = get_arch("llama-2-7b")
    r = bca.advise(cal, arch, GPU, 250, 391, epsilon=0.0)
    expect = memory.memory_split(arch, GPU, 0.9, 1024).kv_capacity_tokens
    assert r.kv_capacity_tokens == expect
    assert r.binding == "kv_capacity" and 100 < r.cap < 160  # ~90k tokens / 641 per sequence
    t, e = calibrate.predict(cal, arch, None, float(r.cap), 250, 391)
    assert r.pred_throughput_tok_s == pytest.approx(float(t)) and r.pred_e2e_s == pytest.approx(float(e))


@pytest.mark.parametrize("kw,field", [({"epsilon": 1.5}, "epsilon"), ({"slo_e2e_s": -1}, "slo_e2e_s"),
                                      ({"input_len": 0}, "input_len"), ({"min_cap": 0}, "max_cap")])
def test_bad_input(kw, field):
    args = {"input_len": 100, "output_len": 100, **kw}
    il, ol = args.pop("input_len"), args.pop("output_len")
    with pytest.raises(InputError) as e:
        bca.advise(saturating(), "opt-1.3b", GPU, il, ol, kv_capacity_tokens=10**6, **args)
    assert e.value.field == field


def test_chunked_prefill_budget_flattens_the_curve_and_throughput_binds():
    params = {"eta_c": 0.6, "eta_m": 0.8, "alpha_s": 3e-5, "gamma_s": 4e-8, "t_step_s": 1e-4,
              "t_layer_s": 8e-5, "eta_w": 1.0, "t_fixed_s": 0.01}
    cal = calibrate.Calibration("kneecap", "h100-64gb", ("opt-1.3b",), params, {}, {}, "")
    r = bca.advise(cal, "opt-1.3b", GPU, 242, 130, epsilon=0.0, max_num_batched_tokens=512)
    assert r.binding == "throughput"
    assert r.cap == int(np.ceil(512 * 130 / 372))  # data README: B saturates near 512·OL/(IL+OL)
    free = bca.advise(cal, "opt-1.3b", GPU, 242, 130, epsilon=0.0)
    assert free.cap > 2 * r.cap
