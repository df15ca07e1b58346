"""SARA (paper 001, DESIGN §5.4): disaggregated prefill / KV-transfer / decode pools sized for
quantile SLOs under a cost budget, plus an exhaustive reference and colocated planning.

Model (symbols as in SARA):
* Prefill: M/G/k_p, k_p replicas of m_p GPUs each. Service S_p(IL) = max(N_mul(IL)/F_p,
  (Ω_LLM + gγ·IL)/B_HBM) (SARA (5)–(7), roofline of the two bounds) or a caller's callable
  (e.g. a calibrated SLIM at B = 1). Pr(TTFT ≤ τ) = F_S(τ) − C_k(A)·∫ Pr(W > τ − s | W > 0) dF_S
  (SARA (25)). Deviation from the paper: SARA's exponential waiting tail (21) under-predicted
  heavy-tailed p95 TTFT by 5–11% on 1–2 replicas; here W | W > 0 has the exact M/G/1 shape
  (``WaitTailTable``, built once per problem) at ρ = A/k, scaled to the M/G/k mean
  ``mgk_conditional_wait_mean_s`` (light/heavy-traffic interpolation). Within 3% of a
  discrete-event simulation for k = 1–8, ρ ≤ 0.9, light and heavy prompts (tests/unit/test_sara_des.py).
* KV transfer: M/G/1 on a link of Bw GiB/s, T_TR = gγ·IL/Bw (SARA (10)); waiting tail
  ρ·e^{−t/w_KV} (SARA (33)); the heavy-tailed case uses the log-normal IL (SARA (35)) in the same
  convolution. The SLO is on T_KV = wait + transfer.
* Decode: one continuous-batching pool of k_d GPUs, TPOT = (Ω_LLM + gγ·L_io)/(k_d·B_HBM)
  (SARA (15)). Batch occupancy N from the birth–death process (births λ, deaths n/(ℓ_o·TPOT(n))):
  its stationary law is negative binomial, mean μ_bat = SARA's C3 right-hand side, variance
  μ_bat/(1 − q). C1: TPOT quantile with L_io as a token sees it (size-biased occupancy) and
  moment-matched — gamma for light
  tails (SARA (43)), Fenton–Wilkinson log-normal for heavy (SARA (44)); Var N gains the
  batch-composition term of ``_occupancy_var_from_context`` (without it p95 TPOT sat 3–5% under
  the simulation at q ≥ 0.8). C2: p_mem-quantile of
  resident KV of N_bat requests fits in k_d·Ω_HBM. C3: μ_bat < N_bat with bandwidth stability.
  C4: N_bat ≥ μ_bat + √μ_bat·Φ⁻¹(p_join).
  Deviation from the paper: C1 is evaluated at the operating load (the paper bounds it with a
  full batch of N_bat), which is what a discrete-event simulation measures; capping at N_bat is
  ignored in C1 because C4 makes it a ≤ 1 − p_join event.
* Goodput: P2 — max λ s.t. k_p·m_p·C_p + Bw·C_KV + k_d·C_d ≤ C_max and all SLOs. Minimum
  resources per stage for a given λ (integer search from the stability floor, a root for Bw),
  bisection on λ (cost is non-decreasing in λ).

Bandwidths are in GiB/s and sizes in bytes internally (γ is reported in GiB/token as in Table I).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
from scipy import optimize, special

from kneecap.errors import InputError
from kneecap.model.arch import ModelArch, get_arch
from kneecap.model.hardware import GPU, get_gpu
from kneecap.model.queueing import (
    LengthDist, WaitTailTable, erlang_c, heavy_traffic_wait_mean_s, moment_matched_cdf, moment_matched_ppf,
    mg1_wait_tail_table, mgk_conditional_wait_mean_s, sojourn_attainment,
)

GIB = 1024**3
TAILS = ("light", "heavy")
NODES = 1024  # midpoint-quantile nodes for the convolution integrals (SARA (25), (33))
# nodes of S_p for the waiting-time table (normal-score grid, see build_problem): its tail sets
# E[R] = E[S²]/(2E[S]); 1024 midpoint quantiles cut the log-normal tail and under-predicted
# heavy-tailed p95 TTFT by ~2% at ρ = 0.9
WAIT_TABLE_NODES = 8192
MAX_NUM_SEQS_CAP = 2048  # largest N_bat considered (vLLM max_num_seqs), SARA and exhaustive alike


# ---------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Workload:
    """Request lengths: input IL and output OL distributions (SARA §VII-A)."""

    input: LengthDist
    output: LengthDist

    @property
    def tail(self) -> str:
        return "heavy" if self.input.family == "lognormal" else "light"


def make_workload(input_mean_tok: float, input_cv: float, output_mean_tok: float,
                  output_cv: float = 1.0, tail: str = "heavy") -> Workload:
    """IL log-normal (``heavy``) or gamma (``light``; exponential at CV 1) with the given mean and
    CV; OL gamma with its CV (exponential at CV 1, as in SARA §VII-A)."""
    if tail not in TAILS:
        raise InputError("tail", f"expected one of {TAILS}, got {tail!r}")
    for name, value in (("input_mean", input_mean_tok), ("output_mean", output_mean_tok)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 1):
            raise InputError(name, f"expected a token count ≥ 1, got {value!r}")
    family = "lognormal" if tail == "heavy" else "gamma"
    try:
        il = LengthDist(float(input_mean_tok), float(input_cv), family)
    except InputError as exc:
        raise InputError("input_cv", str(exc)) from None
    try:
        ol = LengthDist(float(output_mean_tok), float(output_cv), "gamma")
    except InputError as exc:
        raise InputError("output_cv", str(exc)) from None
    return Workload(il, ol)


@dataclass(frozen=True)
class SLO:
    """Stage thresholds, the SLO quantile p_SLO, and SARA's p_mem, p_join (defaults: §VII-A)."""

    ttft_s: float = 0.5
    kv_s: float = 0.15
    tpot_s: float = 0.04
    quantile: float = 0.95
    p_mem: float = 0.99
    p_join: float = 0.99

    def __post_init__(self):
        for name in ("ttft_s", "kv_s", "tpot_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"slo_{name}", f"expected a positive number of seconds, got {v!r}")
        for name in ("quantile", "p_mem", "p_join"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.5 <= v < 1):
                raise InputError(name, f"expected a probability in [0.5, 1), got {v!r}")


@dataclass(frozen=True)
class Costs:
    """Unit costs (SARA §VII-A: $5/h per GPU, $0.1/h per GiB/s)."""

    prefill_gpu_per_hour: float = 5.0
    decode_gpu_per_hour: float = 5.0
    kv_per_gibps_hour: float = 0.1

    def __post_init__(self):
        for name in ("prefill_gpu_per_hour", "decode_gpu_per_hour"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(name.replace("_gpu_per_hour", "_cost"), f"expected a positive $/h, got {v!r}")
        v = self.kv_per_gibps_hour
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InputError("kv_cost_per_gibps", f"expected a non-negative $/h per GiB/s, got {v!r}")


# ---------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Allocation:
    """Resources: k_p prefill replicas of m_p GPUs, Bw GiB/s, k_d decode GPUs, N_bat."""

    prefill_replicas: int
    prefill_gpus_per_replica: int
    kv_bandwidth_gibps: float
    decode_replicas: int  # k_d GPUs in one continuous-batching pool (SARA §III-C)
    max_num_seqs: int  # N_bat

    def cost_per_hour(self, costs: Costs) -> float:
        """SARA (20b): k_p·C_p + Bw·C_KV + k_d·C_d (C_p per GPU, times m_p)."""
        return (self.prefill_replicas * self.prefill_gpus_per_replica * costs.prefill_gpu_per_hour
                + self.kv_bandwidth_gibps * costs.kv_per_gibps_hour
                + self.decode_replicas * costs.decode_gpu_per_hour)


@dataclass(frozen=True)
class SaraPlan:
    """Answer of ``plan`` / ``exhaustive``. ``feasible`` False: ``message`` starts "infeasible: …"
    and names the binding stage; numbers are then 0 and ``allocation`` None."""

    feasible: bool
    goodput_rps: float
    allocation: Allocation | None
    cost_per_hour: float
    binding: dict = field(default_factory=dict)  # stage -> constraint that set its size
    message: str = ""
    solve_seconds: float = 0.0
    method: str = "sara"

    def to_dict(self) -> dict:
        a = self.allocation
        return {
            "feasible": self.feasible, "goodput_rps": self.goodput_rps,
            "prefill_replicas": a.prefill_replicas if a else 0,
            "prefill_gpus_per_replica": a.prefill_gpus_per_replica if a else 0,
            "decode_replicas": a.decode_replicas if a else 0,
            "kv_bandwidth_gibps": a.kv_bandwidth_gibps if a else 0.0,
            "max_num_seqs": a.max_num_seqs if a else 0,
            "cost_per_hour": self.cost_per_hour, "binding": dict(self.binding),
            "message": self.message, "solve_seconds": self.solve_seconds, "method": self.method,
        }


# ---------------------------------------------------------------------------------- problem


def n_mul(arch: ModelArch, input_tok):
    """SARA (5): multiplications of one prefill,
    N_layer·(4·IL·N_mod² + (IL² + IL)·N_mod + 2·IL·N_mod·N_hid)."""
    il = np.asarray(input_tok, dtype=float)
    d = float(arch.hidden)
    return arch.layers * (4.0 * il * d * d + (il * il + il) * d + 2.0 * il * d * arch.ffn)


def gamma_gib_per_token(arch: ModelArch) -> float:
    """SARA Table I γ: MHA KV bytes per token in GiB (2·N_layer·N_mod·N_bits/8/1024³)."""
    return arch.kv_bytes_per_token_mha / GIB


def omega_llm_gib(arch: ModelArch) -> float:
    """SARA Table I Ω_LLM: weights at the nominal size, GiB."""
    return arch.nominal_weight_bytes / GIB


def prefill_gpus_needed(arch: ModelArch, gpu: GPU, workload: Workload, slo: SLO = SLO(),
                        hbm_fraction: float = 1.0) -> int:
    """m_p: fewest GPUs of one prefill replica holding Ω_LLM + gγ·IL(p_mem) (SARA C2 applied to prefill)."""
    need = arch.nominal_weight_bytes + arch.gqa_factor * arch.kv_bytes_per_token_mha * float(workload.input.ppf(slo.p_mem))
    return max(1, math.ceil(need / (gpu.memory_bytes * hbm_fraction)))


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything the SLO-attainment functions need, precomputed once (nodes, moments)."""

    arch: ModelArch
    gpu: GPU
    workload: Workload
    slo: SLO
    costs: Costs
    hbm_fraction: float
    max_num_seqs_cap: int
    g: float
    gamma_bytes: float  # γ (MHA) bytes/token; the KV per token is g·γ
    omega_bytes: float  # Ω_LLM
    hbm_bytes: float  # Ω_HBM usable per GPU
    hbm_bw_bytes_s: float  # B_HBM
    prefill_gpus: int  # m_p
    sp_nodes_s: np.ndarray  # S_p at the IL midpoint-quantile nodes (sorted)
    node_u: np.ndarray
    sp_mean_s: float
    sp_scv: float
    il_nodes_tok: np.ndarray
    il_mean_tok: float
    il_scv: float
    ctx_mean_tok: float  # E[C]: context of a request in the decode batch
    ctx_m2_tok2: float  # E[C²]
    prefill_service_s: Callable  # S_p(IL) seconds on one prefill replica
    prefill_wait_tail: WaitTailTable  # H(ρ, y): shape of the prefill wait given W > 0
    decode_gpus_per_replica: int = 1  # TP of the decode engines: k_d comes in multiples of it

    @property
    def kv_bytes_per_token(self) -> float:
        return self.g * self.gamma_bytes

    def prefill_service_cdf(self, t_s):
        """F_Sp(t), piecewise linear through the nodes."""
        return np.interp(t_s, self.sp_nodes_s, self.node_u, left=0.0, right=1.0)


def build_problem(model: str | ModelArch, gpu: str | GPU, workload: Workload, slo: SLO = SLO(),
                  costs: Costs | None = None, *, prefill_service_s: Callable | None = None,
                  prefill_gpus_per_replica: int | None = None, prefill_flops_efficiency: float = 1.0,
                  hbm_fraction: float = 1.0, max_num_seqs_cap: int = MAX_NUM_SEQS_CAP,
                  nodes: int = NODES, tensor_parallel_size: int | None = None) -> Problem:
    """Precompute the SARA problem.

    ``prefill_service_s(input_tok_array) -> seconds`` replaces SARA's compute model (e.g. a
    calibrated SLIM at batch 1) for one prefill replica. ``prefill_gpus_per_replica`` defaults
    to the fewest GPUs holding the weights plus a p_mem-quantile prompt's KV; F_p = m_p · peak ·
    ``prefill_flops_efficiency``. ``hbm_fraction`` of each GPU's memory is usable (Ω_HBM).
    ``tensor_parallel_size``: the engines' TP (kneecap.model.parallel): a prefill replica is TP
    GPUs (m_p = TP unless ``prefill_gpus_per_replica`` says otherwise) and the decode pool is
    made of TP-GPU engines (k_d a multiple of TP).
    """
    arch = get_arch(model) if not isinstance(model, ModelArch) else model
    gpu = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    costs = costs or Costs(gpu.cost_per_hour, gpu.cost_per_hour, 0.1)
    if not (0 < hbm_fraction <= 1):
        raise InputError("hbm_fraction", f"expected a fraction in (0, 1], got {hbm_fraction!r}")
    if not (0 < prefill_flops_efficiency <= 1):
        raise InputError("prefill_flops_efficiency", f"expected a fraction in (0, 1], got {prefill_flops_efficiency!r}")
    g = arch.gqa_factor
    gamma_b = float(arch.kv_bytes_per_token_mha)
    omega_b = float(arch.nominal_weight_bytes)
    hbm_b = gpu.memory_bytes * hbm_fraction
    il, ol = workload.input, workload.output
    tp = 1
    if tensor_parallel_size is not None:
        from kneecap.model.parallel import check_tensor_parallel_size

        tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    if prefill_gpus_per_replica is None and tensor_parallel_size is not None:
        m_p = tp
        need = prefill_gpus_needed(arch, gpu, workload, slo, hbm_fraction)
        if need > m_p:
            raise InputError("tensor_parallel_size", f"{tp} GPU(s) of {gpu.key} cannot hold {arch.key}'s weights and a "
                                                     f"p{slo.p_mem * 100:g} prompt's KV: at least {need} needed")
    elif prefill_gpus_per_replica is None:
        m_p = prefill_gpus_needed(arch, gpu, workload, slo, hbm_fraction)
    else:
        if not (isinstance(prefill_gpus_per_replica, int) and prefill_gpus_per_replica >= 1):
            raise InputError("prefill_gpus_per_replica", f"expected an integer ≥ 1, got {prefill_gpus_per_replica!r}")
        m_p = prefill_gpus_per_replica

    if prefill_service_s is None:
        f_p = m_p * gpu.peak_flops * prefill_flops_efficiency

        def prefill_service_s(x):  # SARA (6)-(7): compute and HBM bounds, the larger binds
            x = np.asarray(x, dtype=float)
            return np.maximum(n_mul(arch, x) / f_p, (omega_b + g * gamma_b * x) / (m_p * gpu.mem_bw_bytes_s))

    u = (np.arange(nodes) + 0.5) / nodes
    il_nodes = il.ppf(u)
    sp_nodes = np.asarray(prefill_service_s(il_nodes), dtype=float)
    if sp_nodes.shape != il_nodes.shape or not np.all(np.isfinite(sp_nodes)) or np.any(sp_nodes <= 0):
        raise InputError("prefill_service", "the prefill service time must be positive and finite for every input length")
    sp_nodes = np.maximum.accumulate(sp_nodes)  # monotone in IL (SARA (5)); guards a noisy callable
    # S_p on a normal-score grid z ∈ [−8, 8] (IL = F⁻¹(Φ(z)), weights ∝ φ(z)): reaches the far
    # tail that sets E[S²] for the waiting-time table (midpoint quantiles stop at z ≈ 3.3)
    z = np.linspace(-8.0, 8.0, WAIT_TABLE_NODES)
    sp_table_nodes = np.asarray(prefill_service_s(il.ppf_normal_score(z)), dtype=float)
    if not np.all(np.isfinite(sp_table_nodes)) or np.any(sp_table_nodes <= 0):
        raise InputError("prefill_service", "the prefill service time must be positive and finite for every input length")
    sp_table_nodes = np.maximum.accumulate(sp_table_nodes)
    sp_table_weights = np.exp(-0.5 * z * z)
    sp_mean = il.expect(lambda x: np.asarray(prefill_service_s(x), dtype=float))
    sp_m2 = il.expect(lambda x: np.asarray(prefill_service_s(x), dtype=float) ** 2)
    # decode context of a request in the batch: C = IL + J, J = U·OL* with OL* length-biased
    m1o, m2o, m3o = ol.raw_moment(1), ol.raw_moment(2), ol.raw_moment(3)
    e_j, e_j2 = m2o / (2 * m1o), m3o / (3 * m1o)
    ctx_mean = il.mean_tok + e_j
    ctx_m2 = il.raw_moment(2) + 2 * il.mean_tok * e_j + e_j2
    return Problem(
        arch=arch, gpu=gpu, workload=workload, slo=slo, costs=costs, hbm_fraction=hbm_fraction,
        max_num_seqs_cap=int(max_num_seqs_cap), g=g, gamma_bytes=gamma_b, omega_bytes=omega_b,
        hbm_bytes=hbm_b, hbm_bw_bytes_s=gpu.mem_bw_bytes_s, prefill_gpus=m_p,
        sp_nodes_s=sp_nodes, node_u=u, sp_mean_s=sp_mean, sp_scv=max(sp_m2 / sp_mean**2 - 1.0, 0.0),
        il_nodes_tok=il_nodes, il_mean_tok=il.mean_tok, il_scv=il.raw_moment(2) / il.mean_tok**2 - 1.0,
        ctx_mean_tok=ctx_mean, ctx_m2_tok2=ctx_m2, prefill_service_s=prefill_service_s,
        prefill_wait_tail=mg1_wait_tail_table(sp_table_nodes, sp_table_weights), decode_gpus_per_replica=tp,
    )


# ---------------------------------------------------------------------------------- stage models


def prefill_attainment(pb: Problem, rate_rps, k_p, t_s=None):
    """Pr(TTFT ≤ t) for M/G/k_p (SARA (25); DESIGN §5.4). 0 where ρ_p ≥ 1. Broadcasts."""
    t = pb.slo.ttft_s if t_s is None else t_s
    rate = np.asarray(rate_rps, dtype=float)
    k = np.asarray(k_p, dtype=float)
    a = rate * pb.sp_mean_s  # offered load A = λ·E[S_p]
    c = erlang_c(k, a)
    w = mgk_conditional_wait_mean_s(pb.prefill_wait_tail, k, a)  # E[W | W > 0]
    return sojourn_attainment(t, pb.sp_nodes_s, pb.prefill_service_cdf(t), c, w, pb.prefill_wait_tail, a / k)


def kv_attainment(pb: Problem, rate_rps, bw_gibps, t_s=None):
    """Pr(T_KV ≤ t) for the M/G/1 link: F_TR(t) − ρ·∫ e^{−(t−s)/w_KV} dF_TR(s) (SARA (33), (35))."""
    t = pb.slo.kv_s if t_s is None else t_s
    rate = np.asarray(rate_rps, dtype=float)
    bw = np.asarray(bw_gibps, dtype=float) * GIB
    per_tok_s = pb.kv_bytes_per_token / np.maximum(bw, 1e-300)  # T_TR = gγ·IL/Bw (SARA (10))
    mean_s = per_tok_s * pb.il_mean_tok
    rho = rate * mean_s
    w = heavy_traffic_wait_mean_s(mean_s, pb.il_scv, 1.0, rho)
    nodes = per_tok_s[..., None] * pb.il_nodes_tok
    f_t = pb.workload.input.cdf(np.asarray(t) / per_tok_s)
    return np.where(bw > 0, sojourn_attainment(t, nodes, f_t, np.minimum(rho, 1.0), w), 0.0)


def _decode_load(pb: Problem, rate_rps, k_d):
    """(α, q) of the decode birth–death chain (SARA §III-C): births λ, deaths
    n/(ℓ_o·TPOT(n)) with TPOT(n) = (Ω + b·n)/(k_d·B_HBM), b = gγ·E[C]. Its stationary law is
    negative binomial NB(α = Ω/b + 1, q = λ·ℓ_o·b/(k_d·B_HBM)); q < 1 is the C3 stability."""
    rate = np.asarray(rate_rps, dtype=float)
    kd_bw = np.asarray(k_d, dtype=float) * pb.hbm_bw_bytes_s
    b = pb.kv_bytes_per_token * pb.ctx_mean_tok
    q = rate * pb.workload.output.mean_tok * b / kd_bw
    return pb.omega_bytes / b + 1.0, q


def decode_batch_mean(pb: Problem, rate_rps, k_d):
    """μ_bat = α·q/(1 − q) = λ·ℓ_o·(Ω + b)/(k_d·B_HBM − λ·ℓ_o·b) (the C3 form; Little's law).
    +inf where q ≥ 1 (the pool cannot keep up)."""
    alpha, q = _decode_load(pb, rate_rps, k_d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q < 1, alpha * q / (1.0 - q), np.inf)


def decode_batch_std(pb: Problem, rate_rps, k_d):
    """σ_bat = √(μ_bat/(1 − q)) of the negative-binomial occupancy (for C4)."""
    alpha, q = _decode_load(pb, rate_rps, k_d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q < 1, np.sqrt(alpha * q) / (1.0 - q), np.inf)


def _tpot_context_moments(pb: Problem, rate_rps, k_d):
    """Mean and variance of L_io as a token sees it: Σ of N* contexts, N* the size-biased
    occupancy, N* − 1 ~ NB(α + 1, q) (random sum: E = E[N*]·E[C], Var = E[N*]·Var C + Var N*·E[C]²)."""
    alpha, q = _decode_load(pb, rate_rps, k_d)
    qq = np.minimum(q, 1.0 - 1e-12)
    n_mean = 1.0 + (alpha + 1.0) * qq / (1.0 - qq)
    var_c = pb.ctx_m2_tok2 - pb.ctx_mean_tok**2
    n_var = (alpha + 1.0) * qq / (1.0 - qq) ** 2 + _occupancy_var_from_context(pb, rate_rps, k_d, alpha, qq, var_c)
    return n_mean * pb.ctx_mean_tok, n_mean * var_c + n_var * pb.ctx_mean_tok**2


def _occupancy_var_from_context(pb: Problem, rate_rps, k_d, alpha, q, var_c):
    """Extra variance of the batch occupancy N from the composition of the batch: the step time
    depends on the total context L = n·E[C] + Y, not on n alone, and a spell of long prompts
    (Y > 0) slows every request's departures. Linear-noise (Ornstein–Uhlenbeck) approximation
    (van Kampen, *Stochastic Processes in Physics and Chemistry*, ch. X): δṄ = −κ·δN − β·Y + noise,
    κ = λ(1 − q)/μ_bat (the relaxation rate that gives the negative-binomial variance μ/(1 − q)),
    β = λ·gγ/(Ω + gγ·μ_bat·E[C]) (∂ death rate/∂L at equilibrium), Y with variance μ_bat·Var C
    and correlation time τ = ℓ_o·TPOT(μ_bat) (a request's stay); the driven OU variance is
    β²·Var Y·τ/(κ·(1 + κτ)). For LLaMA 3.1 8B on 3 GPUs it adds ~10% to Var N at q = 0.5 and
    50–75% at q = 0.9, and brings p95 TPOT from 3–5% under the simulation to within ±2%."""
    rate = np.asarray(rate_rps, dtype=float)
    kd_bw = np.asarray(k_d, dtype=float) * pb.hbm_bw_bytes_s
    mu = alpha * q / (1.0 - q)
    kv = pb.kv_bytes_per_token
    step_s = (pb.omega_bytes + kv * pb.ctx_mean_tok * mu) / kd_bw
    tau_s = pb.workload.output.mean_tok * step_s
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = rate * (1.0 - q) / mu
        beta = rate * kv / (pb.omega_bytes + kv * pb.ctx_mean_tok * mu)
        extra = beta**2 * mu * var_c * tau_s / (kappa * (1.0 + kappa * tau_s))
    return np.where((rate > 0) & np.isfinite(extra), extra, 0.0)


def tpot_attainment(pb: Problem, rate_rps, k_d, t_s=None):
    """C1: Pr(TPOT ≤ t) = Pr(L_io ≤ (t·k_d·B_HBM − Ω)/(gγ)) (SARA (16), moment matched)."""
    t = pb.slo.tpot_s if t_s is None else t_s
    kd = np.asarray(k_d, dtype=float)
    _, q = _decode_load(pb, rate_rps, kd)
    mean, var = _tpot_context_moments(pb, rate_rps, kd)
    limit_tok = (np.asarray(t) * kd * pb.hbm_bw_bytes_s - pb.omega_bytes) / pb.kv_bytes_per_token
    family = pb.workload.input.family
    return np.where(q < 1, moment_matched_cdf(limit_tok, mean, var, family), 0.0)


def decode_memory_ok(pb: Problem, k_d, n_bat):
    """C2: Ω + gγ·ℓ(p_mem) ≤ k_d·Ω_HBM, ℓ(p_mem) the p_mem-quantile of N_bat contexts (moment matched)."""
    kd = np.asarray(k_d, dtype=float)
    n = np.asarray(n_bat, dtype=float)
    room_tok = (kd * pb.hbm_bytes - pb.omega_bytes) / pb.kv_bytes_per_token
    var_c = pb.ctx_m2_tok2 - pb.ctx_mean_tok**2
    p = moment_matched_cdf(room_tok, n * pb.ctx_mean_tok, n * var_c, pb.workload.input.family)
    return (room_tok > 0) & (p >= pb.slo.p_mem)


def admission_floor(pb: Problem, rate_rps, k_d):
    """C3/C4: the smallest integer N_bat > μ_bat with N_bat ≥ μ_bat + σ_bat·Φ⁻¹(p_join)."""
    mu = decode_batch_mean(pb, rate_rps, k_d)
    sd = decode_batch_std(pb, rate_rps, k_d)
    z = special.ndtri(pb.slo.p_join)
    finite = np.isfinite(mu)
    m = np.where(finite, mu, 0.0)
    n = np.maximum(np.ceil(m + np.where(finite, sd, 0.0) * z), np.floor(m) + 1.0)
    return np.where(finite, np.maximum(n, 1.0), np.inf)


def decode_ok(pb: Problem, rate_rps, k_d, n_bat):
    """All of C1–C4 at (λ, k_d, N_bat)."""
    n = np.asarray(n_bat, dtype=float)
    return ((tpot_attainment(pb, rate_rps, k_d) >= pb.slo.quantile) & decode_memory_ok(pb, k_d, n)
            & (n >= admission_floor(pb, rate_rps, k_d)) & (n <= pb.max_num_seqs_cap))


def _quantile(fn, q: float, hi: float) -> float:
    """Smallest t with fn(t) ≥ q (fn non-decreasing); inf when unreachable."""
    hi = max(hi, 1e-9)
    for _ in range(80):
        if fn(hi) >= q:
            break
        hi *= 2.0
    else:
        return math.inf
    return float(optimize.brentq(lambda t: fn(t) - q, 0.0, hi, xtol=1e-12, rtol=1e-10))


def ttft_quantile_s(pb: Problem, rate_rps: float, k_p: int, q: float | None = None) -> float:
    """Predicted q-quantile of TTFT (inf when ρ_p ≥ 1)."""
    q = pb.slo.quantile if q is None else q
    if rate_rps * pb.sp_mean_s >= k_p:
        return math.inf
    return _quantile(lambda t: float(prefill_attainment(pb, rate_rps, k_p, t)), q, pb.sp_nodes_s[-1])


def kv_quantile_s(pb: Problem, rate_rps: float, bw_gibps: float, q: float | None = None) -> float:
    q = pb.slo.quantile if q is None else q
    if rate_rps * pb.kv_bytes_per_token * pb.il_mean_tok >= bw_gibps * GIB:
        return math.inf
    return _quantile(lambda t: float(kv_attainment(pb, rate_rps, bw_gibps, t)), q,
                     pb.kv_bytes_per_token * pb.il_nodes_tok[-1] / (bw_gibps * GIB))


def tpot_quantile_s(pb: Problem, rate_rps: float, k_d: int, q: float | None = None) -> float:
    """Predicted q-quantile of TPOT, closed form (Ω + gγ·L_q)/(k_d·B_HBM)."""
    q = pb.slo.quantile if q is None else q
    if not math.isfinite(float(decode_batch_mean(pb, rate_rps, k_d))):
        return math.inf
    mean, var = _tpot_context_moments(pb, rate_rps, k_d)
    l_q = float(moment_matched_ppf(q, mean, var, pb.workload.input.family))
    return (pb.omega_bytes + pb.kv_bytes_per_token * l_q) / (k_d * pb.hbm_bw_bytes_s)


def decode_batch_stats(pb: Problem, rate_rps: float, k_d: int) -> tuple[float, float]:
    """(μ_bat, σ_bat) of the decode batch occupancy (negative binomial, SARA §III-C)."""
    return float(decode_batch_mean(pb, rate_rps, k_d)), float(decode_batch_std(pb, rate_rps, k_d))


# ---------------------------------------------------------------------------------- SARA


class _Infeasible(Exception):
    def __init__(self, stage: str, message: str):
        self.stage = stage
        super().__init__(message)


def _prefill_min(pb: Problem, rate: float) -> tuple[int, str]:
    """Fewest replicas k_p ≥ ⌊A⌋ + 1 meeting the TTFT SLO, and whether stability or the SLO set it."""
    a = rate * pb.sp_mean_s
    k0 = int(math.floor(a)) + 1  # ρ_p = A/k_p < 1
    span = 1  # the stability floor often meets the SLO: try it alone, then 8, 16, … at a time
    for _ in range(64):
        ks = np.arange(k0, k0 + span)
        ok = prefill_attainment(pb, rate, ks) >= pb.slo.quantile
        if ok.any():
            k = int(ks[np.argmax(ok)])
            return k, ("stability" if k == int(math.floor(a)) + 1 else "ttft_slo")
        k0 += span
        span = max(8, 2 * span)
    raise _Infeasible("prefill", "no replica count meets the TTFT SLO")


def _kv_min(pb: Problem, rate: float) -> tuple[float, str]:
    """Least link bandwidth (GiB/s) meeting the KV SLO: a root of the monotone attainment above
    the stability floor λ·gγ·ℓ_i."""
    per_gibps = pb.kv_bytes_per_token * pb.il_mean_tok / GIB  # GiB per request
    floor = rate * per_gibps  # ρ_KV < 1: Bw > λ·gγ·ℓ_i
    lo = floor * (1 + 1e-9) + 1e-12
    p = pb.slo.quantile

    il_nodes, n_nodes, tau = pb.il_nodes_tok, pb.il_nodes_tok.size, pb.slo.kv_s
    ctx = pb.kv_bytes_per_token / GIB  # GiB per token

    def f(bw):  # scalar fast path of kv_attainment (same formula, nodes beyond τ skipped)
        per_tok_s = ctx / bw
        mean_s = per_tok_s * pb.il_mean_tok
        rho = rate * mean_s
        if rho >= 1:
            return -p
        w_s = mean_s * (1 + pb.il_scv) / (2 * (1 - rho))
        x_tok = tau / per_tok_s
        m = int(np.searchsorted(il_nodes, x_tok, side="right"))
        integral = float(np.exp(-(x_tok - il_nodes[:m]) * (per_tok_s / w_s)).sum()) / n_nodes
        return min(max(float(pb.workload.input.cdf(x_tok)) - rho * integral, 0.0), 1.0) - p

    if f(lo) >= 0:
        return lo, "stability"
    # closed-form start (SARA §VI-C): floor + gγℓ_i·(1+c²)/(2τ)·log(1/(1−p)) + the transfer quantile
    hi = floor + per_gibps * ((1 + pb.il_scv) / (2 * pb.slo.kv_s) * math.log(1 / (1 - p))) \
        + pb.kv_bytes_per_token * float(pb.workload.input.ppf(p)) / GIB / pb.slo.kv_s
    for _ in range(200):
        if f(hi) >= 0:
            break
        lo, hi = hi, hi * 2
    bw = optimize.brentq(f, lo, hi, xtol=1e-12, rtol=1e-7)
    # land on the feasible side
    while f(bw) < 0:
        bw *= 1 + 1e-9
    return float(bw), ("kv_slo" if bw > floor * 1.01 else "stability")


def _decode_min(pb: Problem, rate: float) -> tuple[int, int, str]:
    """Fewest decode GPUs k_d (from the weights floor up) for which N_bat = the C3/C4 floor also
    passes C1, C2 and the max_num_seqs cap; the label names what failed at k_d − 1."""
    m_d = pb.decode_gpus_per_replica  # k_d in whole TP engines
    k_w = m_d * max(1, math.ceil(pb.omega_bytes / pb.hbm_bytes / m_d))  # weights must fit (C2 with no KV)
    start, span = k_w, 128
    prev_fail = "C2_memory"
    while start < 10**6:
        kd = np.arange(start, start + span * m_d, m_d, dtype=float)
        n_lo = admission_floor(pb, rate, kd)
        c3 = np.isfinite(n_lo)
        c1 = tpot_attainment(pb, rate, kd) >= pb.slo.quantile
        n_eval = np.where(np.isfinite(n_lo), n_lo, 1.0)
        c2 = decode_memory_ok(pb, kd, n_eval)
        c4 = n_eval <= pb.max_num_seqs_cap
        ok = c3 & c1 & c2 & c4
        if ok.any():
            i = int(np.argmax(ok))
            k = int(kd[i])
            if i > 0:
                j = i - 1
                prev_fail = ("C3_stability" if not c3[j] else "C1_tpot" if not c1[j]
                             else "C2_memory" if not c2[j] else "C4_admission")
            elif start == k_w:
                prev_fail = "C2_memory"
            return k, int(n_lo[i]), prev_fail
        j = span - 1
        prev_fail = ("C3_stability" if not c3[j] else "C1_tpot" if not c1[j]
                     else "C2_memory" if not c2[j] else "C4_admission")
        start += span * m_d
        span *= 2
    raise _Infeasible("decode", "no decode pool size meets C1–C4")


def min_resources(pb: Problem, rate_rps: float) -> tuple[Allocation, dict]:
    """Cheapest allocation meeting every SLO at rate λ (closed-form floors + integer search / root)."""
    k_p, b_p = _prefill_min(pb, rate_rps)
    bw, b_kv = _kv_min(pb, rate_rps)
    k_d, n_bat, b_d = _decode_min(pb, rate_rps)
    alloc = Allocation(k_p, pb.prefill_gpus, bw, k_d, n_bat)
    return alloc, {"prefill": b_p, "kv": b_kv, "decode": b_d}


def _check_slo_reachable(pb: Problem):
    """SLOs that no amount of resources can meet (an SLO below the service time)."""
    q = pb.slo.quantile
    f = float(pb.prefill_service_cdf(pb.slo.ttft_s))
    if f < q:
        sq = float(np.interp(q, pb.node_u, pb.sp_nodes_s))
        raise _Infeasible("prefill", f"TTFT SLO {pb.slo.ttft_s:g} s is below the {q:g}-quantile of the "
                          f"prefill service time ({sq:.4g} s on {pb.prefill_gpus} GPU(s)); no replica count can meet it")


def _infeasible_plan(stage: str, message: str, t0: float, method: str) -> SaraPlan:
    return SaraPlan(False, 0.0, None, 0.0, {"stage": stage}, f"infeasible: {stage}: {message}",
                    time.perf_counter() - t0, method)


def _budget_check(budget_per_hour: float):
    if not (isinstance(budget_per_hour, (int, float)) and math.isfinite(budget_per_hour) and budget_per_hour > 0):
        raise InputError("budget_per_hour", f"expected a positive $/h, got {budget_per_hour!r}")


def plan(pb: Problem, budget_per_hour: float, *, rel_tol: float = 1e-4) -> SaraPlan:
    """SARA P2: the largest λ whose cheapest allocation fits the budget (bisection on λ)."""
    _budget_check(budget_per_hour)
    t0 = time.perf_counter()
    try:
        _check_slo_reachable(pb)

        def cost(rate):
            alloc, bind = min_resources(pb, rate)
            return alloc.cost_per_hour(pb.costs), alloc, bind

        # upper bound: prefill or decode stability alone exhausting the budget
        kp_max = budget_per_hour / (pb.prefill_gpus * pb.costs.prefill_gpu_per_hour)
        kd_max = budget_per_hour / pb.costs.decode_gpu_per_hour
        dec_cap = kd_max * pb.hbm_bw_bytes_s / (pb.workload.output.mean_tok * pb.kv_bytes_per_token * pb.ctx_mean_tok)
        hi = min((kp_max + 1) / pb.sp_mean_s, dec_cap)
        lo = hi * 1e-7
        c_lo, a_lo, b_lo = cost(lo)
        if c_lo > budget_per_hour:
            stage = max((("prefill", a_lo.prefill_replicas * a_lo.prefill_gpus_per_replica * pb.costs.prefill_gpu_per_hour),
                         ("decode", a_lo.decode_replicas * pb.costs.decode_gpu_per_hour),
                         ("kv", a_lo.kv_bandwidth_gibps * pb.costs.kv_per_gibps_hour)), key=lambda x: x[1])[0]
            return _infeasible_plan(
                stage, f"budget {budget_per_hour:g} $/h is below the stability floor {c_lo:.4g} $/h "
                f"({a_lo.prefill_replicas}×{a_lo.prefill_gpus_per_replica} prefill GPU(s), "
                f"{a_lo.decode_replicas} decode GPU(s), {a_lo.kv_bandwidth_gibps:.3g} GiB/s; the largest share is {stage})",
                t0, "sara")
        best = (lo, a_lo, b_lo, c_lo)
        while hi / lo > 1 + rel_tol:
            mid = math.sqrt(lo * hi)
            try:
                c, a, b = cost(mid)
            except _Infeasible:
                hi = mid
                continue
            if c <= budget_per_hour:
                lo, best = mid, (mid, a, b, c)
            else:
                hi = mid
    except _Infeasible as exc:
        return _infeasible_plan(exc.stage, str(exc), t0, "sara")
    rate, alloc, bind, c = best
    bind = dict(bind, overall="budget")
    return SaraPlan(True, float(rate), alloc, float(c), bind, "", time.perf_counter() - t0, "sara")


# ---------------------------------------------------------------------------------- exhaustive


def _vector_bisect(ok, hi: np.ndarray, iters: int = 48) -> np.ndarray:
    """Largest λ in [0, hi] with ok(λ) True, elementwise (ok monotone: True below a threshold)."""
    lo = np.zeros_like(hi)
    hi = hi.astype(float).copy()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        lo = np.where(good, mid, lo)
        hi = np.where(good, hi, mid)
    return lo


def exhaustive(pb: Problem, budget_per_hour: float, *, kv_grid_points: int = 4000,
               chunk: int = 256) -> SaraPlan:
    """Reference: enumerate (k_p, Bw, k_d, N_bat) on integer grids (Bw on a grid of
    ``kv_grid_points`` steps up to the budget), compute each configuration's goodput with the same
    SLO-attainment functions (a bisection on λ per grid point and stage) and keep the best
    configuration within budget. Goodput of a configuration = min over stages."""
    _budget_check(budget_per_hour)
    t0 = time.perf_counter()
    try:
        _check_slo_reachable(pb)
    except _Infeasible as exc:
        return _infeasible_plan(exc.stage, str(exc), t0, "exhaustive")
    q = pb.slo.quantile
    cp = pb.prefill_gpus * pb.costs.prefill_gpu_per_hour
    cd = pb.costs.decode_gpu_per_hour
    ckv = pb.costs.kv_per_gibps_hour
    kp = np.arange(1, int(budget_per_hour // cp) + 1)
    m_d = pb.decode_gpus_per_replica
    k_w = m_d * max(1, math.ceil(pb.omega_bytes / pb.hbm_bytes / m_d))
    kd = np.arange(k_w, int(budget_per_hour // cd) + 1, m_d)
    if kp.size == 0 or kd.size == 0:
        return _infeasible_plan("prefill" if kp.size == 0 else "decode",
                                f"budget {budget_per_hour:g} $/h buys no prefill replica ({cp:g} $/h) "
                                f"and decode pool ({k_w}×{cd:g} $/h)", t0, "exhaustive")
    # prefill: λ_p(k_p)
    lam_p = _vector_bisect(lambda lam: prefill_attainment(pb, lam, kp) >= q, kp / pb.sp_mean_s)
    # KV: λ_kv(Bw) on the grid
    bw_max = budget_per_hour / ckv if ckv > 0 else 1e6
    step = bw_max / kv_grid_points
    bw = step * np.arange(0, kv_grid_points + 1)
    per_req_gib = pb.kv_bytes_per_token * pb.il_mean_tok / GIB
    lam_kv = np.zeros_like(bw)
    for s in range(1, bw.size, chunk):
        b = bw[s:s + chunk]
        lam_kv[s:s + chunk] = _vector_bisect(lambda lam: kv_attainment(pb, lam, b) >= q, b / per_req_gib)
    lam_kv_best = np.maximum.accumulate(lam_kv)
    # decode: λ_d(k_d, N_bat) for every pair
    n = np.arange(1, pb.max_num_seqs_cap + 1, dtype=float)
    lam_d_best = np.zeros(kd.size)
    n_best = np.zeros(kd.size, dtype=int)
    lo_ctx = pb.workload.output.mean_tok * pb.kv_bytes_per_token * pb.ctx_mean_tok
    for i, k in enumerate(kd):
        mem = decode_memory_ok(pb, k, n)
        if not mem.any():
            continue
        nn = n[mem]
        cap = np.full(nn.shape, k * pb.hbm_bw_bytes_s / lo_ctx)
        lam = _vector_bisect(lambda lam: decode_ok(pb, lam, k, nn), cap)
        lam_d_best[i] = lam.max()
        n_best[i] = int(nn[np.argmax(lam >= lam_d_best[i] * (1 - 1e-9))])  # smallest N_bat reaching it
    # combine every (k_p, k_d) within budget with the most bandwidth the rest buys
    left = budget_per_hour - kp[:, None] * cp - kd[None, :] * cd
    j = np.where(left >= 0, np.minimum(np.floor(left / (ckv * step) + 1e-9) if ckv > 0 else kv_grid_points,
                                       kv_grid_points), 0).astype(int)
    good = np.minimum(np.minimum(lam_p[:, None], lam_kv_best[j]), lam_d_best[None, :])
    good = np.where(left >= 0, good, 0.0)
    ip, idd = np.unravel_index(int(np.argmax(good)), good.shape)
    best = float(good[ip, idd])
    if best <= 0:
        return _infeasible_plan("decode" if lam_d_best.max() <= 0 else "prefill",
                                f"no configuration within {budget_per_hour:g} $/h meets every SLO", t0, "exhaustive")
    jb = int(j[ip, idd])
    jb = int(np.argmax(lam_kv[: jb + 1] >= best))  # cheapest grid bandwidth that carries it
    alloc = Allocation(int(kp[ip]), pb.prefill_gpus, float(bw[jb]), int(kd[idd]), int(n_best[idd]))
    stage_lams = {"prefill": lam_p[ip], "kv": lam_kv[jb], "decode": lam_d_best[idd]}
    bind = {"overall": "budget", "limiting_stage": min(stage_lams, key=stage_lams.get)}
    return SaraPlan(True, best, alloc, alloc.cost_per_hour(pb.costs), bind, "",
                    time.perf_counter() - t0, "exhaustive")


# ---------------------------------------------------------------------------------- colocated


@dataclass(frozen=True)
class ColocatedPlan:
    feasible: bool
    replicas: int
    goodput_rps: float
    cost_per_hour: float
    binding: str  # "rate" | "budget"
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def plan_colocated(sustainable_rate_per_replica_rps: float, gpus_per_replica: int, gpu_cost_per_hour: float,
                   *, rate_rps: float | None = None, budget_per_hour: float | None = None) -> ColocatedPlan:
    """Colocated pool from a per-replica sustainable rate λ* (e.g. GAUSS): replicas =
    ⌈λ/λ*⌉ for a target rate, or ⌊C_max/(m·C)⌋ for a budget (both given: the budget caps)."""
    if not (isinstance(sustainable_rate_per_replica_rps, (int, float)) and sustainable_rate_per_replica_rps >= 0
            and math.isfinite(sustainable_rate_per_replica_rps)):
        raise InputError("sustainable_rate_rps", f"expected λ* ≥ 0 req/s, got {sustainable_rate_per_replica_rps!r}")
    if not (isinstance(gpus_per_replica, int) and gpus_per_replica >= 1):
        raise InputError("gpus_per_replica", f"expected an integer ≥ 1, got {gpus_per_replica!r}")
    if rate_rps is None and budget_per_hour is None:
        raise InputError("rate_rps", "give a target rate or a budget")
    lam = sustainable_rate_per_replica_rps
    unit = gpus_per_replica * gpu_cost_per_hour
    if lam == 0:
        return ColocatedPlan(False, 0, 0.0, 0.0, "rate", "infeasible: colocated: the SLO is not met at any rate "
                             "on one replica (λ* = 0)")
    if rate_rps is not None:
        n = max(1, math.ceil(rate_rps / lam - 1e-12))
        if budget_per_hour is None or n * unit <= budget_per_hour:
            return ColocatedPlan(True, n, n * lam, n * unit, "rate")
    n = int(budget_per_hour // unit) if unit > 0 else 0
    if n < 1:
        return ColocatedPlan(False, 0, 0.0, 0.0, "budget", f"infeasible: colocated: budget {budget_per_hour:g} $/h "
                             f"is below one replica ({unit:g} $/h)")
    return ColocatedPlan(True, n, n * lam, n * unit, "budget")
