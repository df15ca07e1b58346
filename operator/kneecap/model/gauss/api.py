"""GAUSS's public entry points: :func:`simulate`, :func:`sustainable_rate`, :func:`sweep_rates`,
:func:`simulate_queue` (a raw G/G/k queue) and :func:`replay` (a given trace)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kneecap.errors import InputError
from kneecap.model.gauss.admission import _Limited
from kneecap.model.gauss.engine import _draw_llm, _Draws, _evaluate, _with_prefill, raw_service_draws
from kneecap.model.gauss.errors import Infeasible, _count, _positive
from kneecap.model.gauss.limits import DEFAULT_LIMITS, EngineLimits
from kneecap.model.gauss.mean_field import stability_limit_rps, workload_moments
from kneecap.model.gauss.queues import _layout
from kneecap.model.gauss.results import GaussResult, SweepPoint, _groups, latency_stats
from kneecap.model.gauss.search import _search_draws, _sustainable, _sweep
from kneecap.model.gauss.service import ServiceCoefficients
from kneecap.model.gauss.workload import BucketWorkload, Workload, unit_interarrivals


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
    operating_rate_rps: float  # where the mean-field operating point was taken (:func:`replay`)
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
