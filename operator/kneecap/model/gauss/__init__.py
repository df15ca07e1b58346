"""GAUSS (paper 003, DESIGN §5.5): Monte-Carlo TTFT/TBT distributions and sustainable rate.

Pure numpy, no I/O. Every random draw comes from a caller-supplied ``numpy.random.Generator``.

Model (paper §3, our reading where the summary is loose):

* Workload: weighted buckets (input, cached prefix, output tokens) or independent length
  distributions; arrivals Poisson at λ, or Gamma inter-arrivals with a CV for burstiness.
* Prefill (§3.2): a request with s = input − cached uncached tokens runs n = ⌈s/Δ⌉ chunks;
  chunk j (m_j tokens) attends A_j = cached + tokens through the end of chunk j and costs
  t_chunk + t_tok·m_j + t_attn·(m_j·A_j − m_j·(m_j−1)/2) (affine in A_j for full chunks, GAUSS
  a + b·A_j): causal, its token t attends only tokens up to t, so the prompt's pairs are
  s·c + s·(s+1)/2 at any Δ (FlashAttention-2, Dao 2023, §3.1.1; §3.2's m_j·A_j counts the chunk's
  whole m_j² square, twice the causal work of a one-chunk prompt).
* Decode step (§3.3): d(B, C) = p + q·C/B + r·B + s·C with C the resident context of the
  batch (tokens). p, q, r is the GAUSS form; s (default 0) is our addition so that SLIM
  eqs 9–11 map exactly (see :func:`coefficients_from_slim`).
* Service (§3.4): S = prefill compute + n·d̄, each chunk step also carrying the concurrent
  decode batch; the prefill slot is the server of an M/G/k FCFS queue (§3.6). A chunk step
  costs the decode step plus the chunk's compute, the sum (not the roofline's max of weight
  read and GEMMs: :func:`~kneecap.model.gauss.service.coefficients_from_slim` says why).
* Operating batch (§3.8): by Little's law the mean decode batch B̄ = λ·E[OL]·τ with τ the mean
  step a decoding request sees, d at 1 + B̄ sequences stretched by 1/(1 − ρ_c),
  ρ_c = λ·E[prefill compute] (chunk steps inflate decode steps); linear in B̄, closed form. Stability: decode needs 1 − ρ_c − λ·E[OL]·(r + s·c̄) > 0,
  prefill needs ρ = λ·E[S] < k.
* Queue delay by the Lindley recurrence, vectorised (one server), Kiefer–Wolfowitz (k servers).
  TTFT = W + S + t_fixed (§3.7); TBT per request = mean step time over its decode steps:
  d(B_i, C_i) plus the chunk cost of the steps that carry a chunk (§3.4).

TBT on one server is read off the simulated path (:func:`_tbt_sample_path`): over each
request's decode window, the prefill slot's busy time, the steps it spans and the time-average
decode batch, so bursts and long prompts inflate the TBT of every request decoding through
them. On k servers (no per-server path from Kiefer–Wolfowitz) a mean-field approximation is
used: batch 1 + Poisson(B̄) fixed over the request's life and a Binomial(K, f) share of chunk
steps of the mean cost ℓ̄ (both by normal approximation). Both use resident context own + c̄
per other sequence. Checked against the engine twin in tests/unit/test_gauss_twin.py.

Amendments to the paper, checked against a real vLLM (benchmarks/tails_real_vllm.py): on one
server, prompts waiting together share a step (vLLM packs them under the token budget;
:func:`_packed_service`), and a request that finds the prefill slot free waits for the residual
of the engine step in flight before its prompt runs.

Engine limits (:class:`EngineLimits`; vLLM V1's scheduler, ``vllm/v1/core/sched/scheduler.py``:
running requests are scheduled first, then waiting ones in FCFS order while the limits allow):

1. Token budget (``max_num_batched_tokens`` = ``chunk_tokens``): each running decode takes one
   token of a step's budget before any prefill chunk, so the chunk is Δ = budget − ⌊B̄⌋ in the
   mean field, a fixed point with B̄ (:func:`operating_point`; B̄ < 1 leaves Δ = budget).
2. Batch cap (``max_num_seqs``, and ``max_num_active_seqs`` of vLLM ≥ 0.31: c = the smaller):
   a request holds one of c seats from its prefill start p_i to its last token. The starts
   follow the FCFS recurrence p_i = max(a_i, e_i, h_i), e_i the earliest free prefill slot and
   h_i the earliest free seat: Kiefer–Wolfowitz over the c seats (Kiefer & Wolfowitz 1955; a
   heap of free times, :func:`_admit`), equivalently h_i = the c-th largest departure of
   requests 1..i−1. A request that finds the running set full waits in the queue, so the cap
   moves latency from TPOT (a batch of at most c) to TTFT. Departures depend on the decode
   windows and these on the starts: ``LIMIT_PASSES`` fixed-point passes, damped (seats held
   for the mean of the last two passes' windows). On k servers the k engines pool k·c seats
   (an approximation: a seat may free on another engine).
3. KV cache (``kv_capacity_tokens`` = num_gpu_blocks × block_size, from the memory split,
   :func:`engine_limits_for`), event by event (:func:`_admit_kv`): a request's resident context
   is its uncached prompt plus half a block of rounding from its start, growing one token per
   step of its decode; the longest cached prefix is resident once. A request is admitted when,
   besides a free seat, the running set's resident context R(t) leaves room for its prompt
   (vLLM allocates a step's blocks before scheduling it) and no preempted request waits. When
   R reaches the cache, the newest running request is preempted (vLLM V1 preempts the last of
   its running list, recompute mode): it frees its blocks and waits at the front of the queue;
   re-admitted once a departure leaves room for what it holds, it recomputes its prompt and
   the tokens it had generated on a prefill slot (§3.2 at Δ, its cached prefix still cached,
   the chunk steps carrying the batch) and decodes the rest, and may be preempted again. The
   delay goes to its TTFT when it had no token yet, else to its decode time (TBT). Not
   modelled: the recompute's chunk steps slowing other requests' decode steps.
4. Prefix caching (``enable_prefix_caching``, vLLM V1's default on): cached prefix tokens cost
   no prefill, in whole blocks (vLLM hashes full blocks); off, every prompt token is computed.

Mean-field stability adds the running set, ρ + B̄ < c, and the cache: the p99 of the resident
context of B ~ Poisson(B̄) decoding sequences (compound Poisson: mean B̄·E[x], variance
B̄·E[x²], x a sequence's own context plus half a block), plus the shared prefix, below the
capacity (SARA's C2 at p_mem = 0.99; past it the engine twin thrashes in recompute). A path
on which no limit binds (no request starts with c others running, R never above the cache:
:func:`_limits_bind`) is the uncapped path exactly.

Modules, one idea each: ``workload`` (length distributions, sampling, arrivals), ``service``
(cost coefficients, prefill and decode-step costs, fitting), ``limits`` (:class:`EngineLimits`),
``mean_field`` (operating point, stability limit), ``queues`` (Lindley, Kiefer–Wolfowitz,
prompt packing), ``tbt`` (per-request TBT), ``admission`` (the path under the engine limits),
``engine`` (draws and one evaluation at λ), ``search`` (λ* and sweeps), ``results`` (latency
statistics, :class:`GaussResult`) and ``api`` (the entry points); ``errors`` holds
:class:`Infeasible` and the input checks. This package re-exports the public names.
"""

from __future__ import annotations

from kneecap.errors import InputError
from kneecap.model.gauss.admission import LIMIT_PASSES
from kneecap.model.gauss.api import (
    SustainableRate, TraceReplay, replay, simulate, simulate_queue, sustainable_rate, sweep_rates,
)
from kneecap.model.gauss.engine import raw_service_draws
from kneecap.model.gauss.errors import Infeasible
from kneecap.model.gauss.limits import (
    DEFAULT_LIMITS, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, EngineLimits, engine_limits_for,
)
from kneecap.model.gauss.mean_field import (
    KV_QUANTILE, KV_Z, OperatingPoint, WorkloadMoments, operating_point, stability_limit_rps, workload_moments,
)
from kneecap.model.gauss.queues import kiefer_wolfowitz_waits, lindley_waits, queue_waits
from kneecap.model.gauss.results import QUANTILES, GaussResult, LatencyStats, SweepPoint, latency_stats, quantile_name
from kneecap.model.gauss.search import HINT_BRACKET
from kneecap.model.gauss.service import (
    DecodeFit, ServiceCoefficients, coefficients_for, coefficients_from_slim, decode_step_s, fit_decode_coefficients,
    prefill_compute_s,
)
from kneecap.model.gauss.workload import (
    BucketWorkload, ExponentialLength, FixedLength, HistogramLength, LengthDist, LogNormalLength, Workload,
    lognormal_params, sample_lengths, sample_workload, unit_interarrivals,
)

__all__ = [
    "BucketWorkload", "DEFAULT_LIMITS", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DecodeFit",
    "EngineLimits", "ExponentialLength", "FixedLength", "GaussResult", "HINT_BRACKET", "HistogramLength", "Infeasible",
    "InputError", "KV_QUANTILE", "KV_Z", "LIMIT_PASSES", "LatencyStats", "LengthDist", "LogNormalLength",
    "OperatingPoint", "QUANTILES", "ServiceCoefficients", "SustainableRate", "SweepPoint", "TraceReplay", "Workload",
    "WorkloadMoments", "coefficients_for", "coefficients_from_slim", "decode_step_s", "engine_limits_for",
    "fit_decode_coefficients", "kiefer_wolfowitz_waits", "latency_stats", "lindley_waits", "lognormal_params",
    "operating_point", "prefill_compute_s", "quantile_name", "queue_waits", "raw_service_draws", "replay",
    "sample_lengths", "sample_workload", "simulate", "simulate_queue", "stability_limit_rps", "sustainable_rate",
    "sweep_rates", "unit_interarrivals", "workload_moments",
]
