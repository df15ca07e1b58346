"""model/transfer.py: a SLIM calibration carried to another GPU through its hardware terms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kneecap.errors import InputError
from kneecap.model import gauss
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.model.slim import SlimParams
from kneecap.model.calibrate import Calibration
from kneecap.model.transfer import calibration_on, transfer_params

P = SlimParams(eta_c=0.6, eta_m=0.7, alpha_s=3e-5, gamma_s=2e-8, t_fixed_s=2e-3, t_step_s=2e-5,
               t_layer_s=8e-5, eta_w=0.95)


def test_efficiencies_and_host_times_carry_and_gamma_scales_with_peak_flops():
    src, dst = get_gpu("h100-64gb"), get_gpu("a100-80gb")
    out = transfer_params(P, src, dst)
    assert out.gamma_s == pytest.approx(2e-8 * 989e12 / 312e12)
    assert replace(out, gamma_s=P.gamma_s) == P
    assert transfer_params(P, src, src) == P


def test_the_transferred_decode_step_reads_the_weights_at_the_targets_bandwidth():
    arch = get_arch("llama-3.1-8b")
    src, dst = get_gpu("h100-64gb"), get_gpu("h200")
    here = gauss.coefficients_for(arch, src, P)
    there = gauss.coefficients_for(arch, dst, transfer_params(P, src, dst))
    launch_s = P.t_step_s + arch.layers * P.t_layer_s
    # p = t_step + L·t_layer + W/(η_w·BW): the weight read scales by BW_src/BW_dst, launches do not
    assert (there.decode_step_s - launch_s) == pytest.approx(
        (here.decode_step_s - launch_s) * src.mem_bw_bytes_s / dst.mem_bw_bytes_s)
    # prefill is compute: same peak FLOP/s on both, same per-token cost
    assert there.prefill_s_per_token == pytest.approx(here.prefill_s_per_token)


@pytest.mark.parametrize("args, field", [(("x", get_gpu("h100-64gb"), get_gpu("h200")), "params"),
                                         ((P, "h100-64gb", get_gpu("h200")), "source"),
                                         ((P, get_gpu("h100-64gb"), None), "target")])
def test_bad_input_names_the_field(args, field):
    with pytest.raises(InputError) as exc:
        transfer_params(*args)
    assert exc.value.field == field


def test_a_calibration_moves_only_between_catalog_gpus():
    cal = Calibration(form="kneecap", gpu="h100-64gb", models=("llama-2-7b",), params=P.as_dict(), std={},
                      metrics={}, created="")
    assert calibration_on(cal, get_gpu("h100-64gb")) == (P, False)
    moved, did = calibration_on(cal, get_gpu("rtx-4090"))
    assert did and moved == transfer_params(P, get_gpu("h100-64gb"), get_gpu("rtx-4090"))
    inline = Calibration(form="kneecap", gpu="my-asic", models=(), params=P.as_dict(), std={}, metrics={}, created="")
    assert calibration_on(inline, get_gpu("h200")) == (P, False)  # no hardware terms to move from
