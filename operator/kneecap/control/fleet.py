"""The fleet advice (issue 24, item 3): what packing the LLMDeployments this operator manages onto
fewer GPUs would return, per deployment in ``status.placement`` and fleet-wide in the
``kneecap_fleet_*`` metrics, with a ``FleetRecommendation`` Event when the advice changes.

Advice first: the packing (``kneecap.model.packing.pack``, as ``kneecap pack`` runs it) is always
computed and reported; it is enforced only for a deployment whose ``spec.placement.mechanism``
names a sharing mechanism the cluster offers (NVIDIA device-plugin time-slicing or MPS, or a DRA
ResourceClaim) and whose advice puts it on a GPU shared with another deployment. Enforced, its
pods request ``spec.placement.resourceName`` (the device plugin's shared resource) instead of
whole GPUs, at the advised memory share and at most 0.95 / ``spec.placement.replicasPerGpu`` (any
that many shared pods may land on one GPU); with DRA they reference the ResourceClaim
``spec.placement.resourceClaimName`` at the advised share, and only when the deployments naming
that claim (one replica each) are exactly those the advice puts on one GPU; see
:func:`effective_spec`. Without ``spec.placement`` (or
``mechanism: none``) nothing is co-located: the pods request whole GPUs as before.

Inputs of a deployment (:func:`member`): its spec (model, GPU type and price, SLOs), its last
observed window (``status.workload``; before one, ``spec.placement.workload``), its applied
settings and replicas (``status.applied``) and its calibration (``status.calibration``). Rates
and lengths are rounded to two significant digits, so the packing is recomputed (once for the
whole fleet: :class:`FleetAdvisor`) only when the fleet's inputs move by more than that, and the
Event fires only when the placement itself changes (GPU type, partners, memory share, cap, the
fleet's GPUs and $/h), not when a prediction moves a little.

The GPUs the packing may use: those the fleet holds today (each deployment's ``spec.accelerator``),
or the operator's inventory (``kneecap run --fleet-inventory``, as ``kneecap pack --gpus``), on
which the advice may put a deployment on a smaller or cheaper GPU type than its own (even a lone
deployment). A type change is advice only: the operator never changes ``spec.accelerator`` or the
pods' node selection; the status and the Event name the type, the metrics count its $/h.

Pure except :class:`FleetAdvisor` (a process-wide cache with a lock; the packing runs in a worker
thread) and :func:`advise_resource` (reads nothing, writes the status, the metrics and the Event).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from kneecap.control import status as status_helpers, status_codec
from kneecap.control.spec import LLMDeploymentSpec, parse_spec
from kneecap.errors import InputError
from kneecap.model import colocation, gauss, packing

EVENT_REASON = "FleetRecommendation"
WRITE_FAILED_REASON = "FleetAdviceNotWritten"
SAMPLES = 20_000  # GAUSS requests per engine and check (kneecap pack's default is 50 000)
# a packing reruns for workload drift alone only once the CPU its last run took is this share of
# the time since it started (a change of the fleet's members, specs or replicas reruns it at once)
CPU_SHARE = 0.05
MAX_EVALUATIONS = 200  # GAUSS tails one packing may spend (~1 CPU-s each); beyond: no recommendation
SIGNIFICANT_DIGITS = 2  # rates and lengths are rounded to this many digits before packing
# the status keys a deployment's advice reads (the index keeps only these of the status)
STATUS_KEYS = ("workload", "applied", "calibration", "placement")
_QUANTILES = tuple(sorted(packing.QUANTILE_INDEX))


@dataclass(frozen=True)
class Member:
    """One LLMDeployment as the fleet advice sees it: its packing entry, or why it has none."""

    key: str  # namespace/name
    deployment: packing.Deployment | None
    excluded: str | None = None  # why it is not in the packing
    mechanism: str = "none"  # spec.placement.mechanism
    replicas_per_gpu: int = 2
    claim: str | None = None  # spec.placement.resourceClaimName (dra)
    workload_source: str | None = None  # "observed" | "declared"
    slo_quantile: float | None = None  # spec.slo.quantile (the packing checks the one at or above it)


def index_entry(body: Mapping) -> dict:
    """What the operator's index keeps of an LLMDeployment for the advice: a copy of its spec,
    names and the status keys the advice reads (not the observation ring)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    return {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid", "generation", "deletionTimestamp")},
            "spec": copy.deepcopy(dict(body.get("spec") or {})),
            "status": {k: copy.deepcopy(status[k]) for k in STATUS_KEYS if k in status}}


def _sig(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def _lengths(mean: float, cv: float) -> gauss.FixedLength | gauss.LogNormalLength:
    mean, cv = max(_sig(mean), 1.0), _sig(cv)
    return gauss.FixedLength(mean) if cv == 0 else gauss.LogNormalLength(mean, cv)


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _workload(status: Mapping, spec: LLMDeploymentSpec) -> tuple[float, gauss.Workload, str] | None:
    """(requests/s of the whole deployment, lengths, source): the last observed window when it saw
    traffic, else spec.placement.workload; None: neither."""
    w = status.get("workload") or {}
    if w.get("pool", "server") == "server" and (rate := _number(w.get("requestsPerSecond"))) and rate > 0:
        vals = [_number(w.get(k)) for k in ("inputLengthMean", "inputLengthCoefficientOfVariation",
                                            "outputLengthMean", "outputLengthCoefficientOfVariation")]
        if all(v is not None and v >= 0 for v in vals):
            return _sig(rate), gauss.Workload(_lengths(vals[0], vals[1]), _lengths(vals[2], vals[3])), "observed"
    d = spec.placement.workload
    if d is None:
        return None
    return (_sig(d.requests_per_second), gauss.Workload(_lengths(d.input_length_mean, d.input_length_cv),
                                                        _lengths(d.output_length_mean, d.output_length_cv)),
            "declared")


def member(entry: Mapping, parse=parse_spec) -> Member:
    """The packing entry of one LLMDeployment (an :func:`index_entry` or a whole object);
    ``parse``: :func:`~kneecap.control.spec.parse_spec`, or a cache of it."""
    meta = entry.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("deletionTimestamp"):
        return Member(key, None, "being deleted")
    try:
        spec = parse(entry.get("spec"))
    except InputError as exc:
        if exc.field.startswith("spec.model.configMapRef"):
            return Member(key, None, "its model's shape is in a ConfigMap, which the fleet advice does not read")
        return Member(key, None, f"invalid spec ({exc.field})")
    out = dict(mechanism=spec.placement.mechanism, replicas_per_gpu=spec.placement.replicas_per_gpu,
               claim=spec.placement.resource_claim_name, slo_quantile=spec.slo.quantile)

    def excluded(why: str) -> Member:
        return Member(key, None, why, **out)

    if spec.adopted:
        return excluded("it tunes existing Deployments (spec.targetRef), which kneecap does not place")
    if spec.disaggregated:
        return excluded("disaggregated pools are not packed (one-GPU colocated engines only)")
    if spec.gpus_per_replica != 1 or spec.tensor_parallel_size != 1:
        return excluded(f"{spec.gpus_per_replica} GPUs per replica: the packing places one-GPU engines only")
    if not spec.accelerator.resource_name:
        return excluded("spec.accelerator.resourceName is empty: its engines hold no GPU")
    if spec.slo.ttft_s is None and spec.slo.tpot_s is None:
        return excluded("no TTFT or TPOT SLO (spec.slo) to keep")
    status = entry.get("status") or {}
    load = _workload(status, spec)
    if load is None:
        return excluded("no workload observed yet (status.workload) and none declared (spec.placement.workload)")
    rate, workload, source = load
    applied = status.get("applied") or {}
    replicas = int(_number(applied.get("replicas")) or spec.topology.replicas.min)
    if replicas < 1:
        return excluded("no replica runs")
    cap = _number(applied.get("maxNumSeqs")) or spec.engine.max_num_seqs
    util = _number(applied.get("gpuMemoryUtilization")) or spec.engine.gpu_memory_utilization
    quantile = next((q for q in _QUANTILES if q >= spec.slo.quantile - 1e-12), _QUANTILES[-1])
    calibration = status_codec.calibration_from_status(status.get("calibration"))
    return Member(key, packing.Deployment(
        key, spec.model.architecture, spec.accelerator.gpu, replicas, rate, workload, quantile, spec.slo.ttft_s,
        spec.slo.tpot_s, int(cap), float(util), spec.accelerator.cost_per_hour, calibration),
        workload_source=source, **out)


DRIFT_KEYS = ("rate", "workload", "cal")  # the fingerprint's fields that move with the traffic


def fingerprint(members, drift: bool = True) -> str:
    """What the packing of ``members`` depends on, as one string (equal: the same advice);
    ``drift`` False leaves out what moves with the traffic (:data:`DRIFT_KEYS`)."""
    rows = []
    for m in sorted(members, key=lambda m: m.key):
        d = m.deployment
        row = {"key": m.key, "excluded": m.excluded, "mechanism": m.mechanism, "perGpu": m.replicas_per_gpu,
               "claim": m.claim}
        if d is not None:
            cal = d.calibration
            row.update(arch=d.arch.key, gpu=d.gpu.key, replicas=d.replicas, rate=d.rate_rps,
                       workload=repr(d.workload), q=d.quantile, ttft=d.ttft_s, tpot=d.tpot_s, cap=d.max_num_seqs,
                       util=d.gpu_memory_utilization, cost=d.cost_per_hour,
                       cal=None if cal is None else [cal.created, sorted(cal.params.items())])
        rows.append(row if drift else {k: v for k, v in row.items() if k not in DRIFT_KEYS})
    return json.dumps(rows, sort_keys=True, default=str)


@dataclass(frozen=True)
class Advice:
    """The fleet's advice: the packing's result (None: fewer than two deployments to pack) and
    the fleet totals."""

    fingerprint: str
    members: tuple[Member, ...]
    result: dict | None  # packing.result_dict of the packing
    gpus_current: int
    gpus_recommended: int
    cost_current_per_hour: float
    cost_recommended_per_hour: float
    message: str = ""  # why there is no recommendation (result None or infeasible)

    @property
    def packed(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.deployment is not None)

    def totals(self) -> dict:
        return {"deployments": len(self.packed), "gpusCurrent": self.gpus_current,
                "gpusRecommended": self.gpus_recommended,
                "costPerHourCurrent": round(self.cost_current_per_hour, 4),
                "costPerHourRecommended": round(self.cost_recommended_per_hour, 4)}


def compute(members, *, margin: float = packing.DEFAULT_MARGIN, samples: int = SAMPLES, seed: int = 0,
            inventory=None, tails_cache: packing.TailsCache | None = None,
            max_evaluations: int | None = None) -> Advice:
    """Pack the members that have an entry (two or more; else no recommendation) onto
    ``inventory`` (``packing.GpuOffer`` tuples; None: the GPU types they hold today). With an
    inventory one member is packed too: it may move to a cheaper type. ``tails_cache`` and
    ``max_evaluations``: as :func:`kneecap.model.packing.pack` takes them; a packing past the
    bound is no recommendation, said why."""
    members = tuple(sorted(members, key=lambda m: m.key))
    fp = fingerprint(members)
    deps = tuple(m.deployment for m in members if m.deployment is not None)
    gpus = sum(d.replicas for d in deps)
    cost = math.fsum(d.replicas * d.cost_per_hour for d in deps)
    if len(deps) < (1 if inventory is not None else 2):
        return Advice(fp, members, None, gpus, gpus, cost, cost,
                      f"{len(deps)} deployment{'' if len(deps) == 1 else 's'} with a workload: nothing to pack")
    try:
        res = packing.result_dict(packing.pack(deps, inventory, margin=margin, seed=seed, samples=samples,
                                               tails_cache=tails_cache, max_evaluations=max_evaluations))
    except InputError as exc:  # a model or GPU the packing cannot evaluate: no recommendation, said why
        return Advice(fp, members, None, gpus, gpus, cost, cost, f"the packing failed: {exc}")
    except packing.EvaluationBudgetExceeded as exc:
        return Advice(fp, members, None, gpus, gpus, cost, cost,
                      f"{exc} (kneecap run --fleet-max-evaluations): no recommendation; kneecap pack has no bound")
    if not res["feasible"]:
        return Advice(fp, members, res, gpus, gpus, cost, cost, res["message"])
    return Advice(fp, members, res, res["before"]["gpus"], res["after"]["gpus"], res["before"]["cost_per_hour"],
                  res["after"]["cost_per_hour"])


def _round(x, digits: int = 4):
    return None if x is None else float(f"{x:.{digits}g}")


def status_block(advice: Advice, key: str) -> dict:
    """``status.placement`` of the deployment ``key`` (without ``changedTime``)."""
    m = next((m for m in advice.members if m.key == key), None)
    block: dict = {"fleet": advice.totals()}
    if m is None or m.deployment is None:
        block.update(included=False, message=f"not in the fleet advice: {m.excluded if m else 'not seen yet'}",
                     mechanism=m.mechanism if m else "none", enforced=False)
        return status_helpers.compact(block)
    block.update(included=True, mechanism=m.mechanism, workloadSource=m.workload_source)
    res = advice.result
    if res is None or not res["feasible"]:
        block.update(shared=False, enforced=False, message=advice.message)
        return status_helpers.compact(block)
    engines = [(g, e) for g in res["placement"] for e in g["engines"] if e["deployment"] == key]
    partners = sorted({o["deployment"] for g, _ in engines for o in g["engines"] if o["deployment"] != key})
    per = next(p for p in res["deployments"] if p["name"] == key)
    k = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[m.deployment.quantile]
    after = per["after"]
    share = min(e["gpu_memory_utilization"] for _, e in engines)
    shared = bool(partners)
    enforced, why_not = shared and m.mechanism != "none", ""
    if m.mechanism == "dra":
        # the pods naming one claim share its one device: enforced only when the deployments that
        # name it (one replica each) are exactly those the advice puts on this deployment's GPU
        group = {o.key for o in advice.members if o.mechanism == "dra" and o.claim == m.claim
                 and o.key.split("/", 1)[0] == key.split("/", 1)[0]}
        on_gpu = {o["deployment"] for g, _ in engines for o in g["engines"]}
        if shared and (m.deployment.replicas != 1 or group != on_gpu):
            enforced = False
            why_not = (f"not enforced: ResourceClaim {m.claim} would put {', '.join(sorted(group))} on one GPU, "
                       f"the advice puts {', '.join(sorted(on_gpu))} on it" if m.deployment.replicas == 1 else
                       f"not enforced: {m.deployment.replicas} replicas cannot share one ResourceClaim's device")
        enforced_share = share
    else:
        enforced_share = min(share, colocation.MAX_TOTAL_UTILIZATION / m.replicas_per_gpu)
    gpu_types = sorted({g["gpu"] for g, _ in engines})
    if enforced and gpu_types != [m.deployment.gpu.key]:
        # the share and the partners are the advice's for another GPU type; its pods run on its own
        # (spec.accelerator), which the operator never changes: nothing is enforced
        enforced, why_not = False, "not enforced: the advice is for another GPU type than its pods run on"
    block.update(
        gpu=gpu_types[0] if len(gpu_types) == 1 else ",".join(gpu_types), gpus=len(engines), shared=shared,
        sharedWith=partners, gpuMemoryUtilization=_round(share, 3),
        maxNumSeqs=max(e["max_num_seqs"] for _, e in engines if e["max_num_seqs"] is not None),
        predicted={"quantile": m.deployment.quantile,
                   "ttftSeconds": _round((after["ttft_s"] or {}).get(k)),
                   "tpotSeconds": _round((after["tpot_s"] or {}).get(k))},
        sloMet=bool(after["slo_met_with_margin"]), enforced=enforced,
        enforcedGpuMemoryUtilization=_round(math.floor(enforced_share * 1000) / 1000, 3) if enforced else None,
        resourceClaimName=m.claim if m.mechanism == "dra" else None,
        message=_message(m, shared, partners, share, enforced, why_not) + _moved(m, gpu_types))
    return status_helpers.compact(block)


def _message(m: Member, shared: bool, partners: list[str], share: float, enforced: bool, why_not: str = "") -> str:
    if not shared:
        return "its engines keep a GPU each in the packed fleet"
    how = (why_not or "advice only: spec.placement names no sharing mechanism, nothing is co-located") \
        if not enforced else (f"enforced: its pods reference ResourceClaim {m.claim}" if m.mechanism == "dra"
                              else f"enforced: its pods request {m.mechanism} slices")
    return f"would share a GPU with {', '.join(partners)} at memory share {share:.3f} ({how})"


def _moved(m: Member, gpu_types: list[str]) -> str:
    """What the message adds when the advice puts the deployment on another GPU type than its own."""
    today = m.deployment.gpu.key
    if gpu_types == [today]:
        return ""
    return (f"; on {', '.join(gpu_types)} instead of its {today} (the GPU type is advice only: the operator "
            f"never changes spec.accelerator)")


# what a change of which posts an Event (predictions moving a little do not)
_DISCRETE = ("included", "gpu", "gpus", "shared", "sharedWith", "maxNumSeqs", "enforced", "mechanism",
             "resourceClaimName")


def placement_changed(old: Mapping | None, new: Mapping) -> bool:
    """Whether the advice's placement changed: GPU type, partners, cap, enforcement, memory share
    (to 0.01) or the fleet's GPUs and $/h (to the cent)."""
    old = old or {}
    if any(old.get(k) != new.get(k) for k in _DISCRETE):
        return True
    def share(b: Mapping) -> float | None:
        return None if b.get("gpuMemoryUtilization") is None else round(b["gpuMemoryUtilization"], 2)

    if share(old) != share(new):
        return True
    fo, fn = old.get("fleet") or {}, new.get("fleet") or {}
    return any(fo.get(k) != fn.get(k) for k in ("deployments", "gpusCurrent", "gpusRecommended")) or any(
        round(fo.get(k) or 0.0, 2) != round(fn.get(k) or 0.0, 2) for k in ("costPerHourCurrent",
                                                                           "costPerHourRecommended"))


def event_message(block: Mapping) -> str:
    f = block.get("fleet") or {}
    head = (f"fleet of {f.get('deployments', 0)}: {f.get('gpusCurrent')} -> {f.get('gpusRecommended')} GPUs, "
            f"${f.get('costPerHourCurrent', 0):.2f}/h -> ${f.get('costPerHourRecommended', 0):.2f}/h")
    return f"{head}; {block.get('message', '')}"[:900]


def effective_spec(body: Mapping, spec: LLMDeploymentSpec) -> LLMDeploymentSpec:
    """``spec`` with ``shared_gpu_share`` set when this deployment's engines are to share a GPU:
    spec.placement names a sharing mechanism and status.placement (the fleet advice) enforces a
    share. Otherwise ``spec`` unchanged: whole GPUs, nothing co-located."""
    if not spec.placement.shares or spec.engine is None:
        return spec if spec.shared_gpu_share is None else dataclasses.replace(spec, shared_gpu_share=None)
    block = (body.get("status") or {}).get("placement") or {}
    share = _number(block.get("enforcedGpuMemoryUtilization"))
    if not (block.get("enforced") is True and block.get("mechanism") == spec.placement.mechanism
            and block.get("resourceClaimName") == spec.placement.resource_claim_name
            and share is not None and 0.0 < share < 1.0):
        share = None
    return spec if spec.shared_gpu_share == share else dataclasses.replace(spec, shared_gpu_share=share)


class FleetAdvisor:
    """The operator's one fleet advice, recomputed (in a worker thread, under a lock: once, whichever
    resource's timer asks first) only when the fleet's inputs (:func:`fingerprint`) change.
    ``inventory``: the GPUs the packing may use (``kneecap run --fleet-inventory``), None: today's.
    ``recheck_s``: how long an advice is served without looking at the fleet again (every
    resource's timer asks within one fleet period: without it each of N timers would rebuild all
    N members, N² spec parses a period). A member is rebuilt only when what it reads changed
    (uid, spec, the status keys it reads).

    A packing costs O(N²) GAUSS runs for N deployments, and every window moves the observed rates,
    so its CPU is bounded twice: a change of the fingerprint less its drift (members, specs, flags, replicas)
    reruns it at once, but workload drift alone only once the worker thread's CPU for the last
    run is ``cpu_share`` of the time since it began (on average at most that share of a core);
    and one run spends at most ``max_evaluations`` GAUSS tails (beyond: no recommendation, said
    why). GAUSS tails are kept across runs (:class:`kneecap.model.packing.TailsCache`), so a rerun
    simulates only the engine sets whose inputs changed."""

    def __init__(self, *, margin: float = packing.DEFAULT_MARGIN, samples: int = SAMPLES, seed: int = 0,
                 inventory=None, recheck_s: float = 0.0, cpu_share: float = CPU_SHARE,
                 max_evaluations: int | None = MAX_EVALUATIONS):
        if isinstance(cpu_share, bool) or not isinstance(cpu_share, (int, float)) or not 0.0 < cpu_share <= 1.0:
            raise InputError("cpu_share", f"expected a fraction in (0, 1], got {cpu_share!r}")
        self.margin, self.samples, self.seed = margin, samples, seed
        self.inventory = None if inventory is None else tuple(inventory)
        self.recheck_s = recheck_s
        self.cpu_share, self.max_evaluations = float(cpu_share), max_evaluations
        self.tails_cache = packing.TailsCache()
        self.advice: Advice | None = None
        self.computations = 0
        self.cpu_s = 0.0  # the worker thread's CPU over every run
        self.deferred = 0  # reruns for drift put off by the CPU budget
        self.checked_s: float | None = None
        self._structure: str | None = None
        self._next_s: float | None = None  # no rerun for drift alone before this time
        self._members: dict[str, tuple[str, Member]] = {}
        # each member's spec as parsed (or the InputError it raised), by the spec's JSON: the
        # status keys the advice reads move every window, the spec seldom, and its schema and
        # CEL check is most of a member's cost
        self._specs: dict[str, tuple[str, LLMDeploymentSpec | InputError]] = {}
        self._lock: asyncio.Lock | None = None

    def _member(self, entry) -> tuple[str | None, Member]:
        """(the object's stamp, its Member): rebuilt only when the stamp moved."""
        if isinstance(entry, Member):
            return None, entry
        meta = entry.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        spec_stamp = json.dumps(entry.get("spec"), sort_keys=True, default=str)
        stamp = json.dumps([meta.get("uid"), meta.get("deletionTimestamp"), spec_stamp,
                            {k: v for k, v in (entry.get("status") or {}).items() if k in STATUS_KEYS}],
                           sort_keys=True, default=str)
        hit = self._members.get(key)
        if hit is not None and hit[0] == stamp:
            return stamp, hit[1]

        def parse(raw):
            parsed = self._specs.get(key)
            if parsed is None or parsed[0] != spec_stamp:
                try:
                    parsed = spec_stamp, parse_spec(raw)
                except InputError as exc:
                    parsed = spec_stamp, exc
                self._specs[key] = parsed
            if isinstance(parsed[1], InputError):
                raise parsed[1].with_traceback(None)  # (the kept error gathers no frames across raises)
            return parsed[1]

        return stamp, member(entry, parse)

    async def advise(self, entries, now_s: float | None = None) -> Advice:
        """The advice for ``entries`` (:func:`index_entry` dicts, whole objects or Members),
        served from the last one while it is younger than ``recheck_s`` at ``now_s``."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if (self.advice is not None and now_s is not None and self.checked_s is not None
                    and 0.0 <= now_s - self.checked_s < self.recheck_s):
                return self.advice
            members, seen = [], {}
            for entry in entries:
                stamp, m = self._member(entry)
                members.append(m)
                if stamp is not None:
                    seen[m.key] = (stamp, m)
            self._members = seen  # forget what left the fleet
            self._specs = {k: v for k, v in self._specs.items() if k in seen}
            members = tuple(members)
            fp = fingerprint(members)
            if self.advice is None or self.advice.fingerprint != fp:
                shape = fingerprint(members, drift=False)
                if (shape == self._structure and now_s is not None and self._next_s is not None
                        and now_s < self._next_s):
                    self.deferred += 1  # drift alone, within the CPU budget's wait: the advice stands
                else:
                    self.advice, cpu_s = await asyncio.to_thread(self._compute, members)
                    self._structure = shape
                    self.computations += 1
                    self.cpu_s += cpu_s
                    self._next_s = None if now_s is None else now_s + cpu_s / self.cpu_share
            self.checked_s = now_s
        return self.advice

    def _compute(self, members) -> tuple[Advice, float]:
        """(the advice, this thread's CPU seconds for it): run in the worker thread."""
        start = time.thread_time()
        advice = compute(members, margin=self.margin, samples=self.samples, seed=self.seed, inventory=self.inventory,
                         tails_cache=self.tails_cache, max_evaluations=self.max_evaluations)
        return advice, time.thread_time() - start


async def advise_resource(operator, body: Mapping, entries, advisor: FleetAdvisor, written: MutableMapping,
                          sink, stopping=lambda: False) -> dict | None:
    """One LLMDeployment's fleet timer: the fleet advice over ``entries`` (the index's
    :func:`index_entry` of every LLMDeployment the operator watches), the fleet metrics, and this
    deployment's ``status.placement`` written when it differs from the stored one (a
    ``FleetRecommendation`` Event when the placement changed). ``written`` (the resource's memo)
    keeps the last block written, so a timer that runs before the watch brings the write back
    does not write or post it again. A failed write is counted in kneecap_api_errors and posted as
    a Warning Event; it is retried on the next run. Returns the block written, None when none
    (also when ``stopping()`` turned True while the advice was computed: kopf stopped the timer)."""
    from kneecap.control import loop
    from kneecap.control.kube import ApiFailure
    from kneecap.control.lifecycle import reconcile_slot, status_path

    advice = await advisor.advise(entries, operator.now())
    if stopping():
        return None
    operator.metrics.set_fleet(advice.gpus_current, advice.gpus_recommended, advice.cost_current_per_hour,
                               advice.cost_recommended_per_hour, len(advice.packed))
    meta = body["metadata"]
    block = status_block(advice, f"{meta['namespace']}/{meta['name']}")
    stored = (body.get("status") or {}).get("placement") or {}
    last = written.get("placement") or stored
    strip = lambda b: {k: v for k, v in b.items() if k != "changedTime"}  # noqa: E731
    if strip(last) == block or strip(stored) == block:
        return None
    changed = placement_changed(last, block)
    block["changedTime"] = status_helpers.iso(operator.now()) if changed or not last.get("changedTime") \
        else last["changedTime"]
    try:
        # a merge patch: the keys the new block drops are nulled
        patch = {**{k: None for k in stored if k not in block}, **block}
        async with reconcile_slot(operator):  # hundreds of fleet timers fire together
            await operator.kube.patch_status(status_path(dict(body)), {"placement": patch})
    except loop.API_EXCEPTIONS as exc:
        failure = ApiFailure.of(exc)
        operator.metrics.inc(operator.metrics.api_errors, failure.verb, failure.resource, str(failure.code))
        sink.event("Warning", WRITE_FAILED_REASON, f"status.placement not written, retried: {failure}"[:900])
        return None
    written["placement"] = block
    # an Event when the recommendation changed: a packing now, or a shared GPU before (an advice
    # that never had anything to pack, e.g. a lone deployment, goes to status quietly)
    if changed and ((block.get("included") and advice.result is not None) or last.get("shared")):
        sink.event("Normal", EVENT_REASON, event_message(block))
    return block
