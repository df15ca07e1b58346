"""Fleet packing (issue 24, item 2): place every replica of every deployment of a fleet on the
cheapest set of GPUs found that keeps each deployment's quantile SLOs, several vLLM engines
sharing a GPU where the co-location model (``model/colocation.py``) predicts they all still
meet them. Pure: no I/O, no module-level mutable state; every draw from ``default_rng(seed)``.

Units. A deployment runs ``replicas`` engines (tensor parallel 1), each taking an equal share
λ/replicas of its request rate. Today each engine has a GPU of its own (its declared type, at
its declared flags: vLLM's defaults unless given). Replicas of one deployment never share a GPU
in a packing (they stay failure-isolated, as declared; one engine at 2λ would anyway beat two
time-sliced engines at λ each on one GPU), so a GPU's engine set is a set of deployments.

Checking one GPU type g and an engine set E (``_Packer.evaluate``):

1. memory: each engine's least share (weights + vLLM's reserve + one mean request's KV, by
   ``memory.utilization_for_kv_tokens``) must sum within ``colocation.MAX_TOTAL_UTILIZATION``;
2. operating point: ``colocation.colocation_point`` at provisional shares (the least shares plus
   the free memory split evenly) gives each engine's running set R̄ = ρ + B̄ (GAUSS §3.8 with its
   partners' waits); no fixed point (a partner pushes an engine past stability) rejects E;
3. sizing: the cap ``max_num_seqs`` = R̄ + 4·√R̄ + 1 rounded up to a multiple of 8 (at least 8):
   the running set is about Poisson, so the cap binds only far in its tail. The KV cache holds
   the running set's p99 (R̄ + 2.33·√R̄ + 1 sequences, fewer than the cap: a fuller batch
   preempts, which GAUSS's limits model and step 4 sees) at the workload's full context, prompt
   + output (``memory.kv_tokens_for_cap``; more than the mean-field's resident context), and the
   share ``gpu_memory_utilization`` is the least that holds it (``memory.utilization_for_kv_tokens``).
   The shares must again sum within the limit; while they sum to less than
   ``memory.DEFAULT_UTILIZATION`` (vLLM's 0.9) the free memory is given back to the engines in
   proportion to their shares (more KV, no cost);
4. tails: ``colocation.colocated_tails`` at those caps and shares (one engine alone: exactly
   ``gauss.simulate``, GAUSS), every engine's predicted TTFT and TPOT at its SLO quantile within
   (1 − margin) of its SLO.

A calibration moves to another GPU type by ``transfer.calibration_on`` (efficiencies carried,
γ by the peak FLOP/s ratio); without one the uncalibrated SLIM defaults apply on every type.

The search (``pack``) is a greedy set cover seeded first-fit-decreasing, the classic ratio rule
of weighted set cover (each step buys the set with the least cost per unit covered) made
tractable by growing only one candidate set per GPU type:

* engines are taken largest first (the larger of their memory share and GPU-time share alone on
  today's GPU; ties by name), the largest still unplaced being the seed of the next GPU;
* for every GPU type of the inventory with a unit left, in price order, on which the seed alone
  meets its SLOs, the seed's set grows first-fit over the remaining engines (largest first; an
  engine joins when steps 1–4 still pass for the whole set);
* the GPU bought is the (type, set) of least price per dollar of today's GPUs it replaces (each
  engine weighs its own GPU's price today): the one that retires the most of today's spend per
  dollar; ties to the cheaper type, then the type key;
* a last pass moves each GPU to the cheapest type with a unit left on which its whole set passes.

Why this and not an exact search: a set's feasibility is a Monte-Carlo GAUSS run per engine, so
an exact bin-packing over types (NP-hard already with one type) would need far more of them;
first-fit-decreasing is within 11/9·OPT + 6/9 bins for one type and additive sizes (here
feasibility is not additive: no bound is claimed), the ratio rule is the standard greedy for
weighted covers, and both are deterministic. Evaluations are cached per
(type, set of deployments) within one call, and step 4's tails by their inputs (the engines'
loads less their names, the GPU, the seed and sample sizes: :class:`TailsCache`), so deployments
that look alike to GAUSS (same model, lengths, per-replica rate, SLOs, flags and calibration) are
simulated once, and a caller that keeps the cache across calls (the operator's fleet advice)
reruns GAUSS only for the engine sets whose inputs changed. The answer is a good packing, not a
proven optimum.

Verification (``kneecap.sim.pack_verify``, ``kneecap pack --verify``): each packed GPU replayed on the engine
twins in virtual time (``sim.shared_gpu.verify_placement``), one GPU after another, each with a
seed of its own; ``verification_dict`` sets each deployment's measured quantiles (its worst
replica) beside the predicted ones and lists every SLO missed as measured (no margin).

A deployment whose engine alone meets its SLOs on no type of the inventory with a unit left
ends the search (``PackResult.unplaced`` names it, with the best it could do alone on each type):
interference only adds waits, so no shared placement would do better.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from kneecap.errors import InputError
from kneecap.model import colocation, gauss, memory, transfer
from kneecap.model.arch import ModelArch, get_arch
from kneecap.model.hardware import GPU, get_gpu
from kneecap.model.slim import SlimParams

DEFAULT_MARGIN = 0.10
QUANTILE_INDEX = MappingProxyType({0.5: 0, 0.95: 1, 0.99: 2})  # the quantiles colocated_tails reports
CAP_TAIL_Z = 4.0  # the cap sits this many Poisson standard deviations above the mean running set
KV_TAIL_Z = 2.326  # the KV cache holds the running set's p99 (Poisson), each at its p99 context sum
CAP_STEP = 8
CAP_MIN = 8
PROVISIONAL_CAPS = (256, 64, CAP_MIN)  # caps of the provisional operating point (step 2), largest that fits
SAMPLES = 50_000
REPLICATIONS = 4
MOMENT_SAMPLES = 20_000

_ENTRY_KEYS = frozenset({"name", "model", "accelerator", "replicas", "engine", "workload", "slo", "calibration"})
_SUB_KEYS = MappingProxyType({
    "accelerator": frozenset({"type", "count", "costPerHour"}),
    "engine": frozenset({"tensorParallelSize", "maxNumSeqs", "gpuMemoryUtilization"}),
    "workload": frozenset({"requestsPerSecond", "inputLengthMean", "inputLengthCoefficientOfVariation",
                           "outputLengthMean", "outputLengthCoefficientOfVariation"}),
    "slo": frozenset({"quantile", "ttftSeconds", "tpotSeconds"}),
    "model": frozenset({"name", "architecture"}),
})


@dataclass(frozen=True)
class Deployment:
    """One fleet entry: today's GPU and flags, its workload (the whole deployment's rate) and SLOs."""

    name: str
    arch: ModelArch
    gpu: GPU  # today's
    replicas: int
    rate_rps: float  # all replicas together
    workload: gauss.Workload
    quantile: float
    ttft_s: float | None
    tpot_s: float | None
    max_num_seqs: int | None = None  # today's (None: vLLM's default)
    gpu_memory_utilization: float = memory.DEFAULT_UTILIZATION  # today's
    cost_per_hour: float | None = None  # today's $/h per GPU (None: the inventory's, else the catalog's)
    calibration: object | None = None  # a calibrate.Calibration, or None: uncalibrated SLIM defaults

    @property
    def rate_per_replica_rps(self) -> float:
        return self.rate_rps / self.replicas


@dataclass(frozen=True)
class GpuOffer:
    """GPUs of one type the packing may use, and their price."""

    gpu: GPU
    count: int
    cost_per_hour: float


@dataclass(frozen=True)
class EngineResult:
    """One engine (a replica) on one GPU: its flags and predicted tails (p50, p95, p99, seconds)."""

    deployment: str
    replica: int
    max_num_seqs: int | None
    gpu_memory_utilization: float
    ttft_s: tuple[float, float, float] | None
    tpot_s: tuple[float, float, float] | None
    slo_met: bool
    gpu_share: float | None
    interference_s: float | None
    note: str | None = None


@dataclass(frozen=True)
class GpuPlacement:
    gpu: str
    cost_per_hour: float
    engines: tuple[EngineResult, ...]

    @property
    def memory_share(self) -> float:
        return math.fsum(e.gpu_memory_utilization for e in self.engines)


@dataclass(frozen=True)
class PackResult:
    margin: float
    before: tuple[GpuPlacement, ...]
    after: tuple[GpuPlacement, ...]  # empty when a deployment could not be placed
    deployments: tuple[Deployment, ...]
    unplaced: dict | None = None  # {"deployment", "reason", "best": [...]} when infeasible
    evaluations: int = 0

    @property
    def feasible(self) -> bool:
        return self.unplaced is None


# ------------------------------------------------------------------------------- fleet parsing


def _num(value, field_name: str, who: str, *, integer=False, positive=True, low=None, high=None):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer()
    if ok and positive and value <= 0:
        ok = False
    if ok and low is not None and value < low:
        ok = False
    if ok and high is not None and value > high:
        ok = False
    if not ok:
        what = "a positive integer" if integer else "a positive number" if positive else "a number"
        if low is not None or high is not None:
            what += f" in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise InputError(field_name, f"{who}expected {what}, got {value!r}")
    return int(value) if integer else float(value)


def _mapping(value, field_name: str, who: str, keys: frozenset) -> dict:
    if not isinstance(value, dict):
        raise InputError(field_name, f"{who}expected a mapping, got {type(value).__name__}")
    bad = sorted(set(value) - keys)
    if bad:
        raise InputError(f"{field_name}.{bad[0]}", f"{who}unknown field; expected one of {', '.join(sorted(keys))}")
    return value


def parse_fleet(entries, calibrations=None) -> tuple[Deployment, ...]:
    """Fleet entries (the YAML's mappings, in order) as :class:`Deployment`; ``calibrations`` maps
    an entry's ``calibration`` string to the ``calibrate.Calibration`` read from it. Errors name
    ``fleet[i].<field>`` and the entry's name."""
    calibrations = calibrations or {}
    if not isinstance(entries, (list, tuple)) or not entries:
        raise InputError("fleet", "expected a non-empty list of deployments")
    out, seen = [], {}
    for i, e in enumerate(entries):
        f = f"fleet[{i}]"
        if not isinstance(e, dict):
            raise InputError(f, f"expected a mapping (a deployment), got {type(e).__name__}")
        name = e.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"{f}.name", f"expected a non-empty string, got {name!r}")
        who = f"deployment {name!r}: "
        _mapping(e, f, who, _ENTRY_KEYS)
        if name in seen:
            raise InputError(f"{f}.name", f"{who}duplicate name (also fleet[{seen[name]}])")
        seen[name] = i
        for key in ("model", "accelerator", "replicas", "workload", "slo"):
            if key not in e:
                raise InputError(f"{f}.{key}", f"{who}missing")
        model = e["model"]
        if isinstance(model, dict):
            _mapping(model, f"{f}.model", who, _SUB_KEYS["model"])
            model_key, model_field = model.get("architecture", model.get("name")), \
                f"{f}.model.{'architecture' if 'architecture' in model else 'name'}"
        else:
            model_key, model_field = model, f"{f}.model"
        try:
            arch = get_arch(model_key)
        except InputError as exc:
            raise InputError(model_field, who + str(exc).split(": ", 1)[-1]) from None
        acc = _mapping(e["accelerator"], f"{f}.accelerator", who, _SUB_KEYS["accelerator"])
        try:
            gpu = get_gpu(acc.get("type"))
        except InputError as exc:
            raise InputError(f"{f}.accelerator.type", who + str(exc).split(": ", 1)[-1]) from None
        eng = _mapping(e.get("engine", {}) or {}, f"{f}.engine", who, _SUB_KEYS["engine"])
        for key, where in (("count", acc), ("tensorParallelSize", eng)):
            if key in where and _num(where[key], f"{f}.{'accelerator' if where is acc else 'engine'}.{key}", who,
                                     integer=True) != 1:
                raise InputError(f"{f}.{'accelerator' if where is acc else 'engine'}.{key}",
                                 f"{who}tensor parallel {where[key]}: kneecap pack places one-GPU engines only "
                                 "(tensor parallel 1) for now")
        cost = (_num(acc["costPerHour"], f"{f}.accelerator.costPerHour", who, positive=False, low=0)
                if "costPerHour" in acc else None)
        replicas = _num(e["replicas"], f"{f}.replicas", who, integer=True)
        cap = _num(eng["maxNumSeqs"], f"{f}.engine.maxNumSeqs", who, integer=True) if "maxNumSeqs" in eng else None
        util = (_num(eng["gpuMemoryUtilization"], f"{f}.engine.gpuMemoryUtilization", who, high=1.0)
                if "gpuMemoryUtilization" in eng else memory.DEFAULT_UTILIZATION)
        wl = _mapping(e["workload"], f"{f}.workload", who, _SUB_KEYS["workload"])
        for key in ("requestsPerSecond", "inputLengthMean", "outputLengthMean"):
            if key not in wl:
                raise InputError(f"{f}.workload.{key}", f"{who}missing")
        rate = _num(wl["requestsPerSecond"], f"{f}.workload.requestsPerSecond", who)
        lengths = []
        for which in ("input", "output"):
            mean = _num(wl[f"{which}LengthMean"], f"{f}.workload.{which}LengthMean", who, low=1)
            cv_key = f"{which}LengthCoefficientOfVariation"
            cv = _num(wl.get(cv_key, 1.0), f"{f}.workload.{cv_key}", who, positive=False, low=0)
            lengths.append(gauss.FixedLength(mean) if cv == 0 else gauss.LogNormalLength(mean, cv))
        slo = _mapping(e["slo"], f"{f}.slo", who, _SUB_KEYS["slo"])
        q = _num(slo.get("quantile", 0.95), f"{f}.slo.quantile", who)
        if q not in QUANTILE_INDEX:
            raise InputError(f"{f}.slo.quantile", f"{who}expected one of 0.5, 0.95, 0.99 (the quantiles the "
                                                  f"co-location model reports), got {q!r}")
        ttft = _num(slo["ttftSeconds"], f"{f}.slo.ttftSeconds", who) if "ttftSeconds" in slo else None
        tpot = _num(slo["tpotSeconds"], f"{f}.slo.tpotSeconds", who) if "tpotSeconds" in slo else None
        if ttft is None and tpot is None:
            raise InputError(f"{f}.slo", f"{who}expected ttftSeconds, tpotSeconds or both")
        cal = None
        if e.get("calibration") is not None:
            key = e["calibration"]
            if not isinstance(key, str) or key not in calibrations:
                raise InputError(f"{f}.calibration", f"{who}expected the path of a calibration JSON, got {key!r}")
            cal = calibrations[key]
        out.append(Deployment(name, arch, gpu, replicas, rate, gauss.Workload(*lengths), q, ttft, tpot, cap, util,
                              cost, cal))
    return tuple(out)


def parse_inventory(entries) -> tuple[GpuOffer, ...]:
    """Inventory entries ``{type, count, costPerHour}`` (costPerHour: the catalog's when absent)."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise InputError("inventory", "expected a non-empty list of {type, count, costPerHour}")
    out, seen = [], set()
    for i, e in enumerate(entries):
        f = f"inventory[{i}]"
        e = _mapping(e, f, "", frozenset({"type", "count", "costPerHour"}))
        try:
            gpu = get_gpu(e.get("type"))
        except InputError as exc:
            raise InputError(f"{f}.type", str(exc).split(": ", 1)[-1]) from None
        if gpu.key in seen:
            raise InputError(f"{f}.type", f"duplicate GPU type {gpu.key}")
        seen.add(gpu.key)
        count = _num(e.get("count"), f"{f}.count", "", integer=True, positive=False, low=0)
        cost = (_num(e["costPerHour"], f"{f}.costPerHour", "", positive=False, low=0) if "costPerHour" in e
                else gpu.cost_per_hour)
        out.append(GpuOffer(gpu, count, cost))
    return tuple(out)


def today_inventory(deployments) -> tuple[GpuOffer, ...]:
    """The GPUs the fleet holds today, at their prices (the default inventory)."""
    counts: dict[str, int] = {}
    price: dict[str, float] = {}
    gpus: dict[str, GPU] = {}
    for d in deployments:
        counts[d.gpu.key] = counts.get(d.gpu.key, 0) + d.replicas
        gpus[d.gpu.key] = d.gpu
        price.setdefault(d.gpu.key, d.cost_per_hour if d.cost_per_hour is not None else d.gpu.cost_per_hour)
    return tuple(GpuOffer(gpus[k], counts[k], price[k]) for k in sorted(counts))


# ------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class _Eval:
    ok: bool
    reason: str
    caps: tuple[int, ...] = ()
    shares: tuple[float, ...] = ()
    tails: tuple = ()  # colocation.EngineTails per member
    worst: float = math.inf  # max over members and metrics of predicted / (SLO·(1 − margin))


def engine_params(d: Deployment, gpu: GPU) -> tuple[SlimParams, str]:
    """(SLIM θ, its form) of d's engines on ``gpu``: its calibration moved there, else the defaults."""
    if d.calibration is None:
        return SlimParams(), "kneecap"
    params, _ = transfer.calibration_on(d.calibration, gpu)
    return params, d.calibration.form


def _ceil_step(x: float) -> int:
    return max(CAP_MIN, int(math.ceil(x / CAP_STEP)) * CAP_STEP)


class EvaluationBudgetExceeded(Exception):
    """``pack`` needed more GAUSS tails than its ``max_evaluations``: no packing was found."""

    def __init__(self, evaluations: int, deployments: int):
        self.evaluations, self.deployments = evaluations, deployments
        super().__init__(f"packing {deployments} deployments needed more than {evaluations} GAUSS evaluations")


class TailsCache:
    """``colocation.colocated_tails`` results by everything they depend on: the GPU, the engines'
    loads in order less their names, the seed and the sample sizes (GAUSS's draws come from the
    seed alone, so equal keys give equal tails). Bounded: the least recently used are dropped
    beyond ``max_entries``. ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = 4096):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InputError("max_entries", f"expected a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def tails(self, loads, gpu: GPU, seed: int, samples: int, replications: int) -> tuple[tuple, bool]:
        """(the engines' tails, named as ``loads``; whether GAUSS ran for them)."""
        key = (gpu, tuple(replace(load, name="") for load in loads), seed, samples, replications)
        try:
            hit = self._entries.get(key)
        except TypeError:  # an unhashable load (e.g. a workload holding arrays): not kept
            key, hit = None, None
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return tuple(replace(t, name=load.name) for t, load in zip(hit, loads)), False
        self.misses += 1
        out = tuple(colocation.colocated_tails(list(loads), gpu, seed=seed, samples=samples,
                                               replications=replications))
        if key is not None:
            self._entries[key] = out
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return out, True


@dataclass
class _Packer:
    """State of one ``pack`` call (its caches), never shared between calls but ``tails_cache``."""

    deployments: tuple[Deployment, ...]
    margin: float
    seed: int
    samples: int
    replications: int
    cache: dict = field(default_factory=dict)
    evaluations: int = 0  # GAUSS tails computed (not read from tails_cache)
    tails_cache: TailsCache = field(default_factory=TailsCache)
    max_evaluations: int | None = None

    def params(self, d: Deployment, gpu: GPU) -> tuple[SlimParams, str]:
        return engine_params(d, gpu)

    def context(self, d: Deployment) -> tuple[float, float]:
        """(mean, std) of a request's full context, prompt + output tokens (fixed draws, seed 0)."""
        key = ("ctx", d.name)
        if key not in self.cache:
            inp, _, out = gauss.sample_workload(d.workload, MOMENT_SAMPLES, np.random.default_rng(0))
            ctx = inp + out
            self.cache[key] = (float(ctx.mean()), float(ctx.std()))
        return self.cache[key]

    def least_share(self, d: Deployment, gpu: GPU, cap: int) -> float:
        """Weights + reserve at ``cap`` + one mean request's KV; inf when that exceeds the bound."""
        key = ("u0", d.name, gpu.key, cap)
        if key not in self.cache:
            _, budget = memory.vllm_default_limits(gpu, True, d.arch.max_position or 2048)
            one = int(math.ceil(self.context(d)[0]))
            try:
                u = memory.utilization_for_kv_tokens(d.arch, gpu, one, cap, budget,
                                                     bounds=(0.0, colocation.MAX_TOTAL_UTILIZATION)).gpu_memory_utilization
            except InputError:
                u = math.inf
            self.cache[key] = u
        return self.cache[key]

    def load(self, d: Deployment, gpu: GPU, share: float, cap: int | None, name: str) -> colocation.EngineLoad:
        params, form = self.params(d, gpu)
        return colocation.EngineLoad(d.arch, d.workload, d.rate_per_replica_rps, share, params=params, form=form,
                                     max_num_seqs=cap, name=name)

    def score(self, d: Deployment, t: colocation.EngineTails) -> float:
        """max over d's SLOs of predicted / (SLO·(1 − margin)): ≤ 1 meets them with the margin."""
        if not t.feasible:
            return math.inf
        k, worst = QUANTILE_INDEX[d.quantile], 0.0
        for slo, tail in ((d.ttft_s, t.ttft_s), (d.tpot_s, t.tpot_s)):
            if slo is not None and tail is not None:
                worst = max(worst, tail[k] / (slo * (1.0 - self.margin)))
        return worst

    def tails(self, loads, gpu: GPU):
        if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
            raise EvaluationBudgetExceeded(self.max_evaluations, len(self.deployments))
        out, ran = self.tails_cache.tails(loads, gpu, self.seed, self.samples, self.replications)
        self.evaluations += ran
        return out

    def evaluate(self, members: tuple[int, ...], gpu: GPU) -> _Eval:
        """Steps 1–4 of the module docstring for the deployments ``members`` (indices) on ``gpu``."""
        members = tuple(sorted(members))
        key = ("set", gpu.key, members)
        if key in self.cache:
            return self.cache[key]
        deps = [self.deployments[i] for i in members]
        limit = colocation.MAX_TOTAL_UTILIZATION
        result = None
        for cap0 in PROVISIONAL_CAPS:  # (1) memory, (2) provisional operating point
            least = np.array([self.least_share(d, gpu, cap0) for d in deps])
            if least.sum() <= limit:
                break
        else:
            result = _Eval(False, f"memory: the least shares sum to {least.sum():.3g} > {limit:g}")
        if result is None:
            prov = least + (limit - least.sum()) / len(deps)
            loads = [self.load(d, gpu, float(np.floor(u * 1000) / 1000), cap0, d.name) for d, u in zip(deps, prov)]
            try:
                point = colocation.colocation_point(loads, gpu)
            except InputError as exc:
                point, why = None, str(exc)
            else:
                why = None if point.infeasible is None else str(point.infeasible)
            if why is not None:
                result = _Eval(False, f"co-location: {why}")
        if result is None:  # (3) sizing
            caps, shares = [], []
            for d, op in zip(deps, point.operating_points):
                r = op.running_seqs
                cap = _ceil_step(r + CAP_TAIL_Z * math.sqrt(r) + 1.0)
                mean, std = self.context(d)
                held = int(math.ceil(r + KV_TAIL_Z * math.sqrt(r) + 1.0))  # the running set's p99
                kv = int(memory.kv_tokens_for_cap(held, mean, std, z=KV_TAIL_Z))
                _, budget = memory.vllm_default_limits(gpu, True, d.arch.max_position or 2048)
                try:
                    u = memory.utilization_for_kv_tokens(d.arch, gpu, kv, cap, budget,
                                                         bounds=(0.0, limit)).gpu_memory_utilization
                except InputError:
                    u = math.inf
                caps.append(cap)
                shares.append(u)
            total = math.fsum(shares)
            if total > limit:
                result = _Eval(False, f"memory: the sized shares sum to {total:.3g} > {limit:g}")
            else:
                if total < memory.DEFAULT_UTILIZATION:  # give the free memory back, in proportion
                    shares = [math.floor(u * memory.DEFAULT_UTILIZATION / total * 1000) / 1000 for u in shares]
                loads = [self.load(d, gpu, u, c, d.name) for d, u, c in zip(deps, shares, caps)]
                tails = self.tails(loads, gpu)  # (4)
                worst = max(self.score(d, t) for d, t in zip(deps, tails))
                note = next((t.note for t in tails if t.note), None)
                result = _Eval(worst <= 1.0, note or ("" if worst <= 1.0 else "SLO: predicted past SLO·(1 − margin)"),
                               tuple(caps), tuple(shares), tails, worst)
        self.cache[key] = result
        return result

    def before(self, idx: int) -> tuple[colocation.EngineTails, float]:
        """Deployment ``idx``'s engine alone on today's GPU at today's flags: (tails, score)."""
        d = self.deployments[idx]
        [t] = self.tails([self.load(d, d.gpu, d.gpu_memory_utilization, d.max_num_seqs, d.name)], d.gpu)
        return t, self.score(d, t)


def _tails_dict(t) -> dict | None:
    return None if t is None else dict(zip(("p50", "p95", "p99"), t))


def pack(deployments, inventory=None, *, margin: float = DEFAULT_MARGIN, seed: int = 0, samples: int = SAMPLES,
         replications: int = REPLICATIONS, tails_cache: TailsCache | None = None,
         max_evaluations: int | None = None) -> PackResult:
    """Today's placement and the packing the module docstring describes (``inventory``: the GPUs
    the packing may use, default :func:`today_inventory`). ``tails_cache``: GAUSS tails to reuse
    and add to (None: a fresh one for this call). ``max_evaluations``: the most GAUSS tails
    (``colocation.colocated_tails`` runs, reuses not counted) to spend; one more raises
    :class:`EvaluationBudgetExceeded` (None: no bound). The search evaluates O(N²) engine sets
    for N deployments in the worst case, so a bound is how a caller with a CPU budget stops it."""
    deployments = tuple(deployments)
    if not deployments or not all(isinstance(d, Deployment) for d in deployments):
        raise InputError("deployments", "expected a non-empty list of Deployment")
    if len({d.name for d in deployments}) != len(deployments):
        raise InputError("deployments", "duplicate deployment names")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
        raise InputError("margin", f"expected a fraction in [0, 1), got {margin!r}")
    inventory = today_inventory(deployments) if inventory is None else tuple(inventory)
    if not inventory or not all(isinstance(o, GpuOffer) for o in inventory):
        raise InputError("inventory", "expected a non-empty list of GpuOffer")
    price = {o.gpu.key: o.cost_per_hour for o in inventory}
    if tails_cache is not None and not isinstance(tails_cache, TailsCache):
        raise InputError("tails_cache", f"expected a TailsCache, got {type(tails_cache).__name__}")
    if max_evaluations is not None and (isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int)
                                        or max_evaluations < 1):
        raise InputError("max_evaluations", f"expected a positive integer or None, got {max_evaluations!r}")
    pk = _Packer(deployments, float(margin), int(seed), int(samples), int(replications),
                 tails_cache=TailsCache() if tails_cache is None else tails_cache, max_evaluations=max_evaluations)

    # today: one GPU per replica, at today's flags
    before, size = [], []
    for i, d in enumerate(deployments):
        t, s = pk.before(i)
        today_price = d.cost_per_hour if d.cost_per_hour is not None else price.get(d.gpu.key, d.gpu.cost_per_hour)
        for r in range(d.replicas):
            before.append(GpuPlacement(d.gpu.key, today_price, (EngineResult(
                d.name, r, d.max_num_seqs, d.gpu_memory_utilization, t.ttft_s, t.tpot_s, s * (1.0 - margin) <= 1.0,
                t.gpu_share, t.interference_s, t.note),)))
        mem = pk.least_share(d, d.gpu, CAP_MIN)
        size.append((max(t.gpu_share or 1.0, mem / colocation.MAX_TOTAL_UTILIZATION), today_price))
    weight = [size[i][1] for i in range(len(deployments))]

    # engines, largest first; a unit is (deployment index, replica)
    order = sorted(((i, r) for i, d in enumerate(deployments) for r in range(d.replicas)),
                   key=lambda u: (-size[u[0]][0], deployments[u[0]].name, u[1]))
    left = {o.gpu.key: o.count for o in inventory}
    offers = sorted(inventory, key=lambda o: (o.cost_per_hour, o.gpu.key))
    bins: list[tuple[str, list[tuple[int, int]]]] = []
    unplaced = list(order)
    while unplaced:
        seed_unit, rest = unplaced[0], unplaced[1:]
        best = None
        for o in offers:
            if left[o.gpu.key] <= 0 or not pk.evaluate((seed_unit[0],), o.gpu).ok:
                continue
            members = [seed_unit]
            for u in rest:
                if u[0] in {m[0] for m in members}:
                    continue
                if pk.evaluate(tuple(m[0] for m in members) + (u[0],), o.gpu).ok:
                    members.append(u)
            covered = math.fsum(weight[m[0]] for m in members)
            ratio = o.cost_per_hour / covered if covered > 0 else math.inf
            cand = (ratio, o.cost_per_hour, o.gpu.key)
            if best is None or cand < best[0]:
                best = (cand, o, members)
        if best is None:
            d = deployments[seed_unit[0]]
            tried = []
            for o in offers:
                ev = pk.evaluate((seed_unit[0],), o.gpu)
                t = ev.tails[0] if ev.tails else None
                k = QUANTILE_INDEX[d.quantile]
                tried.append({"gpu": o.gpu.key, "units_left": left[o.gpu.key], "fits": ev.ok,
                              "reason": ev.reason or None, "score": None if not math.isfinite(ev.worst) else ev.worst,
                              "ttft_s": None if t is None or t.ttft_s is None else t.ttft_s[k],
                              "tpot_s": None if t is None or t.tpot_s is None else t.tpot_s[k]})
            tried.sort(key=lambda x: (x["score"] is None, x["score"] or 0.0, x["gpu"]))
            exhausted = any(x["fits"] for x in tried)
            reason = ("every GPU type its engine alone fits is used up by the deployments placed before it"
                      if exhausted else "its engine alone meets its SLOs (with the margin) on no GPU type of "
                                        "the inventory")
            return PackResult(float(margin), tuple(before), (), deployments,
                              {"deployment": d.name, "replica": seed_unit[1], "reason": reason, "best": tried},
                              pk.evaluations)
        _, o, members = best
        left[o.gpu.key] -= 1
        bins.append((o.gpu.key, members))
        placed = set(members)
        unplaced = [u for u in unplaced if u not in placed]

    # last pass: each GPU to the cheapest type with a unit left on which its whole set passes
    by_key = {o.gpu.key: o for o in inventory}
    for b, (key, members) in enumerate(bins):
        for o in offers:
            if o.cost_per_hour >= by_key[key].cost_per_hour:
                break
            if left[o.gpu.key] > 0 and pk.evaluate(tuple(m[0] for m in members), o.gpu).ok:
                left[o.gpu.key] -= 1
                left[key] += 1
                bins[b] = (o.gpu.key, members)
                break

    after = []
    for key, members in bins:
        members = sorted(members)
        ev = pk.evaluate(tuple(m[0] for m in members), by_key[key].gpu)
        engines = []
        for (i, r), cap, share, t in zip(members, ev.caps, ev.shares, ev.tails):
            d = deployments[i]
            engines.append(EngineResult(d.name, r, cap, share, t.ttft_s, t.tpot_s, pk.score(d, t) <= 1.0,
                                        t.gpu_share, t.interference_s, t.note))
        after.append(GpuPlacement(key, by_key[key].cost_per_hour, tuple(engines)))
    after.sort(key=lambda g: (-g.cost_per_hour, g.gpu, [(e.deployment, e.replica) for e in g.engines]))
    return PackResult(float(margin), tuple(before), tuple(after), deployments, None, pk.evaluations)


def _totals(placements) -> dict:
    by_type: dict[str, int] = {}
    for g in placements:
        by_type[g.gpu] = by_type.get(g.gpu, 0) + 1
    return {"gpus": len(placements), "cost_per_hour": math.fsum(g.cost_per_hour for g in placements),
            "by_type": dict(sorted(by_type.items()))}


def _met(d: Deployment, ttft, tpot) -> bool:
    """Whether the worst replica's tails meet d's SLOs (no margin); no TTFT: infeasible, not met.
    No TPOT with a TTFT: one output token, nothing to miss."""
    k = QUANTILE_INDEX[d.quantile]
    if ttft is None:
        return False
    return all(tail is None or tail[k] <= slo for slo, tail in ((d.ttft_s, ttft), (d.tpot_s, tpot))
               if slo is not None)


def _worst(engines, attr):
    vals = [getattr(e, attr) for e in engines]
    if any(v is None for v in vals) or not vals:
        return None
    return tuple(max(v[j] for v in vals) for j in range(3))


def result_dict(res: PackResult) -> dict:
    """The JSON object of ``kneecap pack`` (snake_case, seconds, $/h)."""
    out = {"feasible": res.feasible, "margin": res.margin, "before": _totals(res.before),
           "evaluations": res.evaluations}
    per = []
    for d in res.deployments:
        b_eng = [e for g in res.before for e in g.engines if e.deployment == d.name]
        entry = {"name": d.name, "model": d.arch.key, "replicas": d.replicas, "rate_rps": d.rate_rps,
                 "slo": {"quantile": d.quantile, "ttft_s": d.ttft_s, "tpot_s": d.tpot_s},
                 "before": {"gpu": d.gpu.key, "ttft_s": _tails_dict(b_eng[0].ttft_s),
                            "tpot_s": _tails_dict(b_eng[0].tpot_s),
                            "slo_met": _met(d, b_eng[0].ttft_s, b_eng[0].tpot_s), "note": b_eng[0].note}}
        if res.feasible:
            a_eng = [(gi, e) for gi, g in enumerate(res.after) for e in g.engines if e.deployment == d.name]
            engines = [e for _, e in a_eng]
            ttft, tpot = _worst(engines, "ttft_s"), _worst(engines, "tpot_s")
            entry["after"] = {"gpus": [res.after[gi].gpu for gi, _ in a_eng],
                              "gpu_indices": [gi for gi, _ in a_eng],
                              "ttft_s": _tails_dict(ttft), "tpot_s": _tails_dict(tpot),
                              "slo_met": _met(d, ttft, tpot), "slo_met_with_margin": all(e.slo_met for e in engines)}
        per.append(entry)
    out["deployments"] = per
    if res.feasible:
        after = _totals(res.after)
        out["after"] = after
        out["gpus_returned"] = out["before"]["gpus"] - after["gpus"]
        out["savings_per_hour"] = out["before"]["cost_per_hour"] - after["cost_per_hour"]
        out["all_slo_met"] = all(p["after"]["slo_met"] for p in per)
        out["placement"] = [{"index": gi, "gpu": g.gpu, "cost_per_hour": g.cost_per_hour,
                             "memory_share": g.memory_share,
                             "engines": [{"deployment": e.deployment, "replica": e.replica,
                                          "max_num_seqs": e.max_num_seqs, "gpu_memory_utilization": e.gpu_memory_utilization,
                                          "gpu_share": e.gpu_share, "interference_s": e.interference_s,
                                          "ttft_s": _tails_dict(e.ttft_s), "tpot_s": _tails_dict(e.tpot_s)}
                                         for e in g.engines]} for gi, g in enumerate(res.after)]
    else:
        out["unplaced"] = res.unplaced
        out["message"] = (f"deployment {res.unplaced['deployment']!r} cannot be placed: {res.unplaced['reason']}")
    return out


# ------------------------------------------------------------------------------- verification
