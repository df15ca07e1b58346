"""GAUSS workloads (paper 003 §3.1): length distributions, weighted buckets, and their sampling,
with unit-rate arrivals (Poisson or Gamma) fixed across λ for common random numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.errors import _positive


@dataclass(frozen=True)
class FixedLength:
    tokens: float


@dataclass(frozen=True)
class ExponentialLength:
    mean: float


@dataclass(frozen=True)
class LogNormalLength:
    """Log-normal from mean and coefficient of variation: σ² = ln(1 + cv²), μ = ln(mean) − σ²/2."""

    mean: float
    cv: float


@dataclass(frozen=True)
class HistogramLength:
    """Empirical lengths as vLLM exports a histogram: finite ``le`` upper bounds and the
    *cumulative* counts at each (Prometheus style; a trailing +Inf bound is allowed).
    Sampled by inverse CDF, linear within a bucket from the previous bound (0 for the first);
    mass in the +Inf bucket is placed at the last finite bound."""

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]


LengthDist = Union[FixedLength, ExponentialLength, LogNormalLength, HistogramLength]


@dataclass(frozen=True)
class Workload:
    """Independent length distributions; ``cached_tokens`` is the reused prefix (≤ input − 1)."""

    input_tokens: LengthDist
    output_tokens: LengthDist
    cached_tokens: LengthDist | None = None


@dataclass(frozen=True)
class BucketWorkload:
    """GAUSS §3.1 weighted buckets: per bucket (input, cached prefix, output) and a weight."""

    input_tokens: tuple[float, ...]
    cached_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    weights: tuple[float, ...]


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(μ, σ) of the log-normal with the given mean and CV (moment matching)."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator, field_name: str = "length") -> np.ndarray:
    """Draw ``n`` real-valued lengths (tokens, or seconds for service times) as float64."""
    if isinstance(dist, FixedLength):
        return np.full(n, _positive(f"{field_name}.tokens", dist.tokens, allow_zero=True))
    if isinstance(dist, ExponentialLength):
        return rng.standard_exponential(n) * _positive(f"{field_name}.mean", dist.mean)
    if isinstance(dist, LogNormalLength):
        mean = _positive(f"{field_name}.mean", dist.mean)
        cv = _positive(f"{field_name}.cv", dist.cv, allow_zero=True)
        if cv == 0:
            return np.full(n, mean)
        mu, sigma = lognormal_params(mean, cv)
        return np.exp(mu + sigma * rng.standard_normal(n))
    if isinstance(dist, HistogramLength):
        bounds = np.asarray(dist.upper_bounds, dtype=np.float64)
        cum = np.asarray(dist.cumulative_counts, dtype=np.float64)
        if bounds.ndim != 1 or bounds.shape != cum.shape or bounds.size == 0:
            raise InputError(f"{field_name}.upper_bounds", "expected equal-length 1-D bounds and cumulative counts")
        if np.isinf(bounds[-1]):
            if bounds.size < 2:
                raise InputError(f"{field_name}.upper_bounds", "need at least one finite bound")
            bounds = bounds.copy()
            bounds[-1] = bounds[-2]
        if not np.all(np.isfinite(bounds)) or np.any(np.diff(bounds) < 0) or bounds[0] < 0:
            raise InputError(f"{field_name}.upper_bounds", "expected non-negative increasing bounds")
        if np.any(np.diff(cum) < 0) or cum[0] < 0 or cum[-1] <= 0:
            raise InputError(f"{field_name}.cumulative_counts", "expected non-decreasing cumulative counts with a positive total")
        cdf = np.concatenate(([0.0], cum / cum[-1]))
        edges = np.concatenate(([0.0], bounds))
        u = rng.random(n)
        # inverse CDF, linear within buckets; np.interp needs increasing xp: drop empty buckets
        keep = np.concatenate((np.diff(cdf) > 0, [True]))  # flat runs keep their last edge
        return np.interp(u, cdf[keep], edges[keep])
    raise InputError(field_name, f"unknown length distribution {type(dist).__name__}")


def sample_workload(workload: Workload | BucketWorkload, n: int, rng: np.random.Generator):
    """(input, cached, output) token counts, integers ≥ 1 stored as float64; cached ≤ input − 1."""
    if isinstance(workload, BucketWorkload):
        w = np.asarray(workload.weights, dtype=np.float64)
        cols = [np.asarray(c, dtype=np.float64) for c in (workload.input_tokens, workload.cached_tokens, workload.output_tokens)]
        if w.ndim != 1 or w.size == 0 or any(c.shape != w.shape for c in cols):
            raise InputError("workload.weights", "expected one weight per bucket and equal-length bucket columns")
        if np.any(w < 0) or not w.sum() > 0 or not np.all(np.isfinite(w)):
            raise InputError("workload.weights", "expected non-negative weights with a positive sum")
        if np.any(cols[0] < 1) or np.any(cols[2] < 1) or np.any(cols[1] < 0):
            raise InputError("workload.input_tokens", "expected input and output ≥ 1 and cached ≥ 0 tokens per bucket")
        idx = np.searchsorted(np.cumsum(w) / w.sum(), rng.random(n), side="right")
        idx = np.minimum(idx, w.size - 1)
        inp, cached, out = (c[idx] for c in cols)
    elif isinstance(workload, Workload):
        inp = sample_lengths(workload.input_tokens, n, rng, "input_tokens")
        out = sample_lengths(workload.output_tokens, n, rng, "output_tokens")
        cached = (sample_lengths(workload.cached_tokens, n, rng, "cached_tokens")
                  if workload.cached_tokens is not None else np.zeros(n))
    else:
        raise InputError("workload", f"expected Workload or BucketWorkload, got {type(workload).__name__}")
    inp = np.maximum(np.rint(inp), 1.0)
    out = np.maximum(np.rint(out), 1.0)
    cached = np.clip(np.rint(cached), 0.0, inp - 1.0)
    return inp, cached, out


def unit_interarrivals(shape, rng: np.random.Generator, burst_cv: float = 1.0) -> np.ndarray:
    """Inter-arrival times of a unit-rate process (mean 1): exponential (Poisson arrivals,
    burst_cv = 1) or Gamma with shape 1/cv² (burst_cv ≠ 1). Divide by λ for rate λ; keeping
    these fixed across λ gives common random numbers."""
    cv = _positive("burst_cv", burst_cv, allow_zero=True)
    if cv == 1.0:
        return rng.standard_exponential(shape)
    if cv == 0.0:
        return np.ones(shape)
    k = 1.0 / (cv * cv)
    return rng.standard_gamma(k, shape) / k
