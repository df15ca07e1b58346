"""Per-request TBT (GAUSS §3.4): read off the simulated path on one server, mean field on k
servers (package docstring)."""

from __future__ import annotations

import math

import numpy as np

from kneecap.model.gauss.service import decode_step_s


def _tbt_mean_field(coef, moments, op, inp, out, z_batch, z_chunk, slots=None):
    """TBT with a fixed-over-lifetime batch 1 + Poisson(B̄) (PASTA; normal approximation), at
    most ``slots``, and a Binomial(K, f)/K share of chunk steps (normal approximation). Used for
    k > 1 servers."""
    b = op.decode_batch
    others = np.maximum(b + math.sqrt(b) * z_batch, 0.0)
    if slots is not None:
        others = np.minimum(others, slots - 1.0)  # the cap bounds the running set
    own_ctx = inp + (out + 1.0) / 2.0
    d = decode_step_s(coef, 1.0 + others, own_ctx + others * moments.context_tokens)
    steps = np.maximum(out - 1.0, 1.0)
    f = min(op.chunk_step_fraction, 1.0)
    frac = np.clip(f + np.sqrt(f * (1.0 - f) / steps) * z_chunk, 0.0, 1.0)
    return d + frac * op.mean_chunk_s  # GAUSS §3.4: chunk steps inflate the decode step


def _occupancy_integral(starts, ends):
    """x ↦ ∫₀ˣ N(u) du for N(u) = #{j: starts_j ≤ u < ends_j}; starts and ends sorted (1-D)."""
    cs = np.concatenate(([0.0], np.cumsum(starts)))
    ce = np.concatenate(([0.0], np.cumsum(ends)))

    def integral(x):
        ks = np.searchsorted(starts, x, side="right")
        ke = np.searchsorted(ends, x, side="right")
        return (ks * x - cs[ks]) - (ke * x - ce[ke])

    return integral


def _tbt_sample_path(coef, moments, op, inter, W, S, slot_steps, lag, inp, out, passes: int = 3):
    """Per-request TBT from the simulated path of one server (vectorised per chain).

    Request i decodes over [D_i, D_i + K_i·τ_i] (D_i = arrival + W + S + lag its first token,
    K_i = OL_i − 1 steps). Over that window we read off the path the prefill slot's busy time
    β_i and the engine steps it spans, k_i (FCFS service intervals are disjoint and ordered:
    cumulative busy time and steps by interpolation; service j spans ``slot_steps[j]`` steps),
    and the time-average decode batch B_i (occupancy integral of all decode windows, its own
    included); the rest of the window runs plain decode steps d(B_i, own + (B_i − 1)·c̄), so
    τ_i = span/(k_i + (span − β_i)/d) (GAUSS §3.4 with each chunk's own cost: a long prompt's
    step stalls every request decoding through it once, not in ℓ̄-sized pieces).
    Fixed-point passes: windows first sized with the mean-field τ̄, then each with its τ_i, the
    batch recomputed from all of them, so a burst that slows steps lengthens the windows that
    make the burst (as in the engine). Bursts thus inflate the TBT of every request decoding
    through them (correlated, unlike a binomial).
    """
    own_ctx = inp + (out + 1.0) / 2.0
    steps = np.maximum(out - 1.0, 1.0)
    tbt = np.empty_like(S)
    for row in range(S.shape[0]):
        arrival = np.cumsum(inter[row])
        start = arrival + W[row]  # service starts: nondecreasing for one FCFS server
        ends = start + S[row]  # service ends: nondecreasing too (next start ≥ this end)
        # cumulative busy time of the slot, piecewise linear with knots at starts and ends
        knots = np.empty(2 * ends.size)
        knots[0::2], knots[1::2] = start, ends
        first = ends + lag[row]  # first tokens (a shared step ends with its last member)
        cum = np.concatenate(([0.0], np.cumsum(S[row])))
        level = np.empty_like(knots)
        level[0::2], level[1::2] = cum[:-1], cum[1:]
        cum_steps = np.concatenate(([0.0], np.cumsum(slot_steps[row])))
        step_level = np.empty_like(knots)
        step_level[0::2], step_level[1::2] = cum_steps[:-1], cum_steps[1:]
        busy_first = np.interp(first, knots, level)
        steps_first = np.interp(first, knots, step_level)
        tau = np.full(first.shape, op.mean_step_s)
        for _ in range(passes):
            end = first + steps[row] * tau
            occupancy = _occupancy_integral(first, np.sort(end))  # every window at its current τ
            occ_first = occupancy(first)
            span = end - first
            order = np.argsort(end)  # sorted queries make the binary searches cache-friendly
            busy_end = np.empty_like(end)
            busy_end[order] = np.interp(end[order], knots, level)
            steps_end = np.empty_like(end)
            steps_end[order] = np.interp(end[order], knots, step_level)
            occ_end = np.empty_like(end)
            occ_end[order] = occupancy(end[order])
            busy = np.clip(busy_end - busy_first, 0.0, span)
            batch = np.maximum((occ_end - occ_first) / span, 1.0)
            d = decode_step_s(coef, batch, own_ctx[row] + (batch - 1.0) * moments.context_tokens)
            tau = span / np.maximum(steps_end - steps_first + (span - busy) / d, 1e-12)
        tbt[row] = tau
    return tbt
