"""One control-loop iteration per LLMDeployment (DESIGN §4).

scrape → observe → observation ring → recalibrate SLIM → BCA cap + memory → SARA allocation
(disaggregated) or GAUSS replica count (colocated) → guards → apply (enforce) or record (advise).

Everything a restarted operator needs lives in the resource's status (observation ring,
calibration, applied settings and when they were applied); the in-process `LoopMemory` only
holds the previous scrape of each pod, which a restart loses (the first tick after it only
re-primes the scrapes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import aiohttp
import numpy as np

from kneecap.control import decide, manifests as M, policy, reconcile as R, status as St
from kneecap.control.informer import ApiReads
from kneecap.control.kube import KubeClient
from kneecap.control.metrics import CURVE_BATCHES, OperatorMetrics
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.errors import InputError
from kneecap.model import calibrate
from kneecap.observe import pool as obs_pool
from kneecap.observe import window as W
from kneecap.observe.scrape import ScrapeError, Snapshot, family_filter, scrape as http_scrape
from kneecap.observe.window import NoObservation, Observation, combine, window_deltas

log = logging.getLogger("kneecap.loop")

# The metric families window_deltas reads; a scrape parses only these (a vLLM page has ~90
# families, the window needs ~20: less parsing and smaller snapshots held between ticks).
WINDOW_FAMILIES = family_filter(
    [n for table in (W._COUNTERS, W._HISTOGRAMS, W._GAUGES) for names, _ in table.values() for n in names]
    + [W.CACHE_CONFIG, W.PROCESS_START, W.SUCCESS_CREATED, W.PROMPT_TOKENS_CREATED])

FULL_RECONCILE_TICKS = 10  # a full reconcile (Services, pruning) every this many control ticks

ScrapeFn = Callable[[str], Awaitable[Snapshot]]
EventFn = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)


@dataclass
class LoopMemory:
    """In-process state of one resource: each pod URL's scrapes since its window opened, and
    the spec parsed at the generation the timer last saw."""

    snapshots: dict[str, dict[str, list[Snapshot]]] = field(default_factory=dict)  # role -> url -> scrapes
    last_tick_s: float = 0.0
    parsed_ring: dict = field(default_factory=dict)  # ring entry key -> Observation (see ring_entries)
    ticks: int = 0  # control ticks run since the operator started (every FULL_RECONCILE_TICKS-th is full)
    spec: LLMDeploymentSpec | None = None  # parsed at `spec_generation` (None: that spec is invalid)
    spec_generation: int | str | None = -1


@dataclass(frozen=True)
class LoopContext:
    kube: KubeClient
    metrics: OperatorMetrics
    event: EventFn
    now: Callable[[], float] = time.time
    scrape_timeout_s: float = 5.0
    scrape: ScrapeFn | None = None
    session: aiohttp.ClientSession | None = None  # shared by the scrapes (None: one per scrape)
    reads: ApiReads | None = None  # where Deployments, HPAs and pods are read (None: the API)

    @property
    def reader(self) -> ApiReads:
        return self.reads or ApiReads(self.kube)

    async def scrape_url(self, url: str) -> Snapshot:
        if self.scrape is not None:
            return await self.scrape(url)
        return await http_scrape(url, timeout_s=self.scrape_timeout_s, keep=WINDOW_FAMILIES, session=self.session)


@dataclass
class PoolTick:
    role: str
    state: R.PoolState
    observation: Observation | None = None
    no_observation: str | None = None
    scrape_ok: bool = True
    scrape_errors: list[str] = field(default_factory=list)


def primary_role(spec: LLMDeploymentSpec) -> str:
    """The pool whose batch cap BCA sets: the decode pool, or the only pool."""
    return "decode" if spec.disaggregated else "server"


def ownership_status(pools: list[R.PoolState]) -> dict:
    """Who owns each pool's replicas; kneecap does not fight an HPA or a person."""
    out = {}
    for p in pools:
        o = p.ownership
        out[p.pool.role] = {"replicas": o.replicas_owner,
                            "message": (f"replicas are owned by {o.replicas_owner}; kneecap only recommends them"
                                        if o.external else "kneecap manages replicas")}
    return out


def ring_entries(status: dict, role: str, parsed: dict | None = None) -> list[St.RingEntry]:
    """The ring's observations of one pool (entries that do not parse are skipped). ``parsed``:
    a cache of entries parsed on earlier ticks (a ring entry never changes once written), kept
    to the entries still in the ring."""
    out, seen = [], set()
    for e in status.get("observations") or []:
        if e.get("pool", "server") != role:
            continue
        key = (role, e.get("windowEndUnixSeconds"), e.get("requestsPerSecond"),
               e.get("generationTokensPerSecond"))
        obs = parsed.get(key) if parsed is not None else None
        if obs is None:
            try:
                obs = St.ring_entry_from_status(e)
            except ValueError:
                continue
        out.append(obs)
        seen.add(key)
        if parsed is not None:
            parsed[key] = obs
    if parsed is not None:
        for key in [k for k in parsed if k[0] == role and k not in seen]:
            del parsed[key]
    return out


async def observe_pool(ctx: LoopContext, mem: LoopMemory, ns: str, name: str, spec: LLMDeploymentSpec,
                       state: R.PoolState) -> PoolTick:
    """Scrape the pool's ready pods and turn the windows since the last scrapes into one observation."""
    tick = PoolTick(state.pool.role, state)
    pods = await R.ready_pods(ctx.reader, ns, name, state.pool.role)
    urls = [u for u in (R.metrics_url(p, spec.engine.port) for p in pods) if u]
    if not urls:
        tick.no_observation = "no_pods: no ready pod with an IP or a metrics URL"
        return tick
    results = await asyncio.gather(*(ctx.scrape_url(u) for u in urls), return_exceptions=True)
    snaps = mem.snapshots.setdefault(state.pool.role, {})
    for url, res in zip(urls, results):
        if isinstance(res, BaseException):
            tick.scrape_ok = False
            tick.scrape_errors.append(f"{url}: {res}" if isinstance(res, ScrapeError) else f"{url}: {res!r}")
            continue
        snaps.setdefault(url, []).append(res)
    for gone in set(snaps) - set(urls):
        snaps.pop(gone, None)
    if not tick.scrape_ok:
        return tick
    # A window closes once `spec.control.window` has passed since it opened; the scrapes in
    # between give the gauge samples (batch, queue, KV usage) their time average.
    series = [snaps[u] for u in urls]
    if any(len(sn) < 2 for sn in series):
        tick.no_observation = "priming: first scrape of these pods"
        return tick
    span = min(sn[-1].t_s - sn[0].t_s for sn in series)
    if span < spec.control.window_s * 0.999:
        tick.no_observation = f"window open: {span:.0f}s of {spec.control.window_s:.0f}s"
        return tick
    parts, excluded = [], []
    for url in urls:
        sn = snaps[url]
        d = window_deltas(sn[0], sn[-1], sn[1:-1])
        snaps[url] = [sn[-1]]  # the next window opens where this one closed
        if isinstance(d, NoObservation):
            excluded.append(f"{url}: {d.code}")
        else:
            parts.append(d)
    obs = combine(parts) if parts else None
    if obs is None or isinstance(obs, NoObservation):
        tick.no_observation = obs.code if obs is not None else "; ".join(excluded)
    else:
        tick.observation = obs
    return tick


def _settings_status(s: M.EngineSettings) -> dict:
    return St.compact({"maxNumSeqs": s.max_num_seqs, "gpuMemoryUtilization": s.gpu_memory_utilization,
                       "kvCacheMemoryBytes": s.kv_cache_memory_bytes, "replicas": s.replicas})


async def tick(ctx: LoopContext, body: dict, spec: LLMDeploymentSpec, mem: LoopMemory) -> dict:
    """One iteration. Returns the status patch (the caller writes it)."""
    now = ctx.now()
    meta, status = body["metadata"], dict(body.get("status") or {})
    ns, name, gen = meta["namespace"], meta["name"], meta.get("generation")
    labels = (ns, name)
    conds = status.get("conditions") or []
    out: dict = {"observedGeneration": gen}
    _export_spec(ctx, labels, spec)

    # Deployments every tick (live settings, rollouts, drift); Services and pruning every
    # FULL_RECONCILE_TICKS ticks (the spec handlers run a full pass on every spec change)
    full = mem.ticks % FULL_RECONCILE_TICKS == 0
    rec = await R.reconcile(ctx.kube, body, spec, full=full, reads=ctx.reader)
    mem.ticks += 1
    if rec.changed:
        ctx.event("Normal", "Reconciled", ", ".join(
            [f"{p.pool.name} {'created' if p.created else 'patched'}" for p in rec.pools if p.created or p.patched]
            + [f"{d} deleted" for d in rec.deleted]))
    pools = {p.pool.role: p for p in rec.pools}
    ready = all(int((p.deployment.get("status") or {}).get("readyReplicas", 0)) >= 1 for p in rec.pools)
    conds = St.set_condition(conds, St.READY, ready, "PodsReady" if ready else "PodsNotReady",
                             "every pool has a ready replica" if ready else "a pool has no ready replica", gen, now)

    out["ownership"] = ownership_status(rec.pools)
    if rec.conflicts or full:  # (Services are only checked on full passes)
        conds = St.set_conflict(conds, rec.conflicts, gen, now)
    if len(rec.pools) < len(M.pools(name, spec)):  # a pool's Deployment is not kneecap's: hold
        conds = St.set_condition(conds, St.READY, False, "PodsNotReady", "; ".join(
            c.message for c in rec.conflicts), gen, now)
        out.update(conditions=conds, phase=St.phase_of(conds))
        return out

    ticks = [await observe_pool(ctx, mem, ns, name, spec, p) for p in rec.pools]
    scrape_ok = all(t.scrape_ok for t in ticks)
    for t in ticks:
        if not t.scrape_ok:
            ctx.metrics.inc(ctx.metrics.scrape_failures, *labels, amount=len(t.scrape_errors))
        ctx.metrics.set(ctx.metrics.replicas, t.state.settings.replicas, *labels, t.role)
        ctx.metrics.set(ctx.metrics.applied_max_num_seqs, t.state.settings.max_num_seqs, *labels, t.role)
        ctx.metrics.set(ctx.metrics.applied_memory_fraction, t.state.settings.gpu_memory_utilization, *labels, t.role)

    # ring: append this window's observations (status keeps them across restarts)
    ring = list(status.get("observations") or [])
    for t in ticks:
        if t.observation is not None:
            engine = {k: v for k, v in _settings_status(t.state.settings).items() if k != "replicas"}
            entry = {"pool": t.role, "engine": engine, **St.ring_entry(t.observation)}
            ring = St.push_observation(ring, entry, spec.control.observation_history)
    if any(t.observation is not None for t in ticks) or "observations" not in status:
        out["observations"] = ring  # (unchanged, it is not re-sent: the ring is most of the status)
    status["observations"] = ring
    observations = ring_entries(status, primary_role(spec), mem.parsed_ring)

    role = primary_role(spec)
    main = next(t for t in ticks if t.role == role)
    if main.observation is not None:
        out["workload"] = {"pool": role, **St.rounded(obs_pool.to_status(main.observation))}
        per_pod = (main.observation.prompt_tok_s + main.observation.generation_tok_s) / max(main.observation.pods, 1)
        ctx.metrics.set(ctx.metrics.observed_throughput, per_pod, *labels, role)
        slo_ok = _slo_met(spec, main.observation)
        if slo_ok is not None:
            conds = St.set_condition(conds, St.SLO_MET, slo_ok[0], "SLOMet" if slo_ok[0] else "SLOMissed",
                                     slo_ok[1], gen, now)
        ctx.metrics.set(ctx.metrics.slo_attainment, slo_attainment(spec, observations), *labels)

    if not scrape_ok:
        errs = "; ".join(e for t in ticks for e in t.scrape_errors)
        conds = St.set_condition(conds, St.DEGRADED, True, "ScrapeFailed", errs[:900], gen, now)
        out.update(conditions=conds, phase=St.phase_of(conds))
        _record(ctx, out, labels, "ScrapeFailed", f"scrape failed, keeping the last good state: {errs}"[:900],
                "Warning", now, action=policy.HOLD, previous=status.get("lastDecision"))
        return out

    # calibration (kept across restarts in status)
    previous = decide.calibration_from_status(status.get("calibration"))
    cal_out = decide.recalibrate(spec.model.architecture, spec.accelerator.type, observations, previous,
                                 spec.control.max_fit_error, now_s=now)
    if cal_out.calibration is not None:
        out["calibration"] = decide.calibration_to_status(cal_out.calibration, cal_out.error)
        ctx.metrics.set(ctx.metrics.calibration_error, cal_out.error, *labels)
        # acceptedTime: when the fit in use was accepted (a rejected first fit never was)
        # (a fit that a refit on fresh windows could not beat is accepted anew)
        accepted = (St.iso(now) if (cal_out.refit or cal_out.revalidated) and cal_out.ok
                    else None if cal_out.refit else _accepted_time(status.get("calibration")))
        if accepted:
            out["calibration"]["acceptedTime"] = accepted
            ctx.metrics.set(ctx.metrics.calibration_timestamp, St.parse_iso(accepted), *labels)
        if main.observation is not None:
            _export_curve(ctx, labels, role, spec, cal_out.calibration, main.observation)
    if main.observation is None and main.no_observation and not main.no_observation.startswith(
            ("window open", "priming")):
        # an idle or unusable window: no running batch to be past the knee with
        ctx.metrics.drop(ctx.metrics.batching_efficiency, *labels, role)
    conds = St.set_condition(conds, St.CALIBRATED, cal_out.calibration is not None and cal_out.ok,
                             cal_out.reason, cal_out.message, gen, now)
    degraded_reason = None
    if cal_out.reason in ("FitFailed", "FitRejected", "FitErrorTooHigh") or (
            cal_out.calibration is not None and not cal_out.ok):
        degraded_reason = ("BadFit", cal_out.message)
    conds = St.set_condition(conds, St.DEGRADED, degraded_reason is not None,
                             degraded_reason[0] if degraded_reason else "Healthy",
                             degraded_reason[1] if degraded_reason else "scrapes and fit are healthy", gen, now)

    latest = main.observation or _workload(status, role)  # the last full window when this one is open
    if cal_out.calibration is None or latest is None:
        out.update(conditions=conds, phase=St.phase_of(conds))
        why = main.no_observation or cal_out.message
        ctx.metrics.inc(ctx.metrics.decisions, *labels, "WaitingForData")
        out["lastDecision"] = {"action": policy.HOLD, "reason": "WaitingForData", "message": why, "time": St.iso(now)}
        return out

    # decide
    cur = pools[role].settings
    external = pools[role].ownership.external
    try:
        replicas, rbind, alloc = _replicas(spec, cal_out.calibration, latest, pools, role)
        r = decide.recommend(spec, role, cal_out.calibration, latest, cur,
                             replicas=replicas, replicas_binding=rbind, allocation=alloc)
    except Exception as exc:  # noqa: BLE001 - a model failure must not take the operator down
        log.exception("decision failed for %s/%s", ns, name)
        conds = St.set_condition(conds, St.DEGRADED, True, "ModelError", f"{type(exc).__name__}: {exc}"[:900],
                                 gen, now)
        out.update(conditions=conds, phase=St.phase_of(conds))
        _record(ctx, out, labels, "ModelError", f"{type(exc).__name__}: {exc}"[:900], "Warning", now,
                action=policy.HOLD, previous=status.get("lastDecision"))
        return out
    out["recommendation"] = r.to_status()
    if r.allocation:
        out["allocation"] = r.allocation
    _export_recommendation(ctx, labels, role, r)
    if main.observation is not None:
        ctx.metrics.set(ctx.metrics.knee_throughput,
                        float(slim_curve(cal_out.calibration, spec, main.observation, np.array([r.knee_batch]))[0]),
                        *labels, role)

    applied = status.get("applied") or {}
    state = policy.GuardState(
        now_s=now, last_applied_s=St.parse_iso(applied.get("time")),
        rollout_in_progress=any(p.rollout_in_progress for p in rec.pools),
        n_observations=len(observations), scrape_ok=scrape_ok, fit_ok=cal_out.ok, fit_message=cal_out.message,
        replicas_external=external)
    d = policy.guard(cur, policy.Proposal(r.settings, r.throughput_gain, r.memory_gain), spec.control,
                     spec.batching, M.pool_bounds(spec, role), state,
                     memory_for_cap=lambda cap: decide.memory_for_cap(spec, latest, cap)[:2])

    if d.action == policy.APPLY and spec.enforce:
        patch = M.with_settings(pools[role].deployment, d.target, set_replicas=not external)
        await ctx.kube.patch(R.deployments_path(ns, pools[role].pool.name), patch)
        restart = not policy.only_replicas_changed(cur, d.target)
        if restart:
            ctx.metrics.inc(ctx.metrics.restarts, *labels, d.reason)
        out["applied"] = {**_settings_status(d.target), "pool": role, "time": St.iso(now),
                          "reason": d.reason, "restart": restart}
        ctx.metrics.set(ctx.metrics.applied_max_num_seqs, d.target.max_num_seqs, *labels, role)
        ctx.metrics.set(ctx.metrics.applied_memory_fraction, d.target.gpu_memory_utilization, *labels, role)
        reason, message, etype = "Applied", d.message, "Normal"
    elif d.action == policy.APPLY:
        reason, message, etype = "Advised", "advise mode, not applied: " + d.message, "Normal"
    else:
        reason, message, etype = d.reason, d.message, "Normal"
    if "applied" not in out:
        out["applied"] = {**applied, **_settings_status(cur), "pool": role}
        if "time" not in out["applied"]:
            out["applied"]["time"] = None
    if spec.disaggregated and r.allocation.get("prefillReplicas"):
        await _prefill_replicas(ctx, out, ns, labels, spec, pools["prefill"], int(r.allocation["prefillReplicas"]),
                                state, now)
    out.update(conditions=conds, phase=St.phase_of(conds))
    _record(ctx, out, labels, reason, message, etype, now, action=d.action, target=d.target,
            previous=status.get("lastDecision"))
    return out


async def _prefill_replicas(ctx: LoopContext, out: dict, ns: str, labels, spec: LLMDeploymentSpec,
                            pre: R.PoolState, want: int, state: policy.GuardState, now: float) -> None:
    """SARA's prefill pool size, through the same guards (a replica change restarts no pod)."""
    cur = pre.settings
    target = M.EngineSettings(cur.max_num_seqs, cur.gpu_memory_utilization, cur.kv_cache_memory_bytes, want)
    d = policy.guard(cur, policy.Proposal(target, 0.0, 0.0), spec.control, spec.batching,
                     M.pool_bounds(spec, "prefill"), dataclasses.replace(state, replicas_external=pre.ownership.external))
    decision = {"reason": d.reason, "message": d.message, "replicas": d.target.replicas}
    if d.action == policy.APPLY and spec.enforce and not pre.ownership.external:
        await ctx.kube.patch(R.deployments_path(ns, pre.pool.name), {"spec": {"replicas": d.target.replicas}})
        decision["reason"] = "Applied"
        out["applied"]["prefill"] = {"replicas": d.target.replicas, "time": St.iso(now)}
        out["applied"]["time"] = St.iso(now)  # one cooldown for the whole deployment
        ctx.metrics.set(ctx.metrics.replicas, d.target.replicas, *labels, "prefill")
        ctx.metrics.inc(ctx.metrics.decisions, *labels, "Applied")
        ctx.event("Normal", "Applied", f"prefill pool {pre.pool.name}: replicas {cur.replicas}->{d.target.replicas} "
                                       f"(SARA wants {want}){' (step limited)' if d.step_limited else ''}")
    out.setdefault("allocation", {})["prefillDecision"] = decision


def _replicas(spec, cal, obs, pools, role):
    if spec.disaggregated:
        alloc = decide.disaggregated_allocation(spec, cal, obs)
        return alloc["decodeReplicas"], "sara:" + str(alloc["binding"].get("decode", "")), alloc
    n, binding, alloc = decide.colocated_replicas(spec, cal, obs)
    return n, "gauss:" + str(binding), alloc


def _workload(status: dict, role: str) -> Observation | None:
    """The last window's full observation of the pool, from ``status.workload`` (None if absent
    or unreadable)."""
    w = status.get("workload") or {}
    if w.get("pool", "server") != role:
        return None
    try:
        return obs_pool.from_status({k: v for k, v in w.items() if k != "pool"})
    except ValueError:
        return None


def slo_attainment(spec: LLMDeploymentSpec, ring: Sequence[Observation | St.RingEntry]) -> float | None:
    """Fraction of the ring's windows whose p95 latencies met every declared SLO (None: no SLO
    declared, or no window measured one)."""
    met = [r[0] for r in (_slo_met(spec, o) for o in ring) if r is not None]
    return sum(met) / len(met) if met else None


def slim_curve(cal: calibrate.Calibration, spec: LLMDeploymentSpec, obs: Observation,
               batch: np.ndarray) -> np.ndarray:
    """Calibrated SLIM token throughput per pod at `batch`, at the window's lengths (eq. 6)."""
    thr, _ = calibrate.predict(cal, spec.model.architecture, spec.accelerator.type, np.asarray(batch, float),
                               max(obs.input_len_mean, 1.0), max(obs.output_len_mean, 1.0),
                               output_cv=obs.output_len_cv)
    return np.broadcast_to(np.asarray(thr, float), np.shape(batch))


def _efficiency_batch(obs: Observation) -> float:
    """The batch the efficiency is read at: the window's mean running batch; B < 1 reads as 1."""
    return max(decide.observed_batch(obs), 1.0)


def _efficiency(t1_tok_s: float, tb_tok_s: float, b: float) -> float:
    return tb_tok_s / (b * t1_tok_s)  # T(B)/(B·T(1)), paper 000 eq. 13


def batching_efficiency(cal: calibrate.Calibration, spec: LLMDeploymentSpec, obs: Observation) -> float:
    """T(B)/(B·T(1)) at the window's mean running batch B (paper 000, eq. 13); B < 1 reads as 1."""
    b = _efficiency_batch(obs)
    t1, tb = slim_curve(cal, spec, obs, np.array([1.0, b]))
    return float(_efficiency(t1, tb, b))


def _accepted_time(cal_status: dict | None) -> str | None:
    """acceptedTime of the fit in status; a status written before it existed has the fit's
    creation time (ISO 8601 with an offset), taken as its acceptance."""
    d = cal_status or {}
    if d.get("acceptedTime"):
        return d["acceptedTime"]
    try:
        return St.iso(_dt.datetime.fromisoformat(str(d["time"]).replace("Z", "+00:00")).timestamp())
    except (KeyError, ValueError):
        return None


def _export_spec(ctx: LoopContext, labels, spec: LLMDeploymentSpec) -> None:
    m = ctx.metrics
    m.set(m.efficiency_floor, spec.batching.efficiency_floor, *labels)
    m.set(m.slo_quantile, spec.slo.quantile, *labels)
    for kind, v in (("ttft", spec.slo.ttft_s), ("tpot", spec.slo.tpot_s), ("e2e", spec.slo.e2e_s)):
        if v is None:
            m.drop(m.slo_target, *labels, kind)
        else:
            m.set(m.slo_target, v, *labels, kind)


def _export_curve(ctx: LoopContext, labels, role: str, spec: LLMDeploymentSpec, cal: calibrate.Calibration,
                  obs: Observation) -> None:
    """The calibrated curve at CURVE_BATCHES (≤ maxMaxNumSeqs), the efficiency T(B)/(B·T(1)) at
    the observed batch (paper 000, eq. 13) and the prediction at the window's own batch (the fit
    checked against the window it has just seen): one SLIM evaluation (eq. 6)."""
    m = ctx.metrics
    batch = np.array([b for b in CURVE_BATCHES if b <= spec.batching.max_max_num_seqs], float)
    b_obs = max(decide.observed_batch(obs), 1e-3)  # as decide.fit_rows reads it
    b_eff = _efficiency_batch(obs)
    try:
        thr = slim_curve(cal, spec, obs, np.concatenate([batch, [1.0, b_eff, b_obs]]))
    except (InputError, ValueError, FloatingPointError) as exc:
        log.warning("SLIM curve for %s/%s: %s", labels[0], labels[1], exc)
        return
    t1, t_eff, t_obs = (float(x) for x in thr[len(batch):])
    for b, t in zip(batch, thr):
        if np.isfinite(t):
            m.set(m.predicted_curve, float(t), *labels, role, str(int(b)))
    eff = _efficiency(t1, t_eff, b_eff)
    if np.isfinite(eff):
        m.set(m.batching_efficiency, eff, *labels, role)
    if np.isfinite(t_obs):
        m.set(m.predicted_throughput, t_obs, *labels, role)
    for b in CURVE_BATCHES:
        if b > spec.batching.max_max_num_seqs:
            m.drop(m.predicted_curve, *labels, role, str(b))


def _slo_met(spec: LLMDeploymentSpec, o: Observation | St.RingEntry) -> tuple[bool, str] | None:
    checks = [(spec.slo.ttft_s, o.ttft_p95_s, "TTFT"), (spec.slo.tpot_s, o.itl_p95_s, "TPOT"),
              (spec.slo.e2e_s, o.e2e_p95_s, "E2E")]
    checks = [(slo, v, n) for slo, v, n in checks if slo is not None and v is not None]
    if not checks:
        return None
    missed = [f"{n} p95 {v:.3g}s > {slo:g}s" for slo, v, n in checks if v > slo]
    if missed:
        return False, "; ".join(missed)
    return True, ", ".join(f"{n} p95 {v:.3g}s ≤ {slo:g}s" for slo, v, n in checks)


def _export_recommendation(ctx: LoopContext, labels, role: str, r: decide.Recommendation) -> None:
    m = ctx.metrics
    m.set(m.recommended_max_num_seqs, r.max_num_seqs, *labels, role)
    m.set(m.recommended_memory_fraction, r.gpu_memory_utilization, *labels, role)
    m.set(m.memory_released_gib, r.released_gib, *labels, role)
    m.set(m.knee_batch, r.knee_batch, *labels, role)
    m.set(m.recommended_throughput, r.pred_throughput_tok_s, *labels, role)


def _record(ctx: LoopContext, out: dict, labels, reason: str, message: str, etype: str, now: float,
            action: str, target: M.EngineSettings | None = None, previous: dict | None = None) -> None:
    """Status, metrics and an Event for a decision. The Event is posted when the decision differs
    from the previous one (reason or target), so a steady hold does not flood the namespace."""
    ctx.metrics.inc(ctx.metrics.decisions, *labels, reason)
    decision = St.compact({"action": action, "reason": reason, "message": message, "time": St.iso(now),
                           "target": _settings_status(target) if target else None})
    out["lastDecision"] = decision
    prev = previous or {}
    if reason != "Applied" and prev.get("reason") == reason and prev.get("target") == decision.get("target"):
        return
    ctx.event(etype, reason, message)
