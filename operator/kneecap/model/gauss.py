"""GAUSS (paper 003, DESIGN §5.5): Monte-Carlo TTFT/TBT distributions and sustainable rate.

Pure numpy, no I/O. Every random draw comes from a caller-supplied ``numpy.random.Generator``.

Model (paper §3, our reading where the summary is loose):

* Workload: weighted buckets (input, cached prefix, output tokens) or independent length
  distributions; arrivals Poisson at λ, or Gamma inter-arrivals with a CV for burstiness.
* Prefill (§3.2): a request with s = input − cached uncached tokens runs n = ⌈s/Δ⌉ chunks;
  chunk j (m_j tokens) attends A_j = cached + tokens through the end of chunk j and costs
  t_chunk + t_tok·m_j + t_attn·m_j·A_j (affine in A_j for full chunks, GAUSS a + b·A_j).
* Decode step (§3.3): d(B, C) = p + q·C/B + r·B + s·C with C the resident context of the
  batch (tokens). p, q, r is the GAUSS form; s (default 0) is our addition so that SLIM
  eqs 9–11 map exactly (see :func:`coefficients_from_slim`).
* Service (§3.4): S = prefill compute + n·d̄, each chunk step also carrying the concurrent
  decode batch; the prefill slot is the server of an M/G/k FCFS queue (§3.6).
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Union

import numpy as np

from kneecap.errors import InputError

QUANTILES = (0.5, 0.95, 0.99)
# vLLM's defaults outside ≥ 70 GiB GPUs (memory.vllm_default_limits): batch cap and token budget
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
KV_QUANTILE = 0.99  # the resident context's quantile the KV cache must hold to be stable (SARA p_mem)
KV_Z = 2.3263478740408408  # Φ⁻¹(KV_QUANTILE)
_BLOCK = 1 << 20  # Lindley block length: bounds temporaries to ~8 MiB per array


class Infeasible(Exception):
    """No finite answer: a stage is unstable (ρ ≥ 1) or an SLO is below the service time.

    ``stage`` names the binding stage (``prefill``, ``decode``, ``queue``); ``str()`` starts
    with ``"infeasible: <stage> stage: "``.
    """

    def __init__(self, stage: str, reason: str, **details: float):
        self.stage = stage
        self.reason = reason
        self.details = details
        super().__init__(f"infeasible: {stage} stage: {reason}")


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class FixedLength:
    tokens: float


@dataclass(frozen=True)
class ExponentialLength:
    mean: float


@dataclass(frozen=True)
class LogNormalLength:
    """Log-normal from mean and coefficient of variation: σ² = ln(1 + cv²), μ = ln(mean) − σ²/2."""

    mean: float
    cv: float


@dataclass(frozen=True)
class HistogramLength:
    """Empirical lengths as vLLM exports a histogram: finite ``le`` upper bounds and the
    *cumulative* counts at each (Prometheus style; a trailing +Inf bound is allowed).
    Sampled by inverse CDF, linear within a bucket from the previous bound (0 for the first);
    mass in the +Inf bucket is placed at the last finite bound."""

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]


LengthDist = Union[FixedLength, ExponentialLength, LogNormalLength, HistogramLength]


@dataclass(frozen=True)
class Workload:
    """Independent length distributions; ``cached_tokens`` is the reused prefix (≤ input − 1)."""

    input_tokens: LengthDist
    output_tokens: LengthDist
    cached_tokens: LengthDist | None = None


@dataclass(frozen=True)
class BucketWorkload:
    """GAUSS §3.1 weighted buckets: per bucket (input, cached prefix, output) and a weight."""

    input_tokens: tuple[float, ...]
    cached_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    weights: tuple[float, ...]


def _positive(field_name: str, value: float, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(field_name, f"expected a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise InputError(field_name, f"expected a {'non-negative' if allow_zero else 'positive'} finite number, got {value!r}")
    return v


def _count(field_name: str, value, allow_none: bool = False) -> None:
    """A positive integer (or None where ``allow_none``), else InputError naming the field."""
    if value is None and allow_none:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(field_name, f"expected a positive integer, got {value!r}")


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(μ, σ) of the log-normal with the given mean and CV (moment matching)."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator, field_name: str = "length") -> np.ndarray:
    """Draw ``n`` real-valued lengths (tokens, or seconds for service times) as float64."""
    if isinstance(dist, FixedLength):
        return np.full(n, _positive(f"{field_name}.tokens", dist.tokens, allow_zero=True))
    if isinstance(dist, ExponentialLength):
        return rng.standard_exponential(n) * _positive(f"{field_name}.mean", dist.mean)
    if isinstance(dist, LogNormalLength):
        mean = _positive(f"{field_name}.mean", dist.mean)
        cv = _positive(f"{field_name}.cv", dist.cv, allow_zero=True)
        if cv == 0:
            return np.full(n, mean)
        mu, sigma = lognormal_params(mean, cv)
        return np.exp(mu + sigma * rng.standard_normal(n))
    if isinstance(dist, HistogramLength):
        bounds = np.asarray(dist.upper_bounds, dtype=np.float64)
        cum = np.asarray(dist.cumulative_counts, dtype=np.float64)
        if bounds.ndim != 1 or bounds.shape != cum.shape or bounds.size == 0:
            raise InputError(f"{field_name}.upper_bounds", "expected equal-length 1-D bounds and cumulative counts")
        if np.isinf(bounds[-1]):
            if bounds.size < 2:
                raise InputError(f"{field_name}.upper_bounds", "need at least one finite bound")
            bounds = bounds.copy()
            bounds[-1] = bounds[-2]
        if not np.all(np.isfinite(bounds)) or np.any(np.diff(bounds) < 0) or bounds[0] < 0:
            raise InputError(f"{field_name}.upper_bounds", "expected non-negative increasing bounds")
        if np.any(np.diff(cum) < 0) or cum[0] < 0 or cum[-1] <= 0:
            raise InputError(f"{field_name}.cumulative_counts", "expected non-decreasing cumulative counts with a positive total")
        cdf = np.concatenate(([0.0], cum / cum[-1]))
        edges = np.concatenate(([0.0], bounds))
        u = rng.random(n)
        # inverse CDF, linear within buckets; np.interp needs increasing xp: drop empty buckets
        keep = np.concatenate((np.diff(cdf) > 0, [True]))  # flat runs keep their last edge
        return np.interp(u, cdf[keep], edges[keep])
    raise InputError(field_name, f"unknown length distribution {type(dist).__name__}")


def sample_workload(workload: Workload | BucketWorkload, n: int, rng: np.random.Generator):
    """(input, cached, output) token counts, integers ≥ 1 stored as float64; cached ≤ input − 1."""
    if isinstance(workload, BucketWorkload):
        w = np.asarray(workload.weights, dtype=np.float64)
        cols = [np.asarray(c, dtype=np.float64) for c in (workload.input_tokens, workload.cached_tokens, workload.output_tokens)]
        if w.ndim != 1 or w.size == 0 or any(c.shape != w.shape for c in cols):
            raise InputError("workload.weights", "expected one weight per bucket and equal-length bucket columns")
        if np.any(w < 0) or not w.sum() > 0 or not np.all(np.isfinite(w)):
            raise InputError("workload.weights", "expected non-negative weights with a positive sum")
        if np.any(cols[0] < 1) or np.any(cols[2] < 1) or np.any(cols[1] < 0):
            raise InputError("workload.input_tokens", "expected input and output ≥ 1 and cached ≥ 0 tokens per bucket")
        idx = np.searchsorted(np.cumsum(w) / w.sum(), rng.random(n), side="right")
        idx = np.minimum(idx, w.size - 1)
        inp, cached, out = (c[idx] for c in cols)
    elif isinstance(workload, Workload):
        inp = sample_lengths(workload.input_tokens, n, rng, "input_tokens")
        out = sample_lengths(workload.output_tokens, n, rng, "output_tokens")
        cached = (sample_lengths(workload.cached_tokens, n, rng, "cached_tokens")
                  if workload.cached_tokens is not None else np.zeros(n))
    else:
        raise InputError("workload", f"expected Workload or BucketWorkload, got {type(workload).__name__}")
    inp = np.maximum(np.rint(inp), 1.0)
    out = np.maximum(np.rint(out), 1.0)
    cached = np.clip(np.rint(cached), 0.0, inp - 1.0)
    return inp, cached, out


def unit_interarrivals(shape, rng: np.random.Generator, burst_cv: float = 1.0) -> np.ndarray:
    """Inter-arrival times of a unit-rate process (mean 1): exponential (Poisson arrivals,
    burst_cv = 1) or Gamma with shape 1/cv² (burst_cv ≠ 1). Divide by λ for rate λ; keeping
    these fixed across λ gives common random numbers."""
    cv = _positive("burst_cv", burst_cv, allow_zero=True)
    if cv == 1.0:
        return rng.standard_exponential(shape)
    if cv == 0.0:
        return np.ones(shape)
    k = 1.0 / (cv * cv)
    return rng.standard_gamma(k, shape) / k


# --------------------------------------------------------------------------- service


@dataclass(frozen=True)
class ServiceCoefficients:
    """Engine cost coefficients, seconds (GAUSS §3.2–3.4, DESIGN §5.5).

    Chunk step cost: prefill_s_per_chunk + prefill_s_per_token·m + prefill_s_per_attended_token·m·A
    (m chunk tokens, A attended context). Decode step: d(B, C) = decode_step_s
    + decode_s_per_context_token·C/B + decode_s_per_seq·B + decode_s_per_resident_token·C.
    ``request_overhead_s`` (SLIM t_fixed) adds to TTFT but does not occupy the prefill slot.
    """

    prefill_s_per_token: float
    prefill_s_per_attended_token: float = 0.0
    prefill_s_per_chunk: float = 0.0
    decode_step_s: float = 0.0  # p
    decode_s_per_context_token: float = 0.0  # q, multiplies C/B
    decode_s_per_seq: float = 0.0  # r, multiplies B
    decode_s_per_resident_token: float = 0.0  # s, multiplies C (0 in the GAUSS form)
    chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # vLLM max_num_batched_tokens: chunks of budget − decodes
    request_overhead_s: float = 0.0
    prefill_packing: bool = True  # prompts waiting together share one step (vLLM); False: GAUSS's one per step

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "prefill_packing":
                if not isinstance(value, (bool, np.bool_)):
                    raise InputError("prefill_packing", f"expected true or false, got {value!r}")
            elif f.name == "chunk_tokens":
                if not isinstance(value, (int, np.integer)) or value < 1:
                    raise InputError("chunk_tokens", f"expected a positive integer, got {value!r}")
            else:
                _positive(f.name, value, allow_zero=True)
        if self.prefill_s_per_token + self.prefill_s_per_attended_token + self.prefill_s_per_chunk <= 0:
            raise InputError("prefill_s_per_token", "prefill costs are all zero; expected a positive prefill cost")
        if self.decode_step_s + self.decode_s_per_context_token + self.decode_s_per_seq + self.decode_s_per_resident_token <= 0:
            raise InputError("decode_step_s", "decode costs are all zero; expected a positive decode cost")


@dataclass(frozen=True)
class EngineLimits:
    """vLLM's own limits on one engine (module docstring, "Engine limits"); the token budget
    max_num_batched_tokens is ``ServiceCoefficients.chunk_tokens``.

    ``max_num_active_seqs`` (vLLM ≥ 0.31) caps the running set too: the binding cap is the
    smaller. ``kv_capacity_tokens`` = num_gpu_blocks × block_size (None: the cache never fills).
    ``enable_prefix_caching``: cached prefix tokens, whole blocks of them, cost no prefill."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_active_seqs: int | None = None
    kv_capacity_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True

    def __post_init__(self):
        for name in ("max_num_seqs", "block_size"):
            _count(name, getattr(self, name))
        for name in ("max_num_active_seqs", "kv_capacity_tokens"):
            _count(name, getattr(self, name), allow_none=True)
        if not isinstance(self.enable_prefix_caching, (bool, np.bool_)):
            raise InputError("enable_prefix_caching", f"expected true or false, got {self.enable_prefix_caching!r}")

    @property
    def slots(self) -> int:
        """Sequences the running set holds: min(max_num_seqs, max_num_active_seqs)."""
        return int(min(self.max_num_seqs, self.max_num_active_seqs or self.max_num_seqs))


DEFAULT_LIMITS = EngineLimits()


def engine_limits_for(arch, gpu, *, max_num_seqs: int | None = None, max_num_active_seqs: int | None = None,
                      max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                      kv_cache_memory_bytes: int | None = None, num_gpu_blocks_override: int | None = None,
                      block_size: int = 16, enable_prefix_caching: bool = True,
                      measured_non_kv_bytes: float | None = None,
                      tensor_parallel_size: int = 1) -> tuple[EngineLimits, int]:
    """(limits, token budget) of a vLLM engine serving ``arch`` on ``gpu`` as vLLM resolves its
    flags: unset caps take vLLM's defaults (``memory.vllm_default_limits``, chunked prefill on);
    KV blocks from ``num_gpu_blocks_override``, else ``kv_cache_memory_bytes`` // block bytes, else
    the memory split at ``gpu_memory_utilization`` (``memory.memory_split``, DESIGN §5.3). Under
    TP every byte figure is one rank's (``kv_cache_memory_bytes`` is per GPU, as in vLLM)."""
    from kneecap.model import memory
    from kneecap.model.parallel import check_tensor_parallel_size, kv_bytes_per_token_per_gpu

    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    kv_tok = kv_bytes_per_token_per_gpu(arch, tp)

    seqs, budget = memory.vllm_default_limits(gpu, True, arch.max_position or 2048)
    seqs = seqs if max_num_seqs is None else max_num_seqs
    budget = budget if max_num_batched_tokens is None else max_num_batched_tokens
    for name, v in (("max_num_seqs", seqs), ("max_num_batched_tokens", budget), ("block_size", block_size),
                    ("num_gpu_blocks_override", num_gpu_blocks_override),
                    ("kv_cache_memory_bytes", kv_cache_memory_bytes)):
        _count(name, v, allow_none=True)
    if num_gpu_blocks_override is not None:
        blocks = int(num_gpu_blocks_override)
    elif kv_cache_memory_bytes is not None:
        blocks = int(kv_cache_memory_bytes // (block_size * kv_tok))
        if blocks < 1:
            raise InputError("kv_cache_memory_bytes", f"{kv_cache_memory_bytes} bytes hold no {block_size}-token block "
                                                      f"of {arch.key} ({block_size * kv_tok} bytes)")
    else:
        blocks = memory.memory_split(arch, gpu, gpu_memory_utilization, int(seqs), int(budget), int(block_size),
                                     measured_non_kv_bytes=measured_non_kv_bytes, tensor_parallel_size=tp).num_gpu_blocks
    limits = EngineLimits(int(seqs), max_num_active_seqs, blocks * int(block_size), int(block_size),
                          enable_prefix_caching)
    return limits, int(budget)


def coefficients_from_slim(
    *, eta_c: float, eta_m: float, alpha: float, gamma: float, t_fixed_s: float,
    layers: int, hidden: int, kv_dim: int, ff_ratio: float, kv_bytes: float,
    peak_flops: float, bandwidth_bytes_s: float, b0: float = 0.0, form: str = "paper-a",
    t_step_s: float = 0.0, t_layer_s: float = 0.0, eta_w: float = 1.0, weight_bytes: float = 0.0,
    chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS, tensor_parallel_size: int = 1,
    kv_dim_per_gpu: float | None = None, allreduce_step_s: float = 0.0, allreduce_token_s: float = 0.0,
) -> ServiceCoefficients:
    """GAUSS coefficients from a calibrated SLIM (DESIGN §5.1, kneecap.model.slim), plain numbers in.

    ``ff_ratio`` is the effective r_ff (×1.5 for gated MLPs), ``kv_bytes`` is b_kv.

    * Prefill, SLIM eqs 7–8 at B = 1: T_pre = L·[IL·(4D² + 4·D·Dkv + 4·r_ff·D²) + 4·IL²·D]/(η_c·Fmax).
      prefill_s_per_token = L·(4D² + 4·D·Dkv + 4·r_ff·D²)/(η_c·Fmax) and
      prefill_s_per_attended_token = 4·L·D/(η_c·Fmax), so one chunk holding the whole prompt
      (m = A = IL) reproduces eq. 8 exactly; smaller chunks give the causal Σ m_j·A_j ≈ IL²/2.
      prefill_s_per_chunk = 0 (SLIM has no per-step prefill overhead).
    * Decode per step (T_dec/OL), with α' = α + γ·L·(D/1024)² (eq. 10 per token),
      κ = 2·L·Dkv·b_kv/(η_m·BW) (eq. 11 per context token) and c̄ = C(IL, OL)/OL = C/B the mean
      context per sequence (eq. 12), so d(B, C) = p + q·C/B + r·B + s·C with r = α', s = κ and
        - ``paper-a``, eq. 9 as (B + B0)·[T_d + M_dec/(η_m·BW)]: p = B0·α', q = B0·κ;
        - ``paper-b``, eq. 9 as (B + B0)·T_d + B·M_dec/(η_m·BW): p = B0·α', q = 0;
        - ``kneecap`` (slim.py): p = t_step + L·t_layer + W/(η_w·BW) (W = streamed weight bytes), q = 0.
    * request_overhead_s = t_fixed (eq. 5).
    * Tensor parallelism (kneecap.model.parallel), one rank's costs: FLOPs over TP (eq. 7 with
      TP·Fmax), eq. 10's γ term over TP, κ with the rank's KV width ``kv_dim_per_gpu`` and W the
      rank's shard; the 2·L all-reduces per step (Megatron-LM §3), affine in the step's tokens,
      add ``allreduce_step_s`` to p and to each chunk and ``allreduce_token_s`` to r and to each
      prefill token (ring all-reduce, Thakur et al. 2005).
    """
    if form not in ("paper-a", "paper-b", "kneecap"):
        raise InputError("form", f"expected paper-a, paper-b or kneecap, got {form!r}")
    vals = dict(eta_c=eta_c, eta_m=eta_m, layers=layers, hidden=hidden, kv_dim=kv_dim,
                kv_bytes=kv_bytes, peak_flops=peak_flops, bandwidth_bytes_s=bandwidth_bytes_s, eta_w=eta_w)
    for name, v in vals.items():
        _positive(name, v)
    for name, v in dict(alpha=alpha, gamma=gamma, b0=b0, t_fixed_s=t_fixed_s, ff_ratio=ff_ratio, t_step_s=t_step_s,
                        t_layer_s=t_layer_s, weight_bytes=weight_bytes, allreduce_step_s=allreduce_step_s,
                        allreduce_token_s=allreduce_token_s).items():
        _positive(name, v, allow_zero=True)
    _count("tensor_parallel_size", tensor_parallel_size)
    tp = float(tensor_parallel_size)
    if form != "kneecap" and tp != 1:
        raise InputError("tensor_parallel_size", f"the {form} form models one GPU; tensor parallelism needs the kneecap form")
    L, D, Dkv = float(layers), float(hidden), float(kv_dim)
    Dkv_gpu = Dkv if kv_dim_per_gpu is None else float(kv_dim_per_gpu)
    compute_s_per_flop = 1.0 / (eta_c * peak_flops * tp)  # eq. 7, one rank's F/TP
    per_token = L * (4 * D * D + 4 * D * Dkv + 4 * ff_ratio * D * D) * compute_s_per_flop  # eq. 8, linear
    per_attended = 4.0 * L * D * compute_s_per_flop  # eq. 8, 4·IL²·D
    alpha_step = alpha + gamma * L * (D / 1024.0) ** 2 / tp  # eq. 10 per output token
    kappa = 2.0 * L * Dkv_gpu * kv_bytes / (eta_m * bandwidth_bytes_s)  # eq. 11 per context token, per rank
    if form == "kneecap":
        p, q = t_step_s + t_layer_s * L + weight_bytes / (eta_w * bandwidth_bytes_s) + allreduce_step_s, 0.0
    else:
        p, q = b0 * alpha_step, (b0 * kappa if form == "paper-a" else 0.0)
    return ServiceCoefficients(
        prefill_s_per_token=per_token + allreduce_token_s, prefill_s_per_attended_token=per_attended,
        prefill_s_per_chunk=allreduce_step_s,
        decode_step_s=p, decode_s_per_context_token=q, decode_s_per_seq=alpha_step + allreduce_token_s,
        decode_s_per_resident_token=kappa, chunk_tokens=int(chunk_tokens), request_overhead_s=float(t_fixed_s),
    )


def coefficients_for(arch, gpu, params, form: str = "kneecap",
                     chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                     tensor_parallel_size: int = 1) -> ServiceCoefficients:
    """:func:`coefficients_from_slim` from catalog objects (``kneecap.model.arch.ModelArch``,
    ``kneecap.model.hardware.GPU``) and SLIM parameters (``slim.SlimParams`` or its dict).
    d(B, C)'s step cost does not vary with B, so an MoE's step reads every routed expert (the
    limit of slim.weight_read_bytes as B grows: conservative at small batches).
    ``tensor_parallel_size``: one rank's costs plus the all-reduces (kneecap.model.parallel)."""
    from kneecap.model import parallel
    from kneecap.model.slim import SlimParams, arch_arrays, weight_read_bytes

    p = params if isinstance(params, SlimParams) else SlimParams.from_dict(dict(params))
    tp = parallel.check_tensor_parallel_size(arch, tensor_parallel_size)
    streamed_weight_bytes = lambda a: float(weight_read_bytes(arch_arrays(a, tp), np.inf))  # noqa: E731
    ar_step_s, ar_token_s = parallel.allreduce_coefficients(arch, gpu, tp)
    return coefficients_from_slim(
        tensor_parallel_size=tp, kv_dim_per_gpu=parallel.kv_heads_per_gpu(arch, tp) * arch.head_dim
        if tp > 1 else None, allreduce_step_s=ar_step_s, allreduce_token_s=ar_token_s,
        eta_c=p.eta_c, eta_m=p.eta_m, alpha=p.alpha_s, gamma=p.gamma_s, b0=p.b0, t_fixed_s=p.t_fixed_s,
        t_step_s=p.t_step_s, t_layer_s=p.t_layer_s, eta_w=p.eta_w, weight_bytes=streamed_weight_bytes(arch),
        layers=arch.layers, hidden=arch.hidden, kv_dim=arch.d_kv, ff_ratio=arch.r_ff, kv_bytes=arch.dtype_bytes,
        peak_flops=gpu.peak_flops, bandwidth_bytes_s=gpu.mem_bw_bytes_s, form=form, chunk_tokens=chunk_tokens)


def prefill_compute_s(coef: ServiceCoefficients, input_tokens, cached_tokens, chunk_tokens: float | None = None):
    """(compute seconds, chunk count) of chunked prefill, closed form per request (GAUSS §3.2).

    With s uncached tokens, n = ⌈s/Δ⌉, the last chunk m = s − (n−1)·Δ tokens:
    Σ m_j·A_j = (n−1)·Δ·c + Δ²·n·(n−1)/2 + m·(c + s)  (A_j = c + tokens through chunk j).
    Δ = ``chunk_tokens`` (default: the whole budget, ``coef.chunk_tokens``).
    """
    inp = np.asarray(input_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    delta = float(coef.chunk_tokens if chunk_tokens is None else chunk_tokens)
    s = np.maximum(inp - c, 1.0)
    n = np.ceil(s / delta)
    last = s - (n - 1.0) * delta
    attended = (n - 1.0) * delta * c + delta * delta * n * (n - 1.0) / 2.0 + last * (c + s)
    compute = coef.prefill_s_per_chunk * n + coef.prefill_s_per_token * s + coef.prefill_s_per_attended_token * attended
    return compute, n


def decode_step_s(coef: ServiceCoefficients, batch, resident_tokens):
    """d(B, C) = p + q·C/B + r·B + s·C (GAUSS §3.3; s from SLIM eq. 9–11), B ≥ 1."""
    b = np.maximum(np.asarray(batch, dtype=np.float64), 1.0)
    C = np.asarray(resident_tokens, dtype=np.float64)
    return (coef.decode_step_s + coef.decode_s_per_context_token * C / b
            + coef.decode_s_per_seq * b + coef.decode_s_per_resident_token * C)


@dataclass(frozen=True)
class DecodeFit:
    """d(B, C) coefficients fitted to observed step times (seconds) and the fit's quality."""

    decode_step_s: float  # p
    decode_s_per_context_token: float  # q
    decode_s_per_seq: float  # r
    decode_s_per_resident_token: float  # s
    rms_relative_error: float
    points: int

    def apply(self, coef: ServiceCoefficients) -> ServiceCoefficients:
        """``coef`` with its decode terms replaced by the fitted ones."""
        from dataclasses import replace

        return replace(coef, decode_step_s=self.decode_step_s, decode_s_per_context_token=self.decode_s_per_context_token,
                       decode_s_per_seq=self.decode_s_per_seq, decode_s_per_resident_token=self.decode_s_per_resident_token)


def fit_decode_coefficients(batch, resident_tokens, step_s, per_seq_context: bool = True) -> DecodeFit:
    """Fit d(B, C) = p + q·C/B + r·B + s·C (GAUSS §3.3) to observed inter-token latencies at
    batch B with resident context C (e.g. vLLM ITL against num_requests_running): non-negative
    least squares on the relative error (each row divided by its observation).
    ``per_seq_context=False`` fixes q = 0 (SLIM's form, eqs 9–11; what a roofline twin has)."""
    from scipy.optimize import nnls

    b = np.asarray(batch, dtype=np.float64).ravel()
    c = np.asarray(resident_tokens, dtype=np.float64).ravel()
    y = np.asarray(step_s, dtype=np.float64).ravel()
    if not (b.shape == c.shape == y.shape) or b.size < 4:
        raise InputError("step_s", "expected ≥ 4 observations with equal-length batch, context and step arrays")
    if np.any(~np.isfinite(b) | (b <= 0)) or np.any(~np.isfinite(c) | (c < 0)) or np.any(~np.isfinite(y) | (y <= 0)):
        raise InputError("step_s", "expected positive batch, context ≥ 0 and positive step times, all finite")
    b = np.maximum(b, 1.0)  # as decode_step_s: a mean batch below 1 still decodes one sequence
    design = np.column_stack([np.ones_like(b), c / b if per_seq_context else np.zeros_like(b), b, c])
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls((design / scale) / y[:, None], np.ones_like(y))
    x = x / scale
    rel = design @ x / y - 1.0
    return DecodeFit(*map(float, x), float(np.sqrt(np.mean(rel * rel))), int(y.size))


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
    at capacity: module docstring) is unstable."""
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


# --------------------------------------------------------------------------- queues


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


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class LatencyStats:
    """Pooled mean and p50/p95/p99 (seconds) with 95% CI half-widths from the spread of
    independent replications (Student t)."""

    mean: float
    p50: float
    p95: float
    p99: float
    mean_ci: float
    p50_ci: float
    p95_ci: float
    p99_ci: float
    # the SLO quantile when it is none of p50/p95/p99 (any q in (0, 1)), else None
    q: float | None = None
    pq: float = math.nan
    pq_ci: float = math.nan

    def quantile(self, q: float) -> float:
        if q == self.q:
            return self.pq
        return {0.5: self.p50, 0.95: self.p95, 0.99: self.p99}[q]

    def to_dict(self) -> dict:
        """JSON-safe: a CI that cannot be estimated (one non-empty replication) is None."""
        ci = {"mean": self.mean_ci, "p50": self.p50_ci, "p95": self.p95_ci, "p99": self.p99_ci}
        out = {"mean": self.mean, "p50": self.p50, "p95": self.p95, "p99": self.p99}
        if self.q is not None:
            out[quantile_name(self.q)] = self.pq
            ci[quantile_name(self.q)] = self.pq_ci
        return {**out, "ci95_halfwidth": {k: (v if math.isfinite(v) else None) for k, v in ci.items()}}


def quantile_name(q: float) -> str:
    """0.95 -> 'p95', 0.9 -> 'p90', 0.975 -> 'p97.5'."""
    return f"p{round(q * 100, 6):g}"


def latency_stats(groups: list[np.ndarray], q: float | None = None) -> LatencyStats:
    """Stats over replications (a list of 1-D sample arrays, one per replication); `q`, an SLO
    quantile other than p50/p95/p99, is summarised too."""
    from scipy.special import stdtrit  # Student t quantile; lighter import than scipy.stats

    pooled = np.concatenate(groups)
    if pooled.size == 0:
        raise InputError("samples", "no samples to summarise")
    extra = q is not None and q not in QUANTILES
    levels = QUANTILES + ((q,) if extra else ())
    qs = np.quantile(pooled, levels)
    per = np.array([[g.mean(), *np.quantile(g, levels)] for g in groups if g.size])
    if per.shape[0] > 1:
        half = stdtrit(per.shape[0] - 1, 0.975) * per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])
    else:
        half = np.full(len(levels) + 1, float("inf"))
    stats = LatencyStats(float(pooled.mean()), *map(float, qs[:3]), *map(float, half[:4]))
    return replace(stats, q=q, pq=float(qs[3]), pq_ci=float(half[4])) if extra else stats


@dataclass(frozen=True)
class SweepPoint:
    rate_rps: float
    ttft_s: tuple[float, float, float]  # p50, p95, p99
    tbt_s: tuple[float, float, float] | None
    utilisation: float


@dataclass(frozen=True)
class GaussResult:
    """Outcome of :func:`simulate`. ``tbt`` is None in raw-queue mode (no decode)."""

    rate_rps: float
    servers: int
    ttft: LatencyStats
    tbt: LatencyStats | None
    wait: LatencyStats
    service: LatencyStats
    service_rate_rps: float  # μ·k = k/E[S] at this rate
    utilisation: float  # ρ per server
    stable_rate_rps: float  # largest stable λ (GAUSS λ* = μ, §3.5)
    stable_binding: str
    sustainable_rate_rps: float  # λ where the SLO quantile crosses the SLO (stable rate if no SLO)
    sustainable_binding: str  # which limit sets it: ttft_slo, tbt_slo, prefill, decode, queue
    sustainable_note: str | None  # "infeasible: …" when no λ > 0 meets the SLO
    decode_batch: float | None
    quantile: float
    samples: int
    replications: int
    sweep: tuple[SweepPoint, ...] = ()
    e2e: LatencyStats | None = None  # TTFT + (OL − 1)·TBT per request (GAUSS §3.7); None in raw-queue mode
    ttft_sample_s: np.ndarray = field(default=None, repr=False, compare=False)  # subsample for plots
    tbt_sample_s: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the engine's limits (None without them, and in raw-queue mode)
    limits: EngineLimits | None = None
    prefill_chunk_tokens: float | None = None  # Δ = budget − ⌊B̄⌋ at this rate
    admission_wait: LatencyStats | None = None  # the wait the batch cap and the KV cache add
    admission_wait_fraction: float | None = None  # P(that wait > 0)
    preempted_fraction: float | None = None  # share of requests preempted (recompute) at least once
    preemptions_per_request: float | None = None
    preemption_mean_s: float | None = None  # latency preemptions add to a preempted request, mean


# --------------------------------------------------------------------------- engine


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


@dataclass(frozen=True)
class _Limited:
    """What the engine's limits did to the kept requests of one evaluation."""

    admission_wait_s: np.ndarray  # queueing delay the batch cap and the KV cache add (W − W uncapped)
    preemptions: np.ndarray  # times each request was preempted (recompute)
    first_token_delay_s: np.ndarray  # what preemptions before the first token add to TTFT
    decode_delay_s: np.ndarray  # what preemptions after it add to the decode time


LIMIT_PASSES = 3  # fixed-point passes of admission ↔ decode windows once a limit binds (p95 TTFT within ~3%)


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


# --------------------------------------------------------------------------- engine limits


def _apply_limits(coef, moments, op, limits, draws, inter, servers, full_s, S, shared, lag, chunks, W_all, tbt_all,
                  tbt_of, warm):
    """The path under the batch cap and the KV cache (module docstring, "Engine limits"):
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
    seats, per chain (the recurrence of the module docstring):

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


def _admit_kv(arrival, service, unshared_service, shared, lag, decode, servers, slots, kv, prompt, growth,
              redo_first_s, redo_last_s, steps):
    """:func:`_admit` with a KV cache of ``kv`` tokens, event by event per chain (module
    docstring, "KV cache"). The running set's resident context is R(t) = Σ r_j + g_j·(t − f_j)
    (r_j resident at its admission, g_j = 1/τ_j tokens/s from its first token f_j). A request
    is admitted when a seat is free, no preempted request waits and R leaves room for its
    prompt; when R reaches ``kv`` the newest running request is preempted (recompute): it
    frees its blocks and waits at the front of the queue; re-admitted when a departure leaves
    room, it recomputes its prompt and the k tokens it had on a prefill slot (``redo_first_s``
    + (``redo_last_s`` − ``redo_first_s``)·k/``steps``) and decodes the rest. Returns (p, p0,
    service used, switched, preemptions, first-token delay, decode delay per request)."""
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



def _groups(x: np.ndarray, replications: int, valid: np.ndarray | None = None) -> list[np.ndarray]:
    rows = x.reshape(replications, -1)
    if valid is None:
        return list(rows)
    ok = valid.reshape(replications, -1)
    return [r[m] for r, m in zip(rows, ok)]


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


def _check_common(rate_rps, servers, samples, replications, quantile):
    rate = _positive("rate_rps", rate_rps)
    if not isinstance(servers, (int, np.integer)) or servers < 1:
        raise InputError("servers", f"expected a positive integer, got {servers!r}")
    if not isinstance(replications, (int, np.integer)) or replications < 2:
        raise InputError("replications", f"expected an integer ≥ 2 (CIs need several), got {replications!r}")
    if not isinstance(samples, (int, np.integer)) or samples < 100 * replications:
        raise InputError("samples", f"expected an integer ≥ 100·replications = {100 * replications}, got {samples!r}")
    if not (isinstance(quantile, (int, float)) and 0 < quantile < 1):
        raise InputError("quantile", f"expected a quantile in (0, 1), got {quantile!r}")
    return rate


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


def _finish(draws, coef, moments, rate, servers, replications, chains, warm, slo_ttft_s, slo_tbt_s,
            quantile, sweep_points, search_samples, stable_rps, stable_stage, rng_plot, limits=None):
    ttft, tbt, W, S, op, limited = _evaluate(draws, coef, moments, rate, servers, warm, limits=limits)
    # group chains into replications: (chains, kept) -> (replications, chains/replications·kept)
    ttft_stats = latency_stats(_groups(ttft, replications), quantile)
    wait_stats = latency_stats(_groups(W, replications), quantile)
    service_stats = latency_stats(_groups(S, replications), quantile)
    tbt_stats = None
    e2e_stats = None
    if tbt is not None and np.any(tbt >= 0):
        tbt_stats = latency_stats(_groups(tbt, replications, tbt >= 0), quantile)
        out = draws.out[:, draws.out.shape[1] - ttft.shape[1]:]
        e2e_stats = latency_stats(_groups(ttft + (out - 1.0) * np.maximum(tbt, 0.0), replications), quantile)  # GAUSS §3.7
    sd = _search_draws(draws, search_samples, servers, warm)
    lam_star, binding, note = _sustainable(sd, coef, moments, servers, warm, stable_rps, stable_stage,
                                           slo_ttft_s, slo_tbt_s, quantile, limits=limits)
    sweep = _sweep(sd, coef, moments, servers, warm, stable_rps, sweep_points, limits=limits) if sweep_points else ()
    mean_s = op.mean_service_s if op is not None else servers / stable_rps  # raw queue: nominal E[S]
    rho = op.utilisation if op is not None else rate * mean_s / servers
    sub = rng_plot.choice(ttft.size, size=min(ttft.size, 20000), replace=False)
    tbt_sub = None
    if tbt is not None:
        v = tbt[tbt >= 0]
        tbt_sub = v[rng_plot.choice(v.size, size=min(v.size, 20000), replace=False)] if v.size else None
    return GaussResult(
        rate_rps=rate, servers=servers, ttft=ttft_stats, tbt=tbt_stats, wait=wait_stats, service=service_stats,
        service_rate_rps=servers / mean_s, utilisation=rho, stable_rate_rps=stable_rps, stable_binding=stable_stage,
        sustainable_rate_rps=lam_star, sustainable_binding=binding, sustainable_note=note,
        decode_batch=None if op is None else op.decode_batch, quantile=quantile, samples=int(ttft.size),
        replications=replications, sweep=sweep, e2e=e2e_stats, ttft_sample_s=ttft.ravel()[sub], tbt_sample_s=tbt_sub,
        **_limit_fields(limited, limits, op, replications, quantile))


def _limit_fields(limited: _Limited | None, limits: EngineLimits | None, op, replications: int, quantile: float):
    """GaussResult's engine-limit fields from one evaluation (None without limits)."""
    if limited is None:
        return {}
    preempted = limited.preemptions > 0
    delay_s = limited.first_token_delay_s + limited.decode_delay_s
    return dict(limits=limits, prefill_chunk_tokens=op.chunk_tokens,
                admission_wait=latency_stats(_groups(limited.admission_wait_s, replications), quantile),
                admission_wait_fraction=float(np.mean(limited.admission_wait_s > 0.0)),
                preempted_fraction=float(preempted.mean()), preemptions_per_request=float(limited.preemptions.mean()),
                preemption_mean_s=float(delay_s[preempted].mean()) if preempted.any() else 0.0)


def _engine_draws(workload, coef, rng, servers, burst_cv, samples, replications, limits, **positive):
    """(draws, moments, chains, warm, stability limit, its stage) of an engine simulation, after
    checking ``coef``, ``limits`` and that each of ``positive`` (name: value or None) is positive."""
    for name, v in positive.items():
        if v is not None:
            _positive(name, v)
    if not isinstance(coef, ServiceCoefficients):
        raise InputError("coef", f"expected ServiceCoefficients, got {type(coef).__name__}")
    if limits is not None:
        if not isinstance(limits, EngineLimits):
            raise InputError("limits", f"expected EngineLimits or None, got {type(limits).__name__}")
        if coef.chunk_tokens < limits.slots:  # vLLM refuses this too (SchedulerConfig)
            raise InputError("max_num_batched_tokens", f"the token budget {coef.chunk_tokens} is below the batch cap "
                             f"{limits.slots}: expected max_num_batched_tokens ≥ max_num_seqs")
    chains, kept, warm = _layout(samples, replications, servers)
    draws = _draw_llm(workload, chains, kept + warm, burst_cv, rng)
    if limits is not None:  # vLLM's prefix cache hits whole blocks only; off, nothing is cached
        cached = (np.floor(draws.cached / limits.block_size) * limits.block_size if limits.enable_prefix_caching
                  else np.zeros_like(draws.cached))
        draws = replace(draws, cached=cached)
    draws = _with_prefill(draws, coef)
    moments = workload_moments(coef, draws.inp, draws.cached, draws.out)
    return (draws, moments, chains, warm, *stability_limit_rps(coef, moments, servers, limits))


def simulate(
    workload: Workload | BucketWorkload, coef: ServiceCoefficients, rate_rps: float, *,
    rng: np.random.Generator, servers: int = 1, burst_cv: float = 1.0, samples: int = 10**6,
    replications: int = 8, slo_ttft_s: float | None = None, slo_tbt_s: float | None = None,
    quantile: float = 0.95, sweep_points: int = 0, search_samples: int = 200_000,
    limits: EngineLimits | None = DEFAULT_LIMITS,
) -> GaussResult:
    """GAUSS Algorithm 1: TTFT/TBT/wait distributions at λ = ``rate_rps`` on ``servers`` engines
    sharing one FCFS queue, the service rate, the stability limit and the SLO-sustainable rate
    (bisection over λ with common random numbers on ``search_samples`` samples), and optionally a
    λ sweep of ``sweep_points`` rates from 5% to 98% of the stability limit. ``limits``: the
    engine's batch cap, KV cache and prefix caching (vLLM's defaults; None: none of them).

    Raises :class:`Infeasible` when ``rate_rps`` is at or past the stability limit; an SLO that
    no λ > 0 meets gives ``sustainable_rate_rps = 0`` and an ``infeasible: …`` note.
    """
    rate = _check_common(rate_rps, servers, samples, replications, quantile)
    draws, moments, chains, warm, stable_rps, stage = _engine_draws(
        workload, coef, rng, servers, burst_cv, samples, replications, limits, slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s)
    if rate >= stable_rps:
        why = {"batch": "the running set fills max_num_seqs", "kv": "the KV cache cannot hold the decode batch"}
        raise Infeasible(stage, f"{rate:.4g} req/s is at or past the stability limit {stable_rps:.4g} req/s "
                         f"({servers} server{'s' if servers > 1 else ''}; {why.get(stage, 'ρ ≥ 1')})",
                         stable_rate_rps=stable_rps)
    return _finish(draws, coef, moments, rate, servers, replications, chains, warm, slo_ttft_s, slo_tbt_s,
                   quantile, sweep_points, search_samples, stable_rps, stage, rng, limits)


@dataclass(frozen=True)
class SustainableRate:
    """λ* alone: the SLO-sustainable rate per ``servers`` engines, what binds it, and the
    stability limit it lies below (``note``: why none is sustainable)."""

    rate_rps: float
    binding: str
    stable_rate_rps: float
    note: str | None


def sustainable_rate(
    workload: Workload | BucketWorkload, coef: ServiceCoefficients, *, rng: np.random.Generator,
    servers: int = 1, burst_cv: float = 1.0, samples: int = 200_000, replications: int = 4,
    slo_ttft_s: float | None = None, slo_tbt_s: float | None = None, quantile: float = 0.95,
    rel_tol: float = 1e-3, hint_rps: float | None = None, limits: EngineLimits | None = DEFAULT_LIMITS,
) -> SustainableRate:
    """GAUSS's λ search alone (Algorithm 1's bisection over λ, common random numbers): what an
    autoscaler needs, without the full distributions at one rate that :func:`simulate` adds.
    The draws are :func:`simulate`'s for the same ``rng``, ``samples`` and ``replications``, so
    the answer is the same λ* to ``rel_tol``; ``hint_rps`` (a λ* of nearby inputs) warm-starts
    the bisection. No SLO: λ* is the stability limit."""
    _check_common(1.0, servers, samples, replications, quantile)
    if not (isinstance(rel_tol, (int, float)) and 0 < rel_tol < 1):
        raise InputError("rel_tol", f"expected a relative tolerance in (0, 1), got {rel_tol!r}")
    draws, moments, _, warm, stable_rps, stage = _engine_draws(
        workload, coef, rng, servers, burst_cv, samples, replications, limits, slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s, hint_rps=hint_rps)
    lam, binding, note = _sustainable(draws, coef, moments, servers, warm, stable_rps, stage, slo_ttft_s,
                                      slo_tbt_s, quantile, rel_tol=rel_tol, hint_rps=hint_rps, limits=limits)
    return SustainableRate(float(lam), binding, float(stable_rps), note)


def simulate_queue(
    rate_rps: float, service_mean_s: float, *, rng: np.random.Generator, service_dist: str = "exp",
    service_cv: float | None = None, servers: int = 1, burst_cv: float = 1.0, samples: int = 10**6,
    replications: int = 8, slo_s: float | None = None, quantile: float = 0.95, sweep_points: int = 0,
    search_samples: int = 200_000,
) -> GaussResult:
    """Raw G/G/k FCFS queue for textbook checks: ``ttft`` is the sojourn W + S, ``tbt`` None.
    ``slo_s`` applies to the sojourn quantile. Raises :class:`Infeasible` when ρ = λ·E[S]/k ≥ 1."""
    rate = _check_common(rate_rps, servers, samples, replications, quantile)
    mean = _positive("service_mean_s", service_mean_s)
    if slo_s is not None:
        _positive("slo_s", slo_s)
    rho = rate * mean / servers
    stable_rps = servers / mean
    if rho >= 1.0:
        raise Infeasible("queue", f"ρ = λ·E[S]/k = {rho:.4g} ≥ 1 (stability limit {stable_rps:.4g} req/s)",
                         utilisation=rho)
    chains, kept, warm = _layout(samples, replications, servers)
    shape = (chains, kept + warm)
    inter = unit_interarrivals(shape, rng, burst_cv)
    service = raw_service_draws(service_dist, mean, service_cv, shape, rng)
    empty = np.empty((0, 0))
    draws = _Draws(inter, empty, empty, empty, empty, empty, service)
    return _finish(draws, None, None, rate, servers, replications, chains, warm, slo_s, None,
                   quantile, sweep_points, search_samples, stable_rps, "queue", rng)


def sweep_rates(
    workload: Workload | BucketWorkload, coef: ServiceCoefficients, *, rng: np.random.Generator,
    points: int = 20, servers: int = 1, burst_cv: float = 1.0, samples: int = 200_000, replications: int = 4,
    limits: EngineLimits | None = DEFAULT_LIMITS,
) -> tuple[SweepPoint, ...]:
    """λ sweep alone (GAUSS §3.7): TTFT/TBT p50/p95/p99 at ``points`` rates from 5% to 98% of the
    stability limit, all on the same base draws (common random numbers: curves are monotone)."""
    _check_common(1.0, servers, samples, replications, 0.95)
    if not isinstance(points, (int, np.integer)) or points < 2:
        raise InputError("points", f"expected an integer ≥ 2, got {points!r}")
    draws, moments, _, warm, stable_rps, _ = _engine_draws(workload, coef, rng, servers, burst_cv, samples,
                                                           replications, limits)
    return _sweep(draws, coef, moments, servers, warm, stable_rps, points, limits=limits)


@dataclass(frozen=True)
class TraceReplay:
    """GAUSS on one given trace (:func:`replay`), per request in arrival order, seconds."""

    ttft_s: np.ndarray
    tbt_s: np.ndarray  # −1 where a request has one output token (no TBT)
    e2e_s: np.ndarray
    preemptions: np.ndarray
    rate_rps: float  # the trace's mean arrival rate, (n − 1)/(last − first arrival)
    stable_rate_rps: float
    stable_binding: str
    operating_rate_rps: float  # where the mean-field operating point was taken (module docstring)
    decode_batch: float


def replay(arrival_s, input_tokens, output_tokens, coef: ServiceCoefficients, *, rng: np.random.Generator,
           cached_tokens=None, servers: int = 1, limits: EngineLimits | None = DEFAULT_LIMITS) -> TraceReplay:
    """GAUSS Algorithm 1 on a given trace instead of sampled draws: the measured arrivals and
    per-request lengths go through the same prefill, packing, queue (Lindley / Kiefer–Wolfowitz,
    §3.6), engine-limit and TBT path as :func:`simulate`; nothing is discarded as warm-up.

    The mean-field operating point (B̄, d̄, §3.8) is taken at the trace's mean rate; a trace past
    the stability limit (a transient overload) takes it at the limit: the engine runs with its
    running set at the bound that binds, and the excess waits in the queue and the admission
    recurrence. Only the residual-step and multi-server draws use ``rng``."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    inp = np.asarray(input_tokens, dtype=np.float64)
    out = np.asarray(output_tokens, dtype=np.float64)
    cached = np.zeros_like(inp) if cached_tokens is None else np.asarray(cached_tokens, dtype=np.float64)
    n = arr.size
    for name, a in (("input_tokens", inp), ("output_tokens", out), ("cached_tokens", cached)):
        if a.shape != arr.shape:
            raise InputError(name, f"expected one value per arrival ({n}), got shape {a.shape}")
    if n < 2 or arr.ndim != 1:
        raise InputError("arrival_s", f"expected a 1-D trace of at least 2 arrivals, got shape {arr.shape}")
    if not (np.all(np.isfinite(arr)) and np.all(np.diff(arr) >= 0)):
        raise InputError("arrival_s", "expected finite arrival times in non-decreasing order")
    if not (np.all(inp >= 1) and np.all(out >= 1)):
        raise InputError("input_tokens", "expected at least one input and one output token per request")
    if np.any(cached < 0) or np.any(cached >= inp):
        raise InputError("cached_tokens", "expected 0 ≤ cached < input tokens per request")
    if not isinstance(coef, ServiceCoefficients):
        raise InputError("coef", f"expected ServiceCoefficients, got {type(coef).__name__}")
    _count("servers", servers)
    if limits is not None:
        if not isinstance(limits, EngineLimits):
            raise InputError("limits", f"expected EngineLimits or None, got {type(limits).__name__}")
        cached = (np.floor(cached / limits.block_size) * limits.block_size if limits.enable_prefix_caching
                  else np.zeros_like(cached))
    span_s = float(arr[-1] - arr[0])
    rate = (n - 1) / span_s if span_s > 0 else math.inf
    inter = np.zeros((1, n))
    inter[0, 1:] = np.diff(arr)
    shape = (1, n)
    draws = _Draws(inter, inp.reshape(shape), cached.reshape(shape), out.reshape(shape),
                   rng.standard_normal(shape), rng.standard_normal(shape), None, u_residual=rng.random(shape))
    draws = _with_prefill(draws, coef)
    moments = workload_moments(coef, draws.inp, draws.cached, draws.out)
    stable, stage = stability_limit_rps(coef, moments, servers, limits)
    op_rate = min(rate, stable * (1.0 - 1e-6))
    if not op_rate > 0:
        raise Infeasible(stage, f"no stable rate for this trace's lengths ({stage} stage)", stable_rate_rps=stable)
    ttft, tbt, _, _, op, limited = _evaluate(draws, coef, moments, op_rate, servers, 0, limits=limits,
                                             interarrival_s=inter)
    tbt = tbt[0]
    e2e = ttft[0] + (out - 1.0) * np.maximum(tbt, 0.0)  # GAUSS §3.7
    pre = np.zeros(n) if limited is None else limited.preemptions[0]
    return TraceReplay(ttft[0], tbt, e2e, pre, float(rate), float(stable), stage, float(op_rate),
                       float(op.decode_batch))
