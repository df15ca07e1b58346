"""Co-location: several vLLM engines on one GPU, each with its own ``--gpu-memory-utilization``
share, interleave their steps over one HBM and one set of SMs (issue 24, item 1). Not the
"colocated" (prefill and decode in one pool) topology of ``sara.plan_colocated``.

Engine i alone steps in SLIM's terms, as GAUSS's d(B, C) (``gauss.coefficients_for``, kneecap form):

    (C1) d_i(B, C) = p_i + r_i·B + s_i·C
         p_i = t_step + L_i·t_layer + W_i/(η_w·BW)   (eq. 9's per-step part, kneecap fix i)
         r_i = α + γ·L_i·(D_i/1024)²   (eq. 10 per token)
         s_i = 2·L_i·D_kv,i·b_kv/(η_m·BW)   (eq. 11 per context token, C by eq. 12)
         a step carrying a prefill chunk adds its compute ℓ = F_pre/(η_c·F_max)   (eqs 7–8)

Assumptions:

* A1 step-granular time-slicing: the GPU runs one engine's step at a time (separate processes'
  CUDA contexts are time-sliced; no MPS), and a running step reads its own weights W_i and KV
  s_i·C_i over the whole BW at SLIM's efficiencies, so its GPU time is (C1) unchanged. Sharing is
  serialisation: a round of a bandwidth-bound pair reads W_1 + W_2 + both KVs over BW, the round
  time any work-conserving split of the bandwidth gives; engine i sees BW·d_i/(d_i + d_j) of it.
* A2 round robin: when engine i's step ends, every other engine with a step ready runs one step
  before i runs again (FCFS on ready steps; a vLLM engine with running requests always has its
  next step ready). So i waits a *whole* partner step, not a residual: the partner's step was
  queued while i's ran.
* A3 random observer: at i's step boundaries engine j is in its time-stationary state,
  independent of i: GAUSS's mean field (§3.8), decode batch B_j ~ Poisson(B̄_j) and a share f_j
  of j's steps carrying a chunk of mean compute ℓ̄_j, independently.
* A4 no host overlap: all of d_j occupies the GPU (conservative: t_step and α are partly CPU).

Then, with Δ_i the mean wait per step of engine i:

    (C2) d_i^co(B, C) = d_i(B, C) + Δ_i,   Δ_i = Σ_{j≠i} π_j
    (C3) π_j = E[g_j·1{j busy}] = d̄_j + f_j·ℓ̄_j − (1 − f_j)·e^{−B̄_j}·p_j
         a_j = P(j busy) = 1 − (1 − f_j)·e^{−B̄_j}
         (g_j: j's own GPU time per step; d̄_j = E[d_j(B_j)], an empty batch costing p_j)
    (C4) B̄_j, f_j, ℓ̄_j: GAUSS's operating point of j with p_j + Δ_j, so Δ = G(Δ); G is increasing,
         iterated from Δ = 0 to its least fixed point; none (a GAUSS stage of some engine unstable:
         the waits grow its batch past what it can hold) is infeasible
    (C5) U_j = π_j/T_j, T_j = (d̄_j + Δ_j)/(1 − ρ_c,j) j's mean wall step (ρ_c,j = λ_j·E[S_c,j]): its GPU
         share. T_j = Σ_k π_k + (1 − f_j)·e^{−B̄_j}·p_j, so ΣU ≤ 1 identically, = 1 when every
         engine is always busy (the GPU never idles: a round of one step each)
    (C6) tails: GAUSS (Algorithm 1) on engine i alone with p_i → p_i + Δ_i; every engine step,
         decode or chunk, carries one wait

Closed cases (tests/unit/test_model_colocation.py):

* N = 1: Δ = 0, GAUSS unchanged.
* Decode-heavy pair (f_j, ρ_c → 0): (C3) is π_j = a_j·E[d_j | B_j ≥ 1], a_j = 1 − e^{−B̄_j}:
  the partner's step times the probability it is busy (A2 gives the whole step, A3 the
  probability). At a fixed batch TPOT rises by Δ_i; through Little's law (GAUSS §3.8,
  τ_i = (p_i + Δ_i + σ_i)/(1 − k_i·σ_i), σ_i = r_i + s_i·c̄_i, k_i = λ_i·E[OL_i]) by
  Δ_i/(1 − k_i·σ_i): the slower steps grow i's batch, whose KV reads slow it further.
* Identical pair, both always busy (a → 1), λ/2 each: Δ = π = T/2 (T the round), and with
  ρ_c → 0 τ = (2p + σ)/(1 − k·σ) against one engine at λ, (p + σ)/(1 − k·σ), k = λ·E[OL]:
  the second weight read per round costs p/(1 − k·σ).

Memory: the shares must sum to at most ``MAX_TOTAL_UTILIZATION``: vLLM starts only when the
GPU's free memory holds its share (total·u), and what the other engines' processes hold beyond
their shares (CUDA contexts, allocator slack) counts against it, so the 5% that
``memory.UTILIZATION_BOUNDS`` keeps free of one engine is kept free of all of them (an
allowance, not measured). Each share must hold its weights, buffers and the KV of one request
(``max_model_len`` tokens, else a mean request) by ``memory.memory_split``.

Not modelled: MPS or concurrent kernels (a compute-bound prefill overlapping a bandwidth-bound
decode would cost less than A1 says), host/GPU overlap (A4), L2 contention, tensor parallelism
(each engine on this one GPU, TP 1), and the variance of the waits: Δ_i enters as its mean, so
TPOT tails from a partner's long busy and idle periods are underestimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kneecap.errors import InputError
from kneecap.model import gauss, memory
from kneecap.model.arch import ModelArch, get_arch
from kneecap.model.hardware import GPU, get_gpu
from kneecap.model.slim import SlimParams, check_form

MAX_TOTAL_UTILIZATION = memory.UTILIZATION_BOUNDS[1]
FIXED_POINT_TOL = 1e-12  # relative change of Δ that ends the iteration (C4)
FIXED_POINT_MAX_ITER = 5000
MOMENT_SAMPLES = 20_000  # workload draws for the mean-field moments (seed 0: deterministic)


@dataclass(frozen=True)
class EngineLoad:
    """One vLLM engine on the shared GPU: its model, calibrated SLIM θ, workload, request rate
    and flags (None: vLLM's defaults, ``memory.vllm_default_limits``)."""

    arch: ModelArch | str
    workload: gauss.Workload | gauss.BucketWorkload
    rate_rps: float
    gpu_memory_utilization: float
    params: SlimParams = SlimParams()
    form: str = "kneecap"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # one request the KV cache must hold (None: a mean request)
    block_size: int = memory.DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    name: str = ""


@dataclass(frozen=True)
class EngineTails:
    """Predicted latency of one co-located engine, seconds; the latency fields are None when
    the co-location is infeasible (``note`` says why) or, for TPOT, with one output token."""

    name: str
    feasible: bool
    ttft_s: tuple[float, float, float] | None  # p50, p95, p99
    tpot_s: tuple[float, float, float] | None  # per-request TPOT (GAUSS TBT), p50, p95, p99
    utilisation: float | None  # GAUSS ρ = λ·E[S] of its prefill slot, as GaussResult.utilisation
    busy_probability: float | None  # a_i (C3): the factor its partners' steps wait on it with
    gpu_share: float | None  # U_i (C5): the share of GPU time its steps occupy
    interference_s: float | None  # Δ_i (C2): mean wait per step for the partners' steps
    step_s: float | None  # τ_i: mean wall step a decoding request sees (GAUSS §3.8), waits included
    note: str | None = None  # "infeasible: <stage> stage: …" when infeasible


@dataclass(frozen=True)
class ColocationPoint:
    """The mean-field fixed point (C4), one entry per engine; ``infeasible`` set when none exists."""

    interference_s: tuple[float, ...]  # Δ_i
    busy_probability: tuple[float, ...]  # a_i
    busy_gpu_s: tuple[float, ...]  # π_i: i's own GPU time per step, 0 when idle: what a partner waits (C3)
    gpu_share: tuple[float, ...]  # U_i
    operating_points: tuple[gauss.OperatingPoint, ...]
    iterations: int
    infeasible: gauss.Infeasible | None = None


@dataclass(frozen=True)
class _Engine:
    coef: gauss.ServiceCoefficients  # alone (C1)
    limits: gauss.EngineLimits
    moments: gauss.WorkloadMoments
    rate_rps: float


def colocated_step_s(coef: gauss.ServiceCoefficients, batch, resident_tokens, interference_s):
    """d_i^co(B, C) = d_i(B, C) + Δ_i (C2): engine i's wall-clock step beside its partners."""
    return gauss.decode_step_s(coef, batch, resident_tokens) + np.asarray(interference_s, dtype=np.float64)


def colocated_coefficients(coef: gauss.ServiceCoefficients, interference_s: float) -> gauss.ServiceCoefficients:
    """``coef`` with p → p + Δ (C6); Δ = 0 returns ``coef`` itself."""
    return coef if interference_s == 0.0 else replace(coef, decode_step_s=coef.decode_step_s + float(interference_s))


def busy_step(coef: gauss.ServiceCoefficients, op: gauss.OperatingPoint,
              interference_s: float) -> tuple[float, float, float]:
    """(a, π, U) of an engine (C3, C5) from its own coefficients ``coef`` (alone) and its
    operating point ``op`` beside its partners, whose waits ``interference_s`` = Δ it excludes."""
    idle = (1.0 - op.chunk_step_fraction) * math.exp(-op.decode_batch)  # P(empty decode-only step), A3
    own_dbar = op.decode_step_s - interference_s  # d̄ without the waits (C2)
    pi = own_dbar + op.chunk_step_fraction * op.mean_chunk_s - idle * coef.decode_step_s  # (C3)
    rho_c = op.rate_per_server_rps * op.prefill_compute_s
    wall = op.decode_step_s / (1.0 - rho_c)  # T (C5): GAUSS's τ_sys = d̄/(1 − ρ_c)
    return 1.0 - idle, pi, pi / wall


def _check_engines(engines, gpu: GPU) -> list[_Engine]:
    """Validate each engine and its memory share (module docstring, Memory) and build its GAUSS
    coefficients, limits and workload moments; errors name ``engines[i].<field>``."""
    if not isinstance(engines, (list, tuple)) or not engines:
        raise InputError("engines", "expected a non-empty list of EngineLoad")
    shares = []
    for i, e in enumerate(engines):
        if not isinstance(e, EngineLoad):
            raise InputError(f"engines[{i}]", f"expected EngineLoad, got {type(e).__name__}")
        u = e.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise InputError(f"engines[{i}].gpu_memory_utilization", f"expected a fraction in (0, 1], got {u!r}")
        shares.append(float(u))
    total = math.fsum(shares)
    if total > MAX_TOTAL_UTILIZATION + 1e-12:
        raise InputError("engines.gpu_memory_utilization",
                         f"the shares {shares} sum to {total:.4g} > {MAX_TOTAL_UTILIZATION:g}: keep "
                         f"{1 - MAX_TOTAL_UTILIZATION:.0%} of {gpu.key} free of every engine")
    out = []
    for i, e in enumerate(engines):
        field = f"engines[{i}]"
        try:
            arch = get_arch(e.arch)
        except InputError as exc:
            raise InputError(f"{field}.arch", str(exc)) from None
        if not (isinstance(e.rate_rps, (int, float)) and not isinstance(e.rate_rps, bool)
                and math.isfinite(e.rate_rps) and e.rate_rps > 0):
            raise InputError(f"{field}.rate_rps", f"expected a positive finite rate, got {e.rate_rps!r}")
        if not isinstance(e.params, SlimParams):
            raise InputError(f"{field}.params", f"expected SlimParams, got {type(e.params).__name__}")
        try:
            check_form(e.form)
            limits, budget = gauss.engine_limits_for(
                arch, gpu, max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                gpu_memory_utilization=float(e.gpu_memory_utilization), block_size=e.block_size,
                enable_prefix_caching=e.enable_prefix_caching)
            coef = gauss.coefficients_for(arch, gpu, e.params, form=e.form, chunk_tokens=budget)
            inp, cached, out_tok = gauss.sample_workload(e.workload, MOMENT_SAMPLES, np.random.default_rng(0))
        except InputError as exc:
            raise InputError(f"{field}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
        # vLLM's prefix cache hits whole blocks only; off, nothing is cached (as gauss.simulate does)
        cached = (np.floor(cached / limits.block_size) * limits.block_size if limits.enable_prefix_caching
                  else np.zeros_like(cached))
        need = e.max_model_len if e.max_model_len is not None else math.ceil(float(np.mean(inp + out_tok)))
        if isinstance(need, bool) or not isinstance(need, (int, np.integer)) or need < 1:
            raise InputError(f"{field}.max_model_len", f"expected a positive integer, got {need!r}")
        need = int(memory.block_round_tokens(need, limits.block_size))
        if limits.kv_capacity_tokens < need:
            raise InputError(f"{field}.gpu_memory_utilization",
                             f"{e.gpu_memory_utilization} of {gpu.key} holds the weights of {arch.key} but a KV "
                             f"cache of {limits.kv_capacity_tokens} tokens, less than one request's {need}")
        out.append(_Engine(coef, limits, gauss.workload_moments(coef, inp, cached, out_tok), float(e.rate_rps)))
    return out


def _fixed_point(prepared: list[_Engine]) -> ColocationPoint:
    """Δ = G(Δ) (C4) by monotone iteration from 0."""
    n = len(prepared)
    delta, a, pi, share = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)

    def point(ops, iterations, infeasible=None):
        f = lambda x: tuple(map(float, x))  # noqa: E731
        return ColocationPoint(f(delta), f(a), f(pi), f(share), tuple(ops), iterations, infeasible)

    for it in range(1, FIXED_POINT_MAX_ITER + 1):
        ops = []
        for i, e in enumerate(prepared):
            try:
                op = gauss.operating_point(colocated_coefficients(e.coef, delta[i]), e.moments, e.rate_rps, e.limits)
            except gauss.Infeasible as exc:
                return point(ops, it, gauss.Infeasible(exc.stage, f"engines[{i}]: {exc.reason}", **exc.details))
            ops.append(op)
            a[i], pi[i], share[i] = busy_step(e.coef, op, delta[i])
        new = pi.sum() - pi if n > 1 else np.zeros(1)  # (C2): Σ_{j≠i} π_j
        converged = bool(np.all(np.abs(new - delta) <= FIXED_POINT_TOL * new))
        delta = new
        if converged:
            break
    else:
        return point(ops, FIXED_POINT_MAX_ITER, gauss.Infeasible(
            "gpu", f"the waits still grow after {FIXED_POINT_MAX_ITER} iterations: at the edge of saturation"))
    if n > 1:  # the operating points at the converged Δ
        ops = [gauss.operating_point(colocated_coefficients(e.coef, delta[i]), e.moments, e.rate_rps, e.limits)
               for i, e in enumerate(prepared)]
        for i, e in enumerate(prepared):
            a[i], pi[i], share[i] = busy_step(e.coef, ops[i], delta[i])
    return point(ops, it)


def colocation_point(engines: list[EngineLoad], gpu: GPU | str) -> ColocationPoint:
    """The mean-field co-location (C2–C5) alone: waits, busy probabilities and GPU shares."""
    return _fixed_point(_check_engines(engines, get_gpu(gpu)))


def colocated_tails(engines: list[EngineLoad], gpu: GPU | str, *, seed: int = 0, samples: int = 100_000,
                    replications: int = 4) -> list[EngineTails]:
    """Per engine, p50/p95/p99 TTFT and TPOT beside its partners on ``gpu`` (C6) and its
    utilisation, busy probability and GPU share. Every engine's GAUSS run draws from
    ``default_rng(seed)`` (common random numbers: identical engines get identical tails, one
    engine alone gets exactly ``gauss.simulate``'s). Infeasible co-locations are reported, with
    None latencies and a ``note``, not raised."""
    gpu = get_gpu(gpu)
    prepared = _check_engines(engines, gpu)
    point = _fixed_point(prepared)
    names = [e.name or f"engines[{i}]" for i, e in enumerate(engines)]
    if point.infeasible is not None:
        note = str(point.infeasible)
        return [EngineTails(name, False, None, None, None, None, None, None, None, note) for name in names]
    results = []
    for i, e in enumerate(prepared):
        try:
            results.append(gauss.simulate(
                engines[i].workload, colocated_coefficients(e.coef, point.interference_s[i]), e.rate_rps,
                rng=np.random.default_rng(seed), samples=samples, replications=replications, search_samples=samples,
                limits=e.limits))
        except gauss.Infeasible as exc:  # past GAUSS's limit on its own draws: its partners' waits assumed it steady
            note = f"infeasible: {exc.stage} stage: engines[{i}]: {exc.reason}"
            return [EngineTails(name, False, None, None, None, None, None, None, None, note) for name in names]
    out = []
    for i, (name, res) in enumerate(zip(names, results)):
        tpot = None if res.tbt is None else (res.tbt.p50, res.tbt.p95, res.tbt.p99)
        out.append(EngineTails(name, True, (res.ttft.p50, res.ttft.p95, res.ttft.p99), tpot, float(res.utilisation),
                               point.busy_probability[i], point.gpu_share[i], point.interference_s[i],
                               float(point.operating_points[i].mean_step_s)))
    return out
