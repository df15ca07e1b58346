"""Searches over λ on common random numbers: the SLO-sustainable rate λ* by bisection (GAUSS
Algorithm 1) and the λ sweep (§3.7)."""

from __future__ import annotations

import numpy as np

from kneecap.model.gauss.engine import _Draws, _evaluate
from kneecap.model.gauss.results import QUANTILES, SweepPoint


def _tail(ttft, tbt, q):
    tq = float(np.quantile(ttft, q))
    if tbt is None:
        return tq, None
    v = tbt[tbt >= 0]
    return tq, (float(np.quantile(v, q)) if v.size else None)


HINT_BRACKET = 0.05  # a warm start first brackets λ* within ±5% of the hint


def _sustainable(draws, coef, moments, servers, warm, stable_rps, stable_stage, slo_ttft_s, slo_tbt_s, q,
                 rel_tol=1e-3, hint_rps=None, limits=None):
    """λ* by bisection with common random numbers: the largest λ whose q-quantiles meet the SLOs.

    ``hint_rps`` (a λ* found on nearby inputs) starts the bisection from the bracket ±5% around
    it when the SLOs are met at its lower end and missed at its upper one, and from the full
    range [0, stability limit] otherwise: the same answer to ``rel_tol``, in fewer evaluations."""
    if slo_ttft_s is None and slo_tbt_s is None:
        return stable_rps, stable_stage, None

    def meets(lam):
        ttft, tbt, *_ = _evaluate(draws, coef, moments, lam, servers, warm, want_tbt=slo_tbt_s is not None,
                                  limits=limits)
        tq, bq = _tail(ttft, tbt, q)
        if slo_ttft_s is not None and tq > slo_ttft_s:
            return "ttft_slo", tq
        if slo_tbt_s is not None and bq is not None and bq > slo_tbt_s:
            return "tbt_slo", bq
        return None, None

    def infeasible(why, val):
        stage = "prefill" if why == "ttft_slo" else "decode"
        slo = slo_ttft_s if why == "ttft_slo" else slo_tbt_s
        metric = "TTFT" if why == "ttft_slo" else "TBT"
        return 0.0, why, (f"infeasible: {stage} stage: p{round(q * 100):d} {metric} {val:.4g} s at near-zero "
                          f"load exceeds the SLO {slo:.4g} s (the SLO is below the service time)")

    floor, ceiling = stable_rps * 1e-6, stable_rps * (1.0 - 1e-6)
    # the bracket to bisect: ±5% around the hint when that holds λ*, else [floor, ceiling]
    lo = hi = binding = None
    if hint_rps is not None and floor < hint_rps < ceiling:
        a, b = max(hint_rps * (1.0 - HINT_BRACKET), floor), min(hint_rps * (1.0 + HINT_BRACKET), ceiling)
        why, val = meets(a)
        if why is not None:
            if a == floor:
                return infeasible(why, val)
            hi, binding = a, why
        else:
            lo = a
            why, _ = meets(b)
            if why is None:
                if b == ceiling:
                    return ceiling, stable_stage, None
                lo = b
            else:
                hi, binding = b, why
    if lo is None:
        why, val = meets(floor)
        if why is not None:
            return infeasible(why, val)
        lo = floor
    if hi is None:
        why, _ = meets(ceiling)
        if why is None:
            return ceiling, stable_stage, None
        hi, binding = ceiling, why
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        why, _ = meets(mid)
        if why is None:
            lo = mid
        else:
            hi, binding = mid, why
    return lo, binding, None


def _sweep(draws, coef, moments, servers, warm, stable_rps, points, fractions=None, limits=None):
    fr = np.linspace(0.05, 0.98, points) if fractions is None else np.asarray(fractions)
    out = []
    for lam in fr * stable_rps:
        ttft, tbt, _, _, op, _ = _evaluate(draws, coef, moments, float(lam), servers, warm, limits=limits)
        tt = tuple(float(v) for v in np.quantile(ttft, QUANTILES))
        bt = None
        if tbt is not None and np.any(tbt >= 0):
            bt = tuple(float(v) for v in np.quantile(tbt[tbt >= 0], QUANTILES))
        rho = op.utilisation if op is not None else float(lam / stable_rps)
        out.append(SweepPoint(float(lam), tt, bt, rho))
    return tuple(out)


def _search_draws(draws: _Draws, search_samples: int, servers: int, warm: int):
    """A prefix of the base draws (same random numbers) sized for λ search and sweeps."""
    chains, steps = draws.unit_inter.shape
    keep = min(steps, max(warm + 1000, warm + -(-search_samples // chains)))
    sl = (slice(None), slice(0, keep))
    cut = lambda a: None if a is None else a[sl]  # noqa: E731
    return _Draws(cut(draws.unit_inter), cut(draws.inp), cut(draws.cached), cut(draws.out), cut(draws.z_batch),
                  cut(draws.z_chunk), cut(draws.raw_service_s), cut(draws.prefill_s), cut(draws.chunks),
                  cut(draws.u_residual))
