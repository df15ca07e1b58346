"""Carry a SLIM calibration from the GPU it was fitted on to another GPU (issue 22 item 3).

A calibration (:class:`kneecap.model.slim.SlimParams`) mixes three kinds of constants; each
moves to the target GPU by the hardware term it stands for:

* efficiencies, dimensionless fractions of a peak (η_c of FLOP/s, eq. 7; η_m, η_w of memory
  bandwidth, eqs. 9, 11 and the kneecap weight read): carried unchanged, and the target's peak
  FLOP/s and bandwidth enter where :func:`kneecap.model.gauss.coefficients_for` and
  :func:`kneecap.model.slim.predict` divide by them;
* γ, the marginal per-sequence decode compute per L·(D/1024)² (eq. 10): a compute time at the
  fitted efficiency, scaled by the peak ratio, γ' = γ·F_src/F_dst (``calibrate.form_priors``
  reads γ the same way: 24·1024²/(η·F_max));
* host-side and launch-bound times, α (per-token overhead: sampling, detokenisation, eq. 10),
  t_step (per-step scheduling), t_layer (per-layer kernel-launch floor) and t_fixed (per-request
  overhead, eq. 5), and the batch offset B0 (eq. 9): carried unchanged (they are set by the CPU
  and the driver, not by the GPU's FLOP/s or bandwidth).

The all-reduce of tensor parallelism is a term of its own from the interconnect (the GPU
catalog); a calibration on one GPU carries no interconnect constant to move.
"""

from __future__ import annotations

from dataclasses import replace

from kneecap.errors import InputError
from kneecap.model.hardware import GPU, get_gpu
from kneecap.model.slim import SlimParams


def transfer_params(params: SlimParams, source: GPU, target: GPU) -> SlimParams:
    """``params`` fitted on ``source`` as they apply on ``target`` (module docstring)."""
    if not isinstance(params, SlimParams):
        raise InputError("params", f"expected SlimParams, got {type(params).__name__}")
    for name, gpu in (("source", source), ("target", target)):
        if not isinstance(gpu, GPU):
            raise InputError(name, f"expected a catalog GPU (kneecap.model.hardware.GPU), got {type(gpu).__name__}")
    # eq. 10's γ is compute at the fitted efficiency: time ∝ 1/F_max
    return replace(params, gamma_s=params.gamma_s * source.peak_flops / target.peak_flops)


def calibration_on(calibration, target: GPU) -> tuple[SlimParams, bool]:
    """(parameters of ``calibration`` (a ``calibrate.Calibration``) on ``target``, whether they
    were moved): unchanged on the GPU it was fitted on, or when that GPU is not a catalog entry
    (an inline accelerator: no hardware terms to move from)."""
    params = calibration.slim_params
    try:
        source = get_gpu(calibration.gpu)
    except InputError:
        return params, False
    if source.key == target.key:
        return params, False
    return transfer_params(params, source, target), True
