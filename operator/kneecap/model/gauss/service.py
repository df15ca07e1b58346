"""The GAUSS service model (paper 003 §3.2–3.3): engine cost coefficients, from SLIM or fitted to
observed step times, and the chunked-prefill and decode-step costs they give."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.errors import _count, _positive
from kneecap.model.gauss.limits import DEFAULT_MAX_NUM_BATCHED_TOKENS


@dataclass(frozen=True)
class ServiceCoefficients:
    """Engine cost coefficients, seconds (GAUSS §3.2–3.4, DESIGN §5.5).

    Chunk step cost: prefill_s_per_chunk + prefill_s_per_token·m + prefill_s_per_attended_token·a
    (m chunk tokens, a = m·A₀ + m(m+1)/2 causal query–key pairs after A₀ earlier tokens, as
    :func:`prefill_compute_s`), on top of the decode step it carries. Decode step: d(B, C) =
    decode_step_s + decode_s_per_context_token·C/B + decode_s_per_seq·B
    + decode_s_per_resident_token·C. ``request_overhead_s`` (SLIM t_fixed) adds to TTFT but does
    not occupy the prefill slot.
    """

    prefill_s_per_token: float
    prefill_s_per_attended_token: float = 0.0
    prefill_s_per_chunk: float = 0.0
    decode_step_s: float = 0.0  # p
    decode_s_per_context_token: float = 0.0  # q, multiplies C/B
    decode_s_per_seq: float = 0.0  # r, multiplies B
    decode_s_per_resident_token: float = 0.0  # s, multiplies C (0 in the GAUSS form)
    chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # vLLM max_num_batched_tokens: chunks of budget − decodes
    request_overhead_s: float = 0.0
    prefill_packing: bool = True  # prompts waiting together share one step (vLLM); False: GAUSS's one per step

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "prefill_packing":
                if not isinstance(value, (bool, np.bool_)):
                    raise InputError("prefill_packing", f"expected true or false, got {value!r}")
            elif f.name == "chunk_tokens":
                if not isinstance(value, (int, np.integer)) or value < 1:
                    raise InputError("chunk_tokens", f"expected a positive integer, got {value!r}")
            else:
                _positive(f.name, value, allow_zero=True)
        if self.prefill_s_per_token + self.prefill_s_per_attended_token + self.prefill_s_per_chunk <= 0:
            raise InputError("prefill_s_per_token", "prefill costs are all zero; expected a positive prefill cost")
        if self.decode_step_s + self.decode_s_per_context_token + self.decode_s_per_seq + self.decode_s_per_resident_token <= 0:
            raise InputError("decode_step_s", "decode costs are all zero; expected a positive decode cost")


def coefficients_from_slim(
    *, eta_c: float, eta_m: float, alpha: float, gamma: float, t_fixed_s: float,
    layers: int, hidden: int, kv_dim: int, ff_ratio: float, kv_bytes: float,
    peak_flops: float, bandwidth_bytes_s: float, b0: float = 0.0, form: str = "paper-a",
    t_step_s: float = 0.0, t_layer_s: float = 0.0, eta_w: float = 1.0, weight_bytes: float = 0.0,
    chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS, tensor_parallel_size: int = 1,
    kv_dim_per_gpu: float | None = None, allreduce_step_s: float = 0.0, allreduce_token_s: float = 0.0,
) -> ServiceCoefficients:
    """GAUSS coefficients from a calibrated SLIM (DESIGN §5.1, kneecap.model.slim), plain numbers in.

    ``ff_ratio`` is the effective r_ff (×1.5 for gated MLPs), ``kv_bytes`` is b_kv.

    * Prefill, SLIM eqs 7–8 at B = 1: T_pre = L·[IL·(4D² + 4·D·Dkv + 4·r_ff·D²) + 4·IL²·D]/(η_c·Fmax).
      prefill_s_per_token = L·(4D² + 4·D·Dkv + 4·r_ff·D²)/(η_c·Fmax) and
      prefill_s_per_attended_token = 4·L·D/(η_c·Fmax) per query–key pair. Eq. 8's 4·IL²·D counts
      all IL² pairs; a causal mask computes IL·(IL+1)/2 of them, at any chunking
      (:func:`prefill_compute_s`), so GAUSS's attention is eq. 8's (IL+1)/(2·IL).
      prefill_s_per_chunk = 0 (SLIM has no per-step prefill overhead).
    * A chunk step costs the decode step it carries (weight read in p included) plus the chunk's
      compute: the sum, as SLIM's eq. 9 adds T_pre to the steps. A roofline max(weight read,
      GEMMs) for the step (Williams, Waterman & Patterson, CACM 2009) matches the twin's step but
      not real vLLM: against data/gpu-latency's H100/A100 runs (Llama-3.1-70B, TP 2) it put
      low-load TTFT 14–29% low where the sum is within 0–10% (benchmarks/tails_real_gpu.md).
    * Decode per step (T_dec/OL), with α' = α + γ·L·(D/1024)² (eq. 10 per token),
      κ = 2·L·Dkv·b_kv/(η_m·BW) (eq. 11 per context token) and c̄ = C(IL, OL)/OL = C/B the mean
      context per sequence (eq. 12), so d(B, C) = p + q·C/B + r·B + s·C with r = α', s = κ and
        - ``paper-a``, eq. 9 as (B + B0)·[T_d + M_dec/(η_m·BW)]: p = B0·α', q = B0·κ;
        - ``paper-b``, eq. 9 as (B + B0)·T_d + B·M_dec/(η_m·BW): p = B0·α', q = 0;
        - ``kneecap`` (slim.py): p = t_step + L·t_layer + W/(η_w·BW) (W = streamed weight bytes), q = 0.
    * request_overhead_s = t_fixed (eq. 5).
    * Tensor parallelism (kneecap.model.parallel), one rank's costs: FLOPs over TP (eq. 7 with
      TP·Fmax), eq. 10's γ term over TP, κ with the rank's KV width ``kv_dim_per_gpu`` and W the
      rank's shard; the 2·L all-reduces per step (Megatron-LM §3), affine in the step's tokens,
      add ``allreduce_step_s`` to p and to each chunk and ``allreduce_token_s`` to r and to each
      prefill token (ring all-reduce, Thakur et al. 2005).
    """
    if form not in ("paper-a", "paper-b", "kneecap"):
        raise InputError("form", f"expected paper-a, paper-b or kneecap, got {form!r}")
    vals = dict(eta_c=eta_c, eta_m=eta_m, layers=layers, hidden=hidden, kv_dim=kv_dim,
                kv_bytes=kv_bytes, peak_flops=peak_flops, bandwidth_bytes_s=bandwidth_bytes_s, eta_w=eta_w)
    for name, v in vals.items():
        _positive(name, v)
    for name, v in dict(alpha=alpha, gamma=gamma, b0=b0, t_fixed_s=t_fixed_s, ff_ratio=ff_ratio, t_step_s=t_step_s,
                        t_layer_s=t_layer_s, weight_bytes=weight_bytes, allreduce_step_s=allreduce_step_s,
                        allreduce_token_s=allreduce_token_s).items():
        _positive(name, v, allow_zero=True)
    _count("tensor_parallel_size", tensor_parallel_size)
    tp = float(tensor_parallel_size)
    if form != "kneecap" and tp != 1:
        raise InputError("tensor_parallel_size", f"the {form} form models one GPU; tensor parallelism needs the kneecap form")
    L, D, Dkv = float(layers), float(hidden), float(kv_dim)
    Dkv_gpu = Dkv if kv_dim_per_gpu is None else float(kv_dim_per_gpu)
    compute_s_per_flop = 1.0 / (eta_c * peak_flops * tp)  # eq. 7, one rank's F/TP
    per_token = L * (4 * D * D + 4 * D * Dkv + 4 * ff_ratio * D * D) * compute_s_per_flop  # eq. 8, linear
    per_attended = 4.0 * L * D * compute_s_per_flop  # eq. 8, 4·IL²·D
    alpha_step = alpha + gamma * L * (D / 1024.0) ** 2 / tp  # eq. 10 per output token
    kappa = 2.0 * L * Dkv_gpu * kv_bytes / (eta_m * bandwidth_bytes_s)  # eq. 11 per context token, per rank
    if form == "kneecap":
        p, q = t_step_s + t_layer_s * L + weight_bytes / (eta_w * bandwidth_bytes_s) + allreduce_step_s, 0.0
    else:
        p, q = b0 * alpha_step, (b0 * kappa if form == "paper-a" else 0.0)
    return ServiceCoefficients(
        prefill_s_per_token=per_token + allreduce_token_s, prefill_s_per_attended_token=per_attended,
        prefill_s_per_chunk=allreduce_step_s,
        decode_step_s=p, decode_s_per_context_token=q, decode_s_per_seq=alpha_step + allreduce_token_s,
        decode_s_per_resident_token=kappa, chunk_tokens=int(chunk_tokens), request_overhead_s=float(t_fixed_s),
    )


def coefficients_for(arch, gpu, params, form: str = "kneecap",
                     chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                     tensor_parallel_size: int = 1) -> ServiceCoefficients:
    """:func:`coefficients_from_slim` from catalog objects (``kneecap.model.arch.ModelArch``,
    ``kneecap.model.hardware.GPU``) and SLIM parameters (``slim.SlimParams`` or its dict).
    d(B, C)'s step cost does not vary with B, so an MoE's step reads every routed expert (the
    limit of slim.weight_read_bytes as B grows: conservative at small batches).
    ``tensor_parallel_size``: one rank's costs plus the all-reduces (kneecap.model.parallel)."""
    from kneecap.model import parallel
    from kneecap.model.slim import SlimParams, arch_arrays, weight_read_bytes

    p = params if isinstance(params, SlimParams) else SlimParams.from_dict(dict(params))
    tp = parallel.check_tensor_parallel_size(arch, tensor_parallel_size)
    streamed_weight_bytes = lambda a: float(weight_read_bytes(arch_arrays(a, tp), np.inf))  # noqa: E731
    ar_step_s, ar_token_s = parallel.allreduce_coefficients(arch, gpu, tp)
    return coefficients_from_slim(
        tensor_parallel_size=tp, kv_dim_per_gpu=parallel.kv_heads_per_gpu(arch, tp) * arch.head_dim
        if tp > 1 else None, allreduce_step_s=ar_step_s, allreduce_token_s=ar_token_s,
        eta_c=p.eta_c, eta_m=p.eta_m, alpha=p.alpha_s, gamma=p.gamma_s, b0=p.b0, t_fixed_s=p.t_fixed_s,
        t_step_s=p.t_step_s, t_layer_s=p.t_layer_s, eta_w=p.eta_w, weight_bytes=streamed_weight_bytes(arch),
        layers=arch.layers, hidden=arch.hidden, kv_dim=arch.d_kv, ff_ratio=arch.r_ff, kv_bytes=arch.dtype_bytes,
        peak_flops=gpu.peak_flops, bandwidth_bytes_s=gpu.mem_bw_bytes_s, form=form, chunk_tokens=chunk_tokens)


def prefill_compute_s(coef: ServiceCoefficients, input_tokens, cached_tokens, chunk_tokens: float | None = None):
    """(compute seconds, chunk count) of chunked prefill, closed form per request (GAUSS §3.2).

    With s uncached tokens, n = ⌈s/Δ⌉, the last chunk m = s − (n−1)·Δ tokens. Attention is
    causal: prompt token t (1..s) attends the c cached tokens and tokens 1..t, so the prompt
    computes Σ_t (c + t) = s·c + s·(s+1)/2 query–key pairs, whatever the chunking (chunk j:
    m_j·A_{j−1} + m_j·(m_j+1)/2, A_{j−1} = c + tokens before it; FlashAttention-2, Dao 2023,
    §3.1.1, skips the masked blocks; the twin's roofline.attention_flops counts the same). Not
    GAUSS §3.2's m_j·A_j (A_j through the end of chunk j), which counts a chunk's full m_j² square.
    Δ = ``chunk_tokens`` (default: the whole budget, ``coef.chunk_tokens``). The compute is what
    the n chunk steps cost beyond the decode steps they carry, S_c = Σ_j ℓ_j.
    """
    inp = np.asarray(input_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    delta = float(coef.chunk_tokens if chunk_tokens is None else chunk_tokens)
    s = np.maximum(inp - c, 1.0)
    n = np.ceil(s / delta)
    last = s - (n - 1.0) * delta
    attended = s * c + s * (s + 1.0) / 2.0
    compute = coef.prefill_s_per_chunk * n + coef.prefill_s_per_token * s + coef.prefill_s_per_attended_token * attended
    return compute, n


def decode_step_s(coef: ServiceCoefficients, batch, resident_tokens):
    """d(B, C) = p + q·C/B + r·B + s·C (GAUSS §3.3; s from SLIM eq. 9–11), B ≥ 1."""
    b = np.maximum(np.asarray(batch, dtype=np.float64), 1.0)
    C = np.asarray(resident_tokens, dtype=np.float64)
    return (coef.decode_step_s + coef.decode_s_per_context_token * C / b
            + coef.decode_s_per_seq * b + coef.decode_s_per_resident_token * C)


@dataclass(frozen=True)
class DecodeFit:
    """d(B, C) coefficients fitted to observed step times (seconds) and the fit's quality."""

    decode_step_s: float  # p
    decode_s_per_context_token: float  # q
    decode_s_per_seq: float  # r
    decode_s_per_resident_token: float  # s
    rms_relative_error: float
    points: int

    def apply(self, coef: ServiceCoefficients) -> ServiceCoefficients:
        """``coef`` with its decode terms replaced by the fitted ones."""
        from dataclasses import replace

        return replace(coef, decode_step_s=self.decode_step_s, decode_s_per_context_token=self.decode_s_per_context_token,
                       decode_s_per_seq=self.decode_s_per_seq, decode_s_per_resident_token=self.decode_s_per_resident_token)


def fit_decode_coefficients(batch, resident_tokens, step_s, per_seq_context: bool = True) -> DecodeFit:
    """Fit d(B, C) = p + q·C/B + r·B + s·C (GAUSS §3.3) to observed inter-token latencies at
    batch B with resident context C (e.g. vLLM ITL against num_requests_running): non-negative
    least squares on the relative error (each row divided by its observation).
    ``per_seq_context=False`` fixes q = 0 (SLIM's form, eqs 9–11; what a roofline twin has)."""
    from scipy.optimize import nnls

    b = np.asarray(batch, dtype=np.float64).ravel()
    c = np.asarray(resident_tokens, dtype=np.float64).ravel()
    y = np.asarray(step_s, dtype=np.float64).ravel()
    if not (b.shape == c.shape == y.shape) or b.size < 4:
        raise InputError("step_s", "expected ≥ 4 observations with equal-length batch, context and step arrays")
    if np.any(~np.isfinite(b) | (b <= 0)) or np.any(~np.isfinite(c) | (c < 0)) or np.any(~np.isfinite(y) | (y <= 0)):
        raise InputError("step_s", "expected positive batch, context ≥ 0 and positive step times, all finite")
    b = np.maximum(b, 1.0)  # as decode_step_s: a mean batch below 1 still decodes one sequence
    design = np.column_stack([np.ones_like(b), c / b if per_seq_context else np.zeros_like(b), b, c])
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls((design / scale) / y[:, None], np.ones_like(y))
    x = x / scale
    rel = design @ x / y - 1.0
    return DecodeFit(*map(float, x), float(np.sqrt(np.mean(rel * rel))), int(y.size))
