"""Status field names: Python snake_case with unit suffixes → Kubernetes API-convention camelCase.

The API conventions ask for camelCase, no abbreviations and durations as ``…Seconds``; our
Python names carry units as short suffixes (``_s``, ``_tok_s``, ``_rps``, ``_gib``). One rule
maps them, so status keys stay consistent wherever they are written:
``ttft_p95_s`` → ``ttftP95Seconds``, ``prompt_tok_s`` → ``promptTokensPerSecond``,
``input_len_cv`` → ``inputLengthCV``, ``kv_gib`` → ``kvGiB``.
"""

from __future__ import annotations

from functools import lru_cache

_SUFFIXES = (  # longest first
    (("tok", "s"), "TokensPerSecond"),
    (("rps",), "RequestsPerSecond"),
    (("s",), "Seconds"),
)
_WORDS = {"len": "length", "pred": "predicted", "gib": "GiB", "cv": "CV"}
_WHOLE = {"request_rate_rps": "requestsPerSecond", "t_end_s": "windowEndUnixSeconds"}


@lru_cache(maxsize=1024)  # a few dozen names, converted on every status write
def status_key(name: str) -> str:
    """camelCase status key for a snake_case field name (module docstring)."""
    if name in _WHOLE:
        return _WHOLE[name]
    parts = name.split("_")
    tail = ""
    for suffix, word in _SUFFIXES:
        if len(parts) > len(suffix) and tuple(parts[-len(suffix):]) == suffix:
            parts, tail = parts[:-len(suffix)], word
            break
    words = [_WORDS.get(p, p) for p in parts]
    head = words[0] if words[0] != "GiB" else "gib"
    return head + "".join(w if w[:1].isupper() else w[:1].upper() + w[1:] for w in words[1:]) + tail
