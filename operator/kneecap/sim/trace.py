"""Request traces for replays: arrival times and token counts, read from a CSV.

Two layouts, told apart by the header:

* the Azure LLM inference trace format (``TIMESTAMP, ContextTokens, GeneratedTokens``), where
  TIMESTAMP is an ISO-like date-time (any number of fractional digits);
* ``arrival_s, input_tokens, output_tokens``: seconds (any origin) and token counts.

Rows may come in any order; arrivals are sorted and shifted so the first request is at 0 s.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
from dataclasses import dataclass
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

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1]) if self.arrival_s.size else 0.0


def _timestamp_s(text: str) -> float:
    """Seconds since the epoch of an ISO-like timestamp; fractions beyond microseconds are kept."""
    text = text.strip()
    frac = 0.0
    head = text
    if "." in text:
        head, tail = text.rsplit(".", 1)
        digits = tail.rstrip("Z")
        if not digits.isdigit():
            raise ValueError(text)
        frac = int(digits) / 10 ** len(digits)
    t = _dt.datetime.fromisoformat(head.replace("Z", ""))
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.timestamp() + frac


def _count(text: str, where: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise InputError(where, f"expected a non-negative integer token count, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise InputError(where, f"expected a non-negative integer token count, got {text!r}")
    return int(v)


def read_trace(path: str | Path) -> Trace:
    """Read a trace CSV (module docstring). Raises InputError naming the line and column."""
    path = Path(path)
    try:
        f = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InputError("trace", f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError("trace", f"{path} is empty; expected a header {', '.join(PLAIN_COLUMNS)} "
                                      f"or {', '.join(AZURE_COLUMNS)}") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}:1", f"not a CSV header: {exc}") from None
        if all(c in header for c in AZURE_COLUMNS):
            cols, azure = AZURE_COLUMNS, True
        elif all(c in header for c in PLAIN_COLUMNS):
            cols, azure = PLAIN_COLUMNS, False
        else:
            raise InputError(f"{path}:1", f"header {header} has neither the columns {', '.join(PLAIN_COLUMNS)} "
                                          f"nor {', '.join(AZURE_COLUMNS)}")
        idx = [header.index(c) for c in cols]
        t, inp, out = [], [], []
        line = 1
        try:
            for line, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) < len(header):
                    raise InputError(f"{path}:{line}", f"expected {len(header)} columns, got {len(row)}")
                cell = [row[i] for i in idx]
                where = lambda k: f"{path}:{line} column {cols[k]}"  # noqa: E731
                if azure:
                    try:
                        t.append(_timestamp_s(cell[0]))
                    except ValueError:
                        raise InputError(where(0), f"expected a date-time like 2023-11-16 18:15:46.68, "
                                                   f"got {cell[0]!r}") from None
                else:
                    try:
                        v = float(cell[0])
                    except ValueError:
                        v = math.nan
                    if not math.isfinite(v):
                        raise InputError(where(0), f"expected a finite number of seconds, got {cell[0]!r}")
                    t.append(v)
                inp.append(_count(cell[1], where(1)))
                out.append(_count(cell[2], where(2)))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}:{line + 1}", f"not valid CSV: {exc}") from None
    if not t:
        raise InputError("trace", f"{path} has a header but no requests")
    arrival = np.asarray(t, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order[0]]
    return Trace(arrival, np.asarray(inp, dtype=np.int64)[order], np.asarray(out, dtype=np.int64)[order],
                 str(path))


def compress(trace: Trace, factor: float) -> Trace:
    """The same requests with arrival times divided by ``factor`` (a factor-times higher rate)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
        raise InputError("compress", f"expected a positive number, got {factor!r}")
    return Trace(trace.arrival_s / float(factor), trace.input_tokens, trace.output_tokens, trace.source)
