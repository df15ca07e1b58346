"""BCA: the batch cap (max_num_seqs) at the throughput knee under a latency SLO (paper 000 §VII).

B_cap = argmax_B T(IL, OL, B)  s.t.  E2E(IL, OL, B) ≤ SLO  and  T(B)/(B·T(1)) > ε     (eq. 13)

over integer B in [min_cap, max_cap] whose KV need fits the KV capacity (DESIGN §5.2–5.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kneecap.errors import InputError
from kneecap.model import memory
from kneecap.model.arch import get_arch
from kneecap.model.hardware import GPU, get_gpu

BINDINGS = ("throughput", "slo", "efficiency", "kv_capacity", "max_cap")


@dataclass(frozen=True)
class BCAResult:
    cap: int
    pred_throughput_tok_s: float
    pred_e2e_s: float
    efficiency: float  # T(cap)/(cap·T(1))
    knee_batch: int  # first B where one more sequence adds < ε·T(1) throughput
    binding: str  # which constraint stops a larger cap (BINDINGS)
    feasible: bool  # False when even min_cap violates the SLO (cap = min_cap then)
    kv_limit_batch: int  # largest B whose KV need fits the capacity
    kv_capacity_tokens: int
    curve_batch: np.ndarray  # the candidates evaluated
    curve_throughput_tok_s: np.ndarray
    curve_e2e_s: np.ndarray

    def as_dict(self) -> dict:
        return {"cap": self.cap, "pred_throughput_tok_s": self.pred_throughput_tok_s,
                "pred_e2e_s": self.pred_e2e_s, "efficiency": self.efficiency, "knee_batch": self.knee_batch,
                "binding": self.binding, "feasible": self.feasible, "kv_limit_batch": self.kv_limit_batch,
                "kv_capacity_tokens": self.kv_capacity_tokens}


Predictor = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _predictor(calibration_or_fn, arch, gpu, input_len, output_len, output_cv, budget, chunked, tp=1) -> Predictor:
    if callable(calibration_or_fn):
        return calibration_or_fn
    from kneecap.model import calibrate

    cal = calibration_or_fn
    if not isinstance(cal, calibrate.Calibration):
        raise InputError("calibration", f"expected a Calibration or a callable, got {type(cal).__name__}")
    kw = {}
    if cal.form == "kneecap":
        kw = {"output_cv": output_cv, "chunked_prefill": chunked, "tensor_parallel_size": tp}
        if budget is not None:
            kw["max_num_batched_tokens"] = budget
    return lambda b: calibrate.predict(cal, arch, gpu, b, input_len, output_len, **kw)


def knee_batch(batch: np.ndarray, throughput: np.ndarray, epsilon: float) -> int:
    """First B past which one more sequence adds less than ε·T(1) throughput (marginal batching
    efficiency below ε; the average efficiency of eq. 13 crosses ε later)."""
    t1 = throughput[0] / batch[0]
    gain = np.diff(throughput) / np.diff(batch)
    below = np.nonzero(gain < epsilon * t1)[0]
    return int(batch[below[0]]) if below.size else int(batch[-1])


def advise(calibration, arch, gpu, input_len: float, output_len: float, slo_e2e_s: float | None = None,
           epsilon: float = 0.1, min_cap: int = 1, max_cap: int = 1024, kv_capacity_tokens: int | None = None,
           output_cv: float = 0.0, length_std_tok: float = 0.0, z: float = 1.645,
           gpu_memory_utilization: float = memory.DEFAULT_UTILIZATION,
           max_num_batched_tokens: int | None = None, chunked_prefill: bool | None = None,
           tensor_parallel_size: int = 1) -> BCAResult:
    """Eq. 13 over integer caps. ``calibration`` is a Calibration or a callable B → (T, E2E).
    Without ``kv_capacity_tokens`` the capacity is vLLM's at ``gpu_memory_utilization``
    (kneecap.model.memory). A cap must hold B·(IL+OL) tokens (+ tail margin z·√B·σ).
    ``max_num_batched_tokens``: the chunked-prefill token budget, which caps the running batch
    in the kneecap form (the curve goes flat and "throughput" binds at that batch);
    ``chunked_prefill`` defaults to whether that budget is given. ``tensor_parallel_size``: each
    GPU of the replica holds its shard and KV heads (memory_split) and the step pays the
    all-reduces (slim.predict)."""
    arch = get_arch(arch)
    gpu = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    for name, v in (("input_len", input_len), ("output_len", output_len)):
        if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
            raise InputError(name, f"expected a positive number, got {v!r}")
    if slo_e2e_s is not None and not (np.isfinite(slo_e2e_s) and slo_e2e_s > 0):
        raise InputError("slo_e2e_s", f"expected a positive number of seconds, got {slo_e2e_s!r}")
    if not (0.0 <= epsilon < 1.0):
        raise InputError("epsilon", f"expected 0 ≤ ε < 1, got {epsilon!r}")
    if not (isinstance(min_cap, (int, np.integer)) and isinstance(max_cap, (int, np.integer)) and 1 <= min_cap <= max_cap):
        raise InputError("max_cap", f"expected integers 1 ≤ min_cap ≤ max_cap, got {min_cap!r}, {max_cap!r}")
    if kv_capacity_tokens is None:
        kv_capacity_tokens = memory.memory_split(arch, gpu, gpu_memory_utilization, int(max_cap),
                                                 max_num_batched_tokens,
                                                 tensor_parallel_size=tensor_parallel_size).kv_capacity_tokens
    if not (kv_capacity_tokens > 0):
        raise InputError("kv_capacity_tokens", f"expected a positive token count, got {kv_capacity_tokens!r}")

    batch = np.arange(1, int(max_cap) + 1, dtype=float)
    need = memory.kv_tokens_for_cap(batch, input_len + output_len, length_std_tok, z=z)
    fits = np.asarray(need) <= kv_capacity_tokens
    kv_limit = int(batch[fits][-1]) if fits.any() else 0

    if max_num_batched_tokens is not None and not max_num_batched_tokens > 0:
        raise InputError("max_num_batched_tokens", f"expected a positive token count, got {max_num_batched_tokens!r}")
    chunked = (max_num_batched_tokens is not None) if chunked_prefill is None else bool(chunked_prefill)
    thr, e2e = _predictor(calibration, arch, gpu, input_len, output_len, output_cv, max_num_batched_tokens,
                          chunked, tensor_parallel_size)(batch)
    thr = np.broadcast_to(np.asarray(thr, float), batch.shape)
    e2e = np.broadcast_to(np.asarray(e2e, float), batch.shape)
    if not (np.all(np.isfinite(thr)) and np.all(np.isfinite(e2e))):
        raise InputError("calibration", "the model predicted non-finite throughput or latency")
    eff = thr / (batch * thr[0])  # eq. 13 efficiency floor: T(B)/(B·T(1))
    in_range = batch >= min_cap
    ok_slo = e2e <= slo_e2e_s if slo_e2e_s is not None else np.ones_like(fits)
    ok_eff = eff > epsilon
    ok_eff[0] = True  # B = 1 has efficiency 1 by definition
    feasible = in_range & fits & ok_slo & ok_eff
    knee = knee_batch(batch, thr, epsilon)

    if not feasible.any():
        cap = int(min_cap)
        i = cap - 1
        binding = "kv_capacity" if not fits[i] else "slo"
        return BCAResult(cap, float(thr[i]), float(e2e[i]), float(eff[i]), knee, binding, False, kv_limit,
                         int(kv_capacity_tokens), batch, thr.copy(), e2e.copy())
    cand = np.nonzero(feasible)[0]
    i = int(cand[np.argmax(thr[cand])])  # first maximum: the smallest B reaching it
    cap = int(batch[i])
    if cap == max_cap:
        binding = "max_cap"
    elif not fits[i + 1]:
        binding = "kv_capacity"
    elif not ok_slo[i + 1]:
        binding = "slo"
    elif not ok_eff[i + 1]:
        binding = "efficiency"
    else:
        binding = "throughput"  # the predicted curve peaks here
    return BCAResult(cap, float(thr[i]), float(e2e[i]), float(eff[i]), knee, binding, True, kv_limit,
                     int(kv_capacity_tokens), batch, thr.copy(), e2e.copy())
