"""Windows made from the real vLLM captures (tests/fixtures/vllm-metrics/): their names, the
two scrape times of a window, a copy with the vLLM samples zeroed (the same server freshly
started) and a body cut short inside a line."""

from __future__ import annotations

import re

CAPTURES = ("vllm-0.32-cpu-20req.txt", "vllm-0.32-cpu-kv-saturated.txt", "vllm-0.32-cpu-run4.txt")
T0, T1 = 1000.0, 1010.0


def zeroed(text: str) -> str:
    """The same exposition with every vLLM sample at 0 (cache config and *_created kept)."""
    out = []
    for line in text.split("\n"):
        name = line.split("{")[0].split(" ")[0]
        if line.startswith("vllm:") and name != "vllm:cache_config_info" and not name.endswith("_created"):
            line = re.sub(r" \S+$", " 0.0", line)
        out.append(line)
    return "\n".join(out)


def cut_inside(text: str, marker: str, extra_chars: int = 20) -> str:
    """The body up to ``extra_chars`` past the start of ``marker``: a scrape cut short there."""
    i = text.index(marker)
    return text[: i + extra_chars]
