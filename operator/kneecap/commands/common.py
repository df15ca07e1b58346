"""The flags several commands share, defined once so they are spelled, typed and defaulted alike.

Exit codes of every command (README, Commands): 0 done; 1 ran but the answer is a failure
(an infeasible rate, every scrape failed); 2 bad input (a flag, a file, a spec); 130 interrupted.
Under ``--json`` stdout carries only JSON: one object (most commands) or one object per line
(``observe``, ``run``, ``twin``: events as they happen); a bad input is reported once, as one
object ``{"error", "field", "exitCode"}`` on stderr (stdout stays empty).
"""

from __future__ import annotations

import argparse
import math
import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

QUANTILE_DEFAULT = 0.95
_SUFFIX = {"k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30, "t": 10**12, "T": 2**40}


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``4096``, ``1k`` (10³), ``1K`` (2¹⁰), ``8G`` (2³⁰)."""
    s = str(text).strip()
    try:
        if s and s[-1] in _SUFFIX:
            return int(float(s[:-1]) * _SUFFIX[s[-1]])
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer like 4096, 32k or 8G, got {text!r}") from None


def quantile(text: str) -> float:
    """An SLO quantile in (0, 1); 50/95/99 are read as percentiles."""
    try:
        q = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a quantile in (0, 1), got {text!r}") from None
    if q in (50, 90, 95, 99):
        q /= 100
    if not (math.isfinite(q) and 0 < q < 1):
        raise argparse.ArgumentTypeError(f"expected a quantile in (0, 1), got {text!r}")
    return q


def add_json(parser: argparse.ArgumentParser, what: str = "print one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def add_quantile(parser, default: float = QUANTILE_DEFAULT) -> None:
    parser.add_argument("--quantile", type=quantile, default=default, metavar="Q",
                        help=f"SLO quantile, any in (0, 1) (default {default:g})")


class _DeprecatedAlias(argparse.Action):
    """A former spelling: stores into the new flag's dest and says so on stderr."""

    def __init__(self, option_strings, dest, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kneecap: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_slo(parser, *, ttft: float | None = None, tpot: float | None = None, with_ttft: bool = True,
            old_tpot: tuple[str, ...] = ()) -> None:
    """--slo-ttft-s and --slo-tpot-s (time per output token: vLLM's inter-token latency); `old_tpot`
    are former spellings kept as hidden, warning aliases."""
    if with_ttft:
        parser.add_argument("--slo-ttft-s", type=float, default=ttft, metavar="S",
                            help="time-to-first-token SLO, seconds" + (f" (default {ttft:g})" if ttft else ""))
    parser.add_argument("--slo-tpot-s", type=float, default=tpot, metavar="S",
                        help="time-per-output-token SLO, seconds" + (f" (default {tpot:g})" if tpot else ""))
    for old in old_tpot:
        parser.add_argument(old, dest="slo_tpot_s", type=float, action=_DeprecatedAlias, new="--slo-tpot-s")


def add_engine_limits(group) -> None:
    """vLLM's own limits under vLLM's names, each defaulting to what vLLM does (GAUSS models
    them: ``kneecap.model.gauss.EngineLimits``)."""
    group.add_argument("--max-num-seqs", type=int, help="vLLM's batch cap (default: vLLM's, 1024 on ≥ 70 GiB GPUs "
                                                          "but A100, else 256)")
    group.add_argument("--max-num-active-seqs", type=int, help="vLLM ≥ 0.31's admission cap on the running set "
                                                                 "(default: none; the smaller cap binds)")
    group.add_argument("--max-num-batched-tokens", type=human_int,
                       help="token budget per step (default: vLLM's, 8192 on ≥ 70 GiB GPUs but A100, else 2048)")
    memory = group.add_mutually_exclusive_group()
    memory.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="fraction of GPU memory vLLM takes; the KV cache is what weights and buffers leave "
                             "(needs --model and --gpu)")
    memory.add_argument("--kv-cache-memory-bytes", type=human_int, help="KV cache size (e.g. 20G; needs --model)")
    group.add_argument("--num-gpu-blocks-override", type=int, help="KV cache in blocks (overrides the memory flags)")
    group.add_argument("--block-size", type=int, default=16)
    group.add_argument("--max-model-len", type=human_int,
                       help="longest request, prompt + output, vLLM serves (default: the model's context); vLLM "
                            "refuses to start when its KV cache cannot hold one such request")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="cached prefix tokens (--cached-tokens) cost no prefill (vLLM V1's default: on)")


def engine_limits(args, arch=None, gpu=None, tensor_parallel_size: int = 1):
    """(GAUSS EngineLimits, token budget) from the flags of :func:`add_engine_limits`. With a
    catalog model and GPU, vLLM's defaults for the GPU and its memory split; without, vLLM's
    defaults off large GPUs (256 sequences, 2048 tokens) and a KV cache only from
    --num-gpu-blocks-override."""
    from kneecap.errors import InputError
    from kneecap.model import gauss

    for name in ("max_num_seqs", "max_num_active_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes",
                 "num_gpu_blocks_override", "block_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise InputError(name, f"expected a positive integer, got {v}")
    u = args.gpu_memory_utilization
    if not (math.isfinite(u) and 0 < u <= 1):
        raise InputError("gpu_memory_utilization", f"expected a fraction in (0, 1], got {u}")
    check_max_model_len(args.max_model_len, arch)
    if arch is not None and gpu is not None:
        limits, budget = gauss.engine_limits_for(
            arch, gpu, max_num_seqs=args.max_num_seqs, max_num_active_seqs=args.max_num_active_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, gpu_memory_utilization=u,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes, num_gpu_blocks_override=args.num_gpu_blocks_override,
            block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
            tensor_parallel_size=tensor_parallel_size)
        _check_starts(args.max_model_len, limits.kv_capacity_tokens)
        return limits, budget
    if args.kv_cache_memory_bytes is not None:
        raise InputError("kv_cache_memory_bytes", "--kv-cache-memory-bytes needs --model and --gpu (KV bytes per "
                                                  "token); or give --num-gpu-blocks-override")
    blocks = args.num_gpu_blocks_override
    limits = gauss.EngineLimits(args.max_num_seqs or gauss.DEFAULT_MAX_NUM_SEQS, args.max_num_active_seqs,
                                None if blocks is None else blocks * args.block_size, args.block_size,
                                args.enable_prefix_caching)
    _check_starts(args.max_model_len, limits.kv_capacity_tokens)
    return limits, args.max_num_batched_tokens or gauss.DEFAULT_MAX_NUM_BATCHED_TOKENS


def check_max_model_len(max_model_len: int | None, arch=None, field: str = "max_model_len") -> None:
    """--max-model-len (None: the model's context) is a positive count within ``arch``'s context."""
    from kneecap.errors import InputError

    if max_model_len is None:
        return
    if arch is None and max_model_len < 1:
        raise InputError(field, f"expected a positive integer, got {max_model_len}")
    if arch is not None and not 0 < max_model_len <= arch.max_position:
        raise InputError(field, f"expected 1 to {arch.max_position} (the context of {arch.key}), got {max_model_len}")


def _check_starts(max_model_len: int | None, kv_tokens: int | None) -> None:
    """vLLM V1's start-up check (``check_enough_kv_cache_memory``): the KV cache must hold one
    request of ``max_model_len`` tokens, or the engine refuses to start."""
    from kneecap.errors import InputError

    if max_model_len is not None and kv_tokens is not None and kv_tokens < max_model_len:
        raise InputError("max_model_len", f"vLLM would not start: its KV cache holds {kv_tokens} tokens, fewer than "
                                          f"one request of max_model_len {max_model_len}; lower --max-model-len to at "
                                          f"most {kv_tokens} or give the cache more memory (--gpu-memory-utilization, "
                                          "--kv-cache-memory-bytes)")


def startup_note(args, arch, limits) -> str | None:
    """Where --max-model-len is not given, vLLM serves the model's context: a note when the KV
    cache cannot hold one request of it (vLLM would refuse to start; the numbers are for a
    --max-model-len the cache holds)."""
    if args.max_model_len is not None or arch is None or limits.kv_capacity_tokens is None \
            or limits.kv_capacity_tokens >= arch.max_position:
        return None
    return (f"vLLM at its default max_model_len ({arch.max_position}, the context of {arch.key}) would not start: "
            f"the KV cache holds {limits.kv_capacity_tokens} tokens; these numbers are for --max-model-len "
            f"{limits.kv_capacity_tokens} or less")


def add_tensor_parallel(parser, default: int | None = 1, default_text: str = "", short: bool = False) -> None:
    """--tensor-parallel-size (vLLM's name; ``short``: also vLLM's -tp) and --enable-expert-parallel
    (kneecap.model.parallel)."""
    parser.add_argument("--tensor-parallel-size", *(("-tp",) if short else ()), type=int, default=default, metavar="TP",
                        help="GPUs per replica the model is split across (Megatron-style, as vLLM does): each holds "
                             "1/TP of the weights and of the KV heads, and each layer pays two all-reduces"
                             + default_text)
    parser.add_argument("--enable-expert-parallel", action="store_true",
                        help="MoE only: partition whole experts across the TP ranks (vLLM's flag); memory and "
                             "expected bytes per step as with TP-split experts")


def tensor_parallel(args, arch) -> int:
    """The validated --tensor-parallel-size for ``arch`` (errors name the flag)."""
    from kneecap.model.parallel import FLAG, check_tensor_parallel_size

    tp = 1 if args.tensor_parallel_size is None else args.tensor_parallel_size
    return check_tensor_parallel_size(arch, tp, FLAG,
                                      expert_parallel=getattr(args, "enable_expert_parallel", False))


def limits_json(limits, budget_tokens: int) -> dict:
    """The engine limits a GAUSS run used, under vLLM's names."""
    return {"max_num_seqs": limits.max_num_seqs, "max_num_active_seqs": limits.max_num_active_seqs,
            "max_num_batched_tokens": budget_tokens, "kv_capacity_tokens": limits.kv_capacity_tokens,
            "block_size": limits.block_size, "enable_prefix_caching": limits.enable_prefix_caching}
