"""Request traces for replays: arrival times and token counts, read from a file.

The public production traces' own layouts, told apart by the header (CSV) or the first line (JSON
Lines), each read as published:

* Azure LLM inference traces, 2023 and 2024 (``TIMESTAMP, ContextTokens, GeneratedTokens``):
  TIMESTAMP an ISO-like date-time, any number of fractional digits, with or without a UTC offset
  (2023: ``2023-11-16 18:17:03.9799600``; 2024: ``2024-05-10 00:00:00.009930+00:00``);
* BurstGPT (``Timestamp, Request tokens, Response tokens`` among its columns): seconds;
* Mooncake (JSON Lines of ``{"timestamp", "input_length", "output_length", ...}``): milliseconds;
* ``arrival_s, input_tokens, output_tokens``: seconds (any origin) and token counts.

Rows may come in any order; arrivals are sorted and shifted so the first request is at 0 s. A
row of 0 tokens (BurstGPT logs failed requests so) is kept: the replay sends it as the least
request a server accepts, one token each way.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kneecap.errors import InputError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
PLAIN_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
LAYOUTS = (AZURE_COLUMNS, BURSTGPT_COLUMNS, PLAIN_COLUMNS)
_ISO = re.compile(r"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?)(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?")


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
    """Seconds since the epoch of an ISO-like timestamp (naive ones read as UTC); fractions beyond
    microseconds are kept."""
    m = _ISO.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    head, digits, zone = m.groups()
    t = _dt.datetime.fromisoformat(head.replace("T", " "))
    offset = _dt.timezone.utc
    if zone not in (None, "Z"):
        sign = -1 if zone[0] == "-" else 1
        hours, minutes = int(zone[1:3]), int(zone[-2:])
        offset = _dt.timezone(sign * _dt.timedelta(hours=hours, minutes=minutes))
    frac = int(digits) / 10 ** len(digits) if digits else 0.0
    return t.replace(tzinfo=offset).timestamp() + frac


def _count(text: str, where: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise InputError(where, f"expected a non-negative integer token count, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise InputError(where, f"expected a non-negative integer token count, got {text!r}")
    return int(v)


def _seconds(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


def read_trace(path: str | Path) -> Trace:
    """Read a trace (module docstring). Raises InputError naming the line and column."""
    path = Path(path)
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise InputError("trace", f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        try:
            first = f.readline()
            f.seek(0)
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}:1", f"not UTF-8 text: {exc}") from None
        t, inp, out = _read_json_lines(f, path) if first.lstrip().startswith("{") else _read_csv(f, path)
    if not t:
        raise InputError("trace", f"{path} has a header but no requests")
    arrival = np.asarray(t, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order[0]]
    return Trace(arrival, np.asarray(inp, dtype=np.int64)[order], np.asarray(out, dtype=np.int64)[order],
                 str(path))


def _layouts_text() -> str:
    return "; ".join(", ".join(c) for c in LAYOUTS) + f"; or JSON lines with {', '.join(MOONCAKE_KEYS)}"


def _read_csv(f, path: Path) -> tuple[list, list, list]:
    reader = csv.reader(f)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError("trace", f"{path} is empty; expected a header: {_layouts_text()}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InputError(f"{path}:1", f"not a CSV header: {exc}") from None
    cols = next((c for c in LAYOUTS if all(name in header for name in c)), None)
    if cols is None:
        raise InputError(f"{path}:1", f"header {header} has none of the layouts: {_layouts_text()}")
    clock = _timestamp_s if cols is AZURE_COLUMNS else _seconds
    expected = ("a date-time like 2023-11-16 18:15:46.68 or 2024-05-10 00:00:00.009930+00:00"
                if cols is AZURE_COLUMNS else "a finite number of seconds")
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
            try:
                t.append(clock(cell[0]))
            except ValueError:
                raise InputError(where(0), f"expected {expected}, got {cell[0]!r}") from None
            inp.append(_count(cell[1], where(1)))
            out.append(_count(cell[2], where(2)))
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InputError(f"{path}:{line + 1}", f"not valid CSV: {exc}") from None
    return t, inp, out


def _read_json_lines(f, path: Path) -> tuple[list, list, list]:
    """Mooncake's layout: one JSON object a line, ``timestamp`` in milliseconds."""
    t, inp, out = [], [], []
    line = 0
    try:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{line}", f"not a JSON object: {exc.msg}") from None
            missing = [k for k in MOONCAKE_KEYS if not isinstance(row, dict) or k not in row]
            if missing:
                raise InputError(f"{path}:{line}", f"expected the keys {', '.join(MOONCAKE_KEYS)}; "
                                                   f"missing {', '.join(missing)}")
            ms = row["timestamp"]
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
                raise InputError(f"{path}:{line} key timestamp", f"expected a finite number of milliseconds, "
                                                                 f"got {ms!r}")
            t.append(ms / 1000.0)
            inp.append(_count(str(row["input_length"]), f"{path}:{line} key input_length"))
            out.append(_count(str(row["output_length"]), f"{path}:{line} key output_length"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}:{line + 1}", f"not UTF-8 text: {exc}") from None
    if not t:
        raise InputError("trace", f"{path} has no requests")
    return t, inp, out


def compress(trace: Trace, factor: float) -> Trace:
    """The same requests with arrival times divided by ``factor`` (a factor-times higher rate)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
        raise InputError("compress", f"expected a positive number, got {factor!r}")
    return Trace(trace.arrival_s / float(factor), trace.input_tokens, trace.output_tokens, trace.source)


def cut(trace: Trace, start_s: float = 0.0, seconds: float | None = None) -> Trace:
    """The requests that arrived in ``[start_s, start_s + seconds)`` of the trace as recorded (all
    after ``start_s`` when ``seconds`` is None), shifted so the first is at 0 s: a day of a
    week-long trace, or its busiest hour."""
    def seconds_ok(v) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    if not (seconds_ok(start_s) and start_s >= 0):
        raise InputError("trace-start", f"expected a non-negative number of seconds, got {start_s!r}")
    if seconds is not None and not (seconds_ok(seconds) and seconds > 0):
        raise InputError("trace-seconds", f"expected a positive number of seconds, got {seconds!r}")
    end = math.inf if seconds is None else start_s + seconds
    keep = (trace.arrival_s >= start_s) & (trace.arrival_s < end)
    if not keep.any():
        raise InputError("trace-start", f"no request of {trace.source} arrived in [{start_s:g}, {end:g}) s "
                                        f"(it spans 0 to {trace.span_s:g} s)")
    arrival = trace.arrival_s[keep]
    span = "" if seconds is None else f" for {seconds:g} s"
    return Trace(arrival - arrival[0], trace.input_tokens[keep], trace.output_tokens[keep],
                 f"{trace.source} [from {start_s:g} s{span}]")
