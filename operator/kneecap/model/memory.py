"""KV-cache memory: how many tokens a cap needs, and how vLLM splits GPU memory.

vLLM sizes the KV cache as ``total · gpu_memory_utilization − non_kv`` (DESIGN §5.3), where
non_kv = weights + a reserve for the profiling run's peak activations, the sampler's logit
buffers and non-torch memory. The reserve model here is

    reserve = base + max(a · D · T, s · V · S)

with T the token budget (``max_num_batched_tokens``), D the hidden size, V the vocabulary and
S = ``max_num_seqs``: the profile run's peak is either the forward pass over T tokens or the
sampler over S rows of V logits, whichever is larger. The constants were measured on the real
H100 data (data/real-h100/profiles.csv, vLLM 0.5–0.6 V0; 142 rows, worst KV error
0.13%, see benchmarks/kv_capacity.py). A live pod's ``vllm:cache_config_info`` re-measures
non_kv exactly (``non_kv_from_cache_config``); pass that as ``measured_non_kv_bytes``.

With tensor parallelism (``tensor_parallel_size``, kneecap.model.parallel) every figure is one
GPU's: each rank holds its weight shard and its KV heads' cache, vLLM sizes the cache on each
rank from that rank's free memory and reports per-rank blocks; a block holds the same tokens on
every rank, so the replica's KV capacity in tokens is one rank's. The reserve is kept as measured
at TP 1 (activations of the residual stream are whole on every rank); NCCL's buffers are not
modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model.arch import GIB, ModelArch
from kneecap.model.hardware import GPU
from kneecap.model.parallel import check_tensor_parallel_size, kv_bytes_per_token_per_gpu, weight_bytes_per_gpu

MIB = 1024**2
RESERVE_BASE_BYTES = 151.4 * MIB  # non-torch memory, workspaces
ACTIVATION_BYTES_PER_HIDDEN_TOKEN = 23.07  # a: profile-run activation peak per (D · token)
SAMPLER_BYTES_PER_VOCAB_SEQ = 38.03  # s: logits/probs/logprobs buffers per (V · sequence)
DEFAULT_BLOCK_SIZE = 16
DEFAULT_UTILIZATION = 0.9
UTILIZATION_BOUNDS = (0.05, 0.95)


LONG_CONTEXT_TOKENS = 32768


def default_max_num_batched_tokens(max_model_len: int | None, chunked_prefill: bool = False) -> int:
    """vLLM's default token budget: 512 with chunked prefill (V0, as in the data); past 32K
    context vLLM turns chunked prefill on itself (8192, V1's online default on large GPUs);
    else max(max_model_len, 2048)."""
    if chunked_prefill:
        return 512
    if max_model_len and max_model_len > LONG_CONTEXT_TOKENS:
        return 8192
    return max(int(max_model_len or 2048), 2048)


def vllm_default_limits(gpu: GPU, enable_chunked_prefill: bool, max_model_len: int) -> tuple[int, int]:
    """vLLM's (max_num_seqs, max_num_batched_tokens) defaults for the OpenAI server: V1 picks
    (1024, 8192) on GPUs with ≥ 70 GiB (not A100), else (256, 2048); without chunked prefill
    the budget must hold a whole prompt: max(max_model_len, 2048)."""
    big = gpu.memory_gib >= 70 and "a100" not in gpu.key
    seqs, tokens = (1024, 8192) if big else (256, 2048)
    if not enable_chunked_prefill:
        tokens = max(max_model_len, 2048)
    return seqs, tokens


def block_round_tokens(tokens, block_size: int = DEFAULT_BLOCK_SIZE):
    """Round token counts up to whole vLLM blocks (vectorised)."""
    if block_size <= 0:
        raise InputError("block_size", f"expected a positive integer, got {block_size!r}")
    t = np.asarray(tokens, dtype=float)
    out = np.ceil(t / block_size) * block_size
    return out.astype(np.int64) if out.ndim else int(out)


def kv_tokens_for_cap(max_num_seqs, mean_len_tok, std_len_tok=0.0, z: float = 1.645,
                      max_model_len: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE):
    """KV tokens a batch of ``max_num_seqs`` needs, with a tail margin.

    Sum of B context lengths ≈ B·μ + z·√B·σ (normal approximation of the sum; DESIGN §5.3),
    plus half a block per sequence for per-sequence block rounding, capped at B·max_model_len,
    rounded up to whole blocks.
    """
    b = np.asarray(max_num_seqs, dtype=float)
    mu = np.asarray(mean_len_tok, dtype=float)
    sigma = np.asarray(std_len_tok, dtype=float)
    if np.any(b < 0) or np.any(mu < 0) or np.any(sigma < 0):
        raise InputError("kv_tokens_for_cap", "max_num_seqs, mean and std lengths must be non-negative")
    need = b * mu + z * np.sqrt(b) * sigma + b * block_size / 2.0
    if max_model_len:
        need = np.minimum(need, b * (max_model_len + block_size))
    return block_round_tokens(need, block_size)


def reserve_bytes(arch: ModelArch, max_num_seqs, max_num_batched_tokens):
    """Modelled non-weight, non-KV memory (module docstring)."""
    s = np.asarray(max_num_seqs, dtype=float)
    t = np.asarray(max_num_batched_tokens, dtype=float)
    act = ACTIVATION_BYTES_PER_HIDDEN_TOKEN * arch.hidden * t
    sampler = SAMPLER_BYTES_PER_VOCAB_SEQ * arch.vocab * s
    return RESERVE_BASE_BYTES + np.maximum(act, sampler)


def non_kv_bytes(arch: ModelArch, gpu: GPU, max_num_seqs, max_num_batched_tokens=None, tensor_parallel_size: int = 1):
    """One GPU's weights (its TP shard) + modelled reserve."""
    t = max_num_batched_tokens if max_num_batched_tokens is not None else default_max_num_batched_tokens(arch.max_position)
    return weight_bytes_per_gpu(arch, check_tensor_parallel_size(arch, tensor_parallel_size)) + reserve_bytes(arch, max_num_seqs, t)


@dataclass(frozen=True)
class MemorySplit:
    """How vLLM divides one GPU's memory (bytes); under TP, one rank's."""

    total_bytes: float
    gpu_memory_utilization: float
    weights_bytes: float
    reserve_bytes: float
    non_kv_bytes: float
    kv_bytes: float
    kv_capacity_tokens: int
    num_gpu_blocks: int
    block_size: int
    measured: bool  # non_kv came from a live pod's cache_config_info
    tensor_parallel_size: int = 1
    kv_bytes_per_token: int = 0  # one rank's

    @property
    def reserved_bytes(self) -> float:
        """Everything vLLM takes: total × utilisation."""
        return self.total_bytes * self.gpu_memory_utilization

    def as_dict(self) -> dict:
        return {
            "total_bytes": self.total_bytes, "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_bytes": self.weights_bytes, "reserve_bytes": self.reserve_bytes,
            "non_kv_bytes": self.non_kv_bytes, "kv_bytes": self.kv_bytes,
            "kv_gib": self.kv_bytes / GIB, "kv_capacity_tokens": self.kv_capacity_tokens,
            "num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
            "reserved_gib": self.reserved_bytes / GIB, "non_kv_measured": self.measured,
            "tensor_parallel_size": self.tensor_parallel_size, "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
        }


def _check_util(u: float, field: str = "gpu_memory_utilization") -> float:
    if not (isinstance(u, (int, float)) and 0.0 < u <= 1.0):
        raise InputError(field, f"expected a fraction in (0, 1], got {u!r}")
    return float(u)


def _check_positive_int(v, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise InputError(field, f"expected a positive integer, got {v!r}")
    return int(v)


def memory_split(arch: ModelArch, gpu: GPU, gpu_memory_utilization: float, max_num_seqs: int,
                 max_num_batched_tokens: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                 measured_non_kv_bytes: float | None = None, tensor_parallel_size: int = 1) -> MemorySplit:
    """KV capacity for a utilisation: blocks = floor((total·u − non_kv) / (block·bytes/token)),
    all per GPU: under TP the rank's weight shard and KV bytes per token (module docstring)."""
    u = _check_util(gpu_memory_utilization)
    s = _check_positive_int(max_num_seqs, "max_num_seqs")
    block_size = _check_positive_int(block_size, "block_size")
    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    t = max_num_batched_tokens or default_max_num_batched_tokens(arch.max_position)
    weights = weight_bytes_per_gpu(arch, tp)
    kv_tok = kv_bytes_per_token_per_gpu(arch, tp)
    reserve = float(reserve_bytes(arch, s, t))
    non_kv = float(measured_non_kv_bytes) if measured_non_kv_bytes is not None else weights + reserve
    kv_bytes = gpu.memory_bytes * u - non_kv
    if kv_bytes <= 0:
        hint = "" if tp > 1 else "; a larger tensor parallel size (--tensor-parallel-size) splits the weights"
        raise InputError("gpu_memory_utilization",
                         f"{u} leaves no KV cache: {gpu.memory_bytes * u / GIB:.2f} GiB reserved but "
                         f"{non_kv / GIB:.2f} GiB needed for weights and buffers of {arch.key} on {gpu.key} "
                         f"at tensor parallel {tp}{hint}")
    blocks = int(kv_bytes // (block_size * kv_tok))
    return MemorySplit(gpu.memory_bytes, u, weights,
                       non_kv - weights if measured_non_kv_bytes is not None else reserve,
                       non_kv, blocks * block_size * kv_tok, blocks * block_size, blocks,
                       block_size, measured_non_kv_bytes is not None, tp, kv_tok)


def utilization_for_kv_tokens(arch: ModelArch, gpu: GPU, kv_tokens: int, max_num_seqs: int,
                              max_num_batched_tokens: int | None = None,
                              block_size: int = DEFAULT_BLOCK_SIZE,
                              measured_non_kv_bytes: float | None = None,
                              bounds: tuple[float, float] = UTILIZATION_BOUNDS,
                              tensor_parallel_size: int = 1) -> MemorySplit:
    """The inverse: the smallest ``gpu_memory_utilization`` (rounded up to 0.001) whose KV cache
    holds ``kv_tokens``, clamped to ``bounds``. Raises if even the upper bound cannot hold it."""
    kv_tokens = _check_positive_int(kv_tokens, "kv_tokens")
    s = _check_positive_int(max_num_seqs, "max_num_seqs")
    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    t = max_num_batched_tokens or default_max_num_batched_tokens(arch.max_position)
    non_kv = (float(measured_non_kv_bytes) if measured_non_kv_bytes is not None
              else weight_bytes_per_gpu(arch, tp) + float(reserve_bytes(arch, s, t)))
    need_bytes = block_round_tokens(kv_tokens, block_size) * kv_bytes_per_token_per_gpu(arch, tp)
    u = np.ceil((need_bytes + non_kv) / gpu.memory_bytes * 1000.0) / 1000.0
    lo, hi = bounds
    if u > hi:
        raise InputError("kv_tokens", f"{kv_tokens} KV tokens of {arch.key} need gpu_memory_utilization "
                                      f"{u:.3f} on {gpu.key}, above the bound {hi}")
    return memory_split(arch, gpu, float(min(max(u, lo), hi)), s, t, block_size, measured_non_kv_bytes, tp)


def kv_cache_memory_bytes_for_tokens(arch: ModelArch, kv_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE,
                                     tensor_parallel_size: int = 1) -> int:
    """``--kv-cache-memory-bytes`` (vLLM ≥ 0.10.2, per GPU) that holds ``kv_tokens``: whole blocks."""
    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    return int(block_round_tokens(_check_positive_int(kv_tokens, "kv_tokens"), block_size)) * kv_bytes_per_token_per_gpu(arch, tp)


def non_kv_from_cache_config(arch: ModelArch, gpu: GPU, gpu_memory_utilization: float,
                             num_gpu_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                             tensor_parallel_size: int = 1) -> float:
    """Re-measure non_kv from a live pod's ``vllm:cache_config_info`` labels (DESIGN §5.3), per GPU."""
    u = _check_util(gpu_memory_utilization)
    blocks = _check_positive_int(num_gpu_blocks, "num_gpu_blocks")
    block_size = _check_positive_int(block_size, "block_size")
    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    return gpu.memory_bytes * u - blocks * block_size * kv_bytes_per_token_per_gpu(arch, tp)


def released_bytes(default: MemorySplit | float, new: MemorySplit | float) -> float:
    """Memory released = default reservation − new reservation (DESIGN §5.3)."""
    d = default.reserved_bytes if isinstance(default, MemorySplit) else float(default)
    n = new.reserved_bytes if isinstance(new, MemorySplit) else float(new)
    return d - n
