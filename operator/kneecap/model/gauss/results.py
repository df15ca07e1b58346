"""What GAUSS reports: latency statistics with replication CIs, sweep points and the result of
:func:`kneecap.model.gauss.simulate`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.limits import EngineLimits


QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class LatencyStats:
    """Pooled mean and p50/p95/p99 (seconds) with 95% CI half-widths from the spread of
    independent replications (Student t)."""

    mean: float
    p50: float
    p95: float
    p99: float
    mean_ci: float
    p50_ci: float
    p95_ci: float
    p99_ci: float
    # the SLO quantile when it is none of p50/p95/p99 (any q in (0, 1)), else None
    q: float | None = None
    pq: float = math.nan
    pq_ci: float = math.nan

    def quantile(self, q: float) -> float:
        if q == self.q:
            return self.pq
        return {0.5: self.p50, 0.95: self.p95, 0.99: self.p99}[q]

    def to_dict(self) -> dict:
        """JSON-safe: a CI that cannot be estimated (one non-empty replication) is None."""
        ci = {"mean": self.mean_ci, "p50": self.p50_ci, "p95": self.p95_ci, "p99": self.p99_ci}
        out = {"mean": self.mean, "p50": self.p50, "p95": self.p95, "p99": self.p99}
        if self.q is not None:
            out[quantile_name(self.q)] = self.pq
            ci[quantile_name(self.q)] = self.pq_ci
        return {**out, "ci95_halfwidth": {k: (v if math.isfinite(v) else None) for k, v in ci.items()}}


def quantile_name(q: float) -> str:
    """0.95 -> 'p95', 0.9 -> 'p90', 0.975 -> 'p97.5'."""
    return f"p{round(q * 100, 6):g}"


def latency_stats(groups: list[np.ndarray], q: float | None = None) -> LatencyStats:
    """Stats over replications (a list of 1-D sample arrays, one per replication); `q`, an SLO
    quantile other than p50/p95/p99, is summarised too."""
    from scipy.special import stdtrit  # Student t quantile; lighter import than scipy.stats

    pooled = np.concatenate(groups)
    if pooled.size == 0:
        raise InputError("samples", "no samples to summarise")
    extra = q is not None and q not in QUANTILES
    levels = QUANTILES + ((q,) if extra else ())
    qs = np.quantile(pooled, levels)
    per = np.array([[g.mean(), *np.quantile(g, levels)] for g in groups if g.size])
    if per.shape[0] > 1:
        half = stdtrit(per.shape[0] - 1, 0.975) * per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])
    else:
        half = np.full(len(levels) + 1, float("inf"))
    stats = LatencyStats(float(pooled.mean()), *map(float, qs[:3]), *map(float, half[:4]))
    return replace(stats, q=q, pq=float(qs[3]), pq_ci=float(half[4])) if extra else stats


@dataclass(frozen=True)
class SweepPoint:
    rate_rps: float
    ttft_s: tuple[float, float, float]  # p50, p95, p99
    tbt_s: tuple[float, float, float] | None
    utilisation: float


@dataclass(frozen=True)
class GaussResult:
    """Outcome of :func:`simulate`. ``tbt`` is None in raw-queue mode (no decode)."""

    rate_rps: float
    servers: int
    ttft: LatencyStats
    tbt: LatencyStats | None
    wait: LatencyStats
    service: LatencyStats
    service_rate_rps: float  # μ·k = k/E[S] at this rate
    utilisation: float  # ρ per server
    stable_rate_rps: float  # largest stable λ (GAUSS λ* = μ, §3.5)
    stable_binding: str
    sustainable_rate_rps: float  # λ where the SLO quantile crosses the SLO (stable rate if no SLO)
    sustainable_binding: str  # which limit sets it: ttft_slo, tbt_slo, prefill, decode, queue
    sustainable_note: str | None  # "infeasible: …" when no λ > 0 meets the SLO
    decode_batch: float | None
    quantile: float
    samples: int
    replications: int
    sweep: tuple[SweepPoint, ...] = ()
    e2e: LatencyStats | None = None  # TTFT + (OL − 1)·TBT per request (GAUSS §3.7); None in raw-queue mode
    ttft_sample_s: np.ndarray = field(default=None, repr=False, compare=False)  # subsample for plots
    tbt_sample_s: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the engine's limits (None without them, and in raw-queue mode)
    limits: EngineLimits | None = None
    prefill_chunk_tokens: float | None = None  # Δ = budget − ⌊B̄⌋ at this rate
    admission_wait: LatencyStats | None = None  # the wait the batch cap and the KV cache add
    admission_wait_fraction: float | None = None  # P(that wait > 0)
    preempted_fraction: float | None = None  # share of requests preempted (recompute) at least once
    preemptions_per_request: float | None = None
    preemption_mean_s: float | None = None  # latency preemptions add to a preempted request, mean


def _groups(x: np.ndarray, replications: int, valid: np.ndarray | None = None) -> list[np.ndarray]:
    rows = x.reshape(replications, -1)
    if valid is None:
        return list(rows)
    ok = valid.reshape(replications, -1)
    return [r[m] for r, m in zip(rows, ok)]
