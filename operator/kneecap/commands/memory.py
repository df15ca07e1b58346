"""`kneecap memory`: how vLLM splits a GPU's memory, and the inverse."""

from __future__ import annotations

import json

from kneecap.commands import common
from kneecap.errors import InputError
from kneecap.model.arch import GIB, get_arch
from kneecap.model.hardware import get_gpu
from kneecap.model.memory import (DEFAULT_BLOCK_SIZE, default_max_num_batched_tokens, memory_split,
                                  utilization_for_kv_tokens)

HELP = "KV capacity in tokens for a memory setting (or the setting for --kv-tokens)"


def add_arguments(p):
    p.add_argument("--model", required=True, help="model catalog key (e.g. llama-3.1-8b)")
    p.add_argument("--gpu", required=True, help="GPU catalog key (e.g. h100-80gb)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory vLLM takes")
    p.add_argument("--max-num-seqs", type=int, required=True)
    p.add_argument("--max-num-batched-tokens", type=common.human_int, default=None,
                   help="token budget per step (default: vLLM's for the served context, --max-model-len)")
    p.add_argument("--max-model-len", type=common.human_int, default=None,
                   help="context the engine serves (default: the model's); sets the default token budget")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--kv-tokens", type=int, default=None,
                   help="inverse: the utilisation whose KV cache holds this many tokens")
    common.add_tensor_parallel(p)
    common.add_json(p)


def run(args) -> int:
    arch, gpu = get_arch(args.model), get_gpu(args.gpu)
    tp = common.tensor_parallel(args, arch)
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens <= 0:
        raise InputError("--max-num-batched-tokens", f"expected a positive integer, got {args.max_num_batched_tokens}")
    common.check_max_model_len(args.max_model_len, arch, "--max-model-len")
    max_model_len = args.max_model_len or arch.max_position
    budget = args.max_num_batched_tokens or default_max_num_batched_tokens(max_model_len)
    if args.kv_tokens is not None:
        split = utilization_for_kv_tokens(arch, gpu, args.kv_tokens, args.max_num_seqs, budget, args.block_size,
                                          tensor_parallel_size=tp)
    else:
        split = memory_split(arch, gpu, args.gpu_memory_utilization, args.max_num_seqs, budget, args.block_size,
                             tensor_parallel_size=tp)
    out = {"model": arch.key, "gpu": gpu.key, "max_num_seqs": args.max_num_seqs, "max_model_len": max_model_len,
           "max_num_batched_tokens": budget, **split.as_dict()}
    if args.kv_tokens is not None:
        out["requested_kv_tokens"] = args.kv_tokens
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{arch.key} on {gpu.key} at gpu_memory_utilization={split.gpu_memory_utilization:.3f}, "
          f"max_num_seqs={args.max_num_seqs}, max_model_len={max_model_len}, max_num_batched_tokens={budget}"
          + (f", tensor_parallel_size={tp} (per GPU below)" if tp > 1 else ""))
    print(f"  total            {split.total_bytes / GIB:8.2f} GiB")
    print(f"  reserved by vLLM {split.reserved_bytes / GIB:8.2f} GiB")
    print(f"  weights          {split.weights_bytes / GIB:8.2f} GiB")
    print(f"  other (reserve)  {split.reserve_bytes / GIB:8.2f} GiB")
    print(f"  KV cache         {split.kv_bytes / GIB:8.2f} GiB = {split.kv_capacity_tokens} tokens "
          f"({split.num_gpu_blocks} blocks of {split.block_size})")
    return 0
