"""The path under the engine's limits (package docstring, "Engine limits"): admission under the
batch cap (Kiefer–Wolfowitz over seats) and the KV cache (event by event, recompute preemption)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kneecap.model.gauss.queues import _shared_step_lag
from kneecap.model.gauss.service import prefill_compute_s


@dataclass(frozen=True)
class _Limited:
    """What the engine's limits did to the kept requests of one evaluation."""

    admission_wait_s: np.ndarray  # queueing delay the batch cap and the KV cache add (W − W uncapped)
    preemptions: np.ndarray  # times each request was preempted (recompute)
    first_token_delay_s: np.ndarray  # what preemptions before the first token add to TTFT
    decode_delay_s: np.ndarray  # what preemptions after it add to the decode time


LIMIT_PASSES = 3  # fixed-point passes of admission ↔ decode windows once a limit binds (p95 TTFT within ~3%)


def _apply_limits(coef, moments, op, limits, draws, inter, servers, full_s, S, shared, lag, chunks, W_all, tbt_all,
                  tbt_of, warm):
    """The path under the batch cap and the KV cache (package docstring, "Engine limits"):
    (W, S, lag, TBT for every column, _Limited on the kept columns). Unchanged where no limit
    binds on the uncapped path."""
    arrival = np.cumsum(inter, axis=1)
    out = draws.out
    slots = servers * limits.slots  # k engines behind one queue pool their running sets
    kv = None
    if limits.kv_capacity_tokens is not None:  # the longest cached prefix is resident once
        kv = servers * limits.kv_capacity_tokens - moments.shared_prefix_tokens
    prompt = draws.inp - draws.cached + limits.block_size / 2.0  # own blocks, half a block rounding
    steps = np.maximum(out - 1.0, 0.0)

    def windows(W_all, S, lag, tbt_all):  # (start, first token, departure, tokens/s of KV growth)
        start = arrival + W_all
        first = start + S + lag
        return (start, first, first + np.where(steps > 0, steps * tbt_all, 0.0),
                np.where(steps > 0, 1.0 / np.maximum(tbt_all, 1e-300), 0.0))

    start, first, dep, growth = windows(W_all, S, lag, tbt_all)
    kept = (slice(None), slice(warm, None))
    none = np.zeros(out[kept].shape)
    seats_bind, kv_binds = _limits_bind(start, first, dep, prompt, growth, slots, kv)
    if not (seats_bind or kv_binds):
        return W_all, S, lag, tbt_all, _Limited(none, none, none, none)
    if not kv_binds:
        kv = None  # a cache the uncapped path never fills holds the capped one too (fewer run at once)
    unshared = np.zeros(S.shape, dtype=bool) if shared is None else shared
    if kv is not None:  # a preempted request recomputes its prompt and the tokens it has (§3.2 at Δ, §3.4)
        top_s, top_n = prefill_compute_s(coef, draws.inp + steps, draws.cached, op.chunk_tokens)
        redo = (full_s, top_s + top_n * op.decode_step_s, steps)
    hold = dep - first
    for k in range(LIMIT_PASSES):
        if kv is None:
            p, p0, S_used, switched = _admit(arrival, S, full_s, unshared, lag, hold, servers, slots)
            preemptions = first_delay = decode_delay = np.zeros(S.shape)
        else:
            p, p0, S_used, switched, preemptions, first_delay, decode_delay = _admit_kv(
                arrival, S, full_s, unshared, lag, hold, servers, slots, kv, prompt, growth, *redo)
        lag_now = lag
        if shared is not None:
            now = shared & ~switched  # a request the limits held back no longer shares its predecessor's step
            lag_now = _shared_step_lag(p + S_used, now)
            slot_steps = chunks - now
        else:
            slot_steps = chunks
        W_new = p - arrival
        tbt_all = tbt_of(W_new, S_used, slot_steps, lag_now)
        start, first, dep, growth = windows(W_new, S_used, lag_now, tbt_all)
        # the next pass holds seats for the mean of the last two decode windows: the plain
        # iteration oscillates (long holds queue requests, which shortens the next pass's holds)
        hold = 0.5 * (hold + dep - first) if k else dep - first
    return W_new, S_used, lag_now, tbt_all, _Limited((p - p0)[kept], preemptions[kept], first_delay[kept],
                                                     decode_delay[kept])


def _admit(arrival, service, unshared_service, shared, lag, decode, servers, slots):
    """Prefill starts p_i under FCFS with ``servers`` prefill slots and ``slots`` running-set
    seats, per chain (the recurrence of the package docstring):

        p_i = max(a_i, e_i, h_i),  e_i the earliest free prefill slot, h_i the earliest free
        seat (Kiefer–Wolfowitz over seats: a heap of their free times).

    A seat is held from p_i to the departure p_i + S_i + lag_i + decode_i. Also returns the
    starts p0 of the prefill slots alone (no cap), the service used (a request the cap holds
    back pays its own first chunk step: it no longer shares a predecessor's) and which
    requests that happened to. Compiled per chain (``kv_events.admit_chain``): O(log k) heap
    steps per request."""
    from kneecap.model.gauss.kv_events import admit_chain

    outs = [np.empty_like(arrival), np.empty_like(arrival), service.copy(), np.zeros(arrival.shape, dtype=bool)]
    for row in range(arrival.shape[0]):
        chain = [np.ascontiguousarray(x[row], dtype=float) for x in (arrival, service, unshared_service)]
        got = admit_chain(*chain, np.ascontiguousarray(shared[row], dtype=np.bool_),
                          np.ascontiguousarray(lag[row], dtype=float), np.ascontiguousarray(decode[row], dtype=float),
                          int(servers), int(slots))
        for arr, vals in zip(outs, got):
            arr[row] = vals
    return tuple(outs)


def _admit_kv(arrival, service, unshared_service, shared, lag, decode, servers, slots, kv, prompt, growth,
              redo_first_s, redo_last_s, steps):
    """:func:`_admit` with a KV cache of ``kv`` tokens, event by event per chain (package
    docstring, "KV cache"). The running set's resident context is R(t) = Σ r_j + g_j·(t − f_j)
    (r_j resident at its admission, g_j = 1/τ_j tokens/s from its first token f_j). A request
    is admitted when a seat is free, no preempted request waits and R leaves room for its
    prompt; when R reaches ``kv`` the newest running request is preempted (recompute): it
    frees its blocks and waits at the front of the queue; re-admitted when a departure leaves
    room, it recomputes its prompt and the k tokens it had on a prefill slot (``redo_first_s``
    + (``redo_last_s`` − ``redo_first_s``)·k/``steps``) and decodes the rest. Returns (p, p0,
    service used, switched, preemptions, first-token delay, decode delay per request)."""
    from kneecap.model.gauss.kv_events import admit_kv_chain

    outs = [np.empty_like(arrival), np.empty_like(arrival), service.copy(), np.zeros(arrival.shape, dtype=bool),
            np.zeros(arrival.shape), np.zeros(arrival.shape), np.zeros(arrival.shape)]
    for row in range(arrival.shape[0]):
        chain = [np.ascontiguousarray(x[row], dtype=float) for x in
                 (arrival, service, unshared_service, lag, decode, prompt, growth, redo_first_s, redo_last_s, steps)]
        got = admit_kv_chain(*chain[:3], np.ascontiguousarray(shared[row], dtype=np.bool_), *chain[3:],
                             int(servers), int(slots), float(kv))
        for arr, vals in zip(outs, got):
            arr[row] = vals
    return tuple(outs)


def _resident_tokens(t, start, first, dep, prompt, growth, at_departure: bool):
    """R(t) = Σ_j prompt_j·[start_j ≤ t < dep_j] + growth_j·(t − first_j)·[first_j ≤ t < dep_j]
    for one chain (``start`` nondecreasing), by cumulative sums; ``at_departure``: just before
    t, so a request departing at t still counts."""
    side = "left" if at_departure else "right"
    by_dep, by_first = np.argsort(dep), np.argsort(first)
    csum = lambda x: np.concatenate(([0.0], np.cumsum(x)))  # noqa: E731
    ks = np.searchsorted(start, t, side="right")
    kd = np.searchsorted(dep[by_dep], t, side=side)
    kf = np.searchsorted(first[by_first], t, side="right")
    held = csum(prompt)[ks] - csum(prompt[by_dep])[kd]
    grown = t * csum(growth[by_first])[kf] - csum((growth * first)[by_first])[kf]
    gone = t * csum(growth[by_dep])[kd] - csum((growth * first)[by_dep])[kd]
    return held + grown - gone


def _limits_bind(start, first, dep, prompt, growth, slots, kv) -> tuple[bool, bool]:
    """Whether the seats and the KV cache bind anywhere on a path: a request starts with ≥
    ``slots`` others still running (#{j < i: dep_j > p_i} = i − #{j: dep_j ≤ p_i}, as later
    requests start later); the resident context exceeds ``kv`` just after an admission or just
    before a departure (its local maxima: R only grows between departures)."""
    n = start.shape[1]
    seats = cache = False
    for row in range(start.shape[0]):
        if not seats:
            running = np.arange(n) - np.searchsorted(np.sort(dep[row]), start[row], side="right")
            seats = bool(running.max(initial=0) >= slots)
        if kv is not None and not cache:
            args = (start[row], first[row], dep[row], prompt[row], growth[row])
            cache = bool(_resident_tokens(start[row], *args, at_departure=False).max(initial=0.0) > kv
                         or _resident_tokens(dep[row], *args, at_departure=True).max(initial=0.0) > kv)
    return seats, cache
