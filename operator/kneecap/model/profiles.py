"""Profile rows (CSV text or dicts) → arrays for fitting and prediction. Pure: no file I/O."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model.arch import get_arch

REQUIRED_FIT = ("model", "batch", "input_len", "output_len", "throughput_tok_s")
REQUIRED_PREDICT = ("model", "batch", "input_len", "output_len")
_TRUE = frozenset({"true", "1", "yes", "y", "t"})


@dataclass(frozen=True)
class ProfileArrays:
    """Per-row arrays. ``throughput_tok_s`` is None when not required (prediction points)."""

    models: tuple[str, ...]  # catalog keys
    batch: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    throughput_tok_s: np.ndarray | None
    output_cv: np.ndarray  # 0 where the row gives none
    rows: tuple[dict, ...]  # the rows kept, as read
    chunked_prefill: np.ndarray  # from a chunked_prefill column (False where absent)

    def __len__(self) -> int:
        return len(self.models)


def read_csv_text(text: str) -> list[dict]:
    """CSV text → list of row dicts (column → string)."""
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise InputError("csv", "empty file or no header row")
    return [dict(r) for r in reader]


def parse_where(items) -> dict[str, str]:
    """``COL=VALUE`` strings → dict (a column may repeat: any of its values matches)."""
    out: dict[str, list[str]] = {}
    for item in items or ():
        if "=" not in item:
            raise InputError("--where", f"expected COL=VALUE, got {item!r}")
        col, val = item.split("=", 1)
        if not col.strip():
            raise InputError("--where", f"empty column name in {item!r}")
        out.setdefault(col.strip(), []).append(val.strip())
    return out


def filter_rows(rows: list[dict], where: dict[str, list[str]] | None) -> list[dict]:
    if not where:
        return list(rows)
    if rows:
        for col in where:
            if col not in rows[0]:
                raise InputError("--where", f"no column {col!r}; columns are {', '.join(rows[0])}")
    return [r for r in rows if all(str(r.get(c, "")).strip() in vals for c, vals in where.items())]


def is_outlier(row: dict) -> bool:
    return str(row.get("suspect_outlier", "")).strip().lower() in _TRUE


def _number(row_i: int, col: str, value, positive: bool = True) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(col, f"row {row_i + 1}: expected a number, got {value!r}") from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise InputError(col, f"row {row_i + 1}: expected a positive number, got {value!r}")
    return x


def profile_arrays(rows: list[dict], *, require_throughput: bool = True,
                   skip_outliers: bool = True) -> ProfileArrays:
    """Validate rows and turn them into arrays. Raises InputError naming a missing column,
    a bad value (with its row) or an unknown model. Rows with ``suspect_outlier=True`` are
    skipped when ``skip_outliers``. Optional columns: ``output_cv`` (SLIM's E[C]) and
    ``chunked_prefill`` (True/False)."""
    required = REQUIRED_FIT if require_throughput else REQUIRED_PREDICT
    if not rows:
        raise InputError("csv", "no data rows")
    cols = set(rows[0])
    for col in required:
        if col not in cols:
            raise InputError(col, f"missing column {col!r} (need {', '.join(required)})")
    kept = [r for r in rows if not (skip_outliers and is_outlier(r))]
    if not kept:
        raise InputError("csv", "every row is marked suspect_outlier")
    models, b, il, ol, thr, cv = [], [], [], [], [], []
    for i, r in enumerate(kept):
        models.append(get_arch(str(r["model"]).strip()).key)
        b.append(_number(i, "batch", r["batch"]))
        il.append(_number(i, "input_len", r["input_len"]))
        ol.append(_number(i, "output_len", r["output_len"]))
        if require_throughput:
            thr.append(_number(i, "throughput_tok_s", r["throughput_tok_s"]))
        raw_cv = str(r.get("output_cv", "") or "").strip()
        cv.append(_number(i, "output_cv", raw_cv, positive=False) if raw_cv else 0.0)
    chunked = np.array([str(r.get("chunked_prefill", "") or "").strip().lower() in _TRUE for r in kept])
    return ProfileArrays(tuple(models), np.array(b), np.array(il), np.array(ol),
                         np.array(thr) if require_throughput else None, np.array(cv), tuple(kept), chunked)


def estimate_output_cv(rows: list[dict], group_col: str = "dataset", block_size: int = 16) -> dict[str, float]:
    """Effective output-length CV per workload group, from vLLM's KV usage on rows that did not
    preempt: the mean resident context per running sequence is E[C]/E[OL] (paper 000 eq. 12)
    = IL + 1 + (OL·(1+cv²) − 1)/2, plus half a block. Returns {group: cv} (median over rows);
    groups without usable rows are absent. Dummy fixed-length prompts give cv ≈ 0, ShareGPT ≈ 0.9."""
    need = ("kv_usage_mean", "kv_capacity_tokens", "batch", "input_len", "output_len")
    if not rows or any(c not in rows[0] for c in need):
        return {}
    by_group: dict[str, list[float]] = {}
    for r in rows:
        try:
            usage, cap, b = float(r["kv_usage_mean"]), float(r["kv_capacity_tokens"]), float(r["batch"])
            il, ol = float(r["input_len"]), float(r["output_len"])
        except (TypeError, ValueError):
            continue
        if str(r.get("preempted", "")).strip().lower() in _TRUE or is_outlier(r):
            continue
        if not (usage > 0 and cap > 0 and b > 0 and ol > 0) or not all(map(math.isfinite, (usage, cap, b, il, ol))):
            continue
        ctx = usage * cap / b - block_size / 2.0
        cv2 = (2.0 * (ctx - il - 1.0) + 1.0) / ol - 1.0
        by_group.setdefault(str(r.get(group_col, "")), []).append(cv2)
    return {g: float(math.sqrt(max(float(np.median(v)), 0.0))) for g, v in by_group.items() if v}


def apply_output_cv(rows: list[dict], cv_by_group: dict[str, float], group_col: str = "dataset") -> np.ndarray:
    """Per-row CV: the row's own ``output_cv`` column if set, else its group's estimate, else 0."""
    out = []
    for r in rows:
        raw = str(r.get("output_cv", "") or "").strip()
        out.append(float(raw) if raw else float(cv_by_group.get(str(r.get(group_col, "")), 0.0)))
    return np.asarray(out, dtype=float)
