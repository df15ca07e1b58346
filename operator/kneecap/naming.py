"""Status field names: Python snake_case with unit suffixes → Kubernetes API-convention camelCase.

The API conventions ask for camelCase, no abbreviations, durations as ``…Seconds`` and
quantities in base units; our Python names carry units as short suffixes (``_s``, ``_tok_s``,
``_rps``, ``_pct``). One rule maps them, so status keys stay consistent wherever they are
written: ``ttft_p95_s`` → ``ttftP95Seconds``, ``prompt_tok_s`` → ``promptTokensPerSecond``,
``input_len_cv`` → ``inputLengthCoefficientOfVariation``, ``kv_bytes`` → ``kvBytes``.
The latency names (TTFT, ITL, TPOT, E2E, p95) are the terms spec.slo and vLLM's metrics use.
A ``_gib`` field is refused: status carries bytes (convert before it reaches status).
"""

from __future__ import annotations

from functools import lru_cache

_SUFFIXES = (  # longest first
    (("tok", "s"), "TokensPerSecond"),
    (("rps",), "RequestsPerSecond"),
    (("pct",), "Percent"),
    (("s",), "Seconds"),
)
_WORDS = {"len": "length", "pred": "predicted", "cv": "coefficientOfVariation"}
_WHOLE = {"request_rate_rps": "requestsPerSecond", "t_end_s": "windowEndUnixSeconds"}
_NOT_BASE_UNITS = frozenset({"gib", "gb", "mib", "kib"})


@lru_cache(maxsize=1024)  # a few dozen names, converted on every status write
def status_key(name: str) -> str:
    """camelCase status key for a snake_case field name (module docstring). Raises ValueError
    for a name in a unit other than the base unit (``kv_gib``)."""
    if name in _WHOLE:
        return _WHOLE[name]
    parts = name.split("_")
    if _NOT_BASE_UNITS.intersection(parts):
        raise ValueError(f"{name}: status quantities are in base units (bytes); convert it first")
    tail = ""
    for suffix, word in _SUFFIXES:
        if len(parts) > len(suffix) and tuple(parts[-len(suffix):]) == suffix:
            parts, tail = parts[:-len(suffix)], word
            break
    words = [_WORDS.get(p, p) for p in parts]
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:]) + tail
