"""Window observations: what a vLLM pod did between two scrapes (DESIGN.md §4 step 2, §6).

Means are Δsum/Δcount of histograms, rates Δcounter/Δt, percentiles are interpolated from
histogram bucket deltas (as Prometheus' ``histogram_quantile``), the batch and queue are the
average of the gauge samples available in the window. Series of several ``engine`` label
values are summed. Every failure mode answers with a typed :class:`NoObservation`, never a
wrong number: counter resets, series appearing or vanishing, missing or renamed metrics,
NaN/garbage values, truncated bodies, idle windows.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass, fields
from itertools import chain
from typing import Iterable, Mapping, Sequence

import numpy as np

from kneecap.observe.scrape import Labels, Snapshot

# --- metric names (vLLM V1; old names second) -------------------------------------------
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"
CACHE_CONFIG = "vllm:cache_config_info"
PROCESS_START = "process_start_time_seconds"
SUCCESS_CREATED = "vllm:request_success_created"  # a new value means the counters restarted
PROMPT_TOKENS_CREATED = "vllm:prompt_tokens_created"

H_PROMPT = ("vllm:request_prompt_tokens",)
H_GENERATION = ("vllm:request_generation_tokens",)
H_TTFT = ("vllm:time_to_first_token_seconds",)
H_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
H_TPOT = ("vllm:request_time_per_output_token_seconds",)
H_E2E = ("vllm:e2e_request_latency_seconds",)
H_QUEUE = ("vllm:request_queue_time_seconds",)
H_PREFILL = ("vllm:request_prefill_time_seconds",)
H_DECODE = ("vllm:request_decode_time_seconds",)
H_INFERENCE = ("vllm:request_inference_time_seconds",)

# field prefix -> (histogram names, required)
_HISTOGRAMS: dict[str, tuple[tuple[str, ...], bool]] = {
    "input_len": (H_PROMPT, True),
    "output_len": (H_GENERATION, True),
    "ttft": (H_TTFT, True),
    "itl": (H_ITL, True),
    "tpot": (H_TPOT, False),
    "e2e": (H_E2E, True),
    "queue_time": (H_QUEUE, False),
    "prefill_time": (H_PREFILL, False),
    "decode_time": (H_DECODE, False),
    "inference_time": (H_INFERENCE, False),
}
_COUNTERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "finished": ((SUCCESS,), True),
    "prompt_tokens": ((PROMPT_TOKENS,), True),
    "generation_tokens": ((GENERATION_TOKENS,), True),
    "preemptions": ((PREEMPTIONS,), False),
}
_GAUGES: dict[str, tuple[tuple[str, ...], bool]] = {
    "running": ((RUNNING,), True),
    "waiting": ((WAITING,), True),
    "kv_usage": (KV_USAGE, True),
}

QUANTILE = 0.95


class Reason(str, enum.Enum):
    """Why a window gave no observation."""

    IDLE = "idle"  # nothing ran, nothing finished
    NO_FINISHED = "no_finished_requests"  # work ran but no request finished: no distributions
    COUNTER_RESET = "counter_reset"  # a counter went down or the process restarted
    SERIES_CHANGED = "series_changed"  # a series (e.g. an engine) appeared or vanished
    MISSING_METRIC = "missing_metric"
    INVALID_VALUE = "invalid_value"  # NaN/inf/garbage, or an inconsistent histogram
    TRUNCATED = "truncated"  # the body was cut inside a metric we need
    BAD_WINDOW = "bad_window"  # non-positive window length
    NO_PODS = "no_pods"


@dataclass(frozen=True)
class NoObservation:
    """A window that yields no observation, and why (``code`` is e.g. ``missing_metric:vllm:x``)."""

    reason: Reason
    detail: str = ""

    @property
    def code(self) -> str:
        return f"{self.reason.value}:{self.detail}" if self.detail else self.reason.value

    def __str__(self) -> str:
        return self.code


@dataclass(frozen=True)
class Observation:
    """One window of one pod (or of a pool, see :mod:`kneecap.observe.pool`).

    Counts and rates are window totals (pool: summed over pods). ``mean_batch``,
    ``max_batch``, ``kv_usage`` and the KV capacity/memory fields are per pod (pool: averaged
    over pods). Lengths are in tokens, times in seconds. ``None`` marks a metric this vLLM
    version does not export.
    """

    window_s: float
    t_end_s: float
    pods: int
    finished_requests: float
    request_rate_rps: float
    mean_batch: float
    max_batch: float
    batch_samples: int
    queue_len: float
    prompt_tokens: float
    generation_tokens: float
    prompt_tok_s: float
    generation_tok_s: float
    input_len_mean: float
    input_len_cv: float
    input_len_p95: float
    output_len_mean: float
    output_len_cv: float
    output_len_p95: float
    ttft_mean_s: float
    ttft_p95_s: float
    itl_mean_s: float
    itl_p95_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    kv_usage: float
    kv_usage_max: float
    tpot_mean_s: float | None = None
    tpot_p95_s: float | None = None
    queue_time_mean_s: float | None = None
    queue_time_p95_s: float | None = None
    prefill_time_mean_s: float | None = None
    prefill_time_p95_s: float | None = None
    decode_time_mean_s: float | None = None
    decode_time_p95_s: float | None = None
    mean_batch_little: float | None = None  # Σ inference time / window (Little's law)
    preemptions: float | None = None
    kv_capacity_tokens: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None


OBSERVATION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Observation))


# --- histogram maths (vectorised) ---------------------------------------------------------
@dataclass(frozen=True)
class Histogram:
    """A window's histogram delta: cumulative counts per upper bound (last is +inf)."""

    bounds: np.ndarray  # ascending, last = +inf
    cumulative: np.ndarray
    sum: float
    count: float

    def mean(self) -> float:
        return self.sum / self.count

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank q·count (Prometheus
        ``histogram_quantile``); lower edge of the first bucket is 0. A rank in the +inf
        bucket returns the highest finite bound, a lower bound of the truth."""
        rank = q * self.count
        i = int(np.searchsorted(self.cumulative, rank, side="left"))
        i = min(i, len(self.bounds) - 1)
        if not math.isfinite(self.bounds[i]):
            return float(self.bounds[i - 1]) if i > 0 else 0.0
        lo = float(self.bounds[i - 1]) if i > 0 else min(0.0, float(self.bounds[0]))
        below = float(self.cumulative[i - 1]) if i > 0 else 0.0
        in_bucket = float(self.cumulative[i]) - below
        if in_bucket <= 0:
            return float(self.bounds[i])
        return lo + (float(self.bounds[i]) - lo) * (rank - below) / in_bucket

    def cv(self) -> float:
        """Coefficient of variation from the buckets, mass uniform inside each finite bucket
        (E[x²] of U(a,b) = (a²+ab+b²)/3); the +inf bucket's mass sits where it makes the
        bucket mean equal the exact mean Δsum/Δcount (at its lower edge if that is lower).
        Its resolution is the bucket width: a tight distribution inside one bucket reads as
        that bucket's uniform spread."""
        c = np.concatenate(([0.0], self.cumulative))
        counts = c[1:] - c[:-1]  # np.diff, without its Python-level wrapper
        info = _BOUNDS_INFO.get(id(self.bounds))
        if info is None or info[0] is not self.bounds:
            info = _bounds_moments(self.bounds)
        _, finite, infinite, lo_inf, m1, m2, m1_finite = info
        n_inf = float(counts[infinite].sum())
        if n_inf > 0:
            rest = float((counts[finite] * m1_finite).sum())
            x_inf = max(lo_inf, (self.sum - rest) / n_inf)
            m1 = np.where(finite, m1, x_inf)
            m2 = np.where(finite, m2, x_inf**2)
        mean_b = float((counts * m1).sum()) / self.count
        var_b = max(float((counts * m2).sum()) / self.count - mean_b**2, 0.0)
        return math.sqrt(var_b) / mean_b if mean_b > 0 else 0.0


def _bounds_moments(bounds: np.ndarray) -> tuple:
    """What :meth:`Histogram.cv` needs of the bounds alone: (bounds, finite mask, its negation,
    lower edge of the first infinite bucket, per-bucket E[x] and E[x²] of U(lo, hi) (0 where
    infinite), E[x] of the finite buckets)."""
    hi = bounds.astype(float)
    lo = np.concatenate([[min(0.0, hi[0])], hi[:-1]])
    finite = np.isfinite(hi)
    m1 = np.where(finite, (lo + np.where(finite, hi, 0.0)) / 2.0, 0.0)
    m2 = np.where(finite, (lo**2 + lo * np.where(finite, hi, 0.0) + np.where(finite, hi, 0.0) ** 2) / 3.0, 0.0)
    infinite = ~finite
    lo_inf = float(lo[infinite][0]) if infinite.any() else math.nan  # read only when +inf has mass
    return bounds, finite, infinite, lo_inf, m1, m2, m1[finite]


# Read-only bounds of the bucket plans (below), by id -> _bounds_moments(bounds): known
# ascending, and their moments computed once. Cleared with the plans.
_BOUNDS_INFO: dict[int, tuple] = {}


def merge_histograms(parts: Sequence[Histogram]) -> Histogram:
    """Sum histogram deltas (engines or pods) over their common bucket bounds."""
    b0 = parts[0].bounds
    if _same_bounds(b0, parts):  # the usual case: the sum below is what the general one adds
        cum = np.zeros(len(b0))
        for p in parts:
            cum += p.cumulative
        return Histogram(b0, cum, math.fsum(p.sum for p in parts), math.fsum(p.count for p in parts))
    common = b0
    for p in parts[1:]:
        common = np.intersect1d(common, p.bounds)
    cum = np.zeros(len(common))
    for p in parts:
        cum += p.cumulative[np.searchsorted(p.bounds, common)]
    return Histogram(common, cum, math.fsum(p.sum for p in parts), math.fsum(p.count for p in parts))


def _same_bounds(b0: np.ndarray, parts: Sequence[Histogram]) -> bool:
    """Every part has bounds ``b0`` bit for bit, and ``b0`` is strictly ascending (then the
    common bounds are ``b0`` and each part's cumulative counts are already on them)."""
    raw = None
    for p in parts[1:]:
        b = p.bounds
        if b is not b0:
            if raw is None:
                raw = b0.tobytes()
            if b.shape != b0.shape or b.dtype != b0.dtype or b.tobytes() != raw:
                return False
    if _BOUNDS_INFO.get(id(b0), (None,))[0] is b0:
        return True  # a bucket plan's bounds: ascending, read-only
    return b0.ndim == 1 and (len(b0) < 2 or bool((b0[1:] > b0[:-1]).all()))


# --- window deltas -------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowDeltas:
    """Everything one pod's window contributes, before turning it into an observation."""

    window_s: float
    t_end_s: float
    counters: Mapping[str, float | None]
    histograms: Mapping[str, Histogram | None]
    running: tuple[float, ...]
    waiting: tuple[float, ...]
    kv_usage: tuple[float, ...]
    kv_capacity_tokens: float | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: float | None


class _Fail(Exception):
    def __init__(self, no: NoObservation):
        self.no = no


def _missing(name: str, snaps: Iterable[Snapshot]) -> NoObservation:
    snaps = list(snaps)
    for s in snaps:
        if name in s.invalid:
            return NoObservation(Reason.INVALID_VALUE, name)
    for s in snaps:
        if s.truncated:
            return NoObservation(Reason.TRUNCATED, name)
    return NoObservation(Reason.MISSING_METRIC, name)


def _pick(names: tuple[str, ...], suffix: str, snaps: Sequence[Snapshot], required: bool) -> str | None:
    """First of ``names`` (current name, then older ones) present in every snapshot; None for
    an optional metric present in none; otherwise a typed failure."""
    for n in names:
        n_sfx = n + suffix
        for s in snaps:
            if not s.series.get(n_sfx):
                break
        else:
            return n
    seen = [n for n in names if any(s.get(n + suffix) for s in snaps)]
    if required or seen:
        raise _Fail(_missing((seen or names)[0] + suffix, snaps))
    return None


def _series_delta(name: str, prev: Snapshot, cur: Snapshot) -> dict[Labels, float]:
    a, b = prev.series.get(name) or {}, cur.series.get(name) or {}
    if a.keys() != b.keys():
        if name in prev.invalid or name in cur.invalid:
            raise _Fail(NoObservation(Reason.INVALID_VALUE, name))
        gone = sorted(set(a) ^ set(b))
        raise _Fail(NoObservation(Reason.SERIES_CHANGED, f"{name}{dict(gone[0])}"))
    out = {}
    for k, v in b.items():
        d = v - a[k]
        if d < 0:
            raise _Fail(NoObservation(Reason.COUNTER_RESET, name))
        out[k] = d
    return out


def _counter(names: tuple[str, ...], prev: Snapshot, cur: Snapshot, required: bool) -> float | None:
    name = _pick(names, "", (prev, cur), required)
    if name is None:
        return None
    return math.fsum(_series_delta(name, prev, cur).values())


# A histogram's bucket series, as the tuple of their label tuples in the order the scrape
# listed them -> per series (labels without `le`): the index of each bucket in that order,
# ascending by bound, and the bounds (read-only, shared). The label tuples are the series
# cache's (kneecap.observe.scrape), the same objects every scrape of every pod of a model, so
# after the first window only bucket values are read. None: anything unusual (a bad or repeated
# `le`, no +Inf bucket, unordered bounds): the general path below reads it. Bounded: cleared
# when full.
# Keyed by the id of the first label tuple (the entry holds it, so the id is not reused), the
# entry checked against the whole tuple: with shared label tuples that is an identity check per
# bucket, where hashing the labels would cost more than the rest of the window.
_BucketPlan = tuple[tuple[Labels, np.ndarray, np.ndarray], ...]
_BUCKET_PLANS: dict[int, tuple[tuple[Labels, ...], _BucketPlan | None]] = {}
_BUCKET_PLANS_MAX = 10_000


def _bucket_plan(keys: tuple[Labels, ...]) -> _BucketPlan | None:
    hit = _BUCKET_PLANS.get(id(keys[0]))
    if hit is not None and hit[0] == keys:
        return hit[1]
    per_series: dict[Labels, dict[float, int]] = {}
    plan = None
    try:
        for i, labels in enumerate(keys):
            rest = tuple(kv for kv in labels if kv[0] != "le")
            per_series.setdefault(rest, {})[float(dict(labels).get("le"))] = i  # type: ignore[arg-type]
        groups, shared = [], {}
        for rest, buckets in per_series.items():
            bounds = np.array(sorted(buckets))
            ok = bounds[-1] == math.inf and (len(bounds) < 2 or bool((bounds[1:] > bounds[:-1]).all()))
            if not ok or sum(1 for labels in keys if tuple(kv for kv in labels if kv[0] != "le") == rest) != len(bounds):
                break  # unordered (NaN) bounds, no +Inf bucket, or two buckets of one bound
            bounds = shared.setdefault(bounds.tobytes(), bounds)
            bounds.flags.writeable = False
            _BOUNDS_INFO[id(bounds)] = _bounds_moments(bounds)
            idx = np.array([buckets[b] for b in bounds], dtype=np.intp)
            groups.append((rest, idx, bounds))
        else:
            plan = tuple(groups)
    except (TypeError, ValueError):
        plan = None
    if len(_BUCKET_PLANS) >= _BUCKET_PLANS_MAX:
        _BUCKET_PLANS.clear()
        _BOUNDS_INFO.clear()
    _BUCKET_PLANS[id(keys[0])] = (keys, plan)
    return plan


def _histogram(names: tuple[str, ...], prev: Snapshot, cur: Snapshot, required: bool) -> Histogram | None:
    base = _pick(names, "_count", (prev, cur), required)
    if base is None:
        return None
    for sfx in ("_bucket", "_sum"):
        if not (prev.series.get(base + sfx) and cur.series.get(base + sfx)):
            raise _Fail(_missing(base + sfx, (prev, cur)))
    name = base + "_bucket"
    a, b = prev.series[name], cur.series[name]
    keys = tuple(b)
    same_order = tuple(a) == keys  # shared label tuples: identity checks, no hashing
    plan = _bucket_plan(keys) if same_order or a.keys() == b.keys() else None
    if plan is None:
        return _histogram_general(base, prev, cur)
    # _series_delta of the buckets, vectorised (the same subtractions)
    n = len(keys)
    d = np.fromiter(b.values(), float, n) - np.fromiter(a.values() if same_order else map(a.__getitem__, keys),
                                                         float, n)
    if (d < 0).any():
        raise _Fail(NoObservation(Reason.COUNTER_RESET, name))
    d_sum = _series_delta(base + "_sum", prev, cur)
    d_count = _series_delta(base + "_count", prev, cur)
    parts = []
    for rest, idx, bounds in plan:
        if rest not in d_count or rest not in d_sum:
            raise _Fail(_missing(base + "_count", (prev, cur)))
        cum = d[idx]
        count = d_count[rest]
        if ((cum[1:] - cum[:-1]) < -1e-9).any() or abs(cum[-1] - count) > 1e-6 * max(1.0, count):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base} (inconsistent buckets)"))
        parts.append(Histogram(bounds, cum, d_sum[rest], count))
    if len(plan) != len(d_count):
        raise _Fail(_missing(base + "_bucket", (prev, cur)))
    if len(parts) == 1:  # merge_histograms of one part with ascending bounds: the part, 0.0 added
        cum += 0.0
        return Histogram(bounds, cum, math.fsum((d_sum[rest],)), math.fsum((count,)))
    return merge_histograms(parts)


# The bucket plans of a window's histograms (by their ids; the entry holds them) -> the bucket
# order of all of them at once: per histogram its groups as (labels without `le`, bounds, slice
# of the concatenated cumulative counts); the gather index into the concatenated bucket deltas,
# which differences are inside a group, and the index of each group's last bucket.
_BATCHES: dict[tuple[int, ...], tuple] = {}
_BATCHES_MAX = 1_000


def _batch(plans: tuple[_BucketPlan, ...]) -> tuple:
    key = tuple(map(id, plans))
    hit = _BATCHES.get(key)
    if hit is not None and all(map(operator.is_, hit[0], plans)):
        return hit
    gather, inner, last, groups = [], [], [], []
    offset = at = 0
    for plan in plans:
        gs = []
        n = 0
        for rest, idx, bounds in plan:
            gather.append(idx + offset)
            inner.extend([False] + [True] * (len(idx) - 1))
            gs.append((rest, bounds, slice(at, at + len(idx))))
            at += len(idx)
            last.append(at - 1)
            n += len(idx)
        groups.append(tuple(gs))
        offset += n
    if len(_BATCHES) >= _BATCHES_MAX:
        _BATCHES.clear()
    hit = _BATCHES[key] = (plans, tuple(groups), np.concatenate(gather), np.array(inner[1:], dtype=bool),
                           np.array(last, dtype=np.intp))
    return hit


def _histograms_batched(prev: Snapshot, cur: Snapshot) -> dict[str, Histogram | None] | None:
    """Every histogram of the window at once (one subtraction, one check of all buckets), or
    None when anything is unusual (a metric missing or renamed on one side, series changed or
    reordered, no bucket plan, a reset, inconsistent buckets): then :func:`_histogram`, one by
    one, gives the result or the typed failure. Where it answers, it is what that gives."""
    ps, cs = prev.series, cur.series
    bases, plans, news, olds, sums, counts = [], [], [], [], [], []
    n_all = 0
    try:
        for names, required in _HISTOGRAMS.values():
            base = None
            for n in names:
                if ps.get(n + "_count") and cs.get(n + "_count"):
                    base = n
                    break
            if base is None:
                if required or any(ps.get(n + "_count") or cs.get(n + "_count") for n in names):
                    return None
                bases.append(None)
                continue
            a, b = ps.get(base + "_bucket"), cs.get(base + "_bucket")
            if not (a and b and ps.get(base + "_sum") and cs.get(base + "_sum")):
                return None
            keys = tuple(b)
            if tuple(a) != keys:
                return None
            plan = _bucket_plan(keys)
            if plan is None:
                return None
            d_sum = _series_delta(base + "_sum", prev, cur)
            d_count = _series_delta(base + "_count", prev, cur)
            if len(plan) != len(d_count):
                return None
            for rest, _, _ in plan:
                if rest not in d_count or rest not in d_sum:
                    return None
            bases.append(base)
            plans.append(plan)
            news.append(b.values())
            olds.append(a.values())
            sums.append(d_sum)
            counts.append(d_count)
            n_all += len(keys)
    except _Fail:
        return None
    # _series_delta of all buckets, vectorised (the same subtractions)
    d = np.fromiter(chain.from_iterable(news), float, n_all) - np.fromiter(chain.from_iterable(olds), float, n_all)
    if (d < 0).any():
        return None
    _, groups, gather, inner, last = _batch(tuple(plans))
    cum = d[gather]
    count_all = np.fromiter((dc[rest] for gs, dc in zip(groups, counts) for rest, _, _ in gs), float, len(last))
    if (((cum[1:] - cum[:-1]) < -1e-9) & inner).any() or \
            (np.abs(cum[last] - count_all) > 1e-6 * np.maximum(1.0, count_all)).any():
        return None
    cum += 0.0  # what merge_histograms' zeros + cumulative gives
    out: dict[str, Histogram | None] = {}
    it = iter(zip(groups, sums, counts))
    for k, base in zip(_HISTOGRAMS, bases):
        if base is None:
            out[k] = None
            continue
        gs, d_sum, d_count = next(it)
        if len(gs) == 1:
            rest, bounds, sl = gs[0]
            out[k] = Histogram(bounds, cum[sl], math.fsum((d_sum[rest],)), math.fsum((d_count[rest],)))
        else:
            out[k] = merge_histograms([Histogram(bounds, cum[sl], d_sum[rest], d_count[rest]) for rest, bounds, sl in gs])
    return out


def _histogram_general(base: str, prev: Snapshot, cur: Snapshot) -> Histogram:
    """:func:`_histogram` for any bucket series (label by label)."""
    d_bucket = _series_delta(base + "_bucket", prev, cur)
    d_sum = _series_delta(base + "_sum", prev, cur)
    d_count = _series_delta(base + "_count", prev, cur)
    # group buckets by series (labels without `le`)
    per_series: dict[Labels, dict[float, float]] = {}
    for labels, v in d_bucket.items():
        rest = tuple(kv for kv in labels if kv[0] != "le")
        le = dict(labels).get("le")
        try:
            bound = float(le)
        except (TypeError, ValueError):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base}_bucket le={le!r}")) from None
        per_series.setdefault(rest, {})[bound] = v
    parts = []
    for rest, buckets in per_series.items():
        if rest not in d_count or rest not in d_sum:
            raise _Fail(_missing(base + "_count", (prev, cur)))
        bounds = np.array(sorted(buckets))
        cum = np.array([buckets[b] for b in bounds])
        count = d_count[rest]
        if not np.isinf(bounds[-1]) or np.any(np.diff(cum) < -1e-9) or abs(cum[-1] - count) > 1e-6 * max(1.0, count):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base} (inconsistent buckets)"))
        parts.append(Histogram(bounds, cum, d_sum[rest], count))
    if len(per_series) != len(d_count):
        raise _Fail(_missing(base + "_bucket", (prev, cur)))
    return merge_histograms(parts)


def _gauge_samples(names: tuple[str, ...], snaps: Sequence[Snapshot], how: str) -> tuple[float, ...]:
    """The gauge at each snapshot (engines summed or averaged). The window's ends must have
    it; an intermediate scrape that lacks it (or has other series) is skipped."""
    name = _pick(names, "", (snaps[0], snaps[-1]), True)
    keys = set(snaps[-1].get(name))
    out = []
    for i, s in enumerate(snaps):
        series = s.get(name)
        if not series or set(series) != keys:
            if 0 < i < len(snaps) - 1:
                continue
            gone = sorted(set(series or {}) ^ keys)
            raise _Fail(NoObservation(Reason.SERIES_CHANGED, f"{name}{dict(gone[0])}"))
        vals = list(series.values())
        out.append(math.fsum(vals) if how == "sum" else math.fsum(vals) / len(vals))
    return tuple(out)


def _cache_config(snap: Snapshot) -> tuple[float | None, float | None, float | None]:
    """KV capacity (tokens, summed over engines), memory fraction and KV bytes (first engine)."""
    series = snap.get(CACHE_CONFIG)
    if not series:
        return None, None, None

    def num(labels: dict[str, str], key: str) -> float | None:
        try:
            v = float(labels.get(key, "None"))
        except ValueError:
            return None
        return v if math.isfinite(v) else None

    capacity, gmu, kvb = 0.0, None, None
    for key in sorted(series):
        labels = dict(key)
        blocks, size = num(labels, "num_gpu_blocks"), num(labels, "block_size")
        if blocks is None or size is None:
            capacity = None
        elif capacity is not None:
            capacity += blocks * size
        gmu = num(labels, "gpu_memory_utilization") if gmu is None else gmu
        kvb = num(labels, "kv_cache_memory_bytes") if kvb is None else kvb
    return capacity, gmu, kvb


def window_deltas(prev: Snapshot, cur: Snapshot, between: Sequence[Snapshot] = ()) -> WindowDeltas | NoObservation:
    """One pod's raw window (counters, histogram deltas, gauge samples), or why not."""
    window_s = cur.t_s - prev.t_s
    if not window_s > 0:
        return NoObservation(Reason.BAD_WINDOW, f"window_s={window_s}")
    a, b = prev.process_start_s, cur.process_start_s
    if a is not None and b is not None and b != a:
        return NoObservation(Reason.COUNTER_RESET, "process restarted")
    for created in (SUCCESS_CREATED, PROMPT_TOKENS_CREATED):
        ca, cb = prev.get(created), cur.get(created)
        if ca and cb and any(k in ca and ca[k] != v for k, v in cb.items()):
            return NoObservation(Reason.COUNTER_RESET, f"{created} changed")
    try:
        counters = {k: _counter(names, prev, cur, req) for k, (names, req) in _COUNTERS.items()}
        hists = _histograms_batched(prev, cur)
        if hists is None:  # something unusual: histogram by histogram, each failure typed
            hists = {k: _histogram(names, prev, cur, req) for k, (names, req) in _HISTOGRAMS.items()}
        snaps = (prev, *between, cur)
        running = _gauge_samples(_GAUGES["running"][0], snaps, "sum")
        waiting = _gauge_samples(_GAUGES["waiting"][0], snaps, "sum")
        kv = _gauge_samples(_GAUGES["kv_usage"][0], snaps, "mean")
    except _Fail as f:
        return f.no
    capacity, gmu, kvb = _cache_config(cur)
    return WindowDeltas(window_s, cur.t_s, counters, hists, running, waiting, kv, capacity, gmu, kvb)


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.fsum(xs) / len(xs)


def _all_or_none(xs: Sequence[float | None]) -> list[float] | None:
    return None if any(x is None for x in xs) else list(xs)  # type: ignore[return-value]


def combine(parts: Sequence[WindowDeltas]) -> Observation | NoObservation:
    """Turn one or more pods' window deltas into one observation (pool semantics, see
    :class:`Observation`): counts and rates add, per-request distributions merge their
    histograms, batch/KV quantities average over pods."""
    if not parts:
        return NoObservation(Reason.NO_PODS)
    window_s = _mean(p.window_s for p in parts)
    total = {k: _all_or_none([p.counters[k] for p in parts]) for k in _COUNTERS}
    finished = math.fsum(total["finished"])
    if finished <= 0:
        busy = (
            math.fsum(total["prompt_tokens"]) > 0
            or math.fsum(total["generation_tokens"]) > 0
            or any(max(p.running) > 0 for p in parts)
        )
        return NoObservation(Reason.NO_FINISHED if busy else Reason.IDLE)
    hist: dict[str, Histogram | None] = {}
    for k in _HISTOGRAMS:
        hs = _all_or_none([p.histograms[k] for p in parts])
        hist[k] = merge_histograms(hs) if hs else None
    for k in ("input_len", "output_len", "ttft", "e2e"):
        if hist[k].count <= 0:  # type: ignore[union-attr]
            return NoObservation(Reason.INVALID_VALUE, f"{k}: histogram count 0 with {finished:g} finished")

    def mean_p95(k: str) -> tuple[float | None, float | None]:
        h = hist[k]
        if h is None or h.count <= 0:
            return None, None
        return h.mean(), h.quantile(QUANTILE)

    def rate(k: str) -> float:
        # rates add over pods, each over its own window
        return math.fsum(c / p.window_s for c, p in zip(total[k], parts))

    lens = {}
    for k in ("input_len", "output_len"):
        h = hist[k]
        lens[k] = (h.mean(), h.cv(), h.quantile(QUANTILE))  # type: ignore[union-attr]
    lat = {k: mean_p95(k) for k in ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time")}
    if lat["itl"][0] is None:
        if math.fsum(total["generation_tokens"]) > finished:
            return NoObservation(Reason.INVALID_VALUE, "itl: histogram count 0")
        # one token per request (a disaggregated prefill pool, max_tokens 1): no interval between tokens
        lat["itl"] = (0.0, 0.0)
    inference = [p.histograms["inference_time"] for p in parts]
    little = (
        _mean(h.sum / p.window_s for h, p in zip(inference, parts))  # type: ignore[union-attr]
        if all(h is not None for h in inference)
        else None
    )
    caps = _all_or_none([p.kv_capacity_tokens for p in parts])
    gmus = _all_or_none([p.gpu_memory_utilization for p in parts])
    kvbs = _all_or_none([p.kv_cache_memory_bytes for p in parts])
    return Observation(
        window_s=window_s,
        t_end_s=max(p.t_end_s for p in parts),
        pods=len(parts),
        finished_requests=finished,
        request_rate_rps=rate("finished"),
        mean_batch=_mean(_mean(p.running) for p in parts),
        max_batch=max(max(p.running) for p in parts),
        batch_samples=sum(len(p.running) for p in parts),
        queue_len=math.fsum(_mean(p.waiting) for p in parts),
        prompt_tokens=math.fsum(total["prompt_tokens"]),
        generation_tokens=math.fsum(total["generation_tokens"]),
        prompt_tok_s=rate("prompt_tokens"),
        generation_tok_s=rate("generation_tokens"),
        input_len_mean=lens["input_len"][0],
        input_len_cv=lens["input_len"][1],
        input_len_p95=lens["input_len"][2],
        output_len_mean=lens["output_len"][0],
        output_len_cv=lens["output_len"][1],
        output_len_p95=lens["output_len"][2],
        ttft_mean_s=lat["ttft"][0],
        ttft_p95_s=lat["ttft"][1],
        itl_mean_s=lat["itl"][0],
        itl_p95_s=lat["itl"][1],
        e2e_mean_s=lat["e2e"][0],
        e2e_p95_s=lat["e2e"][1],
        kv_usage=_mean(_mean(p.kv_usage) for p in parts),
        kv_usage_max=max(max(p.kv_usage) for p in parts),
        tpot_mean_s=lat["tpot"][0],
        tpot_p95_s=lat["tpot"][1],
        queue_time_mean_s=lat["queue_time"][0],
        queue_time_p95_s=lat["queue_time"][1],
        prefill_time_mean_s=lat["prefill_time"][0],
        prefill_time_p95_s=lat["prefill_time"][1],
        decode_time_mean_s=lat["decode_time"][0],
        decode_time_p95_s=lat["decode_time"][1],
        mean_batch_little=little,
        preemptions=math.fsum(total["preemptions"]) if total["preemptions"] is not None else None,
        kv_capacity_tokens=_mean(caps) if caps else None,
        gpu_memory_utilization=_mean(gmus) if gmus else None,
        kv_cache_memory_bytes=_mean(kvbs) if kvbs else None,
    )


def observe(prev: Snapshot, cur: Snapshot, between: Sequence[Snapshot] = ()) -> Observation | NoObservation:
    """The observation of one pod's window ``prev`` → ``cur``; ``between`` are optional
    intermediate scrapes whose gauges (batch, queue, KV usage) join the averages."""
    d = window_deltas(prev, cur, between)
    return d if isinstance(d, NoObservation) else combine([d])
