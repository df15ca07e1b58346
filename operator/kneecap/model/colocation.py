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
* A3 stationary partner: j's batch is GAUSS's mean field (§3.8), B_j ~ Poisson(B̄_j) and a share
  f_j of j's steps carrying a chunk of mean compute ℓ̄_j; j is busy (has a step ready) with
  probability a_j in time. Not at i's step boundaries: while j is busy i's steps are longer, so
  fewer of them see j busy (C9), and its busy/idle alternation persists across i's requests (C10).
* A4 no host overlap: all of d_j occupies the GPU (conservative: t_step and α are partly CPU).
* A5 two-state partner: j alternates busy and idle sojourns, taken exponential (a two-state
  Markov environment): its idle ones end at its next arrival, so they are Exp(1/λ_j) exactly;
  its busy ones only in mean (C7).

Then, with Δ_i the mean wait per step of engine i:

    (C2) d_i^co(B, C) = d_i(B, C) + Δ_i,   Δ_i = Σ_{j≠i} q_ij·g_ij
    (C3) π_j = E[g_j·1{j busy}] = d̄_j + f_j·ℓ̄_j − (1 − f_j)·e^{−B̄_j}·p_j,   g_j = π_j/a_j
         a_j = P(j busy) = 1 − (1 − f_j)·e^{−B̄_j}
         (g_j: j's own GPU time per step, g_j here its mean when busy; d̄_j = E[d_j(B_j)], an
         empty batch costing p_j)
    (C4) B̄_j, f_j, ℓ̄_j: GAUSS's operating point of j with p_j + Δ_j, so Δ = G(Δ), iterated from
         Δ = 0; none (a GAUSS stage of some engine unstable: the waits grow its batch past what it
         can hold) is infeasible
    (C5) U_j = π_j/T_j, T_j = (d̄_j + Δ_j)/(1 − ρ_c,j) j's mean wall step (ρ_c,j = λ_j·E[S_c,j]): its GPU
         share. With every engine always busy, q → 1 and g_ij → g_j, T_j = Σ_k π_k and ΣU = 1 (the
         GPU never idles: a round of one step each); otherwise C9 and C9' make the waits
         step-averages and ΣU is 1 to within what they move (1e-4 beside a bursty partner)
    (C6) tails: GAUSS (Algorithm 1) on engine i with p_i → p_i + Δ_i, TTFT less Δ_i. A request's
         first token ends i's own step (its prefill's last chunk); the partners' steps come
         after it. GAUSS's TTFT, W + S + the residual of the step in flight (Kleinrock eq. 5.12),
         has a wall step d̄ + Δ_i for each of the n chunk steps in S and for the residual: the
         residual is the wait for i's next step, partners' steps included (a round, A2); the n
         chunk steps are n own steps and n − 1 rounds between them. One Δ_i too many, so
         TTFT = W + S + residual − Δ_i; S keeps its n waits in the queue (the next request's
         prefill starts one round after this one's first token). One engine alone: Δ = 0.
    (C6') an arrival to an idle i (probability 1 − a_i, PASTA) waits out the partner step in
         flight, j's with probability min(1, U_j/(1 − U_i)), a U(0, g_ij) residual (fixed length,
         Kleinrock eq. 5.12); GAUSS's residual is i's own step's only, weighted by P(i busy)
    (C7) E[BP_j] = a_j/(λ_j·(1 − a_j)): mean busy period (alternating renewal: a_j = E[BP]/(E[BP]
         + E[I]), E[I] = 1/λ_j, Poisson arrivals). For an M/G/1 queue (a = ρ) it is E[S]/(1 − ρ)
         (Kleinrock, Queueing Systems I, §5.8); for GAUSS's Poisson decode batch (M/G/∞,
         a = 1 − e^{−B̄}) it is (e^{B̄} − 1)/λ (the M/G/∞ busy period, Takács)
    (C8) persistence w_ij = E[BP_j]/(E[BP_j] + D_i), D_i = (E[OL_i] − 1)·τ_i i's expected decode
         time: w → 1 when j's busy periods outlast i's requests (i's batch settles at the busy
         regime's GAUSS steady state), w → 0 when they flicker (i's batch does not move). i's
         mean step beside a busy j exceeds that beside an idle one by
         Δτ_ij = g_ij·(w_ij·∂τ_i/∂Δ_i + 1 − w_ij)   (∂τ_i/∂Δ_i from GAUSS §3.8, ≥ 1)
    (C9) step average, not time average: i steps at rate 1/τ_b while j is busy (a time share
         a_j) and 1/τ_0 while idle, τ_b = τ_0 + Δτ_ij, so the share of i's steps that wait on j
         is q_ij = a_j·τ_0/(a_j·τ_0 + (1 − a_j)·τ_b) ≤ a_j. With τ_i = τ_0 + q_ij·Δτ_ij (i's mean
         step) it solves Δτ·q² − (τ_i + Δτ)·q + a_j·τ_i = 0, the root in [0, a_j]:
         q_ij = 2·a_j·τ_i/(τ_i + Δτ + √((τ_i + Δτ)² − 4·Δτ·a_j·τ_i)). Δτ = 0 or a_j = 1: q = a_j
    (C9') g_ij = g_j + w_ji·(1 − q_ji)·g_i·∂g_j/∂Δ_j: while i is busy j waits g_i at each step,
         (1 − q_ji)·g_i above its mean, and its batch, so its step, follows (w_ji) ― the step i's
         waits see (one pass: g, then q again)
    (C10) TPOT/TTFT beside a partner j idle at least ``ALWAYS_BUSY_IDLE`` of the time: two GAUSS
         runs on common random numbers, the idle regime (p_i + Δ_i − q_ij·g_ij) and the busy one
         (that plus g_ij·(w_ij + (1 − w_ij)/∂τ_i/∂Δ_i), a mean step Δτ_ij higher, C8), and per
         sampled request the share Y of its E[OL_i] − 1 steps taken while j is busy, from a path
         of A5's environment (start busy with probability a_j, PASTA; τ_b, τ_0 as C9):
         TPOT = TPOT_idle + Y·(TPOT_busy − TPOT_idle) (linear in the share of waiting steps, as
         GAUSS §3.8's τ is in Δ), TTFT from the regime at arrival, each run's wait counted once
         (C6). Long busy periods (w → 1) give a mixture of the two runs; short ones, Y → q_ij,
         the mean field at Δ_i. Several alternating partners add their terms (superposition);
         always-busy partners (Y ≡ 1) stay in the mean field (C11 aside)
    (C11) the partners' chunk steps at random: the mean field puts q_ij·(f_j/a_j)·ℓ̄_j of j's chunk
         compute in every wait of i, but j's chunks come with j's prompts (Poisson, λ_j) and their
         cost varies with the prompt's length; a long one lands in few of i's TTFT windows, whole.
         Per sampled request of i, its TTFT (C6, C6', C10) spans m = TTFT/(d̄_i + Δ_i) rounds;
         j's chunk steps in it are N ~ Poisson(m·q_ij·f_j/a_j) of costs ℓ drawn from j's workload
         (prefill compute over its chunks, step-weighted, scaled to ℓ̄_j), the mean field's
         m·q_ij·(f_j/a_j)·ℓ̄_j taken off; and the arrival finds a chunk of j in flight with
         probability q_ij·(f_j/a_j)·ℓ̄_j/(d̄_i + Δ_i) (PASTA), of which it waits U·ℓ, ℓ
         length-biased (the inspection paradox: E = E[ℓ²]/(2·E[ℓ]) for a residual, not ℓ̄/2).
         TTFT += Σ_ℓ − m·q_ij·(f_j/a_j)·ℓ̄_j + 1{in flight}·U·ℓ_lb, per partner (independent).
         TPOT the same over E[OL_i] − 1 steps, per step, without the chunk in flight. Mean-zero but
         for the length bias: it moves the tails, where a partner's long prompt is what a p95
         request of i met. The more partners with long, varied prompts, the more it matters (a
         third engine on the example fleet's GPUs: TTFT p95 10–23% low without it); beside a
         decode-heavy partner with short fixed prompts it moves the tails by ~0.1%

Closed cases (tests/unit/test_model_colocation.py):

* N = 1: Δ = 0, GAUSS unchanged (exactly: no C6', C10).
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
(each engine on this one GPU, TP 1); the ramp of i's batch within a busy period (C10 takes the
busy regime's steady state, blended by w_ij), the correlation of several partners' busy periods
(C10 adds them independently, as C11 does their chunks), non-exponential busy periods (A5),
clusters of a partner's chunk steps (C11: a prompt over the budget is n chunks in a row, counted
independently).
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
SLOPE_STEP_S = 1e-7  # forward difference of τ_i in Δ_i (C8)
ALWAYS_BUSY_IDLE = 1e-3  # 1 − a_j below this: j is always busy, Y ≡ 1, the mean field is the waits (C10)
TAIL_QUANTILES = (0.50, 0.95, 0.99)  # EngineTails' p50, p95, p99
PATH_MAX_SOJOURNS = 4096  # busy/idle sojourns followed per request at most (C10); the rest counted at the mean


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
    observed_busy: tuple[tuple[float, ...], ...] = ()  # q_ij (C9): share of i's steps that wait on j
    observed_step_s: tuple[tuple[float, ...], ...] = ()  # g_ij (C9'): j's GPU step, as i's steps see it
    step_slope: tuple[float, ...] = ()  # ∂τ_i/∂Δ_i (C8)
    busy_step_slope: tuple[float, ...] = ()  # ∂g_i/∂Δ_i (C9')


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
    for i, e in enumerate(engines):
        if not isinstance(e, EngineLoad):
            raise InputError(f"engines[{i}]", f"expected EngineLoad, got {type(e).__name__}")
    checked_shares([e.gpu_memory_utilization for e in engines], gpu)
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


def _coupling(prepared: list[_Engine], ops, a, pi, slope, g_slope):
    """The pair terms of (C7)–(C9) at one state of the fixed point, as (N, N) arrays, [i, j] for
    engine i beside partner j (the diagonal 0): g_ij, E[BP_j], w_ij, Δτ_ij, q_ij."""
    n = len(prepared)
    a = np.asarray(a, dtype=np.float64)
    pi = np.asarray(pi, dtype=np.float64)
    lam_rps = np.array([e.rate_rps for e in prepared])
    tau_s = np.array([op.mean_step_s for op in ops])
    steps = np.array([max(e.moments.output_tokens - 1.0, 1.0) for e in prepared])
    busy_gpu_s = np.divide(pi, a, out=np.zeros(n), where=a > 0)  # g_j = π_j/a_j = E[g_j | busy] (C3)
    idle = 1.0 - a
    safe_idle = np.where(idle > 0, idle, 1.0)
    period_s = np.where(idle > 0, a / (lam_rps * safe_idle), np.inf)  # (C7) E[BP_j] = a_j/(λ_j·(1 − a_j))
    decode_s = steps * tau_s  # D_i = (E[OL_i] − 1)·τ_i (C8)
    finite = np.isfinite(period_s)[None, :]
    bp_s = np.where(finite, period_s[None, :], 0.0)
    w = np.where(finite, bp_s / (bp_s + decode_s[:, None]), 1.0)  # (C8), E[BP] = ∞ → 1
    eye = np.eye(n, dtype=bool)
    w[eye] = 0.0
    g = np.broadcast_to(busy_gpu_s[None, :], (n, n)).copy()
    for k in range(2):  # (C9) q from g_j, then (C9') g_ij from q, then q again from g_ij
        dtau_s = g * (w * np.asarray(slope)[:, None] + (1.0 - w))  # (C8)
        tot = tau_s[:, None] + dtau_s
        disc = np.sqrt(np.maximum(tot * tot - 4.0 * dtau_s * a[None, :] * tau_s[:, None], 0.0))
        q = 2.0 * a[None, :] * tau_s[:, None] / (tot + disc)  # (C9), the root in [0, a_j]
        q[eye] = 0.0
        if k == 0:
            # (C9'): while i is busy, j waits g_i at every step, (1 − q_ji)·g_i above its mean, and
            # its step grows by ∂g_j/∂Δ_j of that, persistently (w_ji): the step of j that i sees
            g = busy_gpu_s[None, :] + (w.T * (1.0 - q.T)) * busy_gpu_s[:, None] * np.asarray(g_slope)[None, :]
            g[eye] = 0.0
    dtau_s[eye] = 0.0
    return g, period_s, w, dtau_s, q


def _operating_slope(e: _Engine, delta_s: float, op) -> tuple[float, float]:
    """(∂τ_i/∂Δ_i, ∂g_i/∂Δ_i) at Δ_i (C8, C9'): GAUSS §3.8's mean step grows with the wait
    (Little's law grows the batch, so the first is ≥ 1), and with the batch the busy step g_i =
    π_i/a_i (C3); forward differences of ``gauss.operating_point``."""
    op_h = gauss.operating_point(colocated_coefficients(e.coef, delta_s + SLOPE_STEP_S), e.moments, e.rate_rps,
                                 e.limits)
    a0, pi0, _ = busy_step(e.coef, op, delta_s)
    a1, pi1, _ = busy_step(e.coef, op_h, delta_s + SLOPE_STEP_S)
    g0, g1 = (pi0 / a0 if a0 > 0 else 0.0), (pi1 / a1 if a1 > 0 else 0.0)
    return (op_h.mean_step_s - op.mean_step_s) / SLOPE_STEP_S, (g1 - g0) / SLOPE_STEP_S


def _fixed_point(prepared: list[_Engine]) -> ColocationPoint:
    """Δ = G(Δ) (C4, with C9's step-average waits) by iteration from 0."""
    n = len(prepared)
    delta, a, pi, share = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    slope, g_slope = np.ones(n), np.zeros(n)
    q, g = np.zeros((n, n)), np.zeros((n, n))

    def point(ops, iterations, infeasible=None):
        f = lambda x: tuple(map(float, x))  # noqa: E731
        return ColocationPoint(f(delta), f(a), f(pi), f(share), tuple(ops), iterations, infeasible,
                               tuple(f(row) for row in q), tuple(f(row) for row in g), f(slope), f(g_slope))

    def evaluate():
        ops = []
        for i, e in enumerate(prepared):
            try:
                op = gauss.operating_point(colocated_coefficients(e.coef, delta[i]), e.moments, e.rate_rps, e.limits)
                slope[i], g_slope[i] = _operating_slope(e, delta[i], op) if n > 1 else (1.0, 0.0)
            except gauss.Infeasible as exc:
                return ops, gauss.Infeasible(exc.stage, f"engines[{i}]: {exc.reason}", **exc.details)
            ops.append(op)
            a[i], pi[i], share[i] = busy_step(e.coef, op, delta[i])
        return ops, None

    for it in range(1, FIXED_POINT_MAX_ITER + 1):
        ops, bad = evaluate()
        if bad is not None:
            return point(ops, it, bad)
        if n == 1:
            new = np.zeros(1)
        else:
            g[:], _, _, _, q[:] = _coupling(prepared, ops, a, pi, slope, g_slope)
            new = np.sum(q * g, axis=1)  # (C2): Δ_i = Σ_{j≠i} q_ij·g_ij
        converged = bool(np.all(np.abs(new - delta) <= FIXED_POINT_TOL * new))
        delta = new
        if converged:
            break
    else:
        return point(ops, FIXED_POINT_MAX_ITER, gauss.Infeasible(
            "gpu", f"the waits still grow after {FIXED_POINT_MAX_ITER} iterations: at the edge of saturation"))
    if n > 1:  # the operating points at the converged Δ
        ops, bad = evaluate()
        if bad is not None:
            return point(ops, it, bad)
        g[:], _, _, _, q[:] = _coupling(prepared, ops, a, pi, slope, g_slope)
    return point(ops, it)


def colocation_point(engines: list[EngineLoad], gpu: GPU | str) -> ColocationPoint:
    """The mean-field co-location (C2–C5) alone: waits, busy probabilities and GPU shares."""
    return _fixed_point(_check_engines(engines, get_gpu(gpu)))


def _busy_step_shares(rng: np.random.Generator, n: int, busy_prob: float, busy_s: float, idle_s: float,
                      steps: float, tau0_s: float, taub_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(C10) per request: Y, the share of its ``steps`` decode steps taken while the partner is
    busy, and whether the partner was busy at its arrival. The partner alternates busy and idle
    sojourns, exponential with means ``busy_s``, ``idle_s`` (a two-state Markov environment); a
    request arrives in a busy one with probability ``busy_prob`` (PASTA; memoryless: the residual
    sojourn has the same law) and steps every ``taub_s`` in a busy one, ``tau0_s`` in an idle one."""
    start = rng.random(n) < busy_prob
    state = start.copy()
    left = np.full(n, float(steps))
    busy_steps = np.zeros(n)
    for _ in range(PATH_MAX_SOJOURNS):
        if not np.any(left > 0):
            break
        mean_s = np.where(state, busy_s, idle_s)
        sojourn_s = rng.standard_exponential(n) * mean_s
        take = np.minimum(left, sojourn_s / np.where(state, taub_s, tau0_s))
        busy_steps += np.where(state, take, 0.0)
        left -= take
        state = ~state
    # what is left (only when sojourns are far shorter than a step): at the step-average share
    q = busy_prob * tau0_s / (busy_prob * tau0_s + (1.0 - busy_prob) * taub_s)  # (C9) with these τ
    busy_steps += left * q
    return busy_steps / steps, start


def _chunk_step_costs(load: EngineLoad, e: _Engine, op) -> np.ndarray:
    """Compute of engine j's chunk-carrying steps (C11): per request of its workload (seed 0,
    ``MOMENT_SAMPLES`` draws, whole cached blocks as ``_check_engines``) its prefill compute split
    over its n chunks, each request counted n times (a step-average), scaled to GAUSS's ℓ̄_j."""
    inp, cached, _ = gauss.sample_workload(load.workload, MOMENT_SAMPLES, np.random.default_rng(0))
    cached = (np.floor(cached / e.limits.block_size) * e.limits.block_size if e.limits.enable_prefix_caching
              else np.zeros_like(cached))
    compute, n = gauss.prefill_compute_s(e.coef, inp, cached, op.chunk_tokens)
    costs = np.repeat(compute / n, n.astype(np.int64))
    mean = float(np.mean(costs))
    return costs * (op.mean_chunk_s / mean) if mean > 0 and op.mean_chunk_s > 0 else np.zeros(0)


def _partner_chunk_noise(rng: np.random.Generator, rounds, per_round: float, costs: np.ndarray,
                         in_flight: float) -> np.ndarray:
    """(C11) per request: partner j's chunk compute met in a window of ``rounds`` of i's wall
    steps, less the mean field's share of it: a compound Poisson count (``per_round`` chunk
    steps per round, costs drawn from ``costs``) minus its mean, plus the chunk in flight at the
    arrival (probability ``in_flight``, PASTA; its residual U·ℓ with ℓ length-biased, renewal
    theory's inspection paradox: E = E[ℓ²]/(2·E[ℓ]))."""
    rounds = np.asarray(rounds, dtype=np.float64)
    if costs.size == 0 or per_round <= 0.0:
        return np.zeros(rounds.shape)
    mean_cost = float(np.mean(costs))
    counts = rng.poisson(np.maximum(rounds, 0.0) * per_round)
    total = np.zeros(rounds.shape)
    for k in range(int(counts.max(initial=0))):
        total += np.where(counts > k, costs[rng.integers(0, costs.size, rounds.shape)], 0.0)
    biased = costs[np.searchsorted(np.cumsum(costs) / np.sum(costs), rng.random(rounds.shape), side="right")
                   .clip(0, costs.size - 1)]
    hit = rng.random(rounds.shape) < in_flight
    return total - np.maximum(rounds, 0.0) * per_round * mean_cost + np.where(hit, rng.random(rounds.shape) * biased, 0.0)


def colocated_tails(engines: list[EngineLoad], gpu: GPU | str, *, seed: int = 0, samples: int = 100_000,
                    replications: int = 4) -> list[EngineTails]:
    """Per engine, p50/p95/p99 TTFT and TPOT beside its partners on ``gpu`` (C6, C10) and its
    utilisation, busy probability and GPU share. Every engine's GAUSS run draws from
    ``default_rng(seed)`` (common random numbers: identical engines get identical tails, one
    engine alone gets exactly ``gauss.simulate``'s). An engine whose partners are all always busy
    (idle less than ``ALWAYS_BUSY_IDLE``) takes GAUSS's sampled requests at p + Δ_i, TTFT less Δ_i
    (C6); beside a partner busy part of the time, the mixture (C10); either way with the partners'
    chunk steps at random (C11).
    Infeasible co-locations are reported, with None latencies and a ``note``, not raised."""
    gpu = get_gpu(gpu)
    prepared = _check_engines(engines, gpu)
    point = _fixed_point(prepared)
    names = [e.name or f"engines[{i}]" for i, e in enumerate(engines)]

    def infeasible(note):
        return [EngineTails(name, False, None, None, None, None, None, None, None, note) for name in names]

    if point.infeasible is not None:
        return infeasible(str(point.infeasible))
    n = len(prepared)
    if n > 1:
        g_s, period_s, w, dtau_s, q = _coupling(prepared, point.operating_points, point.busy_probability,
                                                point.busy_gpu_s, point.step_slope, point.busy_step_slope)
    a = np.asarray(point.busy_probability)
    chunk_costs = ([_chunk_step_costs(engines[j], prepared[j], point.operating_points[j]) for j in range(n)]
                   if n > 1 else [])
    out = []
    for i, e in enumerate(prepared):
        # partners idle at least ALWAYS_BUSY_IDLE of the time (C10); the others stay in the mean field
        alternating = [j for j in range(n) if n > 1 and j != i and 1.0 - a[j] >= ALWAYS_BUSY_IDLE and g_s[i, j] > 0]
        base_s = point.interference_s[i] - sum(q[i, j] * g_s[i, j] for j in alternating)  # always-busy partners' waits

        def run(wait_s):
            return gauss.simulate(engines[i].workload, colocated_coefficients(e.coef, wait_s), e.rate_rps,
                                  rng=np.random.default_rng(seed), samples=samples, replications=replications,
                                  search_samples=samples, limits=e.limits)

        try:
            res = run(base_s)
            idle_i = 1.0 - a[i]  # P(i has no step ready at an arrival), PASTA (C3)
            if n == 1:
                ttft = (res.ttft.p50 - base_s, res.ttft.p95 - base_s, res.ttft.p99 - base_s)  # (C6)
                tpot = None if res.tbt is None else (res.tbt.p50, res.tbt.p95, res.tbt.p99)
            else:
                ttft_k = res.ttft_sample_s - base_s  # (C6)
                rng_idle = np.random.default_rng([seed, i, n])
                for j in range(n):  # (C6'): an arrival to an idle i waits out the partner step in flight
                    if j == i or not (alternating or idle_i >= ALWAYS_BUSY_IDLE):
                        continue
                    in_flight = min(1.0, point.gpu_share[j] / max(1.0 - point.gpu_share[i], 1e-12))
                    hit = rng_idle.random(ttft_k.size) < idle_i * in_flight
                    ttft_k = ttft_k + np.where(hit, rng_idle.random(ttft_k.size) * g_s[i, j], 0.0)
                tbt_k = None if res.tbt_sample_s is None else res.tbt_sample_s.copy()
                tau_s = point.operating_points[i].mean_step_s
                for j in alternating:
                    # the busy regime's GAUSS run: a wait that moves its mean step by Δτ_ij (C8)
                    extra_s = g_s[i, j] * (w[i, j] + (1.0 - w[i, j]) / point.step_slope[i])
                    busy = run(base_s + extra_s)
                    tau0_s = tau_s - q[i, j] * dtau_s[i, j]  # (C9): τ_i less j's share
                    size = ttft_k.size if tbt_k is None else max(ttft_k.size, tbt_k.size)
                    y, start = _busy_step_shares(np.random.default_rng([seed, i, j]), size, float(a[j]),
                                                 float(period_s[j]), 1.0 / prepared[j].rate_rps,
                                                 max(e.moments.output_tokens - 1.0, 1.0), tau0_s,
                                                 tau0_s + dtau_s[i, j])
                    # (C10): TTFT from the regime at arrival, each run's wait counted once (C6)
                    ttft_k = ttft_k + np.where(start[:ttft_k.size],
                                               busy.ttft_sample_s - extra_s - res.ttft_sample_s, 0.0)
                    if tbt_k is not None:  # (C10): TPOT by the share of steps in the busy regime
                        tbt_k = tbt_k + y[:tbt_k.size] * (busy.tbt_sample_s - res.tbt_sample_s)
                # (C11): the partners' chunk steps at random, not at their mean, in i's TTFT window
                wall_s = point.operating_points[i].decode_step_s  # d̄_i + Δ_i: i's wall step, a round
                rounds = ttft_k / wall_s
                for k, j in enumerate(jj for jj in range(n) if jj != i):  # streams by partner rank: common
                    if a[j] <= 0.0:  # random numbers, identical engines get identical tails
                        continue
                    op_j = point.operating_points[j]
                    per_round = q[i, j] * op_j.chunk_step_fraction / a[j]  # j's chunk steps per round of i
                    in_flight = min(1.0, per_round * op_j.mean_chunk_s / wall_s)
                    ttft_k = ttft_k + _partner_chunk_noise(np.random.default_rng([seed, n, k, 11]), rounds, per_round,
                                                           chunk_costs[j], in_flight)
                    if tbt_k is not None:  # (C11): and over its E[OL_i] − 1 decode steps, per step
                        steps = max(e.moments.output_tokens - 1.0, 1.0)
                        tbt_k = tbt_k + _partner_chunk_noise(np.random.default_rng([seed, n, k, 12]),
                                                             np.full(tbt_k.size, steps), per_round,
                                                             chunk_costs[j], 0.0) / steps
                ttft = tuple(float(v) for v in np.quantile(ttft_k, TAIL_QUANTILES))
                tpot = None if tbt_k is None else tuple(float(v) for v in np.quantile(tbt_k, TAIL_QUANTILES))
        except gauss.Infeasible as exc:  # past GAUSS's limit on its own draws: its partners' waits assumed it steady
            return infeasible(f"infeasible: {exc.stage} stage: engines[{i}]: {exc.reason}")
        out.append(EngineTails(names[i], True, ttft, tpot, float(res.utilisation), point.busy_probability[i],
                               point.gpu_share[i], point.interference_s[i],
                               float(point.operating_points[i].mean_step_s)))
    return out


def checked_shares(shares: list, gpu: GPU) -> list[float]:
    """The engines' memory shares, each a fraction in (0, 1] and together at most
    MAX_TOTAL_UTILIZATION of the GPU (module docstring, Memory); an InputError names the field."""
    out = []
    for i, u in enumerate(shares):
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise InputError(f"engines[{i}].gpu_memory_utilization", f"expected a fraction in (0, 1], got {u!r}")
        out.append(float(u))
    total = math.fsum(out)
    if total > MAX_TOTAL_UTILIZATION + 1e-12:
        raise InputError("engines.gpu_memory_utilization",
                         f"the shares {out} sum to {total:.4g} > {MAX_TOTAL_UTILIZATION:g}: keep "
                         f"{1 - MAX_TOTAL_UTILIZATION:.0%} of {gpu.key} free of every engine")
    return out
