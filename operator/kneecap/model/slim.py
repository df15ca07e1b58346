"""SLIM: semi-analytical throughput/latency model of vLLM serving (paper 000 §VI, DESIGN §5.1).

Three forms, all vectorised over (batch, input_len, output_len) and one model shape per row:

* ``paper-a``: eq. 9 read as (B+B0)·[T_d + M_dec/(η_m·BW)]  (DESIGN's reading).
* ``paper-b``: eq. 9 read as (B+B0)·T_d + B·M_dec/(η_m·BW).
* ``kneecap`` (default): the paper's prefill (eqs 7–8) and per-sequence terms (eqs 10–12), with
  three fixes measured on the real H100 data (benchmarks/slim_accuracy.py):
  (i)  the per-step cost that SLIM ties to the per-sequence cost through one B0 is split out:
       each decode step pays t_step + L·t_layer + W/(η_w·BW): a kernel-latency floor per layer
       and the weight read, physically known per model;
  (ii) KV traffic uses E[C(IL, OL)] over the output-length distribution (CV-aware) instead of
       C at the mean lengths, which undercounts it on heterogeneous prompts; and without chunked
       prefill, heterogeneous requests are admitted one at a time, each prefill a step of its own;
  (iii) the effective batch is capped by what the KV cache (and a chunked-prefill token budget)
       holds, and requests beyond it pay a recompute (preemption) prefill.

Tensor parallelism (``tensor_parallel_size``, kneecap form only; kneecap.model.parallel): every
term is one rank's: prefill FLOPs and eq. 10's dense γ term over TP, the rank's weight shard and
KV heads read per step (eqs 9–11 per GPU), plus 2·L ring all-reduces per forward step
(Megatron-LM, Shoeybi et al. 2019 §3) of the step's tokens·D·b bytes, t_AR = base + 2(p−1)·α +
2(p−1)/p·n/β (Thakur et al. 2005, ring all-reduce).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from types import MappingProxyType
from typing import Sequence

import numpy as np

from kneecap.errors import InputError
from kneecap.model.arch import ModelArch, get_arch
from kneecap.model.hardware import GPU
from kneecap.model.parallel import (check_tensor_parallel_size, kv_bytes_per_token_per_gpu,
                                    replicated_kv_weight_bytes, ring_allreduce_s)

FORMS = ("paper-a", "paper-b", "kneecap")
DEFAULT_FORM = "kneecap"

# Fraction of the KV cache that running sequences fill at saturation under vLLM V0 (watermark,
# block rounding, preempted-but-resident blocks): measured B_running·(IL+OL/2) / capacity on the
# preempting curves of data/real-h100/profiles.csv is 0.84–0.87 for fixed lengths.
KV_FILL = 0.85


@dataclass(frozen=True)
class SlimParams:
    """Calibrated constants θ. The paper forms use eta_c..t_fixed_s; ``kneecap`` replaces b0
    with the per-step pair (t_step_s, eta_w)."""

    eta_c: float = 0.5  # prefill compute efficiency (eq. 7)
    eta_m: float = 0.6  # KV-read bandwidth efficiency (eq. 9)
    alpha_s: float = 5e-5  # per-token decode overhead α (eq. 10), seconds
    gamma_s: float = 1e-7  # dense decode coefficient γ per L·(D/1024)² (eq. 10), seconds
    b0: float = 30.0  # batch offset B0 (eq. 9; paper forms)
    t_fixed_s: float = 0.01  # batch-level fixed overhead (eq. 5)
    t_step_s: float = 2e-4  # per-decode-step fixed overhead (kneecap)
    t_layer_s: float = 8e-5  # per-layer per-step kernel-latency floor (kneecap)
    eta_w: float = 0.9  # weight-read bandwidth efficiency vs the nominal BW (kneecap)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SlimParams":
        known = {f.name for f in fields(cls)}
        bad = set(d) - known
        if bad:
            raise InputError("params", f"unknown SLIM parameters {sorted(bad)}; expected {sorted(known)}")
        return cls(**{k: float(v) for k, v in d.items()})


# Parameters each form uses (the ones calibration fits).
FORM_PARAMS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "paper-a": ("eta_c", "eta_m", "alpha_s", "gamma_s", "b0", "t_fixed_s"),
    "paper-b": ("eta_c", "eta_m", "alpha_s", "gamma_s", "b0", "t_fixed_s"),
    "kneecap": ("eta_c", "eta_m", "alpha_s", "gamma_s", "t_step_s", "t_layer_s", "eta_w", "t_fixed_s"),
})


@dataclass(frozen=True)
class Prediction:
    throughput_tok_s: np.ndarray  # total (input + output) tokens/s, eq. 6
    e2e_s: np.ndarray  # batch E2E latency, eq. 5
    effective_batch: np.ndarray  # B after the KV / token-budget caps (= B for paper forms)


def check_form(form: str) -> str:
    if form not in FORMS:
        raise InputError("model_form", f"unknown SLIM form {form!r}; expected one of {', '.join(FORMS)}")
    return form


def c_tokens(input_len, output_len):
    """C(IL, OL) = Σ_{j=1..OL}(IL + j) = OL·(IL+1) + OL·(OL−1)/2 (paper 000 eq. 12)."""
    il = np.asarray(input_len, dtype=float)
    ol = np.asarray(output_len, dtype=float)
    return ol * (il + 1.0) + ol * (ol - 1.0) / 2.0


def expected_c_tokens(input_len, output_len, output_cv=0.0):
    """E[C(IL, OL)] with OL of mean ``output_len`` and coefficient of variation ``output_cv``,
    IL independent of OL: E[OL]·(E[IL]+1) + (E[OL²] − E[OL])/2, E[OL²] = OL²·(1+cv²).
    Eq. 12 at the means undercounts KV traffic by OL²·cv²/2 (kneecap fix ii)."""
    il = np.asarray(input_len, dtype=float)
    ol = np.asarray(output_len, dtype=float)
    cv = np.asarray(output_cv, dtype=float)
    return ol * (il + 1.0) + (ol * ol * (1.0 + cv * cv) - ol) / 2.0


@dataclass(frozen=True)
class ArchArrays:
    """Model shapes as per-row arrays (so one call can mix models)."""

    layers: np.ndarray
    hidden: np.ndarray
    d_kv: np.ndarray
    r_ff: np.ndarray
    kv_bytes_per_elem: np.ndarray
    weight_bytes: np.ndarray  # bytes every decode step reads (streamed_weight_bytes: routed experts excluded)
    kv_bytes_per_token: np.ndarray  # 2·L·D_kv·b_kv (eq. 11), or MLA's latent bytes
    expert_bytes: np.ndarray  # one routed expert's bytes summed over the MoE layers (0: dense)
    num_experts: np.ndarray  # E (0: dense)
    experts_per_token: np.ndarray  # k
    tensor_parallel_size: np.ndarray  # TP: the byte fields above are one rank's


def streamed_weight_bytes(arch: ModelArch) -> float:
    """Weight bytes every decode step reads: all weights except an untied input-embedding table
    (only B of its rows are gathered) and the routed experts (see :func:`weight_read_bytes`).
    OPT ties its embeddings to the LM head (read in full); Llama 3.1, Mistral and Qwen have an
    untied table of V·D; Llama 3.2, Gemma and Granite tie theirs."""
    untied_table = 0.0 if arch.tied else arch.vocab * arch.hidden * arch.bytes_per_weight
    return float(arch.weight_bytes - untied_table - arch.routed_expert_params * arch.bytes_per_weight)


def distinct_experts(num_experts, experts_per_token, tokens):
    """Expected distinct experts a step's tokens touch in one MoE layer: E·(1 − (1 − k/E)^B),
    each of B tokens choosing k of E experts uniformly (an upper bound: real routers are
    skewed, so fewer distinct experts are read). 0 for a dense model."""
    e = np.asarray(num_experts, dtype=float)
    k = np.asarray(experts_per_token, dtype=float)
    b = np.asarray(tokens, dtype=float)
    safe_e = np.where(e > 0, e, 1.0)
    return np.where(e > 0, safe_e * (1.0 - (1.0 - k / safe_e) ** b), 0.0)


def weight_read_bytes(aa: "ArchArrays", tokens):
    """W(B): weight bytes one forward step over ``tokens`` tokens reads: the always-read weights
    plus, per MoE layer, the distinct routed experts the tokens touch (:func:`distinct_experts`).
    Dense models: W, the kneecap form's fix (i) term W/(η_w·BW) (the per-step part of SLIM
    eq. 9's B0·T_d); at B = 1 an MoE reads the dense part and k experts per layer."""
    return aa.weight_bytes + aa.expert_bytes * distinct_experts(aa.num_experts, aa.experts_per_token, tokens)


def arch_arrays(arch: ModelArch | str | Sequence, tensor_parallel_size: int = 1) -> ArchArrays:
    """One ModelArch (or catalog key), or a sequence of them (one per row); with TP > 1 the
    weight, expert and KV bytes are one rank's (kneecap.model.parallel)."""
    if isinstance(arch, ArchArrays):
        if tensor_parallel_size != 1 and not np.all(arch.tensor_parallel_size == tensor_parallel_size):
            raise InputError("tensor_parallel_size", "ArchArrays were built for another tensor parallel size")
        return arch
    if isinstance(arch, (ModelArch, str)):
        archs = [get_arch(arch)]
    else:
        archs = [get_arch(a) for a in arch]
        if not archs:
            raise InputError("model", "expected at least one model")
    cache: dict[ModelArch, tuple] = {}
    rows = []
    for a in archs:
        if a not in cache:
            tp = check_tensor_parallel_size(a, tensor_parallel_size)
            cache[a] = (a.layers, a.hidden, a.d_kv, a.r_ff, a.dtype_bytes,
                        streamed_weight_bytes(a) / tp + replicated_kv_weight_bytes(a, tp),
                        kv_bytes_per_token_per_gpu(a, tp), a.moe_layers * a.expert_params * a.bytes_per_weight / tp,
                        a.num_experts, a.experts_per_token, tp)
        rows.append(cache[a])
    m = np.asarray(rows, dtype=float)
    n = m.shape[1]
    if len(archs) == 1:
        return ArchArrays(*(np.asarray(m[0, i]) for i in range(n)))
    return ArchArrays(*(m[:, i] for i in range(n)))


def _positive(name: str, value) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise InputError(name, f"expected positive finite numbers, got {value!r}" if a.size < 6
                         else "expected positive finite numbers (some are not)")
    return a


def prefill_flops(aa: ArchArrays, batch, input_len):
    """F_pre = L·[B·IL·(4D² + 4·D·Dkv + 4·r_ff·D²) + 4·B·IL²·D] (paper 000 eq. 8), over TP per
    rank (Megatron splits every GEMM and the attention heads evenly)."""
    d = aa.hidden
    per_tok = 4.0 * d * d + 4.0 * d * aa.d_kv + 4.0 * aa.r_ff * d * d
    return aa.layers * (batch * input_len * per_tok + 4.0 * batch * input_len * input_len * d) / aa.tensor_parallel_size


def dense_decode_s(p: SlimParams, aa: ArchArrays, output_len):
    """T_d = α·OL + γ·L·(D/1024)²·OL (paper 000 eq. 10); the dense γ term over TP per rank,
    α (per-token host overhead) is not split."""
    return (p.alpha_s * output_len
            + p.gamma_s * aa.layers * (aa.hidden / 1024.0) ** 2 * output_len / aa.tensor_parallel_size)


def kv_limited_batch(kv_capacity_tokens, input_len, output_len, output_cv=0.0, block_size=16):
    """Running batch the KV cache holds at saturation: fill·capacity / (mean resident context +
    half a block). Mean resident context of a sequence over its life is E[C]/E[OL] (eq. 12)."""
    ctx = expected_c_tokens(input_len, output_len, output_cv) / np.asarray(output_len, dtype=float)
    return KV_FILL * np.asarray(kv_capacity_tokens, dtype=float) / (ctx + block_size / 2.0)


def token_budget_batch(max_num_batched_tokens, input_len, output_len):
    """With chunked prefill, each step carries ≤ budget tokens, of which a fraction
    OL/(IL+OL) are decode tokens at steady state: B ≤ budget·OL/(IL+OL) (data README)."""
    il = np.asarray(input_len, dtype=float)
    ol = np.asarray(output_len, dtype=float)
    return np.asarray(max_num_batched_tokens, dtype=float) * ol / (il + ol)


def predict(form: str, params: SlimParams, arch, gpu: GPU, batch, input_len, output_len, *,
            output_cv=0.0, kv_capacity_tokens=None, max_num_batched_tokens=None,
            chunked_prefill=False, block_size: int = 16, tensor_parallel_size: int = 1) -> Prediction:
    """Throughput (eq. 6) and E2E (eq. 5) for ``form``.

    ``batch`` is the running batch B (the data's time-weighted mean). For ``kneecap`` it may be a
    requested cap: with ``kv_capacity_tokens`` (and ``max_num_batched_tokens`` for chunked
    prefill) the effective batch is capped and the excess pays a recompute prefill. The paper
    forms ignore those keywords, as the paper does. ``chunked_prefill`` (per row): prefills ride
    along decode steps (vLLM V1's default) instead of running as steps of their own.
    ``tensor_parallel_size``: one rank's step time plus the all-reduces (module docstring); the
    paper forms take TP 1 only.
    """
    check_form(form)
    if form != "kneecap" and tensor_parallel_size != 1:
        raise InputError("tensor_parallel_size", f"the {form} form models one GPU; tensor parallelism needs the kneecap form")
    b = _positive("batch", batch)
    il = _positive("input_len", input_len)
    ol = _positive("output_len", output_len)
    b, il, ol = np.broadcast_arrays(b, il, ol)
    aa = arch_arrays(arch, tensor_parallel_size)
    fmax, bw = float(gpu.peak_flops), float(gpu.mem_bw_bytes_s)
    p = params

    if form in ("paper-a", "paper-b"):
        t_pre = prefill_flops(aa, b, il) / (p.eta_c * fmax)  # eq. 7
        t_d = dense_decode_s(p, aa, ol)  # eq. 10
        m_dec = aa.kv_bytes_per_token * c_tokens(il, ol)  # eq. 11: 2·L·Dkv·b_kv·C(IL, OL)
        t_mem = m_dec / (p.eta_m * bw)
        if form == "paper-a":
            t_dec = (b + p.b0) * (t_d + t_mem)  # eq. 9, reading a
        else:
            t_dec = (b + p.b0) * t_d + b * t_mem  # eq. 9, reading b
        e2e = t_pre + t_dec + p.t_fixed_s  # eq. 5
        thr = b * (il + ol) / e2e  # eq. 6
        return Prediction(np.asarray(thr, float), np.asarray(e2e, float), np.asarray(b, float))

    # kneecap form
    cv = np.broadcast_to(np.asarray(output_cv, dtype=float), b.shape)
    if np.any(cv < 0) or not np.all(np.isfinite(cv)):
        raise InputError("output_cv", "expected non-negative finite coefficients of variation")
    # The scheduler runs at most the token budget's batch; of that, what the KV cache cannot
    # hold is preempted (fix iii).
    b_try = b
    if max_num_batched_tokens is not None:
        b_try = np.minimum(b_try, token_budget_batch(_positive("max_num_batched_tokens", max_num_batched_tokens),
                                                     il, ol))
    b_eff = b_try
    if kv_capacity_tokens is not None:
        b_eff = np.minimum(b_eff, kv_limited_batch(_positive("kv_capacity_tokens", kv_capacity_tokens),
                                                   il, ol, cv, block_size))
    b_eff = np.maximum(b_eff, 1e-9)
    # Preemption by recompute: the excess over what fits is evicted and re-prefilled. vLLM V0
    # preempts the latest-admitted sequences, which have generated little, so a recompute
    # costs about a prompt's prefill.
    evicted = np.clip(1.0 - b_eff / b_try, 0.0, 1.0)
    recompute_tokens = evicted * il
    t_pre = prefill_flops(aa, b_eff, il + recompute_tokens) / (p.eta_c * fmax)  # eqs 7–8
    # TP: 2·L all-reduces of each forward step's tokens·D·b bytes (Megatron §3; Thakur et al. 2005, ring)
    tp = aa.tensor_parallel_size
    n_ar = np.where(tp > 1, 2.0 * aa.layers, 0.0)
    act_bytes = aa.hidden * aa.kv_bytes_per_elem
    ar = lambda tokens: n_ar * ring_allreduce_s(tokens * act_bytes, float(np.max(tp)), gpu)  # noqa: E731
    t_pre = t_pre + ar(b_eff * (il + recompute_tokens))
    # Per decode step: fixed + per-layer kernel floor + one read of the weights (fix i); an MoE
    # reads the experts the step's B tokens route to.
    t_floor = p.t_step_s + p.t_layer_s * aa.layers
    t_step = t_floor + weight_read_bytes(aa, b_eff) / (p.eta_w * bw) + ar(b_eff)
    t_d = dense_decode_s(p, aa, ol)  # eq. 10, per sequence
    m_dec = aa.kv_bytes_per_token * expected_c_tokens(il, ol, cv)  # eqs 11–12 over the OL distribution (fix ii)
    t_dec = ol * t_step + b_eff * (t_d + m_dec / (p.eta_m * bw))
    # Without chunked prefill, heterogeneous lengths finish one by one, so each admission runs
    # its own prefill step, paying the per-step floor and weight read again; identical lengths
    # finish (and refill) in waves that share one. Fraction prefilled alone ≈ min(cv, 1).
    # Measured: fixed-length → ShareGPT transfer MAPE 12.6% → 5.8% (benchmarks/slim_accuracy.py).
    separate = ~np.broadcast_to(np.asarray(chunked_prefill, dtype=bool), b.shape)
    # A prefill step of IL tokens reads the experts IL tokens route to.
    t_step_prefill = t_floor + weight_read_bytes(aa, il) / (p.eta_w * bw) + ar(0.0 * il)
    t_dec = t_dec + separate * b_eff * np.minimum(cv, 1.0) * t_step_prefill
    e2e = t_pre + t_dec + p.t_fixed_s  # eq. 5
    thr = b_eff * (il + ol) / e2e  # eq. 6
    return Prediction(np.asarray(thr, float), np.asarray(e2e, float), np.asarray(b_eff, float))


def fit(*args, **kwargs):
    """Calibrate a form on measured throughput: see :func:`kneecap.model.calibrate.fit`."""
    from kneecap.model.calibrate import fit as _fit

    return _fit(*args, **kwargs)
