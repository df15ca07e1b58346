"""Per-step time of one vLLM engine iteration: a roofline of the model on the GPU.

A step runs every scheduled token through the weights once and reads the KV cache of every
scheduled sequence's earlier context. Its time is (Williams et al., "Roofline", CACM 2009:
time = max(bytes / bandwidth, FLOPs / compute) per kernel class)

    t = t_step + c_seq·S + max(W / (η_w·BW), F_lin / (η_c·F))           (linear layers)
          + max(KV_read / (η_a·BW), F_attn / (η_c·F))                 (attention)
          + [eager] · L · t_layer                                      (launches without CUDA graphs)

with S sequences and T tokens in the step, W weight bytes, F_lin = 2·(N − N_e)·T + 2·V·D·S for N
parameters (2·N FLOPs per token: Kaplan et al. 2020, "Scaling laws", §2.1) of which N_e = V·D
(×2 untied) are the token embedding, a gather with no FLOPs, and the LM head, whose GEMM vLLM
runs on each sequence's last scheduled position only (``logits_indices`` in its model runner):
2·V·D per sequence, not per token, KV_read = (earlier context tokens) · 2·L·D_kv·b_kv,
F_attn = 4·L·D·Σ_chunks (n·p + n(n+1)/2) for a chunk of n new tokens after p earlier ones
(QKᵀ and AV, 2 FLOPs per multiply-add, causal). A step is "eager" when it carries prefill
tokens or more decode sequences than vLLM captures CUDA graphs for (256). With
``prefill_adds_weight_read`` (the twin of a SLIM θ, :func:`kneecap.sim.shared_gpu.step_cost_for`)
a step carrying prefill tokens costs W/(η_w·BW) + F_lin/(η_c·F), SLIM eq. 9's composition,
under which that θ was fitted. An MoE step reads
the always-used weights plus the distinct routed experts its T tokens touch (E·(1−(1−k/E)^T)
per layer, :func:`kneecap.model.slim.distinct_experts`) and computes with the active parameters.

Under tensor parallelism (kneecap.model.parallel) the step is one rank's: its weight shard W/TP
(plus replicated KV projections), N/TP parameters, its KV heads' bytes and F_attn/TP, plus
2·L ring all-reduces of T·D·b bytes (Megatron-LM §3; t_AR = base + 2(p−1)·α + 2(p−1)/p·n/β,
Thakur et al. 2005, ring all-reduce), the same terms SLIM and GAUSS use.

This is deliberately not SLIM (kneecap.model.slim): it is a per-step physical model that the
engine integrates step by step, so calibrating SLIM on the twin's output is not circular.

The efficiency constants are set once for all models (not per model, not per curve) from the
offline prefill/decode step timings of the real H100 (data/real-h100/offline.csv, 54
runs, 3 models; nsys runs deflated 5%): η_w = 0.90 fixed from microbenchmark knowledge (large
fp16 GEMV reach ~90% of peak HBM bandwidth), the rest by one least-squares fit on log step
time (RMS error 10% over all 108 prefill and decode steps, 5% over decode steps);
``benchmarks/twin_vs_h100.py --refit`` reproduces it. With the LM head per sequence the fit
gives η_c 0.574 (0.606 with it per token; RMS 0.1003 at η_c 0.57 vs 0.1021 before) and the
other constants within their rounding, so only η_c moved (0.61 → 0.57).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model.arch import ModelArch
from kneecap.model.hardware import GPU
from kneecap.model.parallel import allreduce_s_per_step, kv_bytes_per_token_per_gpu, replicated_kv_weight_bytes
from kneecap.model.slim import distinct_experts


@dataclass(frozen=True)
class StepCostParams:
    """Achievable fractions of peak and fixed costs of one engine step."""

    bw_efficiency: float = 0.90  # η_w: weight streaming (large GEMV)
    attn_bw_efficiency: float = 0.78  # η_a: paged-attention KV reads
    compute_efficiency: float = 0.57  # η_c: dense GEMM at prefill sizes
    step_overhead_s: float = 2.2e-3  # scheduler, input prep, sampling, output processing
    per_seq_overhead_s: float = 28e-6  # per scheduled sequence (metadata, sampling, detokenise)
    eager_layer_overhead_s: float = 0.24e-3  # kernel launches per layer without CUDA graphs
    cuda_graph_max_batch: int = 256  # vLLM captures decode graphs up to this batch
    prefill_adds_weight_read: bool = False  # a prefill step's weight read and GEMMs add (SLIM eq. 9), not max

    def __post_init__(self):
        for name in ("bw_efficiency", "attn_bw_efficiency", "compute_efficiency"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
                raise InputError(f"step_cost.{name}", f"expected a fraction in (0, 1], got {v!r}")
        if not isinstance(self.prefill_adds_weight_read, bool):
            raise InputError("step_cost.prefill_adds_weight_read",
                             f"expected true or false, got {self.prefill_adds_weight_read!r}")
        for name in ("step_overhead_s", "per_seq_overhead_s", "eager_layer_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0.0):
                raise InputError(f"step_cost.{name}", f"expected a non-negative time, got {v!r}")


DEFAULT_STEP_COST = StepCostParams()


def attention_flops(arch: ModelArch, new_tokens, prior_tokens) -> float:
    """F_attn = 4·L·D·Σ (n·p + n(n+1)/2) over chunks (module docstring)."""
    n = np.asarray(new_tokens, dtype=float)
    p = np.asarray(prior_tokens, dtype=float)
    d_attn = arch.q_heads * arch.head_dim
    return float(4.0 * arch.layers * d_attn * np.sum(n * p + n * (n + 1.0) / 2.0))


def embedding_params(arch: ModelArch) -> float:
    """N_e = V·D, ×2 untied: the token embedding (a gather, no FLOPs) and the LM head (its GEMM
    runs on each sequence's last position only, vLLM's ``logits_indices``), outside the per-token
    2·N of F_lin (module docstring)."""
    return float(arch.vocab * arch.hidden * (1 if arch.tied else 2))


def step_time_s(arch: ModelArch, gpu: GPU, *, num_seqs: int, num_tokens: int, kv_read_tokens: float,
                attn_flops: float, has_prefill: bool, cost: StepCostParams = DEFAULT_STEP_COST,
                tensor_parallel_size: int = 1) -> float:
    """Time of one engine step (module docstring), one TP rank's plus the all-reduces.
    ``kv_read_tokens``: earlier-context tokens read."""
    return StepPricer(arch, gpu, cost, tensor_parallel_size)(num_seqs, num_tokens, kv_read_tokens, attn_flops,
                                                             has_prefill)


class StepPricer:
    """:func:`step_time_s` of one engine (model, GPU, costs, TP), its per-engine terms computed
    once: the twin prices every step, and those terms were most of a step's cost. The arithmetic
    per step is the same, operation for operation, so the times are bit-identical."""

    def __init__(self, arch: ModelArch, gpu: GPU, cost: StepCostParams = DEFAULT_STEP_COST,
                 tensor_parallel_size: int = 1):
        tp = int(tensor_parallel_size)
        self.arch, self.gpu, self.cost, self.tp = arch, gpu, cost, tp
        params = arch.active_params if arch.moe else arch.params
        self._flops_per_token = 2.0 * max(params - embedding_params(arch), 0.0)  # F_lin (module docstring)
        self._head_flops_per_seq = 2.0 * arch.vocab * arch.hidden
        self._weight_rate = cost.bw_efficiency * gpu.mem_bw_bytes_s
        self._compute_rate = cost.compute_efficiency * gpu.peak_flops
        self._kv_bytes_per_token = kv_bytes_per_token_per_gpu(arch, tp)
        self._attn_rate = cost.attn_bw_efficiency * gpu.mem_bw_bytes_s
        self._eager_s = arch.layers * cost.eager_layer_overhead_s
        self._dense_weight_s = None if arch.moe else self._weight_s(arch.weight_bytes)

    def _weight_s(self, weight_bytes: float) -> float:
        return (weight_bytes / self.tp + replicated_kv_weight_bytes(self.arch, self.tp)) / self._weight_rate

    def __call__(self, num_seqs: int, num_tokens: int, kv_read_tokens: float, attn_flops: float,
                 has_prefill: bool) -> float:
        if num_tokens <= 0:
            return 0.0
        arch, cost, tp = self.arch, self.cost, self.tp
        weight_s = self._dense_weight_s
        if weight_s is None:  # MoE: the step reads the experts its tokens route to
            routed_bytes = arch.routed_expert_params * arch.bytes_per_weight
            touched = float(distinct_experts(arch.num_experts, arch.experts_per_token, num_tokens)) / arch.num_experts
            weight_s = self._weight_s(arch.weight_bytes - routed_bytes * (1.0 - touched))
        linear_flops = self._flops_per_token * num_tokens + self._head_flops_per_seq * num_seqs
        gemm_s = linear_flops / tp / self._compute_rate
        linear_s = weight_s + gemm_s if has_prefill and cost.prefill_adds_weight_read else max(weight_s, gemm_s)
        attn_s = max(kv_read_tokens * self._kv_bytes_per_token / self._attn_rate,
                     attn_flops / tp / self._compute_rate)
        eager = has_prefill or num_seqs > cost.cuda_graph_max_batch
        t = (cost.step_overhead_s + cost.per_seq_overhead_s * num_seqs + linear_s + attn_s
             + (self._eager_s if eager else 0.0))
        if tp == 1:  # no all-reduces (their term is 0)
            return t
        return t + float(allreduce_s_per_step(arch, self.gpu, tp, num_tokens))


def gauss_coefficients(arch: ModelArch, gpu: GPU, chunk_tokens: int, cost: StepCostParams = DEFAULT_STEP_COST):
    """GAUSS's service terms (``kneecap.model.gauss.ServiceCoefficients``) of :func:`step_time_s`
    on one GPU (TP 1), so GAUSS and the twin price the same steps. A decode step is bandwidth-bound:
    t_step + W/(η_w·BW) per step, c_seq per sequence, the KV read per resident token. A prefill
    chunk step adds, compute-bound, 2·(N − N_e) FLOPs per token (F_lin; its LM head per sequence, µs,
    left out) and 4·L·D_attn per attended token (F_attn) over η_c·F, plus the eager launches
    L·t_layer beyond the weight read they replace (per chunk)."""
    from kneecap.model import gauss

    weights_s = arch.weight_bytes / (cost.bw_efficiency * gpu.mem_bw_bytes_s)
    flops_s = cost.compute_efficiency * gpu.peak_flops
    return gauss.ServiceCoefficients(
        prefill_s_per_token=2 * (arch.params - embedding_params(arch)) / flops_s,
        prefill_s_per_attended_token=4 * arch.layers * arch.q_heads * arch.head_dim / flops_s,
        prefill_s_per_chunk=max(arch.layers * cost.eager_layer_overhead_s - weights_s, 0.0),
        decode_step_s=cost.step_overhead_s + weights_s, decode_s_per_seq=cost.per_seq_overhead_s,
        decode_s_per_resident_token=arch.kv_bytes_per_token / (cost.attn_bw_efficiency * gpu.mem_bw_bytes_s),
        chunk_tokens=int(chunk_tokens))
