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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Union

import numpy as np

from kneecap.errors import InputError

QUANTILES = (0.5, 0.95, 0.99)
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
    chunk_tokens: int = 2048  # Δ: vLLM max_num_batched_tokens
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


def coefficients_from_slim(
    *, eta_c: float, eta_m: float, alpha: float, gamma: float, t_fixed_s: float,
    layers: int, hidden: int, kv_dim: int, ff_ratio: float, kv_bytes: float,
    peak_flops: float, bandwidth_bytes_s: float, b0: float = 0.0, form: str = "paper-a",
    t_step_s: float = 0.0, t_layer_s: float = 0.0, eta_w: float = 1.0, weight_bytes: float = 0.0,
    chunk_tokens: int = 2048,
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
    """
    if form not in ("paper-a", "paper-b", "kneecap"):
        raise InputError("form", f"expected paper-a, paper-b or kneecap, got {form!r}")
    vals = dict(eta_c=eta_c, eta_m=eta_m, layers=layers, hidden=hidden, kv_dim=kv_dim,
                kv_bytes=kv_bytes, peak_flops=peak_flops, bandwidth_bytes_s=bandwidth_bytes_s, eta_w=eta_w)
    for name, v in vals.items():
        _positive(name, v)
    for name, v in dict(alpha=alpha, gamma=gamma, b0=b0, t_fixed_s=t_fixed_s, ff_ratio=ff_ratio, t_step_s=t_step_s,
                        t_layer_s=t_layer_s, weight_bytes=weight_bytes).items():
        _positive(name, v, allow_zero=True)
    L, D, Dkv = float(layers), float(hidden), float(kv_dim)
    compute_s_per_flop = 1.0 / (eta_c * peak_flops)  # eq. 7
    per_token = L * (4 * D * D + 4 * D * Dkv + 4 * ff_ratio * D * D) * compute_s_per_flop  # eq. 8, linear
    per_attended = 4.0 * L * D * compute_s_per_flop  # eq. 8, 4·IL²·D
    alpha_step = alpha + gamma * L * (D / 1024.0) ** 2  # eq. 10 per output token
    kappa = 2.0 * L * Dkv * kv_bytes / (eta_m * bandwidth_bytes_s)  # eq. 11 per context token
    if form == "kneecap":
        p, q = t_step_s + t_layer_s * L + weight_bytes / (eta_w * bandwidth_bytes_s), 0.0
    else:
        p, q = b0 * alpha_step, (b0 * kappa if form == "paper-a" else 0.0)
    return ServiceCoefficients(
        prefill_s_per_token=per_token, prefill_s_per_attended_token=per_attended, prefill_s_per_chunk=0.0,
        decode_step_s=p, decode_s_per_context_token=q, decode_s_per_seq=alpha_step,
        decode_s_per_resident_token=kappa, chunk_tokens=int(chunk_tokens), request_overhead_s=float(t_fixed_s),
    )


def coefficients_for(arch, gpu, params, form: str = "kneecap", chunk_tokens: int = 2048) -> ServiceCoefficients:
    """:func:`coefficients_from_slim` from catalog objects (``kneecap.model.arch.ModelArch``,
    ``kneecap.model.hardware.GPU``) and SLIM parameters (``slim.SlimParams`` or its dict).
    d(B, C)'s step cost does not vary with B, so an MoE's step reads every routed expert (the
    limit of slim.weight_read_bytes as B grows: conservative at small batches)."""
    from kneecap.model.slim import SlimParams, arch_arrays, weight_read_bytes

    p = params if isinstance(params, SlimParams) else SlimParams.from_dict(dict(params))
    streamed_weight_bytes = lambda a: float(weight_read_bytes(arch_arrays(a), np.inf))  # noqa: E731
    return coefficients_from_slim(
        eta_c=p.eta_c, eta_m=p.eta_m, alpha=p.alpha_s, gamma=p.gamma_s, b0=p.b0, t_fixed_s=p.t_fixed_s,
        t_step_s=p.t_step_s, t_layer_s=p.t_layer_s, eta_w=p.eta_w, weight_bytes=streamed_weight_bytes(arch),
        layers=arch.layers, hidden=arch.hidden, kv_dim=arch.d_kv, ff_ratio=arch.r_ff, kv_bytes=arch.dtype_bytes,
        peak_flops=gpu.peak_flops, bandwidth_bytes_s=gpu.mem_bw_bytes_s, form=form, chunk_tokens=chunk_tokens)


def prefill_compute_s(coef: ServiceCoefficients, input_tokens, cached_tokens):
    """(compute seconds, chunk count) of chunked prefill, closed form per request (GAUSS §3.2).

    With s uncached tokens, n = ⌈s/Δ⌉, the last chunk m = s − (n−1)·Δ tokens:
    Σ m_j·A_j = (n−1)·Δ·c + Δ²·n·(n−1)/2 + m·(c + s)  (A_j = c + tokens through chunk j).
    """
    inp = np.asarray(input_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    delta = float(coef.chunk_tokens)
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

    prefill_compute_s: float  # E[S_c]
    chunks: float  # E[n]
    output_tokens: float  # E[OL]
    context_tokens: float  # c̄: decode-time-weighted mean resident context per sequence


def workload_moments(coef: ServiceCoefficients, inp, cached, out) -> WorkloadMoments:
    compute, n = prefill_compute_s(coef, inp, cached)
    own_ctx = inp + (out + 1.0) / 2.0  # eq. 12 / OL: mean context during this request's decode
    return WorkloadMoments(float(compute.mean()), float(n.mean()), float(out.mean()),
                           float((out * own_ctx).sum() / out.sum()))


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


def _decode_mean(coef: ServiceCoefficients, b: float, cbar: float) -> float:
    # E over B ~ Poisson(b) of d(B, B·c̄) with an empty batch costing p only.
    return (coef.decode_step_s + coef.decode_s_per_context_token * cbar * (-math.expm1(-b))
            + (coef.decode_s_per_seq + coef.decode_s_per_resident_token * cbar) * b)


def operating_point(coef: ServiceCoefficients, m: WorkloadMoments, rate_per_server_rps: float) -> OperatingPoint:
    """Mean decode batch by Little's law B̄ = λ_s·E[OL]·τ(B̄) (GAUSS §3.8, closed form since d is
    affine in B); raise Infeasible when decode (1 − ρ_c − λ·E[OL]·(r + s·c̄) ≤ 0) or prefill
    (ρ = λ·E[S] ≥ 1) is unstable."""
    lam = float(rate_per_server_rps)
    rho_c = lam * m.prefill_compute_s
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
    service = m.prefill_compute_s + m.chunks * dbar
    rho = lam * service
    if rho >= 1.0:
        # name the stage whose work dominates the saturated prefill slot
        stage = "decode" if m.chunks * dbar > m.prefill_compute_s else "prefill"
        raise Infeasible(stage, f"ρ = λ·E[S] = {rho:.3g} ≥ 1 at {lam:.4g} req/s per server (E[S] = {service:.4g} s: "
                         f"prefill compute {m.prefill_compute_s:.4g} s + {m.chunks:.3g} chunk steps × decode batch "
                         f"step {dbar:.4g} s at B̄ = {b:.3g})", utilisation=rho)
    # engine steps per second 1/τ_sys with τ_sys = d̄/(1 − ρ_c); a share f of them carries a chunk
    f = lam * m.chunks * dbar / (1.0 - rho_c)  # f < 1 ⟺ ρ < 1
    return OperatingPoint(lam, b, dbar, tau, f, m.prefill_compute_s / max(m.chunks, 1e-300), service, rho)


def stability_limit_rps(coef: ServiceCoefficients, m: WorkloadMoments, servers: int = 1) -> tuple[float, str]:
    """Largest total λ with both stages stable (bisection on the mean-field model) and the stage
    that binds there."""
    def stable(lam):
        try:
            operating_point(coef, m, lam / servers)
            return None
        except Infeasible as exc:
            return exc.stage
    hi = servers / max(m.prefill_compute_s + m.chunks * coef.decode_step_s, 1e-300)  # ρ(λ) ≥ λ·E[S] at B̄ = 0
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


def _evaluate(draws: _Draws, coef: ServiceCoefficients | None, moments: WorkloadMoments | None,
              rate_rps: float, servers: int, warm: int, want_tbt: bool = True):
    """(ttft, tbt or None, wait, service, operating point or None) at λ: kept columns only."""
    inter = draws.unit_inter / rate_rps
    if coef is None:
        S = draws.raw_service_s
        op = None
        overhead = 0.0
    else:
        op = operating_point(coef, moments, rate_rps / servers)
        compute, n = ((draws.prefill_s, draws.chunks) if draws.prefill_s is not None
                      else prefill_compute_s(coef, draws.inp, draws.cached))
        S = compute + n * op.decode_step_s  # GAUSS §3.4: chunk steps carry the decode batch
        slot_steps, lag = n, np.zeros_like(S)
        if coef.prefill_packing and servers == 1:
            S, slot_steps, lag = _packed_service(S, compute, n, op.decode_step_s, inter,
                                                 draws.inp - draws.cached, coef.chunk_tokens - op.decode_batch)
        overhead = coef.request_overhead_s
    W_all = queue_waits(S, inter, servers)
    W = W_all[:, warm:]
    ttft = W + S[:, warm:] + overhead  # GAUSS §3.7
    if coef is not None:
        ttft = ttft + lag[:, warm:]
    if coef is not None and draws.u_residual is not None:
        # a request that finds the prefill slot free still waits for the engine's step in flight:
        # residual life of a step of length d̄ (Kleinrock, Queueing Systems I, eq. 5.12; U(0, d̄)
        # for a fixed length), the engine being busy with probability 1 − e^{−B̄} (PASTA)
        busy = -math.expm1(-op.decode_batch)
        ttft = ttft + np.where(W == 0.0, draws.u_residual[:, warm:] * op.decode_step_s * busy, 0.0)
    tbt = None
    if coef is not None and want_tbt:
        if servers == 1:
            tbt = _tbt_sample_path(coef, moments, op, inter, W_all, S, slot_steps, lag, draws.inp,
                                   draws.out)[:, warm:]
        else:
            tbt = _tbt_mean_field(coef, moments, op, draws.inp[:, warm:], draws.out[:, warm:],
                                  draws.z_batch[:, warm:], draws.z_chunk[:, warm:])
        tbt = np.where(draws.out[:, warm:] >= 2.0, tbt, -1.0)  # one output token: no TBT
    return ttft, tbt, W, S[:, warm:], op


def _packed_service(full_s, compute_s, chunks, step_s, inter, uncached, budget_tokens, passes: int = 2):
    """Prefill-slot service with vLLM's prompt packing (GAUSS §3.4 amended): a step admits every
    waiting prompt that fits its token budget, so a request that arrived before its predecessor
    started (A_i < W_{i−1}) and fits beside it (s_{i−1} + s_i ≤ Δ − B̄) shares that step and
    pays its compute and later chunk steps only, S_i = S_c,i + (n_i − 1)·d̄, instead of
    S_c,i + n_i·d̄. Who waited depends on S: fixed-point passes of the Lindley recurrence (§3.6)
    starting from the unpacked service. Returns (S, engine steps each service spans: n_i, or
    n_i − 1 when shared, and the lag from the end of each service to the end of the step it
    shares, when its first token comes)."""
    fits = np.zeros(full_s.shape, dtype=bool)
    fits[:, 1:] = uncached[:, 1:] + uncached[:, :-1] <= budget_tokens
    packed_s = compute_s + (chunks - 1.0) * step_s
    S, shared = full_s, np.zeros_like(fits)
    for _ in range(passes):
        W = lindley_waits(S, inter)
        shared[:, 1:] = fits[:, 1:] & (inter[:, 1:] < W[:, :-1])
        S = np.where(shared, packed_s, full_s)
    # every member of a shared step gets its first token when the step ends: at the last
    # member's service end (FCFS ends are nondecreasing)
    end = np.cumsum(inter, axis=1) + lindley_waits(S, inter) + S
    n = end.shape[1]
    last = np.ones_like(shared)
    last[:, :-1] = ~shared[:, 1:]  # i closes its step unless i + 1 joins it
    step_end = np.minimum.accumulate(np.where(last, np.arange(n), n - 1)[:, ::-1], axis=1)[:, ::-1]
    return S, chunks - shared, np.take_along_axis(end, step_end, axis=1) - end


def _tbt_mean_field(coef, moments, op, inp, out, z_batch, z_chunk):
    """TBT with a fixed-over-lifetime batch 1 + Poisson(B̄) (PASTA; normal approximation) and a
    Binomial(K, f)/K share of chunk steps (normal approximation). Used for k > 1 servers."""
    b = op.decode_batch
    others = np.maximum(b + math.sqrt(b) * z_batch, 0.0)
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
                 rel_tol=1e-3, hint_rps=None):
    """λ* by bisection with common random numbers: the largest λ whose q-quantiles meet the SLOs.

    ``hint_rps`` (a λ* found on nearby inputs) starts the bisection from the bracket ±5% around
    it when the SLOs are met at its lower end and missed at its upper one, and from the full
    range [0, stability limit] otherwise: the same answer to ``rel_tol``, in fewer evaluations."""
    if slo_ttft_s is None and slo_tbt_s is None:
        return stable_rps, stable_stage, None

    def meets(lam):
        ttft, tbt, *_ = _evaluate(draws, coef, moments, lam, servers, warm, want_tbt=slo_tbt_s is not None)
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


def _sweep(draws, coef, moments, servers, warm, stable_rps, points, fractions=None):
    fr = np.linspace(0.05, 0.98, points) if fractions is None else np.asarray(fractions)
    out = []
    for lam in fr * stable_rps:
        ttft, tbt, _, _, op = _evaluate(draws, coef, moments, float(lam), servers, warm)
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
            quantile, sweep_points, search_samples, stable_rps, stable_stage, rng_plot):
    ttft, tbt, W, S, op = _evaluate(draws, coef, moments, rate, servers, warm)
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
                                           slo_ttft_s, slo_tbt_s, quantile)
    sweep = _sweep(sd, coef, moments, servers, warm, stable_rps, sweep_points) if sweep_points else ()
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
        replications=replications, sweep=sweep, e2e=e2e_stats, ttft_sample_s=ttft.ravel()[sub], tbt_sample_s=tbt_sub)


def _engine_draws(workload, coef, rng, servers, burst_cv, samples, replications, **positive):
    """(draws, moments, chains, warm, stability limit, its stage) of an engine simulation, after
    checking ``coef`` and that each of ``positive`` (name: value or None) is positive."""
    for name, v in positive.items():
        if v is not None:
            _positive(name, v)
    if not isinstance(coef, ServiceCoefficients):
        raise InputError("coef", f"expected ServiceCoefficients, got {type(coef).__name__}")
    chains, kept, warm = _layout(samples, replications, servers)
    draws = _with_prefill(_draw_llm(workload, chains, kept + warm, burst_cv, rng), coef)
    moments = workload_moments(coef, draws.inp, draws.cached, draws.out)
    return (draws, moments, chains, warm, *stability_limit_rps(coef, moments, servers))


def simulate(
    workload: Workload | BucketWorkload, coef: ServiceCoefficients, rate_rps: float, *,
    rng: np.random.Generator, servers: int = 1, burst_cv: float = 1.0, samples: int = 10**6,
    replications: int = 8, slo_ttft_s: float | None = None, slo_tbt_s: float | None = None,
    quantile: float = 0.95, sweep_points: int = 0, search_samples: int = 200_000,
) -> GaussResult:
    """GAUSS Algorithm 1: TTFT/TBT/wait distributions at λ = ``rate_rps`` on ``servers`` engines
    sharing one FCFS queue, the service rate, the stability limit and the SLO-sustainable rate
    (bisection over λ with common random numbers on ``search_samples`` samples), and optionally a
    λ sweep of ``sweep_points`` rates from 5% to 98% of the stability limit.

    Raises :class:`Infeasible` when ``rate_rps`` is at or past the stability limit; an SLO that
    no λ > 0 meets gives ``sustainable_rate_rps = 0`` and an ``infeasible: …`` note.
    """
    rate = _check_common(rate_rps, servers, samples, replications, quantile)
    draws, moments, chains, warm, stable_rps, stage = _engine_draws(
        workload, coef, rng, servers, burst_cv, samples, replications, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s)
    if rate >= stable_rps:
        op_stage = stage
        raise Infeasible(op_stage, f"{rate:.4g} req/s is at or past the stability limit {stable_rps:.4g} req/s "
                         f"({servers} server{'s' if servers > 1 else ''}; ρ ≥ 1)", stable_rate_rps=stable_rps)
    return _finish(draws, coef, moments, rate, servers, replications, chains, warm, slo_ttft_s, slo_tbt_s,
                   quantile, sweep_points, search_samples, stable_rps, stage, rng)


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
    rel_tol: float = 1e-3, hint_rps: float | None = None,
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
        workload, coef, rng, servers, burst_cv, samples, replications, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s,
        hint_rps=hint_rps)
    lam, binding, note = _sustainable(draws, coef, moments, servers, warm, stable_rps, stage, slo_ttft_s,
                                      slo_tbt_s, quantile, rel_tol=rel_tol, hint_rps=hint_rps)
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
) -> tuple[SweepPoint, ...]:
    """λ sweep alone (GAUSS §3.7): TTFT/TBT p50/p95/p99 at ``points`` rates from 5% to 98% of the
    stability limit, all on the same base draws (common random numbers: curves are monotone)."""
    _check_common(1.0, servers, samples, replications, 0.95)
    if not isinstance(points, (int, np.integer)) or points < 2:
        raise InputError("points", f"expected an integer ≥ 2, got {points!r}")
    chains, kept, warm = _layout(samples, replications, servers)
    draws = _with_prefill(_draw_llm(workload, chains, kept + warm, burst_cv, rng), coef)
    moments = workload_moments(coef, draws.inp, draws.cached, draws.out)
    stable_rps, _ = stability_limit_rps(coef, moments, servers)
    return _sweep(draws, coef, moments, servers, warm, stable_rps, points)
