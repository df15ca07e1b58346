"""Tensor parallelism: what one of a replica's TP GPUs holds and reads, and what the ranks exchange.

Megatron-style TP (Shoeybi et al. 2019, "Megatron-LM", §3 and Fig. 3), as vLLM implements it:

* every weight matrix of attention (Q/K/V column-parallel by head, O row-parallel) and of the MLP
  (gate/up column-parallel, down row-parallel) is split TP ways, and so are the vocabulary
  embedding and the LM head (vLLM VocabParallelEmbedding / ParallelLMHead); norms are replicated
  (O(L·D), ignored). Per GPU: W/TP.
* KV heads are split across ranks: max(1, H_kv/TP) per GPU. With GQA and H_kv < TP each KV head is
  replicated on TP/H_kv ranks (vLLM QKVParallelLinear ``num_kv_head_replicas``), so its K/V
  projection weights and its KV cache are held that many times. MLA's latent (DeepSeek) is not
  split by head: every rank caches the whole latent.
* each transformer layer ends its attention and its MLP with an all-reduce of the activations
  (Megatron §3: the "g" operator, two all-reduces per layer in the forward pass), a message of
  tokens·D·b bytes.
* the ring all-reduce of n bytes over p ranks takes 2(p−1) steps, each sending n/p bytes
  (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
  MPICH", the ring: a reduce-scatter then an all-gather; nccl-tests doc/PERFORMANCE.md: busBw =
  algBw·2(p−1)/p for all-reduce):
      t_AR = base + 2(p−1)·α + 2(p−1)/p · n / β
  with β the per-GPU link bandwidth in one direction and α, base NCCL's own ring/LL latency
  constants (kneecap.model.hardware).
* MoE: each routed expert is split TP ways as the dense MLP is (vLLM FusedMoE under TP); with
  ``--enable-expert-parallel`` whole experts are partitioned E/TP per rank instead. Both hold
  W_experts/TP per GPU and, in expectation over uniform routing, read the same bytes per step
  (the distinct experts a step touches, over TP): the model does not distinguish them beyond
  checking that expert parallelism applies (an MoE model); rank imbalance under EP is not modelled.
* Only a rank's shard is read in a decode step (SLIM's weight and KV reads, paper 000 eqs 9–11,
  per GPU); FLOPs split evenly (F/TP per rank).
"""

from __future__ import annotations

import numpy as np

from kneecap.errors import InputError
from kneecap.model.arch import ModelArch
from kneecap.model.hardware import ALLREDUCE_BASE_LATENCY_S, GPU

FLAG = "--tensor-parallel-size"
EP_FLAG = "--enable-expert-parallel"


def check_tensor_parallel_size(arch: ModelArch, tensor_parallel_size, field: str = "tensor_parallel_size",
                               expert_parallel: bool = False) -> int:
    """TP as vLLM accepts it: a positive integer dividing the attention heads, and either dividing
    the KV heads or a multiple of them (vLLM ModelConfig.verify_with_parallel_config,
    QKVParallelLinear). Errors name ``field``."""
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
        raise InputError(field, f"expected a positive integer, got {tp!r}")
    tp = int(tp)
    if arch.q_heads % tp:
        raise InputError(field, f"{tp} does not divide the {arch.q_heads} attention heads of {arch.key} "
                                f"(vLLM requires it)")
    if not arch.kv_latent_dim and (arch.kv_heads % tp if arch.kv_heads >= tp else tp % arch.kv_heads):
        raise InputError(field, f"{tp} neither divides nor is a multiple of the {arch.kv_heads} KV heads of "
                                f"{arch.key} (vLLM requires one or the other)")
    if expert_parallel and not arch.moe:
        raise InputError(EP_FLAG if field.startswith("--") else "expert_parallel",
                         f"{arch.key} has no experts to partition")
    return tp


def kv_heads_per_gpu(arch: ModelArch, tensor_parallel_size: int) -> int:
    """max(1, H_kv/TP): GQA with fewer KV heads than ranks replicates them (module docstring)."""
    return max(1, arch.kv_heads // int(tensor_parallel_size))


def kv_bytes_per_token_per_gpu(arch: ModelArch, tensor_parallel_size: int) -> int:
    """One rank's KV bytes per token: 2·L·(H_kv per GPU)·dh·b_kv (DESIGN §5.3 per rank); MLA's
    latent L·latent·b_kv is held whole on every rank."""
    if arch.kv_latent_dim:
        return arch.kv_bytes_per_token
    return 2 * arch.layers * kv_heads_per_gpu(arch, tensor_parallel_size) * arch.head_dim * arch.dtype_bytes


def replicated_kv_weight_bytes(arch: ModelArch, tensor_parallel_size: int) -> float:
    """Bytes one rank holds beyond W/TP because its KV heads are replicated: the K and V
    projections (2·D·dh each head and layer) of H_kv/GPU heads minus their H_kv/TP share."""
    tp = int(tensor_parallel_size)
    if arch.kv_latent_dim or tp == 1:
        return 0.0
    extra_heads = kv_heads_per_gpu(arch, tp) - arch.kv_heads / tp
    return float(arch.layers * 2 * arch.hidden * arch.head_dim * extra_heads * arch.bytes_per_weight)


def weight_bytes_per_gpu(arch: ModelArch, tensor_parallel_size: int) -> float:
    """What one rank holds: W/TP plus its replicated K/V projections (module docstring)."""
    tp = int(tensor_parallel_size)
    return arch.weight_bytes / tp + replicated_kv_weight_bytes(arch, tp)


def allreduces_per_step(arch: ModelArch, tensor_parallel_size: int) -> int:
    """2·L all-reduces per forward step (Megatron §3); none without TP."""
    return 0 if int(tensor_parallel_size) == 1 else 2 * arch.layers


def ring_allreduce_s(message_bytes, tensor_parallel_size, gpu: GPU):
    """t_AR = base + 2(p−1)·α + 2(p−1)/p·n/β (Thakur et al. 2005, ring all-reduce; NCCL busBw), 0 at p = 1."""
    n = np.asarray(message_bytes, dtype=float)
    p = float(tensor_parallel_size)
    if p == 1:
        return np.zeros_like(n) if n.ndim else 0.0
    t = ALLREDUCE_BASE_LATENCY_S + 2.0 * (p - 1.0) * gpu.link_latency_s + 2.0 * (p - 1.0) / p * n / gpu.link_bw_bytes_s
    return t if n.ndim else float(t)


def allreduce_s_per_step(arch: ModelArch, gpu: GPU, tensor_parallel_size: int, tokens):
    """Communication of one forward step over ``tokens`` tokens: 2·L ring all-reduces of
    tokens·D·b_act bytes each (Megatron §3, message = the layer's output activations)."""
    n_bytes = np.asarray(tokens, dtype=float) * arch.hidden * arch.dtype_bytes
    return allreduces_per_step(arch, tensor_parallel_size) * ring_allreduce_s(n_bytes, tensor_parallel_size, gpu)


def allreduce_coefficients(arch: ModelArch, gpu: GPU, tensor_parallel_size: int) -> tuple[float, float]:
    """(seconds per step, seconds per token) of :func:`allreduce_s_per_step`, which is affine in
    the step's tokens: 2L·(base + 2(p−1)·α) and 2L·2(p−1)/p·D·b/β."""
    tp = int(tensor_parallel_size)
    if tp == 1:
        return 0.0, 0.0
    per_step = float(allreduce_s_per_step(arch, gpu, tp, 0.0))
    per_token = allreduces_per_step(arch, tp) * 2.0 * (tp - 1) / tp * arch.hidden * arch.dtype_bytes / gpu.link_bw_bytes_s
    return per_step, float(per_token)
