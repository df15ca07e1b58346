"""The interpreted admission loops GAUSS ran before they were compiled
(kneecap.model.gauss.kv_events): under the KV cache and under the batch cap alone, the oracles
the compiled chains are checked against, operation for operation
(tests/unit/test_gauss_kv_events.py)."""

from __future__ import annotations

import math

import numpy as np


def admit_kv(arrival, service, unshared_service, shared, lag, decode, servers, slots, kv, prompt, growth,
             redo_first_s, redo_last_s, steps):
    """kneecap.model.gauss.admission._admit_kv, interpreted (its docstring says what it computes)."""
    from heapq import heappop, heappush, heapreplace

    inf = math.inf
    chains, n = arrival.shape
    outs = [np.empty_like(arrival), np.empty_like(arrival), service.copy(), np.zeros(arrival.shape, dtype=bool),
            np.zeros(arrival.shape), np.zeros(arrival.shape), np.zeros(arrival.shape)]
    for row in range(chains):
        a, s_l, u_l = arrival[row].tolist(), service[row].tolist(), unshared_service[row].tolist()
        sh, lg, dc, r0, g = (x[row].tolist() for x in (shared, lag, decode, prompt, growth))
        lo, hi, st = redo_first_s[row].tolist(), redo_last_s[row].tolist(), steps[row].tolist()
        pre, pre0 = [0.0] * servers, [0.0] * servers
        p, p0, used, switched = [0.0] * n, [0.0] * n, list(s_l), [False] * n
        preempted, first, token, done, gone = [0] * n, [0.0] * n, [inf] * n, [0.0] * n, [0.0] * n
        resident, gen, live = list(r0), [0] * n, [False] * n
        running, order, waiting = [], [], []  # departures (t, i, gen); admission order; preempted
        state = [0.0, 0.0, 0.0, 0, 0.0]  # Σ r, Σ g, Σ g·f over the running set, seats taken, clock

        def enter(j, t_start, slot_s, lag_s):  # j takes a prefill slot at t_start, then decodes
            heapreplace(pre, t_start + slot_s)
            first[j] = t_start + slot_s + lag_s
            if token[j] == inf:  # its first token comes at the end of this (re)computed prefill
                token[j] = first[j]
            rest = dc[j] * (1.0 - done[j] / st[j]) if st[j] else 0.0
            heappush(running, (first[j] + rest, j, gen[j]))
            live[j] = True
            order.append(j)
            state[0] += resident[j]
            state[1] += g[j]
            state[2] += g[j] * first[j]
            state[3] += 1

        def leave(j):
            live[j] = False
            state[0] -= resident[j]
            state[1] -= g[j]
            state[2] -= g[j] * first[j]
            state[3] -= 1

        def next_departure():
            while running and gen[running[0][1]] != running[0][2]:
                heappop(running)  # a preempted request's old departure
            return running[0][0] if running else inf

        def advance(until):  # departures, preemptions and re-admissions up to ``until``
            while True:
                d = next_departure()
                base, rate, rate_at, taken, now = state
                over = inf  # when R(t) = base + rate·t − rate_at reaches the cache
                if taken > 1:
                    if rate > 0.0:
                        over = max(now, (kv - base + rate_at) / rate)
                    elif base - rate_at > kv:
                        over = now
                if min(d, over) > until or d == over == inf:
                    return
                if over < d:  # preempt the newest running request (vLLM: the last of its running list)
                    state[4] = over
                    v = order.pop()
                    while not live[v]:
                        v = order.pop()
                    leave(v)
                    gen[v] += 1
                    if over < token[v]:
                        token[v] = inf  # no token yet: the prompt is recomputed in full
                    else:
                        done[v] = min(done[v] + max(over - first[v], 0.0) * g[v], st[v])
                    resident[v] = r0[v] + done[v]
                    preempted[v] += 1
                    waiting.append(v)
                    continue
                _, j, _ = heappop(running)
                leave(j)
                gone[j] = state[4] = d
                while waiting and state[3] < slots:  # the preempted go first, the last preempted first
                    v = waiting[-1]
                    if state[3] and state[0] + state[1] * d - state[2] + resident[v] > kv:
                        break
                    waiting.pop()
                    redo = lo[v] + (hi[v] - lo[v]) * (done[v] / st[v] if st[v] else 0.0)
                    enter(v, max(d, pre[0]), redo, 0.0)

        last = 0.0
        for i in range(n):
            ai = a[i]
            t0 = pre0[0] if pre0[0] > ai else ai
            heapreplace(pre0, t0 + s_l[i])
            free = max(ai, pre[0], last)  # FCFS: never before its predecessor
            t = free
            while True:
                advance(t)
                if pre[0] > t:  # a re-admitted request took the prefill slot
                    t = pre[0]
                    continue
                base, rate, rate_at, taken, _ = state
                if not waiting and taken < slots and (not taken or base + rate * t - rate_at + r0[i] <= kv):
                    break
                t = max(t, next_departure())  # wait for the next departure
            si, lag_i = s_l[i], lg[i]
            if t > free and sh[i]:
                si, lag_i = u_l[i], 0.0
                used[i], switched[i] = si, True
            state[4] = last = t
            enter(i, t, si, lag_i)
            p[i], p0[i] = t, t0
        advance(inf)
        own_first = [p[j] + used[j] + (0.0 if switched[j] else lg[j]) for j in range(n)]
        delay_first = [token[j] - own_first[j] if preempted[j] else 0.0 for j in range(n)]
        delay_decode = [gone[j] - token[j] - dc[j] if preempted[j] else 0.0 for j in range(n)]
        for arr, vals in zip(outs, (p, p0, used, switched, preempted, delay_first, delay_decode)):
            arr[row] = vals
    return tuple(outs)


def admit(arrival, service, unshared_service, shared, lag, decode, servers, slots):
    """kneecap.model.gauss.admission._admit, interpreted with heapq. Prefill starts p_i under FCFS with ``servers`` prefill slots and ``slots`` running-set
    seats, per chain (the recurrence of the package docstring):

        p_i = max(a_i, e_i, h_i),  e_i the earliest free prefill slot, h_i the earliest free
        seat (Kiefer–Wolfowitz over seats: a heap of their free times).

    A seat is held from p_i to the departure p_i + S_i + lag_i + decode_i. Also returns the
    starts p0 of the prefill slots alone (no cap), the service used (a request the cap holds
    back pays its own first chunk step: it no longer shares a predecessor's) and which
    requests that happened to. A Python loop with O(log k) heap steps per request."""
    from heapq import heapreplace

    chains, n = arrival.shape
    p_out, p0_out = np.empty_like(arrival), np.empty_like(arrival)
    s_out, sw_out = service.copy(), np.zeros(arrival.shape, dtype=bool)
    for row in range(chains):
        a, s_l, u_l = arrival[row].tolist(), service[row].tolist(), unshared_service[row].tolist()
        sh, lg, dc = shared[row].tolist(), lag[row].tolist(), decode[row].tolist()
        pre, pre0, seats = [0.0] * servers, [0.0] * servers, [0.0] * slots
        p, p0, used, switched = [0.0] * n, [0.0] * n, list(s_l), [False] * n
        for i in range(n):
            ai = a[i]
            t0 = pre0[0] if pre0[0] > ai else ai
            heapreplace(pre0, t0 + s_l[i])
            free = pre[0] if pre[0] > ai else ai
            t = seats[0] if seats[0] > free else free
            si, lag_i = s_l[i], lg[i]
            if t > free and sh[i]:
                si, lag_i = u_l[i], 0.0
                used[i], switched[i] = si, True
            heapreplace(pre, t + si)
            heapreplace(seats, t + si + lag_i + dc[i])
            p[i], p0[i] = t, t0
        p_out[row], p0_out[row], s_out[row], sw_out[row] = p, p0, used, switched
    return p_out, p0_out, s_out, sw_out
