"""Histogram deltas of a window, vectorised and pure: the :class:`Histogram` (mean,
Prometheus-style quantile, coefficient of variation from the buckets), :func:`merge_histograms`
over engines or pods, and bucket plans: where a scrape's bucket series sit, by series and bound,
so that after the first window only bucket values are read.

The plans are kept in a :class:`HistogramCache` that the owner of a stream of scrapes passes in
(the operator loop keeps one for all its scrapes); without one each window plans afresh. A
plan's bounds carry their moments (:class:`BoundsMoments`) into the histograms made on them.
Neither changes what a window computes, only how fast.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from kneecap.observe.scrape import Labels


class BoundsMoments(NamedTuple):
    """What :meth:`Histogram.cv` needs of the bounds alone: the bounds, their finite mask and its
    negation, the lower edge of the first infinite bucket, per-bucket E[x] and E[x²] of U(lo, hi)
    (0 where infinite), E[x] of the finite buckets."""

    bounds: np.ndarray
    finite: np.ndarray
    infinite: np.ndarray
    lo_inf: float
    m1: np.ndarray
    m2: np.ndarray
    m1_finite: np.ndarray


def _bounds_moments(bounds: np.ndarray) -> BoundsMoments:
    """The moments of ``bounds`` (ascending, last = +inf)."""
    hi = bounds.astype(float)
    lo = np.concatenate([[min(0.0, hi[0])], hi[:-1]])
    finite = np.isfinite(hi)
    m1 = np.where(finite, (lo + np.where(finite, hi, 0.0)) / 2.0, 0.0)
    m2 = np.where(finite, (lo**2 + lo * np.where(finite, hi, 0.0) + np.where(finite, hi, 0.0) ** 2) / 3.0, 0.0)
    infinite = ~finite
    lo_inf = float(lo[infinite][0]) if infinite.any() else math.nan  # read only when +inf has mass
    return BoundsMoments(bounds, finite, infinite, lo_inf, m1, m2, m1[finite])


@dataclass(frozen=True)
class Histogram:
    """A window's histogram delta: cumulative counts per upper bound (last is +inf).
    ``moments``: those of ``bounds`` when they are a bucket plan's (strictly ascending,
    read-only); None: computed when needed."""

    bounds: np.ndarray  # ascending, last = +inf
    cumulative: np.ndarray
    sum: float
    count: float
    moments: BoundsMoments | None = field(default=None, compare=False, repr=False)

    def mean(self) -> float:
        return self.sum / self.count

    def _bucket_of(self, q: float) -> tuple[int, float]:
        """(index of the bucket holding rank q·count, that rank)."""
        rank = q * self.count
        i = int(np.searchsorted(self.cumulative, rank, side="left"))
        return min(i, len(self.bounds) - 1), rank

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank q·count (Prometheus
        ``histogram_quantile``); lower edge of the first bucket is 0. A rank in the +inf
        bucket returns the highest finite bound, a lower bound of the truth."""
        i, rank = self._bucket_of(q)
        if not math.isfinite(self.bounds[i]):
            return float(self.bounds[i - 1]) if i > 0 else 0.0
        lo = float(self.bounds[i - 1]) if i > 0 else min(0.0, float(self.bounds[0]))
        below = float(self.cumulative[i - 1]) if i > 0 else 0.0
        in_bucket = float(self.cumulative[i]) - below
        if in_bucket <= 0:
            return float(self.bounds[i])
        return lo + (float(self.bounds[i]) - lo) * (rank - below) / in_bucket

    def quantile_floor(self, q: float) -> float:
        """The least the q-quantile can be, given the buckets: the lower edge of the bucket
        holding rank q·count (0 for the first). Every request of that bucket and above took
        longer than it, so a quantile whose floor is at or above a target surely exceeds it,
        while one interpolated above the target inside the bucket that straddles it may not:
        the interpolation assumes the bucket's mass is spread evenly up to its upper edge."""
        i, _ = self._bucket_of(q)
        return float(self.bounds[i - 1]) if i > 0 else min(0.0, float(self.bounds[0]))

    def fraction_surely_above(self, x: float) -> float:
        """The fraction of the observations that surely exceed ``x``: those in buckets whose
        lower edge is at or above it (above the least bound ≥ x). A lower bound of the
        fraction above ``x``, exact where ``x`` is a bucket edge; 0 past the last finite one."""
        i = int(np.searchsorted(self.bounds, x, side="left"))  # the least bound ≥ x
        if i >= len(self.bounds) - 1 or self.count <= 0:
            return 0.0
        return min(max(self.count - float(self.cumulative[i]), 0.0) / self.count, 1.0)

    def cv(self) -> float:
        """Coefficient of variation from the buckets, mass uniform inside each finite bucket
        (E[x²] of U(a,b) = (a²+ab+b²)/3); the +inf bucket's mass sits where it makes the
        bucket mean equal the exact mean Δsum/Δcount (at its lower edge if that is lower).
        Its resolution is the bucket width: a tight distribution inside one bucket reads as
        that bucket's uniform spread."""
        c = np.concatenate(([0.0], self.cumulative))
        counts = c[1:] - c[:-1]  # np.diff, without its Python-level wrapper
        info = self.moments
        if info is None or info.bounds is not self.bounds:
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


def merge_histograms(parts: Sequence[Histogram]) -> Histogram:
    """Sum histogram deltas (engines or pods) over their common bucket bounds."""
    b0 = parts[0].bounds
    if _same_bounds(b0, parts):  # the usual case: the sum below is what the general one adds
        cum = np.zeros(len(b0))
        for p in parts:
            cum += p.cumulative
        return Histogram(b0, cum, math.fsum(p.sum for p in parts), math.fsum(p.count for p in parts),
                         parts[0].moments)
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
    moments = parts[0].moments
    if moments is not None and moments.bounds is b0:
        return True  # a bucket plan's bounds: ascending, read-only
    return b0.ndim == 1 and (len(b0) < 2 or bool((b0[1:] > b0[:-1]).all()))


# A histogram's bucket plan: per series (labels without `le`) the index of each of its buckets in
# the scrape's order, ascending by bound, and the bounds' moments (the bounds read-only, shared).
BucketPlan = tuple[tuple[Labels, np.ndarray, BoundsMoments], ...]


class HistogramCache:
    """The bucket plans learned from a stream of scrapes, kept by its owner (the operator loop
    one for all its scrapes, a virtual-time run one per run) and passed to
    :func:`kneecap.observe.window.window_deltas`.

    ``plans``: a histogram's bucket series, as the tuple of their label tuples in the order the
    scrape listed them -> its :data:`BucketPlan`, or None for anything unusual (a bad or
    repeated `le`, no +Inf bucket, unordered bounds: the general path of
    :mod:`kneecap.observe.window` reads it). The label tuples are the parser's
    (:class:`kneecap.observe.scrape.ParseCache`), the same objects every scrape of every pod of
    a model, so after the first window only bucket values are read. Keyed by the id of the
    first label tuple; the entry holds the whole tuple (so that id is not reused while the
    entry lives) and is checked against it: with shared label tuples that is an identity check
    per bucket, where hashing the labels would cost more than the rest of the window.

    ``batches``: the plans of a window's histograms, by their ids (the entry holds the plans and
    is checked against them by identity) -> :func:`batched_plan` of them.

    Each table is bounded (``max_plans``, ``max_batches``) and emptied when full."""

    def __init__(self, max_plans: int = 10_000, max_batches: int = 1_000):
        self.plans: dict[int, tuple[tuple[Labels, ...], BucketPlan | None]] = {}
        self.batches: dict[tuple[int, ...], tuple] = {}
        self.max_plans, self.max_batches = max_plans, max_batches


def bucket_plan(keys: tuple[Labels, ...], cache: HistogramCache | None = None) -> BucketPlan | None:
    """The plan of the bucket series ``keys`` (see :class:`HistogramCache`): ``cache``'s if it
    holds it, else made (and kept there)."""
    if cache is not None:
        hit = cache.plans.get(id(keys[0]))
        if hit is not None and hit[0] == keys:
            return hit[1]
    plan = _make_bucket_plan(keys)
    if cache is not None:
        if len(cache.plans) >= cache.max_plans:
            cache.plans.clear()
        cache.plans[id(keys[0])] = (keys, plan)
    return plan


def _make_bucket_plan(keys: tuple[Labels, ...]) -> BucketPlan | None:
    per_series: dict[Labels, dict[float, int]] = {}
    try:
        for i, labels in enumerate(keys):
            rest = tuple(kv for kv in labels if kv[0] != "le")
            per_series.setdefault(rest, {})[float(dict(labels).get("le"))] = i  # type: ignore[arg-type]
        groups, shared = [], {}
        for rest, buckets in per_series.items():
            bounds = np.array(sorted(buckets))
            ok = bounds[-1] == math.inf and (len(bounds) < 2 or bool((bounds[1:] > bounds[:-1]).all()))
            if not ok or sum(1 for labels in keys if tuple(kv for kv in labels if kv[0] != "le") == rest) != len(bounds):
                return None  # unordered (NaN) bounds, no +Inf bucket, or two buckets of one bound
            moments = shared.get(bounds.tobytes())
            if moments is None:
                bounds.flags.writeable = False
                moments = shared[bounds.tobytes()] = _bounds_moments(bounds)
            idx = np.array([buckets[b] for b in moments.bounds], dtype=np.intp)
            groups.append((rest, idx, moments))
    except (TypeError, ValueError):
        return None
    return tuple(groups)


def batched_plan(plans: tuple[BucketPlan, ...], cache: HistogramCache | None = None) -> tuple:
    """The bucket order of a window's histograms' ``plans`` all at once: (the plans; per
    histogram its groups as (labels without `le`, bounds' moments, slice of the concatenated
    cumulative counts); the gather index into the concatenated bucket deltas; which
    differences are inside a group; the index of each group's last bucket). ``cache``'s if it
    holds it, else made (and kept there)."""
    key = tuple(map(id, plans))
    if cache is not None:
        hit = cache.batches.get(key)
        if hit is not None and all(map(operator.is_, hit[0], plans)):
            return hit
    gather, inner, last, groups = [], [], [], []
    offset = at = 0
    for plan in plans:
        gs = []
        n = 0
        for rest, idx, moments in plan:
            gather.append(idx + offset)
            inner.extend([False] + [True] * (len(idx) - 1))
            gs.append((rest, moments, slice(at, at + len(idx))))
            at += len(idx)
            last.append(at - 1)
            n += len(idx)
        groups.append(tuple(gs))
        offset += n
    batch = (plans, tuple(groups), np.concatenate(gather), np.array(inner[1:], dtype=bool),
             np.array(last, dtype=np.intp))
    if cache is not None:
        if len(cache.batches) >= cache.max_batches:
            cache.batches.clear()
        cache.batches[key] = batch
    return batch
