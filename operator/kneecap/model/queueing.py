"""Queueing building blocks for SARA: length distributions, Erlang-C, heavy-traffic waiting tails.

Pure numpy/scipy, vectorised over their array arguments. Symbols follow SARA (paper 001) and
DESIGN.md §5.4: A offered load (Erlangs), k servers, w the mean of the exponential waiting tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import special

from kneecap.errors import InputError

FAMILIES = ("lognormal", "gamma")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution given by mean and coefficient of variation.

    ``lognormal`` is SARA's heavy-tailed model (§VII-A: LN[μ, σ²] with σ² = log(1 + CV²));
    ``gamma`` is the light-tailed one (exponential at CV = 1, SARA's OL ~ Exp[1/ℓ_o]).
    """

    mean_tok: float
    cv: float
    family: str = "gamma"

    def __post_init__(self):
        if not (np.isfinite(self.mean_tok) and self.mean_tok > 0):
            raise InputError("mean_tok", f"expected a positive token count, got {self.mean_tok!r}")
        if not (np.isfinite(self.cv) and 0 < self.cv <= 10):
            raise InputError("cv", f"expected a coefficient of variation in (0, 10], got {self.cv!r}")
        if self.family not in FAMILIES:
            raise InputError("family", f"expected one of {FAMILIES}, got {self.family!r}")

    # lognormal parameters (SARA §VII-A: ℓ = e^{μ+σ²/2})
    @property
    def sigma(self) -> float:
        return float(np.sqrt(np.log1p(self.cv**2)))

    @property
    def mu(self) -> float:
        return float(np.log(self.mean_tok) - 0.5 * self.sigma**2)

    # gamma parameters: shape α = 1/CV², scale θ = ℓ·CV²
    @property
    def shape(self) -> float:
        return 1.0 / self.cv**2

    @property
    def scale(self) -> float:
        return self.mean_tok * self.cv**2

    def cdf(self, x):
        x = np.maximum(np.asarray(x, dtype=float), 0.0)
        if self.family == "lognormal":
            with np.errstate(divide="ignore"):
                return special.ndtr((np.log(x) - self.mu) / self.sigma)
        return special.gammainc(self.shape, x / self.scale)

    def ppf(self, u):
        u = np.asarray(u, dtype=float)
        if self.family == "lognormal":
            return np.exp(self.mu + self.sigma * special.ndtri(u))
        return special.gammaincinv(self.shape, u) * self.scale

    def raw_moment(self, k: int) -> float:
        """E[X^k] in closed form."""
        if self.family == "lognormal":
            return float(np.exp(k * self.mu + 0.5 * k * k * self.sigma**2))
        return float(self.scale**k * np.exp(special.gammaln(self.shape + k) - special.gammaln(self.shape)))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.family == "lognormal":
            return rng.lognormal(self.mu, self.sigma, n)
        return rng.gamma(self.shape, self.scale, n)

    @cached_property
    def _gauss(self) -> tuple[np.ndarray, np.ndarray]:
        """Gauss nodes/weights for E[f(X)]: Hermite in log space, generalised Laguerre for gamma."""
        n = 96
        if self.family == "lognormal":
            t, wt = special.roots_hermite(n)
            return np.exp(self.mu + self.sigma * np.sqrt(2.0) * t), wt / np.sqrt(np.pi)
        t, wt = special.roots_genlaguerre(n, self.shape - 1.0)
        return t * self.scale, wt / special.gamma(self.shape)

    def expect(self, f) -> float:
        """E[f(X)] by Gauss quadrature (f vectorised)."""
        x, wt = self._gauss
        return float(np.sum(wt * f(x)))

    def quantile_nodes(self, n: int) -> np.ndarray:
        """Midpoint quantiles x_i = F⁻¹((i − ½)/n): an n-point rule for ∫ g dF."""
        return self.ppf((np.arange(n) + 0.5) / n)


def erlang_c(k, a):
    """Erlang-C probability of waiting C_k(A) for k servers at offered load A (SARA (21)).

    Via Erlang B = Poisson pmf/cdf (stable for large k): C = k·B / (k − A·(1 − B)).
    Returns 1 where A ≥ k (unstable) and 0 where A = 0.
    """
    k = np.asarray(k, dtype=float)
    a = np.asarray(a, dtype=float)
    a_safe = np.maximum(a, 1e-300)
    log_pmf = k * np.log(a_safe) - a_safe - special.gammaln(k + 1.0)
    cdf = special.gammaincc(k + 1.0, a_safe)
    erlang_b = np.exp(log_pmf) / np.maximum(cdf, 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = k * erlang_b / (k - a * (1.0 - erlang_b))
    c = np.where(a >= k, 1.0, np.clip(c, 0.0, 1.0))
    return np.where(a <= 0, 0.0, c)


def heavy_traffic_wait_mean_s(mean_service_s, scv_service, k, a):
    """w = E[S]·(1 + c_s²) / (2·(k − A)): mean of the exponential waiting tail (DESIGN §5.4;
    SARA (21) for M/G/k, Pollaczek–Khinchine E[W | W > 0] at k = 1). Infinite where A ≥ k."""
    k = np.asarray(k, dtype=float)
    a = np.asarray(a, dtype=float)
    gap = k - a
    with np.errstate(divide="ignore"):
        return np.where(gap > 0, mean_service_s * (1.0 + scv_service) / (2.0 * np.maximum(gap, 1e-300)), np.inf)


def sojourn_attainment(threshold_s, service_nodes_s, service_cdf_at_threshold, p_wait, w_s):
    """Pr(W + S ≤ τ) ≈ F_S(τ) − P_wait·∫₀^τ e^{−(τ−s)/w} dF_S(s) (SARA (25), DESIGN §5.4).

    ``service_nodes_s``: (..., n) midpoint-quantile nodes of S (the integral's n-point rule);
    ``p_wait`` and ``w_s`` broadcast against the leading axes. Zero where w is infinite (ρ ≥ 1).
    """
    s = np.asarray(service_nodes_s, dtype=float)
    w = np.asarray(w_s, dtype=float)[..., None]
    tau = np.asarray(threshold_s, dtype=float)[..., None]
    finite = np.isfinite(w)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        kernel = np.where((s <= tau) & finite, np.exp(-(tau - s) / np.where(finite, w, 1.0)), 0.0)
    integral = kernel.mean(axis=-1)
    out = np.asarray(service_cdf_at_threshold) - np.asarray(p_wait) * integral
    return np.where(finite[..., 0], np.clip(out, 0.0, 1.0), 0.0)


def moment_matched_cdf(x, mean, var, family: str):
    """CDF at x of the gamma (light tail, SARA (43)) or log-normal (heavy tail, Fenton–Wilkinson,
    SARA (44)) with the given mean and variance."""
    x = np.asarray(x, dtype=float)
    mean = np.asarray(mean, dtype=float)
    var = np.maximum(np.asarray(var, dtype=float), 1e-300)
    xpos = np.maximum(x, 0.0)
    if family == "lognormal":
        s2 = np.log1p(var / mean**2)
        with np.errstate(divide="ignore"):
            out = special.ndtr((np.log(xpos) - np.log(mean) + 0.5 * s2) / np.sqrt(s2))
    else:
        out = special.gammainc(mean**2 / var, xpos * mean / var)
    return np.where(x > 0, out, 0.0)


def moment_matched_ppf(q, mean, var, family: str):
    """Quantile of the moment-matched gamma / log-normal (inverse of ``moment_matched_cdf``)."""
    mean = np.asarray(mean, dtype=float)
    var = np.maximum(np.asarray(var, dtype=float), 1e-300)
    if family == "lognormal":
        s2 = np.log1p(var / mean**2)
        return np.exp(np.log(mean) - 0.5 * s2 + np.sqrt(s2) * special.ndtri(q))
    return special.gammaincinv(mean**2 / var, q) * var / mean
