"""One chain of GAUSS's event-by-event KV-cache admission (package docstring, "KV cache"),
compiled: the recurrence of :func:`kneecap.model.gauss.admission._admit_kv` per chain; and
one chain of the admission under the batch cap alone (:func:`admit_chain`, the recurrence of
:func:`kneecap.model.gauss.admission._admit`), compiled for the same reason.

Compiled with numba because it is the operator's measured hot path: every departure,
preemption and re-admission is one event in a sequential loop, and where the cache binds a
GAUSS λ search runs it for every evaluation (benchmarks/results/trace_replay.md, speed). The
arithmetic is the interpreted loop's, operation for operation and in the same order (no
fastmath), so results are bit-identical to it (tests/unit/test_gauss_kv_events.py checks this
against the reference loop in tests/support/gauss_kv_reference.py).

The first call in a process compiles (seconds of CPU) unless numba's on-disk cache holds it.

Heaps: the prefill slots are min-heaps of free times (``_replace_min``: pop the earliest, push
the new); the running set's departures are a heap of (time, request, generation), a preempted
request's old entry left in place and skipped when it surfaces (its generation is stale).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_INF = math.inf


def _compiled(function):
    """numba's njit, its machine code cached on disk where numba finds a writable place (beside
    this module, or the user's cache directory: the image's HOME is /tmp), in memory otherwise."""
    try:
        return njit(cache=True)(function)
    except RuntimeError:  # no writable cache location: compile once per process
        return njit(function)


@_compiled
def _replace_min(heap, value):
    """heapq.heapreplace on a float array: drop the smallest, insert ``value``."""
    n = heap.shape[0]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] < value:
            heap[i] = heap[child]
            i = child
        else:
            break
    heap[i] = value


@_compiled
def _before(heap_t, heap_j, heap_g, x, y):
    """Entry x sorts before entry y: (time, request, generation) compared in that order."""
    if heap_t[x] != heap_t[y]:
        return heap_t[x] < heap_t[y]
    if heap_j[x] != heap_j[y]:
        return heap_j[x] < heap_j[y]
    return heap_g[x] < heap_g[y]


@_compiled
def _swap(heap_t, heap_j, heap_g, x, y):
    heap_t[x], heap_t[y] = heap_t[y], heap_t[x]
    heap_j[x], heap_j[y] = heap_j[y], heap_j[x]
    heap_g[x], heap_g[y] = heap_g[y], heap_g[x]


@_compiled
def _push(running, size, t, j, g):
    """Push (t, j, g) on the departure heap ``running`` = (times, requests, generations) holding
    ``size[0]`` entries; grows its arrays when full. Returns the heap."""
    heap_t, heap_j, heap_g = running
    if size[0] == heap_t.shape[0]:
        heap_t = np.concatenate((heap_t, np.empty_like(heap_t)))
        heap_j = np.concatenate((heap_j, np.empty_like(heap_j)))
        heap_g = np.concatenate((heap_g, np.empty_like(heap_g)))
    i = size[0]
    heap_t[i], heap_j[i], heap_g[i] = t, j, g
    size[0] += 1
    while i > 0:
        parent = (i - 1) // 2
        if not _before(heap_t, heap_j, heap_g, i, parent):
            break
        _swap(heap_t, heap_j, heap_g, i, parent)
        i = parent
    return heap_t, heap_j, heap_g


@_compiled
def _pop(running, size):
    """Drop the earliest entry of the departure heap."""
    heap_t, heap_j, heap_g = running
    size[0] -= 1
    n = size[0]
    _swap(heap_t, heap_j, heap_g, 0, n)
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _before(heap_t, heap_j, heap_g, child + 1, child):
            child += 1
        if not _before(heap_t, heap_j, heap_g, child, i):
            break
        _swap(heap_t, heap_j, heap_g, i, child)
        i = child


@_compiled
def _next_departure(running, size, gen):
    heap_t, heap_j, heap_g = running
    while size[0] > 0 and gen[heap_j[0]] != heap_g[0]:
        _pop(running, size)  # a preempted request's old departure
    return heap_t[0] if size[0] > 0 else _INF


@_compiled
def _grown(stack, size):
    """``stack`` with room for one more entry beyond ``size``."""
    return stack if size < stack.shape[0] else np.concatenate((stack, np.empty_like(stack)))


@_compiled
def _enter(j, t_start, slot_s, lag_s, pre, first, token, dc, done, st, running, sizes, gen, live, order, state,
           resident, g):
    """j takes a prefill slot at t_start, then decodes. Returns the (possibly grown) departure
    heap and admission-order stack."""
    _replace_min(pre, t_start + slot_s)
    first[j] = t_start + slot_s + lag_s
    if token[j] == _INF:  # its first token comes at the end of this (re)computed prefill
        token[j] = first[j]
    rest = dc[j] * (1.0 - done[j] / st[j]) if st[j] != 0.0 else 0.0
    running = _push(running, sizes[0:1], first[j] + rest, j, gen[j])
    live[j] = True
    order = _grown(order, sizes[1])
    order[sizes[1]] = j
    sizes[1] += 1
    state[0] += resident[j]
    state[1] += g[j]
    state[2] += g[j] * first[j]
    state[3] += 1.0
    return running, order


@_compiled
def _leave(j, live, state, resident, g, first):
    live[j] = False
    state[0] -= resident[j]
    state[1] -= g[j]
    state[2] -= g[j] * first[j]
    state[3] -= 1.0


@_compiled
def _advance(until, kv, slots, pre, first, token, dc, done, st, running, sizes, gen, live, order, waiting, state,
             resident, g, r0, lo, hi, preempted, gone):
    """Departures, preemptions and re-admissions up to ``until``. ``sizes``: entries of the
    departure heap, the admission-order stack and the waiting (preempted) stack. Returns the
    (possibly grown) heap and order stack."""
    while True:
        d = _next_departure(running, sizes[0:1], gen)
        base, rate, rate_at, taken, now = state[0], state[1], state[2], state[3], state[4]
        over = _INF  # when R(t) = base + rate·t − rate_at reaches the cache
        if taken > 1.0:
            if rate > 0.0:
                over = max(now, (kv - base + rate_at) / rate)
            elif base - rate_at > kv:
                over = now
        if min(d, over) > until or (d == over and over == _INF):
            return running, order
        if over < d:  # preempt the newest running request (vLLM: the last of its running list)
            state[4] = over
            sizes[1] -= 1
            v = order[sizes[1]]
            while not live[v]:
                sizes[1] -= 1
                v = order[sizes[1]]
            _leave(v, live, state, resident, g, first)
            gen[v] += 1
            if over < token[v]:
                token[v] = _INF  # no token yet: the prompt is recomputed in full
            else:
                done[v] = min(done[v] + max(over - first[v], 0.0) * g[v], st[v])
            resident[v] = r0[v] + done[v]
            preempted[v] += 1.0
            waiting[sizes[2]] = v  # a request waits at most once at a time: n entries suffice
            sizes[2] += 1
            continue
        j = running[1][0]
        _pop(running, sizes[0:1])
        _leave(j, live, state, resident, g, first)
        gone[j] = d
        state[4] = d
        while sizes[2] > 0 and state[3] < slots:  # the preempted go first, the last preempted first
            v = waiting[sizes[2] - 1]
            if state[3] != 0.0 and state[0] + state[1] * d - state[2] + resident[v] > kv:
                break
            sizes[2] -= 1
            redo = lo[v] + (hi[v] - lo[v]) * (done[v] / st[v] if st[v] != 0.0 else 0.0)
            running, order = _enter(v, max(d, pre[0]), redo, 0.0, pre, first, token, dc, done, st, running, sizes,
                                    gen, live, order, state, resident, g)


@_compiled
def admit_kv_chain(a, s_l, u_l, sh, lg, dc, r0, g, lo, hi, st, servers, slots, kv):
    """One chain of ``_admit_kv``: (p, p0, service used, switched, preemptions, first-token
    delay, decode delay) per request, all float arrays but ``switched`` (bool)."""
    n = a.shape[0]
    pre, pre0 = np.zeros(servers), np.zeros(servers)
    p, p0, used, switched = np.zeros(n), np.zeros(n), s_l.copy(), np.zeros(n, dtype=np.bool_)
    preempted, first, token = np.zeros(n), np.zeros(n), np.full(n, _INF)
    done, gone = np.zeros(n), np.zeros(n)
    resident, gen, live = r0.copy(), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_)
    room = max(n, 1)
    running = (np.zeros(room), np.zeros(room, dtype=np.int64), np.zeros(room, dtype=np.int64))
    order, waiting = np.zeros(room, dtype=np.int64), np.zeros(room, dtype=np.int64)
    sizes = np.zeros(3, dtype=np.int64)  # departure heap, admission order, waiting (preempted)
    state = np.zeros(5)  # Σ r, Σ g, Σ g·f over the running set, seats taken, clock
    last = 0.0
    for i in range(n):
        ai = a[i]
        t0 = pre0[0] if pre0[0] > ai else ai
        _replace_min(pre0, t0 + s_l[i])
        free = max(ai, max(pre[0], last))  # FCFS: never before its predecessor
        t = free
        while True:
            running, order = _advance(t, kv, slots, pre, first, token, dc, done, st, running, sizes, gen, live,
                                      order, waiting, state, resident, g, r0, lo, hi, preempted, gone)
            if pre[0] > t:  # a re-admitted request took the prefill slot
                t = pre[0]
                continue
            base, rate, rate_at, taken = state[0], state[1], state[2], state[3]
            if sizes[2] == 0 and taken < slots and (taken == 0.0 or base + rate * t - rate_at + r0[i] <= kv):
                break
            t = max(t, _next_departure(running, sizes[0:1], gen))  # wait for the next departure
        si, lag_i = s_l[i], lg[i]
        if t > free and sh[i]:
            si, lag_i = u_l[i], 0.0
            used[i], switched[i] = si, True
        state[4] = t
        last = t
        running, order = _enter(i, t, si, lag_i, pre, first, token, dc, done, st, running, sizes, gen, live, order,
                                state, resident, g)
        p[i], p0[i] = t, t0
    _advance(_INF, kv, slots, pre, first, token, dc, done, st, running, sizes, gen, live, order, waiting, state,
             resident, g, r0, lo, hi, preempted, gone)
    delay_first, delay_decode = np.zeros(n), np.zeros(n)
    for j in range(n):
        if preempted[j] != 0.0:
            own_first = p[j] + used[j] + (0.0 if switched[j] else lg[j])
            delay_first[j] = token[j] - own_first
            delay_decode[j] = gone[j] - token[j] - dc[j]
    return p, p0, used, switched, preempted, delay_first, delay_decode


@_compiled
def admit_chain(a, s_l, u_l, sh, lg, dc, servers, slots):
    """One chain of ``_admit``: (p, p0, service used, switched). Its heaps hold the same values
    as heapq's after every replacement, so every minimum read, and every result, is the same."""
    n = a.shape[0]
    pre, pre0, seats = np.zeros(servers), np.zeros(servers), np.zeros(slots)
    p, p0, used, switched = np.zeros(n), np.zeros(n), s_l.copy(), np.zeros(n, dtype=np.bool_)
    for i in range(n):
        ai = a[i]
        t0 = pre0[0] if pre0[0] > ai else ai
        _replace_min(pre0, t0 + s_l[i])
        free = pre[0] if pre[0] > ai else ai
        t = seats[0] if seats[0] > free else free
        si, lag_i = s_l[i], lg[i]
        if t > free and sh[i]:
            si, lag_i = u_l[i], 0.0
            used[i], switched[i] = si, True
        _replace_min(pre, t + si)
        _replace_min(seats, t + si + lag_i + dc[i])
        p[i], p0[i] = t, t0
    return p, p0, used, switched
