"""The mean-field steady state of one server (GAUSS §3.5, §3.8): workload moments, the operating
point (decode batch B̄ by Little's law, chunk Δ, utilisation) and the stability limit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kneecap.model.gauss.errors import Infeasible
from kneecap.model.gauss.limits import EngineLimits
from kneecap.model.gauss.service import ServiceCoefficients, prefill_compute_s


KV_QUANTILE = 0.99  # the resident context's quantile the KV cache must hold to be stable (SARA p_mem)
KV_Z = 2.3263478740408408  # Φ⁻¹(KV_QUANTILE)


@dataclass(frozen=True)
class WorkloadMoments:
    """Moments of a sampled workload under given coefficients (per request)."""

    prefill_compute_s: float  # E[S_c] at Δ = the whole budget
    chunks: float  # E[n] at Δ = the whole budget
    output_tokens: float  # E[OL]
    context_tokens: float  # c̄: decode-time-weighted mean resident context per sequence
    shared_prefix_tokens: float = 0.0  # the longest cached prefix: its blocks are resident once
    # a decoding sequence's own resident context (uncached prompt + tokens so far), decode-time
    # weighted: mean and second moment (the KV cache's compound-Poisson load)
    resident_tokens: float = 0.0
    resident_m2_tokens2: float = 0.0
    # distinct (uncached, cached) prompt shapes and their counts: E[S_c], E[n] at any other Δ
    shapes: tuple = field(default=(), repr=False, compare=False)

    def prefill_at(self, coef: ServiceCoefficients, chunk_tokens: float) -> tuple[float, float]:
        """(E[S_c], E[n]) with chunks of Δ = ``chunk_tokens`` (GAUSS §3.2 over the sampled shapes)."""
        if chunk_tokens == coef.chunk_tokens or not self.shapes:
            return self.prefill_compute_s, self.chunks
        uncached, cached, count = self.shapes
        compute, n = prefill_compute_s(coef, uncached + cached, cached, chunk_tokens)
        return float(compute @ count / count.sum()), float(n @ count / count.sum())


def workload_moments(coef: ServiceCoefficients, inp, cached, out) -> WorkloadMoments:
    compute, n = prefill_compute_s(coef, inp, cached)
    own_ctx = inp + (out + 1.0) / 2.0  # eq. 12 / OL: mean context during this request's decode
    c = np.asarray(cached, dtype=np.float64).ravel()
    s = np.maximum(np.asarray(inp, dtype=np.float64).ravel() - c, 1.0)
    key, count = np.unique(s.astype(np.int64) << 32 | c.astype(np.int64), return_counts=True)
    shapes = ((key >> 32).astype(np.float64), (key & 0xFFFFFFFF).astype(np.float64), count.astype(np.float64))
    # own context x = s + k, k uniform over the decode: E[x] = s + (OL + 1)/2, E[x²] ≈ s² + s·OL + OL²/3
    own = np.asarray(inp, dtype=np.float64) - np.asarray(cached, dtype=np.float64)
    weight = out / out.sum()
    return WorkloadMoments(float(compute.mean()), float(n.mean()), float(out.mean()),
                           float((out * own_ctx).sum() / out.sum()), float(c.max(initial=0.0)),
                           float((weight * (own + (out + 1.0) / 2.0)).sum()),
                           float((weight * (own * own + own * out + out * out / 3.0)).sum()), shapes)


@dataclass(frozen=True)
class OperatingPoint:
    """Mean-field steady state of one server at per-server rate λ_s (GAUSS §3.5, §3.8)."""

    rate_per_server_rps: float
    decode_batch: float  # B̄, time-average sequences in decode (Little's law: λ_s·E[OL]·τ)
    decode_step_s: float  # d̄: decode cost an engine step carries (expectation over Poisson(B̄), empty = p)
    mean_step_s: float  # τ: mean step time a decoding request sees (itself in the batch), chunks included
    chunk_step_fraction: float  # f = λ_s·E[n]·d̄/(1 − ρ_c): share of engine steps carrying a prefill chunk
    mean_chunk_s: float  # ℓ̄ = E[S_c]/E[n]
    mean_service_s: float  # E[S] = E[S_c] + E[n]·d̄
    utilisation: float  # ρ = λ_s·E[S]
    chunk_tokens: float  # Δ = budget − ⌊B̄⌋: the decodes take their tokens of the budget first
    prefill_compute_s: float  # E[S_c] at Δ
    chunks: float  # E[n] at Δ
    running_seqs: float  # ρ + B̄: mean sequences in the running set (prefilling and decoding)


def _decode_mean(coef: ServiceCoefficients, b: float, cbar: float) -> float:
    # E over B ~ Poisson(b) of d(B, B·c̄) with an empty batch costing p only.
    return (coef.decode_step_s + coef.decode_s_per_context_token * cbar * (-math.expm1(-b))
            + (coef.decode_s_per_seq + coef.decode_s_per_resident_token * cbar) * b)


def _mean_field(coef: ServiceCoefficients, m: WorkloadMoments, lam: float, compute_s: float, chunks: float):
    """(B̄, τ, d̄, E[S], ρ, f) at per-server λ with prefill moments (E[S_c], E[n]) (GAUSS §3.8)."""
    rho_c = lam * compute_s
    slope = coef.decode_s_per_seq + coef.decode_s_per_resident_token * m.context_tokens
    den = 1.0 - rho_c - lam * m.output_tokens * slope
    if rho_c >= 1.0:
        raise Infeasible("prefill", f"prefill compute alone loads the server to ρ = {rho_c:.3g} ≥ 1 at {lam:.4g} req/s per server",
                         utilisation=rho_c)
    if den <= 0.0:
        raise Infeasible("decode", f"decode batch grows without bound at {lam:.4g} req/s per server "
                         f"(1 − ρ_c − λ·E[OL]·(r + s·c̄) = {den:.3g} ≤ 0)", margin=den)
    # A decoding request is itself in the batch: its steps see 1 + Poisson(B̄) sequences (PASTA),
    # mean cost p + q·c̄ + (r + s·c̄)·(1 + B̄) (d is affine in B with C = B·c̄), stretched by the
    # chunk steps to τ = that/(1 − ρ_c). Little's law B̄ = λ·E[OL]·τ is then linear in B̄.
    k = lam * m.output_tokens / (1.0 - rho_c)
    tagged0 = coef.decode_step_s + coef.decode_s_per_context_token * m.context_tokens + slope
    b = k * tagged0 / (1.0 - k * slope)  # 1 − k·slope > 0 ⟺ den > 0
    tau = (tagged0 + slope * b) / (1.0 - rho_c)
    dbar = _decode_mean(coef, b, m.context_tokens)  # what a prefill chunk step carries
    service = compute_s + chunks * dbar
    rho = lam * service
    if rho >= 1.0:
        # name the stage whose work dominates the saturated prefill slot
        stage = "decode" if chunks * dbar > compute_s else "prefill"
        raise Infeasible(stage, f"ρ = λ·E[S] = {rho:.3g} ≥ 1 at {lam:.4g} req/s per server (E[S] = {service:.4g} s: "
                         f"prefill compute {compute_s:.4g} s + {chunks:.3g} chunk steps × decode batch "
                         f"step {dbar:.4g} s at B̄ = {b:.3g})", utilisation=rho)
    # engine steps per second 1/τ_sys with τ_sys = d̄/(1 − ρ_c); a share f of them carries a chunk
    f = lam * chunks * dbar / (1.0 - rho_c)  # f < 1 ⟺ ρ < 1
    return b, tau, dbar, service, rho, f


def operating_point(coef: ServiceCoefficients, m: WorkloadMoments, rate_per_server_rps: float,
                    limits: EngineLimits | None = None) -> OperatingPoint:
    """Mean decode batch by Little's law B̄ = λ_s·E[OL]·τ(B̄) (GAUSS §3.8, closed form since d is
    affine in B) at the chunk Δ = budget − ⌊B̄⌋ (a fixed point: a few iterations); raise
    Infeasible when decode (1 − ρ_c − λ·E[OL]·(r + s·c̄) ≤ 0), prefill (ρ = λ·E[S] ≥ 1), the
    batch cap (ρ + B̄ ≥ slots) or the KV cache (the p99 of the decode batch's resident context
    at capacity: package docstring) is unstable."""
    lam = float(rate_per_server_rps)
    budget = float(coef.chunk_tokens)
    delta, tried = budget, []
    while True:
        compute, chunks = m.prefill_at(coef, delta)
        b, tau, dbar, service, rho, f = _mean_field(coef, m, lam, compute, chunks)
        nxt = budget - math.floor(b)  # vLLM V1 schedules the running decodes (one token each) first
        if nxt < 1.0:
            raise Infeasible("decode", f"the {b:.4g} decoding sequences fill the token budget {budget:g} at "
                             f"{lam:.4g} req/s per server: no prefill chunk fits", margin=nxt)
        if nxt == delta:
            break
        tried.append(delta)
        if nxt in tried or len(tried) >= 8:  # a cycle between two Δ: keep the smaller (more chunks)
            delta = min(nxt, delta)
            compute, chunks = m.prefill_at(coef, delta)
            b, tau, dbar, service, rho, f = _mean_field(coef, m, lam, compute, chunks)
            break
        delta = nxt
    if limits is not None:
        slots = limits.slots
        if rho + b >= slots:
            raise Infeasible("batch", f"the running set needs ρ + B̄ = {rho + b:.4g} ≥ {slots} sequences "
                             f"(max_num_seqs) at {lam:.4g} req/s per server", utilisation=(rho + b) / slots)
        if limits.kv_capacity_tokens is not None:
            # resident context of B ~ Poisson(B̄) sequences: compound Poisson, mean B̄·E[x], variance
            # B̄·E[x²] (x own context + half a block); its KV_QUANTILE must fit, else recompute
            # preemption thrashes (SARA's C2 at p_mem, normal approximation; checked on the twin)
            half = limits.block_size / 2.0
            mean_x = m.resident_tokens + half
            m2_x = m.resident_m2_tokens2 + 2.0 * half * m.resident_tokens + half * half
            need = b * mean_x + KV_Z * math.sqrt(b * m2_x) + m.shared_prefix_tokens
            if need >= limits.kv_capacity_tokens:
                raise Infeasible("kv", f"the resident context of the decode batch (B̄ = {b:.4g}) reaches {need:.4g} "
                                 f"tokens at its p{KV_QUANTILE * 100:g}, ≥ the cache's {limits.kv_capacity_tokens} "
                                 f"at {lam:.4g} req/s per server", utilisation=need / limits.kv_capacity_tokens)
    return OperatingPoint(lam, b, dbar, tau, f, compute / max(chunks, 1e-300), service, rho, delta, compute, chunks,
                          rho + b)


def stability_limit_rps(coef: ServiceCoefficients, m: WorkloadMoments, servers: int = 1,
                        limits: EngineLimits | None = None) -> tuple[float, str]:
    """Largest total λ with every stage stable (bisection on the mean-field model) and the stage
    that binds there."""
    def stable(lam):
        try:
            operating_point(coef, m, lam / servers, limits)
            return None
        except Infeasible as exc:
            return exc.stage
    hi = servers / max(m.prefill_compute_s + m.chunks * coef.decode_step_s, 1e-300)  # ρ(λ) ≥ λ·E[S] at B̄ = 0
    for _ in range(60):  # smaller chunks (Δ < budget) can cost less attention: make sure hi is unstable
        if stable(hi) is not None:
            break
        hi *= 2.0
    lo = 0.0
    stage = stable(hi) or "prefill"
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        st = stable(mid)
        if st is None:
            lo = mid
        else:
            hi, stage = mid, st
        if hi - lo <= 1e-10 * hi:
            break
    return lo, stage
