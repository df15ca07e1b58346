"""Several vLLM engine twins on one simulated GPU (issue 24, item 1): step-granular time-slicing.

Rule (the twin half of :mod:`kneecap.model.colocation`'s A1–A2, without its A3–A4 mean field):

* one GPU clock ``now_s``; one step runs at a time, over the whole GPU, at the cost the engine's
  own roofline gives it alone (:func:`kneecap.sim.roofline.step_time_s`, unchanged);
* an engine is *ready* at ``Engine.ready_s()``: at once with requests running or queued, else at
  its next arrival. When the GPU frees at t, the first ready engine (``ready_s ≤ t``) in
  round-robin order after the one that ran last takes the next step; if none is ready the GPU
  idles to the earliest ``ready_s`` and the same rule picks among the engines ready then;
* the chosen engine's clock moves to t (it waited t − its own ``now_s`` for the GPU), and its
  ``Engine.step()`` forms the batch at t as it does alone: waits lengthen inter-token intervals
  and let more arrivals join the batch, nothing else changes.

So a request's inter-token interval is its engine's step plus one step of every partner that was
ready when it ended (a round), and one engine alone runs exactly as :meth:`Engine.run_until_idle`
(same steps, same floats). :class:`SharedGPU` drives existing :class:`~kneecap.sim.engine.Engine`
objects; the engine module only gained ``ready_s()``.

:func:`verify_placement` replays engines with Poisson load on one GPU in virtual time
(deterministic, seeded) and measures TTFT/TPOT percentiles and GPU shares: the check behind
``kneecap pack --verify``. Not modelled, as in the analytic model: MPS or concurrent kernels,
host/GPU overlap, L2 contention, tensor parallelism.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model import gauss, memory
from kneecap.model.arch import ModelArch, get_arch
from kneecap.model.hardware import GPU, get_gpu
from kneecap.model.slim import SlimParams, arch_arrays, weight_read_bytes
from kneecap.sim.engine import Engine, StepResult, engine_config
from kneecap.sim.roofline import DEFAULT_STEP_COST, StepCostParams, attention_flops, step_time_s

ARRIVAL_BLOCK = 1024  # arrivals drawn per engine at a time (fixed: the draws do not depend on the run)
PERCENTILES = (0.50, 0.95, 0.99)


class SharedGPU:
    """Engines time-slicing one GPU, one step at a time, round robin on ready steps (module
    docstring). The engines must serve the same GPU; each keeps its own scheduler and KV cache.
    ``before_step(index, start_s)``, if set, is called once a step is chosen, before it runs (a
    load generator queues arrivals there; arrivals after ``start_s`` do not change the choice)."""

    def __init__(self, engines):
        engines = tuple(engines)
        if not engines or not all(isinstance(e, Engine) for e in engines):
            raise InputError("engines", "expected a non-empty list of Engine")
        if len({id(e) for e in engines}) != len(engines):
            raise InputError("engines", "an engine appears twice")
        if len({e.config.gpu.key for e in engines}) != 1:
            raise InputError("engines", "engines on one GPU must share its type, got "
                                        f"{sorted({e.config.gpu.key for e in engines})}")
        self.engines = engines
        self.now_s = min(e.now_s for e in engines)  # when the GPU is next free
        self._turn = 0  # round-robin pointer: the engine after the last one that ran
        self.num_steps = 0
        self.busy_s = 0.0
        self.before_step = None  # optional callable(index, start_s), called once a step is chosen

    def next_engine(self) -> tuple[int, float] | None:
        """(index, start time) of the next step: the first engine ready by the time the GPU is
        free, in round-robin order; None when no engine has work."""
        ready_s = [e.ready_s() for e in self.engines]
        t = self.now_s
        if min(ready_s) > t:  # the GPU idles until the earliest ready engine
            t = min(ready_s)
            if math.isinf(t):
                return None
        n = len(self.engines)
        for k in range(n):
            i = (self._turn + k) % n
            if ready_s[i] <= t:
                return i, t
        raise AssertionError("unreachable: some engine is ready at t")

    def step(self) -> tuple[int, StepResult] | None:
        """Run one step of the next engine (:meth:`next_engine`) on the GPU; None when idle for good."""
        nxt = self.next_engine()
        if nxt is None:
            return None
        i, t = nxt
        if self.before_step is not None:  # may queue arrivals after t; the choice stands
            self.before_step(i, t)
        eng = self.engines[i]
        if t > eng.now_s:  # it waited for the GPU (or for its next arrival)
            eng.now_s = t
        res = eng.step()
        self.now_s = res.end_s
        self._turn = (i + 1) % len(self.engines)
        self.num_steps += 1
        self.busy_s += res.duration_s
        return i, res

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until no engine has work (or ``max_steps``); returns steps run."""
        steps = 0
        while max_steps is None or steps < max_steps:
            if self.step() is None:
                break
            steps += 1
        return steps


# ---------------------------------------------------------------- verification of a placement


@dataclass(frozen=True)
class PlacedEngine:
    """One engine on the shared GPU, in the twin's terms: model, step costs, flags, Poisson load.

    ``max_num_seqs``/``max_num_batched_tokens`` None take vLLM's defaults as
    ``gauss.engine_limits_for`` does (chunked prefill on); the KV cache is the
    ``gpu_memory_utilization`` share's (``memory.memory_split``). ``request_overhead_s`` (SLIM's
    t_fixed) adds to each TTFT without occupying the GPU. ``seed`` None: ``[seed, index]`` of
    :func:`verify_placement`. A workload's cached prefix is taken as prefilled KV (no compute;
    its blocks are the request's own, not shared: a conservative prefix cache)."""

    arch: ModelArch | str
    workload: gauss.Workload | gauss.BucketWorkload
    rate_rps: float
    gpu_memory_utilization: float
    step_cost: StepCostParams = DEFAULT_STEP_COST
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = memory.DEFAULT_BLOCK_SIZE
    request_overhead_s: float = 0.0
    seed: int | None = None
    name: str = ""


def step_cost_for(arch: ModelArch | str, params: SlimParams) -> StepCostParams:
    """The twin's step costs whose decode step equals SLIM's kneecap-form d(B, C) (C1 of
    :mod:`kneecap.model.colocation`) for ``arch``:

    * per step: t_step + L·t_layer + W_slim/(η_w·BW) = step_overhead + W_twin/(bw·BW), with
      bw = η_w·W_twin/W_slim (the twin streams ``arch.weight_bytes``, SLIM
      ``weight_read_bytes``); if that exceeds 1, bw = 1 and the overhead takes the rest (≥ 0);
    * per sequence: α + γ·L·(D/1024)²; per context token: η_m is the attention bandwidth share;
    * prefill: η_c; no eager launch term (SLIM's t_layer is in every step). A prefill step's
      weight read and GEMMs add, as SLIM's θ was fitted (eq. 9 adds T_pre to the step) and GAUSS
      composes them (``gauss.coefficients_from_slim``), not the roofline's max of the twin's own
      fit (``prefill_adds_weight_read``).

    A bw over 1 (η_w·W_twin/W_slim > 1) is refused: no share of the bandwidth gives that step.
    """
    arch = get_arch(arch)
    w_twin = float(arch.weight_bytes)
    w_slim = float(weight_read_bytes(arch_arrays(arch, 1), np.inf))
    per_step_s = params.t_step_s + arch.layers * params.t_layer_s
    bw_eff = params.eta_w * w_twin / w_slim
    if bw_eff > 1.0:
        raise InputError("params.eta_w", f"{params.eta_w} with {arch.key}'s streamed weights needs a twin "
                                         f"bandwidth share {bw_eff:.3f} > 1")
    per_seq_s = params.alpha_s + params.gamma_s * arch.layers * (arch.hidden / 1024.0) ** 2
    return StepCostParams(bw_efficiency=bw_eff, attn_bw_efficiency=params.eta_m, compute_efficiency=params.eta_c,
                          step_overhead_s=per_step_s, per_seq_overhead_s=per_seq_s, eager_layer_overhead_s=0.0,
                          prefill_adds_weight_read=True)


def slim_params_for(arch: ModelArch | str, cost: StepCostParams = DEFAULT_STEP_COST) -> SlimParams:
    """SLIM θ (kneecap form) whose GAUSS decode step d(B, C) equals the twin's decode step under
    ``cost`` (the inverse of :func:`step_cost_for`, t_fixed 0). The twin's eager launches of
    prefill steps have no SLIM term; they are left out."""
    arch = get_arch(arch)
    w_twin = float(arch.weight_bytes)
    w_slim = float(weight_read_bytes(arch_arrays(arch, 1), np.inf))
    return SlimParams(eta_c=cost.compute_efficiency, eta_m=cost.attn_bw_efficiency, alpha_s=cost.per_seq_overhead_s,
                      gamma_s=0.0, t_step_s=cost.step_overhead_s, t_layer_s=0.0,
                      eta_w=cost.bw_efficiency * w_slim / w_twin, t_fixed_s=0.0)


def placed_engine(load, seed: int | None = None) -> PlacedEngine:
    """A :class:`PlacedEngine` from a ``kneecap.model.colocation.EngineLoad`` (kneecap form):
    its SLIM θ as twin step costs (:func:`step_cost_for`), t_fixed as the request overhead."""
    if load.form != "kneecap":
        raise InputError("form", f"the twin replays SLIM's kneecap form only, got {load.form!r}")
    return PlacedEngine(load.arch, load.workload, load.rate_rps, load.gpu_memory_utilization,
                        step_cost_for(load.arch, load.params), load.max_num_seqs, load.max_num_batched_tokens,
                        load.max_model_len, load.block_size, float(load.params.t_fixed_s), seed, load.name)


@dataclass(frozen=True)
class MeasuredEngine:
    """What one engine's measured requests saw beside its partners (seconds)."""

    name: str
    requests: int  # measured: arrived in [warmup_s, horizon_s]
    ttft_s: tuple[float, float, float]  # p50, p95, p99
    tpot_s: tuple[float, float, float] | None  # per request (last − first)/(tokens − 1); None: 1-token outputs
    ttft_mean_s: float
    tpot_mean_s: float | None
    gpu_share: float  # its steps' GPU time / the window
    busy_fraction: float  # share of the window it had a step running or ready (colocation's a, as a time share)
    mean_step_s: float  # its own GPU time per step (the step alone)
    mean_wall_step_s: float  # step end to next step end while it had work: its step plus the partners' waits
    mean_batch: float  # sequences per step
    steps: int  # its steps started in the window
    preemptions: int  # over the whole run
    rejected: int = 0  # drawn arrivals in the window vLLM would refuse (``oversize="reject"``), not served


@dataclass(frozen=True)
class Verification:
    """A replayed placement: one :class:`MeasuredEngine` per engine, the window measured
    (``warmup_s`` to ``horizon_s``, virtual seconds) and the GPU's busy share in it."""

    engines: tuple[MeasuredEngine, ...]
    warmup_s: float
    horizon_s: float
    end_s: float  # when the last measured request finished
    gpu_busy_share: float

    def as_dict(self) -> dict:
        return asdict(self)


def _check(engines, gpu: GPU, seed: int) -> list[tuple[PlacedEngine, Engine, np.random.Generator]]:
    """Validate each engine (errors name ``engines[i].<field>``) and build its twin and stream."""
    from kneecap.model.colocation import EngineLoad, checked_shares

    if not isinstance(engines, (list, tuple)) or not engines:
        raise InputError("engines", "expected a non-empty list of PlacedEngine or EngineLoad")
    placed = []
    for i, e in enumerate(engines):
        try:
            if isinstance(e, EngineLoad):
                e = placed_engine(e)
            elif not isinstance(e, PlacedEngine):
                raise InputError("", f"expected PlacedEngine or EngineLoad, got {type(e).__name__}")
        except InputError as exc:
            raise InputError(f"engines[{i}]" + (f".{exc.field}" if exc.field else ""),
                             str(exc).split(": ", 1)[-1]) from None
        placed.append(e)
    checked_shares([e.gpu_memory_utilization for e in placed], gpu)
    out = []
    for i, e in enumerate(placed):
        field = f"engines[{i}]"
        try:
            arch = get_arch(e.arch)
            if not (isinstance(e.rate_rps, (int, float)) and not isinstance(e.rate_rps, bool)
                    and math.isfinite(e.rate_rps) and e.rate_rps > 0):
                raise InputError("rate_rps", f"expected a positive finite rate, got {e.rate_rps!r}")
            if not (isinstance(e.request_overhead_s, (int, float)) and e.request_overhead_s >= 0):
                raise InputError("request_overhead_s", f"expected a non-negative time, got {e.request_overhead_s!r}")
            # unset caps as gauss.engine_limits_for resolves them, so the twin and the model agree
            seqs, budget = memory.vllm_default_limits(gpu, True, arch.max_position or 2048)
            cfg = engine_config(arch, gpu, max_num_seqs=e.max_num_seqs if e.max_num_seqs is not None else seqs,
                                max_num_batched_tokens=(e.max_num_batched_tokens if e.max_num_batched_tokens
                                                        is not None else budget),
                                max_model_len=e.max_model_len, block_size=e.block_size,
                                gpu_memory_utilization=float(e.gpu_memory_utilization), step_cost=e.step_cost)
        except InputError as exc:
            raise InputError(f"{field}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
        rng = np.random.default_rng(e.seed if e.seed is not None else [seed, i])
        out.append((e, Engine(cfg), rng))
    return out


def _longest_step_s(cfg) -> float:
    """An upper bound of any step of this engine: the roofline at a full token budget, a full
    batch and a full KV cache read (step_time_s grows in each of them)."""
    cap = cfg.kv_capacity_tokens
    return step_time_s(cfg.arch, cfg.gpu, num_seqs=cfg.max_num_seqs, num_tokens=cfg.max_num_batched_tokens,
                       kv_read_tokens=cap, attn_flops=attention_flops(cfg.arch, cfg.max_num_batched_tokens, cap),
                       has_prefill=True, cost=cfg.step_cost, tensor_parallel_size=cfg.tensor_parallel_size)


def _quantiles(x: np.ndarray) -> tuple[float, float, float]:
    return tuple(float(v) for v in np.quantile(x, PERCENTILES))


def verify_placement(engines, gpu: GPU | str, *, requests: int = 4000, seed: int = 0,
                     warmup_fraction: float = 0.1, oversize: str = "error") -> Verification:
    """Replay ``engines`` (:class:`PlacedEngine` or ``colocation.EngineLoad``) together on one
    ``gpu`` (:class:`SharedGPU`) under Poisson load and measure each one.

    Rules: every engine draws its arrivals (exponential gaps at its rate) and lengths
    (``gauss.sample_workload``) from its own seeded stream, in blocks, for as long as the run
    lasts, so no engine's load stops early. The window is [warmup_s, horizon_s] with horizon_s =
    ``requests``/(λ_max·(1 − warmup_fraction)): the busiest engine gets about ``requests``
    measured requests, a lighter one λ_i/λ_max of that (``MeasuredEngine.requests``), all over
    the same virtual time. The run ends when every request that arrived in the window has
    finished. Deterministic: no wall clock; the same inputs give the same numbers.

    ``oversize``: a drawn request longer than the engine's ``max_model_len`` (prompt + output; a
    log-normal draw can be) is an error (``"error"``, the default) or, with ``"reject"``, refused
    as vLLM answers it (HTTP 400): not served, counted in ``MeasuredEngine.rejected`` when it
    arrived in the window. The draws are the same either way; only what is queued differs."""
    gpu = get_gpu(gpu)
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise InputError("requests", f"expected a positive integer, got {requests!r}")
    if not (isinstance(warmup_fraction, (int, float)) and 0.0 <= warmup_fraction < 1.0):
        raise InputError("warmup_fraction", f"expected a fraction in [0, 1), got {warmup_fraction!r}")
    if oversize not in ("error", "reject"):
        raise InputError("oversize", f"expected 'error' or 'reject', got {oversize!r}")
    built = _check(engines, gpu, seed)
    n = len(built)
    rates = np.array([e.rate_rps for e, _, _ in built], dtype=np.float64)
    horizon_s = float(requests / (rates.max() * (1.0 - warmup_fraction)))
    warmup_s = warmup_fraction * horizon_s
    shared = SharedGPU([eng for _, eng, _ in built])

    frontier_s = np.zeros(n)  # last arrival drawn per engine
    longest_step_s = np.array([_longest_step_s(eng.config) for _, eng, _ in built])
    measured: list[list] = [[] for _ in range(n)]
    pending: set = set()  # measured requests not finished yet
    rejected = [0] * n  # window arrivals refused (oversize="reject")

    def draw_past(i: int, t_s: float) -> None:
        """Queue engine i's arrivals, ARRIVAL_BLOCK at a time, until one lies past ``t_s``. Every
        arrival is queued while it is still ahead of the engine's clock (FCFS intact)."""
        spec, eng, rng = built[i]
        while frontier_s[i] <= t_s:
            arrivals_s = frontier_s[i] + np.cumsum(rng.standard_exponential(ARRIVAL_BLOCK) / spec.rate_rps)
            inp, cached, out = gauss.sample_workload(spec.workload, ARRIVAL_BLOCK, rng)
            prefilled = np.floor(cached / eng.config.block_size) * eng.config.block_size
            if arrivals_s[0] <= eng.now_s:
                raise AssertionError("an arrival was drawn after the engine's clock passed it")
            for a, p, c, o in zip(arrivals_s.tolist(), inp.astype(int).tolist(), prefilled.astype(int).tolist(),
                                  out.astype(int).tolist()):
                if oversize == "reject" and p + o > eng.config.max_model_len:
                    rejected[i] += warmup_s <= a <= horizon_s
                    continue
                try:
                    req = eng.add_request(p, o, arrival_s=a, prefilled_tokens=c)
                except InputError as exc:
                    raise InputError(f"engines[{i}].workload", f"a drawn request ({p} prompt + {o} output "
                                                              f"tokens) cannot run: {exc}") from None
                if warmup_s <= a <= horizon_s:
                    measured[i].append(req)
                    pending.add(req)
            frontier_s[i] = arrivals_s[-1]

    # Before a decision every engine's arrivals are queued past now + its longest step, so the
    # ready times are right; before a step starting at t, the stepping engine's past t + its
    # longest step, so none lands behind its clock (SharedGPU's before_step hook).
    shared.before_step = lambda i, t: draw_past(i, t + longest_step_s[i])
    start_s = [[] for _ in range(n)]
    end_s = [[] for _ in range(n)]
    seqs = [[] for _ in range(n)]
    ready_after = [[] for _ in range(n)]  # it had work when the step ended (its next step was ready)
    while pending or shared.now_s < horizon_s:
        for i in range(n):
            draw_past(i, shared.now_s + longest_step_s[i])
        i, res = shared.step()  # never None: the streams do not end
        eng = shared.engines[i]
        start_s[i].append(res.start_s)
        end_s[i].append(res.end_s)
        seqs[i].append(res.num_seqs)
        ready_after[i].append(bool(eng.running or eng.waiting))
        for r in res.finished:
            pending.discard(r)

    window_s = horizon_s - warmup_s
    out, busy_total_s = [], 0.0
    for i, (spec, eng, _) in enumerate(built):
        s, e = np.asarray(start_s[i]), np.asarray(end_s[i])
        busy_s = float(np.sum(np.clip(e, warmup_s, horizon_s) - np.clip(s, warmup_s, horizon_s)))
        busy_total_s += busy_s
        in_window = (s >= warmup_s) & (s < horizon_s)
        ready = np.asarray(ready_after[i][:-1], dtype=bool) & in_window[:-1]
        wall = np.diff(e)[ready]
        waiting_s = float(np.sum((s[1:] - e[:-1])[ready]))  # ready but the GPU was the partners'
        reqs = measured[i]
        if not reqs:
            raise InputError("requests", f"engine {i} got no request in the window; raise requests")
        first = np.array([r.first_token_s for r in reqs])
        ttft = first - np.array([r.arrival_s for r in reqs]) + float(spec.request_overhead_s)
        toks = np.array([r.output_tokens for r in reqs])
        last = np.array([r.last_token_s for r in reqs])
        multi = toks > 1
        tpot = (last[multi] - first[multi]) / (toks[multi] - 1)
        out.append(MeasuredEngine(
            spec.name or f"engines[{i}]", len(reqs), _quantiles(ttft), _quantiles(tpot) if tpot.size else None,
            float(ttft.mean()), float(tpot.mean()) if tpot.size else None, float(busy_s / window_s),
            float((np.sum((e - s)[in_window]) + waiting_s) / window_s),
            float(np.mean((e - s)[in_window])), float(np.mean(wall)) if wall.size else math.nan,
            float(np.mean(np.asarray(seqs[i])[in_window])), int(in_window.sum()), eng.num_preemptions,
            int(rejected[i])))
    return Verification(tuple(out), warmup_s, horizon_s, shared.now_s, float(busy_total_s / window_s))


# ---------------------------------------------------------------- a placement fed recorded arrivals


@dataclass(frozen=True)
class ArrivalsRun:
    """One engine of :func:`replay_arrivals`: per given request its TTFT and TPOT (seconds; inf
    for a request refused, NaN TPOT never: 0 for a one-token output, as ``sim.replay.latencies``),
    whether it was refused, and the engine's preemptions and GPU time."""

    name: str
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    refused: np.ndarray  # bool per request
    preemptions: int
    busy_s: float


def replay_arrivals(engines, gpu: GPU | str, arrivals) -> tuple[ArrivalsRun, ...]:
    """Replay ``engines`` (:class:`PlacedEngine` or ``colocation.EngineLoad``) together on one
    ``gpu`` (:class:`SharedGPU`), each fed the requests it is given instead of Poisson draws:
    ``arrivals[i]`` = (arrival_s, prompt_tokens, output_tokens) arrays for engine i (a trace's
    share). All are queued up front (the engine admits each at its arrival) and the GPU runs
    until every one has finished. A request the engine cannot hold (longer than its
    ``max_model_len`` or its KV cache) is refused as vLLM answers it (HTTP 400): not served, its
    latencies inf. Deterministic: no draws, no wall clock."""
    gpu = get_gpu(gpu)
    built = _check(engines, gpu, 0)
    if not isinstance(arrivals, (list, tuple)) or len(arrivals) != len(built):
        raise InputError("arrivals", f"expected one (arrival_s, prompt, output) triple per engine ({len(built)})")
    shared = SharedGPU([eng for _, eng, _ in built])
    queued = []
    for (spec, eng, _), (arrival_s, prompt, output) in zip(built, arrivals):
        reqs = []
        for a, p, o in zip(np.asarray(arrival_s, dtype=float).tolist(), np.asarray(prompt).astype(int).tolist(),
                           np.asarray(output).astype(int).tolist()):
            try:
                reqs.append(eng.add_request(max(p, 1), max(o, 1), arrival_s=a))
            except InputError:
                reqs.append(None)
        queued.append(reqs)
    busy = [0.0] * len(built)
    while (nxt := shared.step()) is not None:
        busy[nxt[0]] += nxt[1].duration_s
    out = []
    for (spec, eng, _), reqs, b in zip(built, queued, busy):
        refused = np.array([r is None for r in reqs], dtype=bool)
        ttft, tpot = np.full(len(reqs), np.inf), np.full(len(reqs), np.inf)
        for k, r in enumerate(reqs):
            if r is None:
                continue
            ttft[k] = r.first_token_s - r.arrival_s + float(spec.request_overhead_s)
            tpot[k] = (r.last_token_s - r.first_token_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        out.append(ArrivalsRun(spec.name, ttft, tpot, refused, eng.num_preemptions, float(b)))
    return tuple(out)
