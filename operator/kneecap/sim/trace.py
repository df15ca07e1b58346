"""Request traces: arrival instants and token lengths read from a file, for replay.

Two formats, told apart by the header: the Azure LLM inference trace (``TIMESTAMP,
ContextTokens,GeneratedTokens``, timestamps like ``2023-11-16 18:15:46.6805900``) and a plain
CSV ``arrival_s,input_tokens,output_tokens`` (seconds from any origin). Arrivals are made
relative to the first request and sorted; bad input names the line and column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kneecap.errors import InputError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # seconds from the first request, ascending
    input_tokens: np.ndarray  # int
    output_tokens: np.ndarray  # int
    source: str


def _azure_time_s(text: str) -> float:
    day, _, clock = text.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    base = datetime.fromisoformat(f"{day} {whole}").replace(tzinfo=timezone.utc).timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)  # 7 fractional digits: more than isoformat takes


def _positive_int(text: str, where: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise InputError(where, f"expected a whole number of tokens, got {text!r}") from None
    if v < 1:
        raise InputError(where, f"expected at least 1 token, got {v}")
    return v


def read_trace(path: str | Path) -> Trace:
    """Read an Azure or plain CSV trace (module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("trace", f"cannot read {path}: {exc}") from None
    rows = csv.reader(text.splitlines())
    header = tuple(h.strip() for h in next(rows, ()))
    if header == AZURE_COLUMNS:
        to_s = _azure_time_s
    elif header == PLAIN_COLUMNS:
        to_s = float
    else:
        raise InputError(f"{path}:1", f"expected the header {','.join(AZURE_COLUMNS)} (Azure) or "
                                      f"{','.join(PLAIN_COLUMNS)}, got {','.join(header) or 'nothing'}")
    t, inp, out = [], [], []
    for line, row in enumerate(rows, start=2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != 3:
            raise InputError(f"{path}:{line}", f"expected 3 columns, got {len(row)}")
        try:
            ts = to_s(row[0])
        except ValueError:
            raise InputError(f"{path}:{line}:{header[0]}", f"expected a time, got {row[0]!r}") from None
        if not math.isfinite(ts):
            raise InputError(f"{path}:{line}:{header[0]}", f"expected a finite time, got {row[0]!r}")
        t.append(ts)
        inp.append(_positive_int(row[1], f"{path}:{line}:{header[1]}"))
        out.append(_positive_int(row[2], f"{path}:{line}:{header[2]}"))
    if not t:
        raise InputError(f"{path}", "the trace has no requests")
    arrival = np.asarray(t, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    return Trace(arrival - arrival[0], np.asarray(inp, dtype=int)[order], np.asarray(out, dtype=int)[order],
                 str(path))


def compress(trace: Trace, factor: float) -> Trace:
    """The same requests ``factor`` times closer together (arrival_s / factor)."""
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise InputError("compress", f"expected a positive factor, got {factor!r}")
    return Trace(trace.arrival_s / factor, trace.input_tokens, trace.output_tokens, trace.source)
