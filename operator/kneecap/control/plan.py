"""The decision of one control tick, a pure function (DESIGN §4; STYLE: gather → plan → apply).

``plan(gathered, status, spec, now_s)`` turns what the tick gathered (the pools as reconcile
left them, each pool's window, the parsed observation ring, the API calls that failed) and the
resource's status into the new status, the Events to post, the metric updates and at most one
Deployment patch per pool. No I/O and no clock: :mod:`kneecap.control.loop` gathers and applies.

A decision needs a usable window no older than ``spec.control.maxObservationAge``: a failed
scrape or an unusable window (garbage, NaN, a truncated page, missing families, counter resets)
holds with ``Degraded`` naming it until a usable window closes; idle windows are usable (there
is just nothing to decide). A patch carries the `kneecap.io/applied` record (see applied.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Sequence

import numpy as np

from kneecap.control import applied as applied_record, cudagraph, decide, gauss_reuse, manifests, policy, reconcile
from kneecap.control import restart, status as status_helpers
from kneecap.control.kube import MERGE
from kneecap.control.metrics import CURVE_BATCHES
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.control.target import STRATEGIC, settings_patch
from kneecap.control.tick import (APPLY_FAILED, FAILED, IDLE, NO_PODS, OBSERVED, OPEN, SCRAPE_FAILED, STALE,
                                  UNUSABLE, DeploymentPatch, Event, FailedPatch, MetricUpdate, Plan, PoolWindow,
                                  TickInput, decision_status)
from kneecap.errors import InputError
from kneecap.model import calibrate, slim
from kneecap.model.arch import get_arch
from kneecap.naming import status_key
from kneecap.observe import pool as obs_pool
from kneecap.observe.observation import Observation

log = logging.getLogger("kneecap.plan")

class _Metrics:
    """Collects MetricUpdates with the OperatorMetrics call shape."""

    def __init__(self):
        self.updates: list[MetricUpdate] = []

    def set(self, metric: str, value: float | None, *labels: str) -> None:
        if value is not None:
            self.updates.append(MetricUpdate("set", metric, labels, float(value)))

    def inc(self, metric: str, *labels: str, amount: float = 1.0) -> None:
        self.updates.append(MetricUpdate("inc", metric, labels, float(amount)))

    def drop(self, metric: str, *labels: str) -> None:
        self.updates.append(MetricUpdate("drop", metric, labels))


# ---------------------------------------------------------------- small pure helpers

def primary_role(spec: LLMDeploymentSpec) -> str:
    """The pool whose batch cap BCA sets: the decode pool, or the only pool."""
    return "decode" if spec.disaggregated else "server"


def target_tensor_parallel_size(g: "TickInput", spec: LLMDeploymentSpec) -> int | None:
    """--tensor-parallel-size of the primary pool's adopted container (None: unread)."""
    role = primary_role(spec)
    p = next((p for p in g.pools if p.state.pool.role == role and p.state.adoption is not None), None)
    return None if p is None else p.state.adoption.tensor_parallel_size


def ownership_status(pools: Sequence[reconcile.PoolState]) -> dict:
    """Who owns each pool's replicas; kneecap does not fight an HPA or a person."""
    out = {}
    for p in pools:
        o = p.ownership
        out[p.pool.role] = {"replicas": o.replicas_owner,
                            "message": (f"replicas are owned by {o.replicas_owner}; kneecap only recommends them"
                                        if o.external else "kneecap manages replicas")}
        if p.adoption is not None:  # spec.targetRef: whose Deployment kneecap tunes
            out[p.pool.role]["target"] = status_helpers.compact({
                "deployment": p.pool.name, "container": p.adoption.container, "controller": p.adoption.controller,
                "adviseOnly": p.adoption.advise_only, "tensorParallelSize": p.adoption.tensor_parallel_size})
    return out


def _advisory(t: "_Tick", states: Sequence[reconcile.PoolState]) -> None:
    """The Advisory condition of an adopted deployment: True (reason TargetControlled, naming
    the controller, or ArgvNotWritable) when kneecap may not write to a target, so it only
    advises; decisions are still computed and reported."""
    held = [s for s in states if s.adoption is not None and s.adoption.advise_only]
    if held:
        s = held[0]
        reason = "TargetControlled" if s.adoption.controller else "ArgvNotWritable"
        t.condition(status_helpers.ADVISORY, True, reason, "; ".join(
            f"Deployment {x.pool.name}: {x.adoption.why_advise_only}" for x in held)[:900])
    else:
        t.condition(status_helpers.ADVISORY, False, "TargetWritable",
                    "kneecap may patch the managed flags of every target Deployment"
                    + ("" if t.spec.enforce else " (spec.control.mode is advise)"))


def _ring_key(role: str, e: dict) -> tuple:
    return (role, e.get("windowEndUnixSeconds"), e.get("requestsPerSecond"), e.get("generationTokensPerSecond"))


def parse_ring(entries: Sequence[dict], role: str, parsed: dict | None = None) -> tuple:
    """Each ring entry with its parse for pool ``role`` (None: another pool's, or unreadable).
    ``parsed``: a cache of entries parsed on earlier ticks (an entry never changes once
    written), kept to the entries still in the ring."""
    out, seen = [], set()
    for e in entries:
        obs = None
        if e.get("pool", "server") == role:
            key = _ring_key(role, e)
            obs = parsed.get(key) if parsed is not None else None
            if obs is None:
                try:
                    obs = status_helpers.ring_entry_from_status(e)
                except ValueError:
                    obs = None
            if obs is not None:
                seen.add(key)
                if parsed is not None:
                    parsed[key] = obs
        out.append((e, obs))
    if parsed is not None:
        for key in [k for k in parsed if k[0] == role and k not in seen]:
            del parsed[key]
    return tuple(out)


def ring_entries(status: dict, role: str, parsed: dict | None = None) -> list[status_helpers.RingEntry]:
    """The ring's observations of one pool (entries that do not parse are skipped)."""
    return [o for _, o in parse_ring(status.get("observations") or [], role, parsed) if o is not None]


def settings_status(s: manifests.EngineSettings) -> dict:
    return status_helpers.compact({"maxNumSeqs": s.max_num_seqs, "gpuMemoryUtilization": s.gpu_memory_utilization,
                                   "kvCacheMemoryBytes": s.kv_cache_memory_bytes, "replicas": s.replicas})


def workload_from_status(status: dict, role: str) -> Observation | None:
    """The last window's full observation of the pool, from ``status.workload`` (None if absent
    or unreadable)."""
    w = status.get("workload") or {}
    if w.get("pool", "server") != role:
        return None
    try:
        return obs_pool.from_status({k: v for k, v in w.items() if k != "pool"})
    except ValueError:
        return None


def slo_met(spec: LLMDeploymentSpec, o: Observation | status_helpers.RingEntry) -> tuple[bool, str] | None:
    checks = decide.slo_checks(spec, o)
    if not checks:
        return None
    missed = [f"{n} p95 {v:.3g}s > {slo:g}s" for slo, v, n in checks if v > slo]
    if missed:
        return False, "; ".join(missed)
    return True, ", ".join(f"{n} p95 {v:.3g}s ≤ {slo:g}s" for slo, v, n in checks)


def slo_attainment(spec: LLMDeploymentSpec, ring: Sequence[Observation | status_helpers.RingEntry]) -> float | None:
    """Fraction of the ring's windows whose p95 latencies met every declared SLO (None: no SLO
    declared, or no window measured one)."""
    met = [r[0] for r in (slo_met(spec, o) for o in ring) if r is not None]
    return sum(met) / len(met) if met else None


def slim_curve(cal: calibrate.Calibration, spec: LLMDeploymentSpec, obs: Observation,
               batch: np.ndarray) -> np.ndarray:
    """Calibrated SLIM token throughput per pod at `batch`, at the window's lengths (eq. 6)."""
    thr, _ = calibrate.predict(cal, spec.model.architecture, spec.accelerator.gpu, np.asarray(batch, float),
                               max(obs.input_len_mean, 1.0), max(obs.output_len_mean, 1.0),
                               output_cv=obs.output_len_cv, tensor_parallel_size=decide.model_tp(spec))
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


# ---------------------------------------------------------------- calibration in status (camelCase)

_METRIC_KEYS = MappingProxyType({"mape_pct": "meanErrorPercent", "max_error_pct": "maxErrorPercent",
                                 "n_points": "points", "cost": "fitCost"})
_NOTE_KEYS = MappingProxyType({"checkedS": "checkedUnixSeconds", "ringN": "ringPoints",
                               "ringErrorPct": "ringErrorPercent"})
# status.calibration keys earlier versions wrote → the current ones (an upgraded operator reads them)
_EARLIER_CALIBRATION_KEYS = MappingProxyType({
    "mapePct": "meanErrorPercent", "maxErrorPct": "maxErrorPercent", "nPoints": "points",
    "fitErrorPct": "fitErrorPercent", "parameterStd": "parameterStandardDeviations"})


def calibration_to_status(cal: calibrate.Calibration, error: float | None, accepted_time: str | None) -> dict:
    """A Calibration as status.calibration: camelCase keys (SLIM's parameters included, e.g.
    ``t_fixed_s`` → ``tFixedSeconds``), the fit's error on the current ring (``fitErrorPercent``)
    and when it was created and accepted."""
    return status_helpers.compact({
        "version": cal.version, "form": cal.form, "gpu": cal.gpu, "models": list(cal.models),
        "parameters": {status_key(k): v for k, v in cal.params.items()},
        "parameterStandardDeviations": {status_key(k): v for k, v in cal.std.items()},
        **{_METRIC_KEYS.get(k, status_key(k)): v for k, v in cal.metrics.items()},
        "fitErrorPercent": None if error is None else round(100.0 * error, 3),
        "notes": {_NOTE_KEYS.get(k, k): v for k, v in (cal.notes or {}).items()} or None,
        "createdTime": cal.created, "acceptedTime": accepted_time})


def calibration_from_status(d: dict | None) -> calibrate.Calibration | None:
    """Inverse of :func:`calibration_to_status`, the keys of earlier versions read too (None:
    absent or unreadable)."""
    if not d or "parameters" not in d or d.get("form") not in slim.FORM_PARAMS:
        return None
    d = obs_pool.with_current_keys(d, _EARLIER_CALIBRATION_KEYS)
    names = {status_key(k): k for k in slim.FORM_PARAMS[d["form"]]}
    metrics_back = {v: k for k, v in _METRIC_KEYS.items()}
    notes_back = {v: k for k, v in _NOTE_KEYS.items()}
    try:
        return calibrate.Calibration.from_json(json.dumps({
            "version": d.get("version", calibrate.CALIBRATION_VERSION), "form": d["form"], "gpu": d.get("gpu"),
            "models": d.get("models", []),
            "params": {names.get(k, k): v for k, v in dict(d["parameters"]).items()},
            "std": {names.get(k, k): v for k, v in dict(d.get("parameterStandardDeviations") or {}).items()},
            "metrics": {metrics_back[k]: d[k] for k in metrics_back if k in d},
            "created": d.get("createdTime", ""),
            "notes": {notes_back.get(k, k): v for k, v in dict(d.get("notes") or {}).items()}}))
    except (InputError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- the plan

@dataclass
class _Tick:
    """The plan being built (private; `plan` returns a frozen Plan)."""

    g: TickInput
    spec: LLMDeploymentSpec
    status: dict
    now_s: float
    out: dict
    conds: list
    m: _Metrics = field(default_factory=_Metrics)
    events: list = field(default_factory=list)
    patches: list = field(default_factory=list)
    gauss_runs: gauss_reuse.GaussRuns | None = None  # the loop's past GAUSS runs (decide.colocated_replicas)

    @property
    def labels(self) -> tuple[str, str]:
        return self.g.namespace, self.g.name

    def condition(self, type_: str, ok: bool | None, reason: str, message: str) -> None:
        self.conds = status_helpers.set_condition(self.conds, type_, ok, reason, message, self.g.generation, self.now_s)

    def decision(self, reason: str, message: str, etype: str = "Normal", action: str = policy.HOLD,
                 target: manifests.EngineSettings | None = None, restart_cost: dict | None = None) -> dict:
        """Status, metrics and an Event for a decision. The Event is posted when the decision
        differs from the previous one (reason or target), so a steady hold does not flood the
        namespace."""
        self.m.inc("decisions", *self.labels, reason)
        d = decision_status(action, reason, message, self.now_s, settings_status(target) if target else None,
                            restart_cost)
        self.out["lastDecision"] = d
        prev = self.status.get("lastDecision") or {}
        if reason == "Applied" or prev.get("reason") != reason or prev.get("target") != d.get("target"):
            self.events.append(Event(etype, reason, message[:900]))
        return d

    def finish(self) -> Plan:
        self.out.update(conditions=self.conds, phase=status_helpers.phase_of(self.conds))
        patches, undone = [], {}
        for patch in reversed(self.patches):  # a failed patch's later ones are not sent either
            undone = {**undone, **patch.rollback}
            failed = FailedPatch({**self.out, **undone}, self.g.generation, self.now_s, self.labels)
            patches.insert(0, dataclasses.replace(patch, if_failed=failed))
        return Plan(self.out, tuple(self.events), tuple(self.m.updates), tuple(patches))


def plan(g: TickInput, status: dict, spec: LLMDeploymentSpec, now_s: float,
         gauss_runs: gauss_reuse.GaussRuns | None = None) -> Plan:
    """The new status, Events, metric updates and Deployment patches of one tick; ``gauss_runs``
    (the loop's reuse of GAUSS's λ* search) is the one state it reads and adds to."""
    status = status or {}
    if spec.adopted and any(p.state.settings.kv_cache_memory_bytes is not None for p in g.pools):
        spec = dataclasses.replace(spec, target_memory_knob="kvCacheMemoryBytes")  # the flag the user's argv sets
    if spec.adopted:  # the TP size the primary pool's argv runs with
        spec = dataclasses.replace(spec, target_tensor_parallel_size=target_tensor_parallel_size(g, spec))
    t = _Tick(g, spec, status, now_s, out={"observedGeneration": g.generation},
              conds=list(status.get("conditions") or []), gauss_runs=gauss_runs)
    labels, role = t.labels, primary_role(spec)
    _export_spec(t)
    if g.changes:
        t.events.append(Event("Normal", "Reconciled", ", ".join(g.changes)))
    states = [p.state for p in g.pools]
    t.condition(status_helpers.READY, *status_helpers.ready(
        [s.deployment for s in states], conflicts=g.conflicts, missing=g.missing_targets,
        unschedulable=[f"{p.role}: {p.unschedulable}" for p in g.pools if p.unschedulable]))
    ignored = "; ".join(f"{p.role}: {p.ignored_metrics_url}" for p in g.pools if p.ignored_metrics_url)
    if ignored and not status_helpers.condition_true(t.conds, status_helpers.METRICS_URL_IGNORED):
        t.events.append(Event("Warning", status_helpers.METRICS_URL_IGNORED,
                              f"ignored (its host is not the pod's IP): {ignored}"[:900]))
    # (the condition is present once it has been True)
    if ignored or status_helpers.get_condition(t.conds, status_helpers.METRICS_URL_IGNORED):
        t.condition(status_helpers.METRICS_URL_IGNORED, bool(ignored), "ForeignHost" if ignored else "NoneIgnored",
                    (f"ignored (its host is not the pod's IP; the pod's IP is scraped): {ignored}"[:900]
                     if ignored else "no pod's kneecap.io/metrics-url names another host"))
    if g.conflicts or g.full_pass:
        t.conds = status_helpers.set_conflict(t.conds, g.conflicts, g.generation, now_s)
    if spec.adopted:
        _advisory(t, states)
    t.out["ownership"] = ownership_status(states)
    _api_errors(t)

    for p in g.pools:
        # counted from the first tick (0 while every scrape succeeds): a rate query has a series
        t.m.inc("scrape_failures", *labels, amount=p.scrape_errors)
        t.m.set("replicas", p.state.settings.replicas, *labels, p.role)
        t.m.set("applied_max_num_seqs", p.state.settings.max_num_seqs, *labels, p.role)
        t.m.set("applied_gpu_memory_utilization", p.state.settings.gpu_memory_utilization, *labels, p.role)

    # the ring: this tick's observations appended as they are (status keeps them across restarts)
    ring = list(g.ring)
    for p in g.pools:
        if p.observation is not None:
            engine = {k: v for k, v in settings_status(p.state.settings).items() if k != "replicas"}
            entry = {"pool": p.role, "engine": engine, **status_helpers.ring_entry(p.observation)}
            ring = (ring + [(entry, p.observation if p.role == role else None)])[-spec.control.observation_history:]
    if any(p.observation is not None for p in g.pools) or "observations" not in status:
        t.out["observations"] = [e for e, _ in ring]  # (unchanged, it is not re-sent: most of the status)
    observations = [o for _, o in ring if o is not None]

    main = next((p for p in g.pools if p.role == role), None)
    if main is None:
        why = ("; ".join(c.message for c in g.conflicts) or "; ".join(map(str, g.api_failures))
               or "; ".join(g.missing_targets) or f"no {role} pool")
        reason = ("OwnershipConflict" if g.conflicts else "ReconcileFailed" if g.reconcile_failed
                  else "TargetMissing" if g.missing_targets else "PoolMissing")
        t.decision(reason, f"not acting: {why}", "Warning")
        return t.finish()
    if main.observation is not None:
        t.out["workload"] = {"pool": role, **status_helpers.rounded(obs_pool.to_status(main.observation))}
        per_pod = (main.observation.prompt_tok_s + main.observation.generation_tok_s) / max(main.observation.pods, 1)
        t.m.set("observed_throughput", per_pod, *labels, role)
        ok = slo_met(spec, main.observation)
        if ok is not None:
            t.condition(status_helpers.SLO_MET, ok[0], "SLOMet" if ok[0] else "SLOMissed", ok[1])
        t.m.set("slo_attainment", slo_attainment(spec, observations), *labels)

    if _observation_held(t, main):
        return t.finish()

    # calibration (kept across restarts in status)
    previous_status = status.get("calibration")
    cal_out = decide.recalibrate(spec.model.architecture, spec.accelerator.gpu, observations,
                                 calibration_from_status(previous_status), spec.control.max_fit_error,
                                 now_s=now_s, tensor_parallel_size=decide.model_tp(spec))
    if cal_out.calibration is not None:
        # acceptedTime: when the fit in use was accepted (a rejected first fit never was; a fit
        # that a refit on fresh windows could not beat is accepted anew)
        accepted = (status_helpers.iso(now_s) if (cal_out.refit or cal_out.revalidated) and cal_out.ok
                    else None if cal_out.refit else (previous_status or {}).get("acceptedTime"))
        t.out["calibration"] = calibration_to_status(cal_out.calibration, cal_out.error, accepted)
        t.m.set("calibration_error", cal_out.error, *labels)
        if accepted:
            t.m.set("calibration_timestamp", status_helpers.parse_iso(accepted), *labels)
        if main.observation is not None:
            _export_curve(t, role, cal_out.calibration, main.observation)
    if main.outcome == IDLE:  # no running batch to be past the knee with
        t.m.drop("batching_efficiency", *labels, role)
    t.condition(status_helpers.CALIBRATED, cal_out.calibration is not None and cal_out.ok, cal_out.reason,
                cal_out.message)
    bad_fit = cal_out.reason in ("FitFailed", "FitRejected", "FitErrorTooHigh") or (
        cal_out.calibration is not None and not cal_out.ok)
    t.condition(status_helpers.DEGRADED, bad_fit, "BadFit" if bad_fit else "Healthy",
                cal_out.message if bad_fit else "observations are fresh and the fit is healthy")

    latest = main.observation or workload_from_status(status, role)  # the last full window when this one is open
    if cal_out.calibration is None or latest is None:
        t.decision("WaitingForData", main.message or cal_out.message)
        return t.finish()
    age_s = now_s - latest.t_end_s
    if age_s > spec.control.max_observation_age_s:
        # not stale (the windows since were usable): idle, nothing to decide on
        t.decision("Idle", f"no window with traffic for {age_s:.0f}s (maxObservationAge "
                           f"{spec.control.max_observation_age_s:.0f}s); keeping the live settings")
        return t.finish()

    pools = {p.role: p.state for p in g.pools}
    cur, external = pools[role].settings, pools[role].ownership.external
    restart_cost = _restart_cost(t, pools[role], latest)
    try:
        r = decide.recommend(spec, role, cal_out.calibration, latest, cur)
        # replicas sized at the cap and memory the recommendation applies (GAUSS's engine limits)
        replicas, rbind, alloc = _replicas(t, cal_out.calibration, latest, cur.replicas, restart_cost.restart_s,
                                           observations, settings=r.settings)
        r = dataclasses.replace(r, replicas=int(replicas), replicas_binding=rbind, allocation=dict(alloc or {}))
    except Exception as exc:  # noqa: BLE001 - a model failure must not take the operator down
        log.exception("decision failed for %s/%s", *labels)
        t.condition(status_helpers.DEGRADED, True, "ModelError", f"{type(exc).__name__}: {exc}"[:900])
        t.decision("ModelError", f"{type(exc).__name__}: {exc}", "Warning")
        return t.finish()
    t.out["recommendation"] = r.to_status()
    if r.allocation:
        t.out["allocation"] = dict(r.allocation)
    _export_recommendation(t, role, r)
    if main.observation is not None:
        t.m.set("knee_throughput",
                float(slim_curve(cal_out.calibration, spec, main.observation, np.array([r.knee_batch]))[0]),
                *labels, role)

    records = {p.role: applied_record.from_deployment(p.state.deployment) for p in g.pools}
    applied = applied_record.newest(status.get("applied"), records.get(role))
    t.out["applied"] = {**applied, **settings_status(cur), "pool": role}
    if g.reconcile_failed or g.conflicts or g.missing_targets:
        why = "; ".join([str(f) for f in g.api_failures] + [c.message for c in g.conflicts] + list(g.missing_targets))
        t.decision("OwnershipConflict" if g.conflicts else "ReconcileFailed" if g.reconcile_failed
                   else "TargetMissing", f"not acting until the pools reconcile: {why}", "Warning")
        return t.finish()

    state = policy.GuardState(
        now_s=now_s, last_applied_s=applied_record.last_applied_s(applied, records.values()),
        rollout_in_progress=any(s.rollout_in_progress for s in states),
        n_observations=len(observations), fit_ok=cal_out.ok, fit_message=cal_out.message,
        replicas_external=external, restart=restart_cost)
    round_cap = None if cudagraph.eager(pools[role].engine_container) else (
        lambda cap: cudagraph.round_cap(cap, spec.batching.min_max_num_seqs, spec.batching.max_max_num_seqs))
    d = policy.guard(cur, policy.Proposal(r.settings, r.throughput_gain, r.memory_gain), spec.control,
                     spec.batching, manifests.pool_bounds(spec, role), state,
                     memory_for_cap=lambda cap: decide.memory_for_cap(spec, latest, cap)[:2], round_cap=round_cap,
                     gains_for=lambda target: decide.gains(spec, cal_out.calibration, latest, cur, target))
    if d.action == policy.APPLY and spec.enforce:
        _apply_primary(t, pools[role], d, cur, external)
    elif d.action == policy.APPLY:
        t.decision("Advised", "advise mode, not applied: " + d.message, action=d.action, target=d.target,
                   restart_cost=d.restart)
    else:
        t.decision(d.reason, d.message, action=d.action, target=d.target, restart_cost=d.restart)
    if spec.disaggregated and r.allocation.get("prefillReplicas") and "prefill" in pools:
        _prefill_replicas(t, pools["prefill"], int(r.allocation["prefillReplicas"]), state)
    return t.finish()


def _api_errors(t: _Tick) -> None:
    """The ApiError condition: True naming the first failed write of this tick (or the last
    tick's status write), with a Warning Event and the api_errors counter; False otherwise."""
    failures = list(t.g.api_failures) + ([t.g.status_write_failure] if t.g.status_write_failure else [])
    for f in t.g.api_failures:
        t.m.inc("api_errors", f.verb, f.resource, str(f.code))
    if not failures:
        # (absent until a write first fails: fewer bytes a tick)
        if status_helpers.get_condition(t.conds, status_helpers.API_ERROR):
            t.condition(status_helpers.API_ERROR, False, "WritesSucceeded", "the operator's API writes succeed again")
        return
    f = failures[0]
    reason = ("StatusWriteFailed" if f is t.g.status_write_failure and not t.g.api_failures
              else f"{f.verb.capitalize()}Failed")
    message = "; ".join(map(str, failures))[:900]
    prev = status_helpers.get_condition(t.conds, status_helpers.API_ERROR) or {}
    t.condition(status_helpers.API_ERROR, True, reason, message)
    if t.g.api_failures and not (prev.get("status") == "True" and prev.get("message") == message):
        t.events.append(Event("Warning", reason, message))


def _observation_held(t: _Tick, main: PoolWindow) -> bool:
    """Count failed observations in status and hold on them, or on a stale last usable window.
    True when the tick holds here (Degraded names why)."""
    g, spec, now_s, labels = t.g, t.spec, t.now_s, t.labels
    failed = [p for p in g.pools if p.outcome in FAILED]
    fails = dict(t.status.get("observationFailures") or {})
    consecutive = int(fails.get("consecutive") or 0)
    if failed:
        p = failed[0]
        consecutive += 1
        fails = {"consecutive": consecutive, "lastReason": p.outcome,
                 "lastMessage": "; ".join(f"{q.role}: {q.message}" for q in failed)[:900],
                 "lastTime": status_helpers.iso(now_s)}
        t.out["observationFailures"] = fails
        for q in failed:
            t.m.inc("observation_failures", *labels, q.outcome)
    elif consecutive and main.outcome in (OBSERVED, IDLE):
        consecutive = 0
        t.out["observationFailures"] = {**fails, "consecutive": 0}
    t.m.set("observation_consecutive_failures", consecutive, *labels)

    last = dict(t.status.get("lastWindow") or {})
    if main.outcome in (OBSERVED, IDLE, UNUSABLE):
        last = status_helpers.compact({"pool": main.role, "outcome": main.outcome, "time": status_helpers.iso(now_s),
                                       "usableTime": status_helpers.iso(now_s) if main.outcome != UNUSABLE
                                       else last.get("usableTime")})
        t.out["lastWindow"] = last
    usable_s = status_helpers.parse_iso(last.get("usableTime")) if last.get("usableTime") else None
    if usable_s is not None:
        t.m.set("observation_age", now_s - usable_s, *labels)

    if consecutive:
        reason = fails.get("lastReason") or UNUSABLE
        what = fails.get("lastMessage", "")
        message = (f"{consecutive} failed observation(s) since the last usable window, the last "
                   f"{fails.get('lastTime')}: {what}; keeping the last good state")[:900]
        t.condition(status_helpers.DEGRADED, True, reason, message)
        t.decision(reason, message, "Warning")
        return True
    if usable_s is not None and now_s - usable_s > spec.control.max_observation_age_s:
        message = (f"the last usable window closed {now_s - usable_s:.0f}s ago (> maxObservationAge "
                   f"{spec.control.max_observation_age_s:.0f}s): {main.message or main.outcome}; "
                   f"keeping the last good state")[:900]
        t.condition(status_helpers.DEGRADED, True, STALE, message)
        t.decision(STALE, message, "Warning")
        return True
    return False


def _apply_primary(t: _Tick, pool: reconcile.PoolState, d: policy.Decision, cur: manifests.EngineSettings,
                   external: bool) -> None:
    role, labels = pool.pool.role, t.labels
    if pool.adoption is not None and pool.adoption.advise_only:
        t.decision("Advised", f"advise only, not applied (Deployment {pool.pool.name}: "
                              f"{pool.adoption.why_advise_only}): " + d.message, action=d.action, target=d.target)
        return
    restart = not policy.only_replicas_changed(cur, d.target)
    record = {**settings_status(d.target), "time": status_helpers.iso(t.now_s), "reason": d.reason, "restart": restart}
    if pool.adoption is not None:  # only the managed flags of the user's container, strategic merge
        body = settings_patch(pool.deployment, pool.adoption.container, d.target, set_replicas=not external)
        content_type = STRATEGIC
    else:
        body, content_type = manifests.with_settings(pool.deployment, d.target, set_replicas=not external), MERGE
    body = {**body, **applied_record.annotation_patch(record)}
    rollback = {"applied": t.out["applied"]}
    t.out["applied"] = {**record, "pool": role}
    decisions_before = len(t.m.updates), len(t.events)
    t.decision("Applied", d.message, action=d.action, target=d.target, restart_cost=d.restart)
    # the decision's Event and counter follow the patch: on failure the hold is recorded instead
    metrics = t.m.updates[decisions_before[0]:]
    events = t.events[decisions_before[1]:]
    del t.m.updates[decisions_before[0]:], t.events[decisions_before[1]:]
    metrics += [MetricUpdate("set", "applied_max_num_seqs", (*labels, role), float(d.target.max_num_seqs)),
                MetricUpdate("set", "applied_gpu_memory_utilization", (*labels, role),
                             float(d.target.gpu_memory_utilization))]
    if restart:
        metrics.append(MetricUpdate("inc", "restarts", (*labels, d.reason), 1.0))
    t.patches.append(DeploymentPatch(role, pool.pool.name, body, rollback, tuple(events), tuple(metrics),
                                     content_type))


def _prefill_replicas(t: _Tick, pre: reconcile.PoolState, want: int, state: policy.GuardState) -> None:
    """SARA's prefill pool size, through the same guards (a replica change restarts no pod)."""
    spec, labels = t.spec, t.labels
    cur = pre.settings
    target = manifests.EngineSettings(cur.max_num_seqs, cur.gpu_memory_utilization, cur.kv_cache_memory_bytes, want)
    d = policy.guard(cur, policy.Proposal(target, 0.0, 0.0), spec.control, spec.batching,
                     manifests.pool_bounds(spec, "prefill"),
                     dataclasses.replace(state, replicas_external=pre.ownership.external))
    decision = {"reason": d.reason, "message": d.message, "replicas": d.target.replicas}
    alloc = t.out.setdefault("allocation", {})
    advise_only = pre.adoption is not None and pre.adoption.advise_only
    if d.action == policy.APPLY and spec.enforce and not pre.ownership.external and not advise_only:
        now = status_helpers.iso(t.now_s)
        rollback = {"applied": dict(t.out["applied"]), "allocation": {**alloc, "prefillDecision": decision}}
        record = {"replicas": d.target.replicas, "time": now, "reason": d.reason, "restart": False}
        body = {"spec": {"replicas": d.target.replicas}, **applied_record.annotation_patch(record)}
        t.out["applied"] = {**t.out["applied"], "prefill": {"replicas": d.target.replicas, "time": now},
                            "time": now}  # one cooldown for the whole deployment
        alloc["prefillDecision"] = {**decision, "reason": "Applied"}
        t.patches.append(DeploymentPatch(
            "prefill", pre.pool.name, body, rollback,
            (Event("Normal", "Applied", f"prefill pool {pre.pool.name}: replicas {cur.replicas}->{d.target.replicas}"
                                        f" (SARA wants {want}){' (step limited)' if d.step_limited else ''}"),),
            (MetricUpdate("set", "replicas", (*labels, "prefill"), float(d.target.replicas)),
             MetricUpdate("inc", "decisions", (*labels, "Applied"), 1.0))))
    elif d.action == policy.APPLY and advise_only:
        alloc["prefillDecision"] = {**decision, "reason": "Advised", "message": (
            f"advise only, not applied (Deployment {pre.pool.name}: {pre.adoption.why_advise_only}): {d.message}")}
    else:
        alloc["prefillDecision"] = decision


def stabilised_replicas(want: int, want_down: int, history, current: int, now_s: float, window_s: float,
                        cooldown_s: float, min_recommendations: int = 1) -> tuple[int, list]:
    """(replicas, the history to keep in ``status.scaleDownRecommendations``).

    A pool grows to ``want`` at once. It shrinks only to the highest scale-down recommendation
    (sized for the rate plus the hysteresis band) of the last ``window_s``, once that window
    holds ``min_recommendations`` of them (a pool just taken over, or whose history was lost,
    does not shrink on one window), and never within ``cooldown_s`` of growing (a scale-up is
    kept in the history for the cooldown: no count is left and taken again within it).
    ``history``: ``[{"recommendedUnixSeconds", "replicas", "scaleUp"?}, ...]`` (the positional
    ``[unixSeconds, replicas, 1?]`` of earlier versions read too); unreadable entries are
    dropped."""
    kept: list[tuple[float, int, bool]] = []
    for e in history or []:
        try:
            if isinstance(e, dict):
                t_s, n, up = float(e["recommendedUnixSeconds"]), int(e["replicas"]), bool(e.get("scaleUp", False))
            else:
                t_s, n, up = float(e[0]), int(e[1]), len(e) > 2 and bool(e[2])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if 0.0 <= now_s - t_s < (cooldown_s if up else window_s):
            kept.append((t_s, n, up))

    def as_status(entries):
        return [{"recommendedUnixSeconds": t_s, "replicas": n, **({"scaleUp": True} if up else {})}
                for t_s, n, up in entries]
    if want > current:
        return want, as_status(kept + [(now_s, int(want), True)])
    kept.append((now_s, int(want_down), False))
    if want == current or sum(not up for _, _, up in kept) < min_recommendations:
        return current, as_status(kept)
    return min(current, max(want, *(n for _, n, _ in kept))), as_status(kept)


def scale_down_window_s(spec: LLMDeploymentSpec, restart_s: float) -> float:
    """How long a pod no longer needed is kept: as long as starting it again takes (an idle pod
    costs its GPU-seconds; one started again costs ``restart_s`` of them loading before it serves:
    the ski-rental break-even), at least three control windows, at most the cooldown."""
    return min(spec.control.cooldown_s, max(restart_s, 3.0 * spec.control.interval_s))


def watched_long_enough(spec: LLMDeploymentSpec, ring, now_s: float) -> bool:
    """Whether the pool's windows in the ring reach a cooldown back (or fill the ring): before
    that, its traffic's swings are unknown and it is not shrunk (a pool just taken over is
    sized for a peak kneecap has not seen)."""
    if len(ring) >= spec.control.observation_history:
        return True
    starts = [o.t_end_s - o.window_s for o in ring]
    return bool(starts) and now_s - min(starts) >= spec.control.cooldown_s


def min_scale_down_recommendations(spec: LLMDeploymentSpec, restart_s: float) -> int:
    """Recommendations a scale-down window must hold before a pool shrinks: one per control
    interval it spans (at least three, as the window spans at least three)."""
    return max(3, int(scale_down_window_s(spec, restart_s) // spec.control.interval_s))


def _restart_cost(t: _Tick, pool: reconcile.PoolState, obs: Observation) -> restart.RestartCost:
    """The pool's restart cost: this tick's creation → Ready measurement (kept in
    ``status.restartCost``), else the last one kept, else the model (weights / load bandwidth +
    start-up); the window's throughput; the live Deployment's rollout."""
    role = pool.pool.role
    kept = dict(t.status.get("restartCost") or {})
    window = next((p for p in t.g.pools if p.role == role), None)
    measured = restart.pool_restart_s(list(window.start_to_ready_s)) if window else None
    if measured is not None:
        kept[role] = {"seconds": round(measured, 1), "source": restart.MEASURED, "time": status_helpers.iso(t.now_s)}
        t.out["restartCost"] = kept
    last = kept.get(role) or {}
    try:
        seconds, source = float(last["seconds"]), restart.MEASURED
        if not (seconds > 0 and np.isfinite(seconds)):
            raise ValueError(seconds)
    except (KeyError, TypeError, ValueError):
        from kneecap.model.parallel import weight_bytes_per_gpu

        seconds = restart.modelled_restart_s(weight_bytes_per_gpu(get_arch(t.spec.model.architecture),
                                                                  decide.model_tp(t.spec)))  # each GPU loads its shard
        source = restart.MODELLED
    return restart.RestartCost(seconds, source, obs.prompt_tok_s + obs.generation_tok_s, pool.settings.replicas,
                               t.spec.control.cooldown_s, restart.leaves_no_ready_pod(pool.deployment),
                               t.spec.control.released_memory_value,
                               saturated=restart.saturated(obs, pool.settings.max_num_seqs))


def _replicas(t: _Tick, cal, obs: Observation, current: int, restart_s: float, ring=(), settings=None):
    spec = t.spec
    if spec.disaggregated:
        alloc = decide.disaggregated_allocation(spec, cal, obs)
        return alloc["decodeReplicas"], "sara:" + str(alloc["binding"].get("decode", "")), alloc
    served = decide.served_rate_per_replica(spec, ring, obs)
    n, binding, alloc = decide.colocated_replicas(spec, cal, obs, served_rps=served, settings=settings,
                                                  gauss_runs=t.gauss_runs)
    if alloc:  # GAUSS found λ*: outside the hysteresis band only, a scale-down stabilised (stabilised_replicas)
        band = lambda f: decide.colocated_replicas(  # noqa: E731
            spec, cal, dataclasses.replace(obs, request_rate_rps=obs.request_rate_rps * f), served_rps=served,
            settings=settings, gauss_runs=t.gauss_runs)[0]
        n_down = band(1.0 + spec.control.hysteresis)
        if n > current:
            n = max(current, band(1.0 / (1.0 + spec.control.hysteresis)))
        n, t.out["scaleDownRecommendations"] = stabilised_replicas(
            n, n_down, t.status.get("scaleDownRecommendations"), current, t.now_s,
            scale_down_window_s(spec, restart_s), spec.control.cooldown_s,
            min_recommendations=min_scale_down_recommendations(spec, restart_s))
        if n < current and not watched_long_enough(spec, ring, t.now_s):
            n = current
        # the cost of the replicas kept, each of its GPUs
        alloc = {**alloc, "replicas": n,
                 "costPerHour": round(n * spec.gpus_per_replica * max(spec.accelerator.cost_per_hour, 1e-9), 4)}
    return n, "gauss:" + str(binding), alloc


def _export_spec(t: _Tick) -> None:
    spec, labels = t.spec, t.labels
    t.m.set("efficiency_floor", spec.batching.efficiency_floor, *labels)
    t.m.set("slo_quantile", spec.slo.quantile, *labels)
    for kind, v in (("ttft", spec.slo.ttft_s), ("tpot", spec.slo.tpot_s), ("e2e", spec.slo.e2e_s)):
        if v is None:
            t.m.drop("slo_target", *labels, kind)
        else:
            t.m.set("slo_target", v, *labels, kind)


def _export_curve(t: _Tick, role: str, cal: calibrate.Calibration, obs: Observation) -> None:
    """The calibrated curve at CURVE_BATCHES (≤ maxMaxNumSeqs), the efficiency T(B)/(B·T(1)) at
    the observed batch (paper 000, eq. 13) and the prediction at the window's own batch (the fit
    checked against the window it has just seen): one SLIM evaluation (eq. 6)."""
    spec, labels = t.spec, t.labels
    batch = np.array([b for b in CURVE_BATCHES if b <= spec.batching.max_max_num_seqs], float)
    b_obs = max(decide.observed_batch(obs), 1e-3)  # as decide.fit_rows reads it
    b_eff = _efficiency_batch(obs)
    try:
        thr = slim_curve(cal, spec, obs, np.concatenate([batch, [1.0, b_eff, b_obs]]))
    except (InputError, ValueError, FloatingPointError) as exc:
        log.warning("SLIM curve for %s/%s: %s", labels[0], labels[1], exc)
        return
    t1, t_eff, t_obs = (float(x) for x in thr[len(batch):])
    for b, thr_b in zip(batch, thr):
        if np.isfinite(thr_b):
            t.m.set("predicted_curve", float(thr_b), *labels, role, str(int(b)))
    eff = _efficiency(t1, t_eff, b_eff)
    if np.isfinite(eff):
        t.m.set("batching_efficiency", eff, *labels, role)
    if np.isfinite(t_obs):
        t.m.set("predicted_throughput", t_obs, *labels, role)
    for b in CURVE_BATCHES:
        if b > spec.batching.max_max_num_seqs:
            t.m.drop("predicted_curve", *labels, role, str(b))


def _export_recommendation(t: _Tick, role: str, r: decide.Recommendation) -> None:
    labels = t.labels
    t.m.set("recommended_max_num_seqs", r.max_num_seqs, *labels, role)
    t.m.set("recommended_gpu_memory_utilization", r.gpu_memory_utilization, *labels, role)
    t.m.set("memory_released_bytes", r.released_bytes, *labels, role)
    t.m.set("knee_batch", r.knee_batch, *labels, role)
    t.m.set("recommended_throughput", r.pred_throughput_tok_s, *labels, role)
