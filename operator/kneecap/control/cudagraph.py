"""vLLM's CUDA-graph capture sizes, and caps rounded down to one of them. Pure.

vLLM captures decode CUDA graphs for batch sizes 1, 2, 4, then every 8 up to 248 and every 16
from 256 up to ``min(2 · max_num_seqs, 512)`` (vLLM 0.32, ``VllmConfig._set_cudagraph_sizes``;
1024 on data-centre Blackwell). A batch runs the smallest captured graph at least its size, so
a ``--max-num-seqs`` that is not a capture size pads its full batches into the next graph, and
per vllm-project/vllm#57355 drops to piecewise graphs: the cap is rounded DOWN to a capture size.
``--enforce-eager`` captures nothing, and then any cap is as good as another.
"""

from __future__ import annotations

import bisect

from kneecap.control import vllm_args

DEFAULT_MAX_CAPTURE = 512  # vLLM's default ceiling (1024 on data-centre Blackwell, compute capability 10.x)
ENFORCE_EAGER = "--enforce-eager"


def capture_sizes(max_capture: int = DEFAULT_MAX_CAPTURE) -> tuple[int, ...]:
    """vLLM's default capture sizes up to ``max_capture``: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_capture + 1, 16))
    return tuple(s for s in sizes if s <= max_capture)


def eager(container: dict) -> bool:
    """True when the container runs vLLM without CUDA graphs: its argv (any shape) sets
    ``--enforce-eager`` (a switch; the last of it and ``--no-enforce-eager`` wins)."""
    on = False
    for tok in vllm_args.read_argv(container).argv:
        if not tok.startswith("--"):
            continue
        name, _, value = tok.partition("=")
        flag = vllm_args.canonical_flag(name)
        if flag == ENFORCE_EAGER:
            on = value.lower() not in ("false", "0", "no") if value else True
        elif flag == "--no-enforce-eager":
            on = False
    return on


def round_cap(cap: int, lo: int = 1, hi: int | None = None, max_capture: int = DEFAULT_MAX_CAPTURE) -> int:
    """``cap`` rounded down to a capture size within [lo, hi]; the smallest capture size ≥ lo when
    rounding down leaves the bounds, ``cap`` itself when none lies within them or the cap is past
    the largest capture size (such batches run without graphs whatever the cap)."""
    sizes = capture_sizes(max_capture)
    if cap > sizes[-1]:
        return cap
    fits = [s for s in sizes if lo <= s <= (cap if hi is None else min(cap, hi))]
    if fits:
        return fits[-1]
    i = bisect.bisect_left(sizes, lo)
    if i < len(sizes) and (hi is None or sizes[i] <= hi):
        return sizes[i]
    return cap
