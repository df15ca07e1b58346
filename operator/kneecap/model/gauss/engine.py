"""The Monte-Carlo engine: base draws (common random numbers across λ) and one evaluation at λ,
prefill, packing, queue, engine limits and TBT (GAUSS Algorithm 1's inner step)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.admission import _apply_limits
from kneecap.model.gauss.errors import _positive
from kneecap.model.gauss.limits import EngineLimits
from kneecap.model.gauss.mean_field import WorkloadMoments, operating_point
from kneecap.model.gauss.queues import _packed_service, queue_waits
from kneecap.model.gauss.service import ServiceCoefficients, prefill_compute_s
from kneecap.model.gauss.tbt import _tbt_mean_field, _tbt_sample_path
from kneecap.model.gauss.workload import lognormal_params, sample_workload, unit_interarrivals


@dataclass(frozen=True)
class _Draws:
    """Base random numbers, fixed across λ (common random numbers)."""

    unit_inter: np.ndarray  # (chains, steps)
    inp: np.ndarray
    cached: np.ndarray
    out: np.ndarray
    z_batch: np.ndarray
    z_chunk: np.ndarray
    raw_service_s: np.ndarray | None  # raw-queue mode: service times
    prefill_s: np.ndarray | None = None  # prefill compute per request (independent of λ)
    chunks: np.ndarray | None = None
    u_residual: np.ndarray | None = None  # U(0, 1): where in the engine's current step a request arrives


def _draw_llm(workload, chains, steps, burst_cv, rng) -> _Draws:
    shape = (chains, steps)
    inter = unit_interarrivals(shape, rng, burst_cv)
    inp, cached, out = (a.reshape(shape) for a in sample_workload(workload, chains * steps, rng))
    return _Draws(inter, inp, cached, out, rng.standard_normal(shape), rng.standard_normal(shape), None,
                  u_residual=rng.random(shape))


def _with_prefill(draws: _Draws, coef: ServiceCoefficients) -> _Draws:
    from dataclasses import replace

    compute, n = prefill_compute_s(coef, draws.inp, draws.cached)
    return replace(draws, prefill_s=compute, chunks=n)


def raw_service_draws(dist: str, mean_s: float, cv: float | None, n: int | tuple, rng: np.random.Generator) -> np.ndarray:
    """Service times for the raw queue: ``exp``, ``det``, ``lognormal`` or ``gamma`` (mean, CV)."""
    mean = _positive("service_mean_s", mean_s)
    if dist == "exp":
        return rng.standard_exponential(n) * mean
    if dist == "det":
        return np.full(n, mean)
    cv = _positive("service_cv", 1.0 if cv is None else cv, allow_zero=True)
    if cv == 0:
        return np.full(n, mean)
    if dist == "lognormal":
        mu, sigma = lognormal_params(mean, cv)
        return np.exp(mu + sigma * rng.standard_normal(n))
    if dist == "gamma":
        k = 1.0 / (cv * cv)
        return rng.standard_gamma(k, n) * (mean / k)
    raise InputError("service_dist", f"expected one of exp, det, lognormal, gamma, got {dist!r}")


def _evaluate(draws: _Draws, coef: ServiceCoefficients | None, moments: WorkloadMoments | None,
              rate_rps: float, servers: int, warm: int, want_tbt: bool = True, limits: EngineLimits | None = None,
              interarrival_s: np.ndarray | None = None):
    """(ttft, tbt or None, wait, service, operating point or None, _Limited or None) at λ: kept
    columns only. ``limits`` None: no batch cap and no KV limit (the paper's GAUSS).
    ``interarrival_s``: given gaps (a trace) instead of the unit draws scaled by 1/λ; λ then
    sets the operating point only."""
    inter = draws.unit_inter / rate_rps if interarrival_s is None else interarrival_s
    if coef is None:
        S = draws.raw_service_s
        W = queue_waits(S, inter, servers)[:, warm:]
        return W + S[:, warm:], None, W, S[:, warm:], None, None
    op = operating_point(coef, moments, rate_rps / servers, limits)
    if op.chunk_tokens == coef.chunk_tokens and draws.prefill_s is not None:
        compute, n = draws.prefill_s, draws.chunks
    else:
        compute, n = prefill_compute_s(coef, draws.inp, draws.cached, op.chunk_tokens)
    full_s = compute + n * op.decode_step_s  # GAUSS §3.4: chunk steps carry the decode batch
    S, shared, lag = full_s, None, np.zeros_like(full_s)
    if coef.prefill_packing and servers == 1:
        S, shared, lag = _packed_service(full_s, compute, n, op.decode_step_s, inter, draws.inp - draws.cached,
                                         op.chunk_tokens)
    slot_steps = n if shared is None else n - shared
    W_all = queue_waits(S, inter, servers)

    def tbt_of(W_all, S, slot_steps, lag):  # per request, every column
        if servers == 1:
            return _tbt_sample_path(coef, moments, op, inter, W_all, S, slot_steps, lag, draws.inp, draws.out)
        return _tbt_mean_field(coef, moments, op, draws.inp, draws.out, draws.z_batch, draws.z_chunk,
                               None if limits is None else limits.slots)

    tbt_all = tbt_of(W_all, S, slot_steps, lag) if (want_tbt or limits is not None) else None
    limited = None
    if limits is not None:
        W_all, S, lag, tbt_all, limited = _apply_limits(
            coef, moments, op, limits, draws, inter, servers, full_s, S, shared, lag, n, W_all, tbt_all, tbt_of, warm)
    W = W_all[:, warm:]
    ttft = W + S[:, warm:] + coef.request_overhead_s  # GAUSS §3.7
    ttft = ttft + lag[:, warm:]
    if draws.u_residual is not None:
        # a request that finds the prefill slot free still waits for the engine's step in flight:
        # residual life of a step of length d̄ (Kleinrock, Queueing Systems I, eq. 5.12; U(0, d̄)
        # for a fixed length), the engine being busy with probability 1 − e^{−B̄} (PASTA)
        busy = -math.expm1(-op.decode_batch)
        ttft = ttft + np.where(W == 0.0, draws.u_residual[:, warm:] * op.decode_step_s * busy, 0.0)
    preempted = limited is not None and limited.preemptions.any()
    if preempted:  # waiting for re-admission and the recompute delay the first token, or the later ones
        ttft = ttft + limited.first_token_delay_s
    tbt = None
    if want_tbt:
        tbt = tbt_all[:, warm:]
        out = draws.out[:, warm:]
        if preempted:
            tbt = tbt + limited.decode_delay_s / np.maximum(out - 1.0, 1.0)
        tbt = np.where(out >= 2.0, tbt, -1.0)  # one output token: no TBT
    return ttft, tbt, W, S[:, warm:], op, limited
