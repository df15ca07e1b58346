"""FCFS queue recursions (GAUSS §3.6): Lindley for one server, Kiefer–Wolfowitz for k, the chain
layout they run on, and vLLM's prompt packing on the prefill slot built on Lindley."""

from __future__ import annotations

import numpy as np

from kneecap.errors import InputError


_BLOCK = 1 << 20  # Lindley block length: bounds temporaries to ~8 MiB per array


def lindley_waits(service_s: np.ndarray, interarrival_s: np.ndarray, initial_wait_s: float = 0.0,
                  block: int = _BLOCK) -> np.ndarray:
    """Single-server FCFS waits, W_{n+1} = max(0, W_n + S_n − A_{n+1}), along the last axis.

    ``interarrival_s[..., n]`` is the gap before request n (index 0 unused). Vectorised per
    block (GAUSS §3.6, DESIGN §5.5): with X the partial sums of (S − A) inside the block and
    W₀ the wait carried in, W_n = X_n − min(−W₀, min_{k≤n} X_k). Blocks bound temporaries
    and keep the partial sums small (float64 drift stays ~1e-16·block·E[A]).
    """
    S = np.asarray(service_s, dtype=np.float64)
    A = np.asarray(interarrival_s, dtype=np.float64)
    if S.shape != A.shape:
        raise InputError("interarrival_s", f"expected the shape of service_s {S.shape}, got {A.shape}")
    n = S.shape[-1]
    W = np.empty_like(S)
    if n == 0:
        return W
    W[..., 0] = initial_wait_s
    buf = np.empty(S.shape[:-1] + (min(block, n),))
    for start in range(1, n, block):
        stop = min(start + block, n)
        x = W[..., start:stop]  # X (partial sums) built in place, then turned into W
        low = buf[..., : stop - start]
        np.subtract(S[..., start - 1:stop - 1], A[..., start:stop], out=x)
        np.cumsum(x, axis=-1, out=x)
        np.minimum.accumulate(x, axis=-1, out=low)
        np.minimum(low, -W[..., start - 1:start], out=low)
        np.subtract(x, low, out=x)
    return W


def kiefer_wolfowitz_waits(service_s: np.ndarray, interarrival_s: np.ndarray, servers: int) -> np.ndarray:
    """k-server FCFS waits by the Kiefer–Wolfowitz workload vector, arrays (chains, n).

    w ← sort((w + S_n·e₁ − A_{n+1})⁺); the wait of request n is the smallest workload w₁.
    Cost: a Python loop over the n requests of a chain, vectorised over the chains (one numpy
    call sequence of O(chains·k log k) per request), ~10 µs per step: use many short chains
    (the caller runs ≥ 256) rather than one long one. Exact, not an approximation.
    """
    k = int(servers)
    S = np.ascontiguousarray(np.asarray(service_s, dtype=np.float64).T)  # (n, chains): rows contiguous
    A = np.ascontiguousarray(np.asarray(interarrival_s, dtype=np.float64).T)
    n, chains = S.shape
    out = np.empty((n, chains))
    w = np.zeros((chains, k))
    w0 = w[:, 0]
    for i in range(n):
        out[i] = w0
        w0 += S[i]
        if i + 1 < n:
            w -= A[i + 1][:, None]
            np.maximum(w, 0.0, out=w)
            w.sort(axis=1)
    return out.T


def queue_waits(service_s: np.ndarray, interarrival_s: np.ndarray, servers: int = 1) -> np.ndarray:
    """FCFS waits for 1 (Lindley) or k (Kiefer–Wolfowitz) servers, arrays (chains, n)."""
    if int(servers) == 1:
        return lindley_waits(service_s, interarrival_s)
    return kiefer_wolfowitz_waits(service_s, interarrival_s, servers)


def _layout(samples: int, replications: int, servers: int) -> tuple[int, int, int]:
    """(chains, kept steps per chain, warm-up steps per chain). One chain per replication for a
    single server; ≥ 256 short chains (grouped into replications) for Kiefer–Wolfowitz."""
    if servers == 1:
        kept = -(-samples // replications)
        return replications, kept, kept // 20
    per = max(1, -(-256 // replications))
    chains = replications * per
    kept = -(-samples // chains)
    return chains, kept, max(500, kept // 5)


def _packed_service(full_s, compute_s, chunks, step_s, inter, uncached, budget_tokens, passes: int = 2):
    """Prefill-slot service with vLLM's prompt packing (GAUSS §3.4 amended): a step admits every
    waiting prompt that fits its token budget, so a request that arrived before its predecessor
    started (A_i < W_{i−1}) and fits beside it (s_{i−1} + s_i ≤ Δ) shares that step and
    pays its compute and later chunk steps only, S_i = S_c,i + (n_i − 1)·d̄, instead of
    S_c,i + n_i·d̄. Who waited depends on S: fixed-point passes of the Lindley recurrence (§3.6)
    starting from the unpacked service. Returns (S, whether each request shares its
    predecessor's step, and the lag from the end of each service to the end of the step it
    shares, when its first token comes)."""
    fits = np.zeros(full_s.shape, dtype=bool)
    fits[:, 1:] = uncached[:, 1:] + uncached[:, :-1] <= budget_tokens
    packed_s = compute_s + (chunks - 1.0) * step_s
    S, shared = full_s, np.zeros_like(fits)
    for _ in range(passes):
        W = lindley_waits(S, inter)
        shared[:, 1:] = fits[:, 1:] & (inter[:, 1:] < W[:, :-1])
        S = np.where(shared, packed_s, full_s)
    end = np.cumsum(inter, axis=1) + lindley_waits(S, inter) + S
    return S, shared, _shared_step_lag(end, shared)


def _shared_step_lag(end, shared):
    """Every member of a shared step gets its first token when the step ends, at the last
    member's service end (FCFS ends are nondecreasing): that end minus each one's own."""
    n = end.shape[1]
    last = np.ones_like(shared)
    last[:, :-1] = ~shared[:, 1:]  # i closes its step unless i + 1 joins it
    step_end = np.minimum.accumulate(np.where(last, np.arange(n), n - 1)[:, ::-1], axis=1)[:, ::-1]
    return np.take_along_axis(end, step_end, axis=1) - end
