"""vLLM's own limits on one engine (package docstring, "Engine limits"): batch cap, KV cache and
prefix caching as :class:`EngineLimits`, with vLLM's defaults and how it resolves its flags."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.errors import _count


# vLLM's defaults outside ≥ 70 GiB GPUs (memory.vllm_default_limits): batch cap and token budget
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(frozen=True)
class EngineLimits:
    """vLLM's own limits on one engine (package docstring, "Engine limits"); the token budget
    max_num_batched_tokens is ``ServiceCoefficients.chunk_tokens``.

    ``max_num_active_seqs`` (vLLM ≥ 0.31) caps the running set too: the binding cap is the
    smaller. ``kv_capacity_tokens`` = num_gpu_blocks × block_size (None: the cache never fills).
    ``enable_prefix_caching``: cached prefix tokens, whole blocks of them, cost no prefill."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_active_seqs: int | None = None
    kv_capacity_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True

    def __post_init__(self):
        for name in ("max_num_seqs", "block_size"):
            _count(name, getattr(self, name))
        for name in ("max_num_active_seqs", "kv_capacity_tokens"):
            _count(name, getattr(self, name), allow_none=True)
        if not isinstance(self.enable_prefix_caching, (bool, np.bool_)):
            raise InputError("enable_prefix_caching", f"expected true or false, got {self.enable_prefix_caching!r}")

    @property
    def slots(self) -> int:
        """Sequences the running set holds: min(max_num_seqs, max_num_active_seqs)."""
        return int(min(self.max_num_seqs, self.max_num_active_seqs or self.max_num_seqs))


DEFAULT_LIMITS = EngineLimits()


def engine_limits_for(arch, gpu, *, max_num_seqs: int | None = None, max_num_active_seqs: int | None = None,
                      max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                      kv_cache_memory_bytes: int | None = None, num_gpu_blocks_override: int | None = None,
                      block_size: int = 16, enable_prefix_caching: bool = True,
                      measured_non_kv_bytes: float | None = None,
                      tensor_parallel_size: int = 1) -> tuple[EngineLimits, int]:
    """(limits, token budget) of a vLLM engine serving ``arch`` on ``gpu`` as vLLM resolves its
    flags: unset caps take vLLM's defaults (``memory.vllm_default_limits``, chunked prefill on);
    KV blocks from ``num_gpu_blocks_override``, else ``kv_cache_memory_bytes`` // block bytes, else
    the memory split at ``gpu_memory_utilization`` (``memory.memory_split``, DESIGN §5.3). Under
    TP every byte figure is one rank's (``kv_cache_memory_bytes`` is per GPU, as in vLLM)."""
    from kneecap.model import memory
    from kneecap.model.parallel import check_tensor_parallel_size, kv_bytes_per_token_per_gpu

    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    kv_tok = kv_bytes_per_token_per_gpu(arch, tp)

    seqs, budget = memory.vllm_default_limits(gpu, True, arch.max_position or 2048)
    seqs = seqs if max_num_seqs is None else max_num_seqs
    budget = budget if max_num_batched_tokens is None else max_num_batched_tokens
    for name, v in (("max_num_seqs", seqs), ("max_num_batched_tokens", budget), ("block_size", block_size),
                    ("num_gpu_blocks_override", num_gpu_blocks_override),
                    ("kv_cache_memory_bytes", kv_cache_memory_bytes)):
        _count(name, v, allow_none=True)
    if num_gpu_blocks_override is not None:
        blocks = int(num_gpu_blocks_override)
    elif kv_cache_memory_bytes is not None:
        blocks = int(kv_cache_memory_bytes // (block_size * kv_tok))
        if blocks < 1:
            raise InputError("kv_cache_memory_bytes", f"{kv_cache_memory_bytes} bytes hold no {block_size}-token block "
                                                      f"of {arch.key} ({block_size * kv_tok} bytes)")
    else:
        blocks = memory.memory_split(arch, gpu, gpu_memory_utilization, int(seqs), int(budget), int(block_size),
                                     measured_non_kv_bytes=measured_non_kv_bytes, tensor_parallel_size=tp).num_gpu_blocks
    limits = EngineLimits(int(seqs), max_num_active_seqs, blocks * int(block_size), int(block_size),
                          enable_prefix_caching)
    return limits, int(budget)
