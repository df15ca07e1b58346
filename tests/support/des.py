"""Discrete-event simulation of SARA's three stages in tandem, for validating its formulas.

Prefill: FCFS M/G/k with an event heap (arrivals and departures) and a shared queue. KV transfer:
the same simulator with one server, fed by the prefill departures. Decode: iteration-level
continuous batching on one pool — every iteration takes (Ω + gγ·Σ context)/(k_d·B_HBM)
seconds and gives each of the (≤ N_bat) running requests one token; arrivals join at the next
iteration. Nothing here uses SARA's formulas: only the service-time laws they assume.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

ARRIVAL, DEPARTURE = 0, 1


def mgk_fcfs(arrival_s: np.ndarray, service_s: np.ndarray, servers: int) -> np.ndarray:
    """Departure times of an FCFS queue with ``servers`` servers (arrivals sorted).

    Event-driven: a heap of (time, kind, request) events; a departure frees a server which takes
    the head of the queue. Ties: departures before arrivals at the same instant.
    """
    n = arrival_s.size
    depart = np.empty(n)
    events: list[tuple[float, int, int]] = [(float(arrival_s[0]), ARRIVAL, 0)]
    queue: deque[int] = deque()
    free = servers
    next_arrival = 1
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == ARRIVAL:
            if next_arrival < n:
                heapq.heappush(events, (float(arrival_s[next_arrival]), ARRIVAL, next_arrival))
                next_arrival += 1
            if free > 0:
                free -= 1
                heapq.heappush(events, (t + float(service_s[i]), DEPARTURE, i))
            else:
                queue.append(i)
        else:
            depart[i] = t
            if queue:
                j = queue.popleft()
                heapq.heappush(events, (t + float(service_s[j]), DEPARTURE, j))
            else:
                free += 1
    return depart


def mgk_fcfs_servers(arrival_s: np.ndarray, service_s: np.ndarray, servers: int) -> np.ndarray:
    """Same departures as ``mgk_fcfs``, faster: FCFS hands each request, in arrival order, to the
    server that frees first (Kiefer–Wolfowitz workload recursion; a heap of k free-at times).
    At k = 1 it is Lindley's recursion D_n = max(A_n, D_{n−1}) + S_n, vectorised as
    D = C + cummax(A − C_prev) with C the running sum of S. Checked equal to the event-driven
    simulator in tests/unit/test_sara_des.py."""
    a = np.asarray(arrival_s, dtype=float)
    s = np.asarray(service_s, dtype=float)
    if servers == 1:
        c = np.cumsum(s)
        return c + np.maximum.accumulate(a - (c - s))
    free = [float(a[0])] * servers
    depart = np.empty(a.size)
    replace = heapq.heapreplace
    for i, (t, x) in enumerate(zip(a.tolist(), s.tolist())):
        f = free[0]
        d = (t if t > f else f) + x
        replace(free, d)
        depart[i] = d
    return depart


@dataclass(frozen=True)
class DecodeResult:
    step_s: np.ndarray  # one per iteration
    batch: np.ndarray  # requests in each iteration (tokens produced)
    max_batch: int

    def token_quantile_s(self, q: float) -> float:
        """Quantile of the time per output token as tokens see it (steps weighted by batch)."""
        order = np.argsort(self.step_s)
        cw = np.cumsum(self.batch[order], dtype=float)
        return float(self.step_s[order][np.searchsorted(cw, q * cw[-1])])


def continuous_batching(arrival_s: np.ndarray, input_tok: np.ndarray, output_tok: np.ndarray, *,
                        omega_bytes: float, kv_bytes_per_token: float, pool_bw_bytes_s: float,
                        max_num_seqs: int) -> DecodeResult:
    """Iteration-level decode simulation. A request admitted at iteration s with input IL has
    context IL + (it − s) + 1 tokens at iteration it and leaves after OL iterations."""
    n = arrival_s.size
    finish: list[tuple[int, int]] = []  # (last iteration index, request)
    waiting: deque[int] = deque()
    start = np.zeros(n, dtype=np.int64)
    sum_il = 0.0
    sum_start = 0
    running = 0
    it = 0
    t = float(arrival_s[0])
    nxt = 0
    done = 0
    steps, batches = [], []
    max_batch = 0
    while done < n:
        while nxt < n and arrival_s[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        while waiting and running < max_num_seqs:
            j = waiting.popleft()
            start[j] = it
            sum_il += input_tok[j]
            sum_start += it
            running += 1
            heapq.heappush(finish, (it + int(output_tok[j]) - 1, j))
        if running == 0:
            t = float(arrival_s[nxt])
            continue
        context = sum_il + running * (it + 1) - sum_start
        step = (omega_bytes + kv_bytes_per_token * context) / pool_bw_bytes_s
        steps.append(step)
        batches.append(running)
        max_batch = max(max_batch, running)
        t += step
        while finish and finish[0][0] <= it:
            _, j = heapq.heappop(finish)
            sum_il -= input_tok[j]
            sum_start -= int(start[j])
            running -= 1
            done += 1
        it += 1
    return DecodeResult(np.asarray(steps), np.asarray(batches), max_batch)


@dataclass(frozen=True)
class PipelineResult:
    ttft_s: np.ndarray
    kv_s: np.ndarray
    decode: DecodeResult


def simulate(rng: np.random.Generator, rate_rps: float, n: int, input_tok: np.ndarray, output_tok: np.ndarray,
             prefill_service_s, prefill_replicas: int, kv_s_per_token: float, *, omega_bytes: float,
             kv_bytes_per_token: float, pool_bw_bytes_s: float, max_num_seqs: int,
             warmup: float = 0.1) -> PipelineResult:
    """Poisson arrivals at ``rate_rps`` through prefill (M/G/k), KV link (·/G/1) and decode."""
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    sp = np.asarray(prefill_service_s(input_tok), dtype=float)
    dep_p = mgk_fcfs(arrival, sp, prefill_replicas)
    order = np.argsort(dep_p, kind="stable")
    tr = kv_s_per_token * input_tok[order]
    dep_kv_sorted = mgk_fcfs(dep_p[order], tr, 1)
    dep_kv = np.empty(n)
    dep_kv[order] = dep_kv_sorted
    keep = slice(int(warmup * n), None)
    order2 = np.argsort(dep_kv, kind="stable")
    dec = continuous_batching(dep_kv[order2], input_tok[order2], output_tok[order2], omega_bytes=omega_bytes,
                              kv_bytes_per_token=kv_bytes_per_token, pool_bw_bytes_s=pool_bw_bytes_s,
                              max_num_seqs=max_num_seqs)
    w = int(warmup * dec.step_s.size)
    dec = DecodeResult(dec.step_s[w:], dec.batch[w:], dec.max_batch)
    return PipelineResult((dep_p - arrival)[keep], (dep_kv - dep_p)[keep], dec)
