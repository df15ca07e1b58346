"""The decision of one control tick, a pure function (DESIGN §4; STYLE: gather → plan → apply).

``plan(gathered, status, spec, now_s)`` turns what the tick gathered (the pools as reconcile
left them, each pool's window, the parsed observation ring, the API calls that failed) and the
resource's status into the new status, the Events to post, the metric updates and at most one
Deployment patch per pool. No I/O and no clock: :mod:`kneecap.control.loop` gathers and applies.

A decision needs a usable window no older than ``spec.control.maxObservationAge``: a failed
scrape or an unusable window (garbage, NaN, a truncated page, missing families, counter resets)
holds with ``Degraded`` naming it until a usable window closes; idle windows are usable (there
is just nothing to decide). A patch carries the `kneecap.io/applied` record (see applied.py).

Its parts live beside it: the camelCase status blocks in :mod:`~kneecap.control.status_codec`,
the metric updates in :mod:`~kneecap.control.plan_metrics`, the SLO verdicts in
:mod:`~kneecap.control.slo` and when a pool may shrink in :mod:`~kneecap.control.replica_stabilisation`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kneecap.control import applied as applied_record, cudagraph, decide, gauss_reuse, manifests, policy, reconcile
from kneecap.control import restart, slo_budget, status as status_helpers, workload_estimate
from kneecap.control.kube import MERGE
from kneecap.control.metric_series import Series
from kneecap.control.plan_metrics import MetricCollector, export_curve, export_recommendation, export_spec, slim_curve
from kneecap.control.replica_stabilisation import (min_scale_down_recommendations, load_margin, rising_rate_rps,
                                                   scale_down_window_s, stabilised_replicas, watched_long_enough)
from kneecap.control.slo import slo_attainment, slo_met
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.control.status_codec import (calibration_from_status, calibration_to_status, ownership_status,
                                          settings_status, workload_from_status)
from kneecap.control.target import STRATEGIC, settings_patch
from kneecap.control.tick import (FAILED, IDLE, OBSERVED, RECONCILE_FAILED, STALE, UNUSABLE, DeploymentPatch, Event,
                                  FailedWrite, MetricUpdate, Plan, PoolWindow, ReconcileWrite, TickInput,
                                  decision_status)
from kneecap.model.arch import get_arch
from kneecap.observe import pool as obs_pool
from kneecap.observe.observation import Observation

log = logging.getLogger("kneecap.plan")

# ---------------------------------------------------------------- small pure helpers

def primary_role(spec: LLMDeploymentSpec) -> str:
    """The pool whose batch cap BCA sets: the decode pool, or the only pool."""
    return "decode" if spec.disaggregated else "server"


def target_tensor_parallel_size(g: "TickInput", spec: LLMDeploymentSpec) -> int | None:
    """--tensor-parallel-size of the primary pool's adopted container (None: unread)."""
    role = primary_role(spec)
    p = next((p for p in g.pools if p.state.pool.role == role and p.state.adoption is not None), None)
    return None if p is None else p.state.adoption.tensor_parallel_size


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
    m: MetricCollector = field(default_factory=MetricCollector)
    events: list = field(default_factory=list)
    patches: list = field(default_factory=list)
    reconcile_writes: tuple = ()  # reconcile.ObjectWrite, sent before the patches
    gauss_runs: gauss_reuse.GaussRuns | None = None  # the loop's past GAUSS runs (decide.colocated_replicas)
    budget: slo_budget.Budget = field(default_factory=slo_budget.Budget)  # the SLO's error budget (slo_budget)

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
        self.m.inc(Series.DECISIONS, *self.labels, reason)
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
        for patch in reversed(self.patches):  # a failed write's later ones are not sent either
            undone = {**undone, **patch.rollback}
            failed = FailedWrite({**self.out, **undone}, self.g.generation, self.now_s, self.labels)
            patches.insert(0, dataclasses.replace(patch, if_failed=failed))
        writes = tuple(ReconcileWrite(w, FailedWrite(
            {**self.out, **undone}, self.g.generation, self.now_s, self.labels, RECONCILE_FAILED,
            f"not acting until the pools reconcile: the {w.verb} of {w.kind} {w.name} failed"))
            for w in self.reconcile_writes)
        return Plan(self.out, tuple(self.events), tuple(self.m.updates), tuple(patches), writes)


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
    export_spec(t)
    if g.live is not None and g.owner is not None:  # the owned objects brought to the spec first
        t.reconcile_writes = tuple(reconcile.plan_reconcile(g.owner, spec, g.live, g.known_in_sync).writes)
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
        t.m.inc(Series.SCRAPE_FAILURES, *labels, amount=p.scrape_errors)
        t.m.set(Series.REPLICAS, p.state.settings.replicas, *labels, p.role)
        t.m.set(Series.APPLIED_MAX_NUM_SEQS, p.state.settings.max_num_seqs, *labels, p.role)
        t.m.set(Series.APPLIED_GPU_MEMORY_UTILIZATION, p.state.settings.gpu_memory_utilization, *labels, p.role)

    # the ring: this tick's observations appended as they are (status keeps them across restarts)
    ring = list(g.ring)
    for p in g.pools:
        if p.observation is not None:
            engine = {k: v for k, v in settings_status(p.state.settings).items() if k != "replicas"}
            entry = {"pool": p.role, "engine": engine,
                     **status_helpers.ring_entry(p.observation, decide.p95_targets(spec))}
            ring = (ring + [(entry, p.observation if p.role == role else None)])[-spec.control.observation_history:]
    if any(p.observation is not None for p in g.pools) or "observations" not in status:
        t.out["observations"] = [e for e, _ in ring]  # (unchanged, it is not re-sent: most of the status)
    observations = [o for _, o in ring if o is not None]
    t.budget = slo_budget.from_status(status.get("sloBudget"))
    main_window = next((p.observation for p in g.pools if p.role == role and p.observation is not None), None)
    if main_window is not None and main_window.slo_missed_fraction is not None:
        t.budget = slo_budget.updated(t.budget, main_window.request_rate_rps, main_window.slo_missed_fraction,
                                      now_s, spec.control.interval_s, spec.control.window_s)
        t.out["sloBudget"] = t.budget.to_status()

    main = next((p for p in g.pools if p.role == role), None)
    if main is None:
        why = ("; ".join(c.message for c in g.conflicts) or "; ".join(map(str, g.api_failures))
               or "; ".join(g.missing_targets) or f"no {role} pool")
        reason = ("OwnershipConflict" if g.conflicts else RECONCILE_FAILED if g.reconcile_failed
                  else "TargetMissing" if g.missing_targets else "PoolMissing")
        t.decision(reason, f"not acting: {why}", "Warning")
        return t.finish()
    if main.observation is not None:
        t.out["workload"] = {"pool": role, **status_helpers.rounded(obs_pool.to_status(main.observation))}
        per_pod = (main.observation.prompt_tok_s + main.observation.generation_tok_s) / max(main.observation.pods, 1)
        t.m.set(Series.OBSERVED_THROUGHPUT, per_pod, *labels, role)
        ok = slo_met(spec, main.observation)
        if ok is not None:
            t.condition(status_helpers.SLO_MET, ok[0], "SLOMet" if ok[0] else "SLOMissed", ok[1])
        t.m.set(Series.SLO_ATTAINMENT, slo_attainment(spec, observations), *labels)

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
        t.m.set(Series.CALIBRATION_ERROR, cal_out.error, *labels)
        if accepted:
            t.m.set(Series.CALIBRATION_TIMESTAMP, status_helpers.parse_iso(accepted), *labels)
        if main.observation is not None:
            export_curve(t, role, cal_out.calibration, main.observation)
    if main.outcome == IDLE:  # no running batch to be past the knee with
        t.m.drop(Series.BATCHING_EFFICIENCY, *labels, role)
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
    restart_cost = _restart_cost(t, pools[role], latest, observations)
    # the length mix the models are asked about: the latest window's, pooled with the windows of the
    # same mix before it (kneecap.control.workload_estimate); rates and tails stay the latest window's
    workload, _ = workload_estimate.pooled(latest, observations)
    try:
        r = decide.recommend(spec, role, cal_out.calibration, workload, cur)
        r = _memory_for_replicas(t, cal_out.calibration, workload, cur, r)
        # replicas sized at the cap and memory the recommendation applies (GAUSS's engine limits)
        replicas, rbind, alloc = _replicas(t, cal_out.calibration, workload, cur.replicas, restart_cost.restart_s,
                                           observations, settings=r.settings, live=cur)
        r = dataclasses.replace(r, replicas=int(replicas), replicas_binding=rbind, allocation=dict(alloc or {}))
    except Exception as exc:  # noqa: BLE001 - a model failure must not take the operator down
        log.exception("decision failed for %s/%s", *labels)
        t.condition(status_helpers.DEGRADED, True, "ModelError", f"{type(exc).__name__}: {exc}"[:900])
        t.decision("ModelError", f"{type(exc).__name__}: {exc}", "Warning")
        return t.finish()
    t.out["recommendation"] = r.to_status()
    if r.allocation:
        t.out["allocation"] = dict(r.allocation)
    export_recommendation(t, role, r)
    if main.observation is not None:
        t.m.set(Series.KNEE_THROUGHPUT,
                float(slim_curve(cal_out.calibration, spec, main.observation, np.array([r.knee_batch]))[0]),
                *labels, role)

    records = {p.role: applied_record.from_deployment(p.state.deployment) for p in g.pools}
    applied = applied_record.newest(status.get("applied"), records.get(role))
    t.out["applied"] = {**applied, **settings_status(cur), "pool": role}
    if g.reconcile_failed or g.conflicts or g.missing_targets:
        why = "; ".join([str(f) for f in g.api_failures] + [c.message for c in g.conflicts] + list(g.missing_targets))
        t.decision("OwnershipConflict" if g.conflicts else RECONCILE_FAILED if g.reconcile_failed
                   else "TargetMissing", f"not acting until the pools reconcile: {why}", "Warning")
        return t.finish()

    adoption = pools[role].adoption
    advise = not spec.enforce or (adoption is not None and adoption.advise_only)
    standing = _standing_advice(status, cur, role) if advise else None
    last_applied_s = applied_record.last_applied_s(applied, records.values())
    if standing is not None:  # advise mode guards against its last advice as enforce does against what it applied
        last_applied_s = max(last_applied_s or standing.time_s, standing.time_s)
    base = standing.target if standing is not None else cur
    state = policy.GuardState(
        now_s=now_s, last_applied_s=last_applied_s,
        rollout_in_progress=any(s.rollout_in_progress for s in states),
        n_observations=len(observations), fit_ok=cal_out.ok, fit_message=cal_out.message,
        replicas_external=external, restart=restart_cost)
    round_cap = None if cudagraph.eager(pools[role].engine_container) else (
        lambda cap: cudagraph.round_cap(cap, spec.batching.min_max_num_seqs, spec.batching.max_max_num_seqs))
    guard = lambda proposal: policy.guard(  # noqa: E731
        base, proposal, spec.control, spec.batching, manifests.pool_bounds(spec, role), state,
        memory_for_cap=lambda cap: decide.memory_for_cap(spec, workload, cap)[:2], round_cap=round_cap,
        gains_for=lambda target: decide.gains(spec, cal_out.calibration, workload, base, target),
        replicas_saved_for=None if spec.disaggregated else (  # SARA sizes disaggregated pools
            lambda target: _replicas_saved(t, cal_out.calibration, workload, base, target)))
    d = guard(policy.Proposal(r.settings, r.throughput_gain, r.memory_gain))
    if not spec.disaggregated and _flags(r.settings) != _flags(base) and (
            d.action == policy.HOLD or _flags(d.target) == _flags(base)):
        d = _replicas_at_held_flags(t, d, guard, base, cal_out.calibration, workload, restart_cost.restart_s,
                                    observations)
    if d.action == policy.APPLY and not advise:
        _apply_primary(t, pools[role], d, cur, external)
    elif d.action == policy.APPLY:
        why = (f"advise only, not applied (Deployment {pools[role].pool.name}: {adoption.why_advise_only}): "
               if spec.enforce else "advise mode, not applied: ")
        t.out["advised"] = {"pool": role, "from": settings_status(cur), "target": settings_status(d.target),
                            "time": status_helpers.iso(now_s), "message": (why + d.message)[:900]}
        t.decision("Advised", why + d.message, action=d.action, target=d.target, restart_cost=d.restart)
    elif standing is not None:  # the advice stands (its Event is not posted again)
        t.decision("Advised", f"{standing.message} (advised {status_helpers.iso(standing.time_s)}; a new advice "
                              f"is held: {d.reason})"[:900], action=policy.APPLY, target=standing.target)
    else:
        t.decision(d.reason, d.message, action=d.action, target=d.target, restart_cost=d.restart)
    if status.get("advised") and standing is None and "advised" not in t.out:
        t.out["advised"] = None  # enforce mode now, or advised from settings the pool no longer runs
    if spec.disaggregated and r.allocation.get("prefillReplicas") and "prefill" in pools:
        _prefill_replicas(t, pools["prefill"], int(r.allocation["prefillReplicas"]), state)
    return t.finish()


def _gauss_replicas(t: _Tick, cal, obs: Observation, settings: manifests.EngineSettings) -> float:
    return decide.gauss_replicas(t.spec, cal, obs, settings, gauss_runs=t.gauss_runs)


def _replicas_saved(t: _Tick, cal, obs: Observation, live: manifests.EngineSettings,
                    target: manifests.EngineSettings) -> int:
    """Whole replicas GAUSS sizes for the window at the ``live`` flags beyond those at
    ``target``'s (negative: the target needs more): what a flag change is worth in the SLO's
    GPUs (:meth:`kneecap.control.restart.RestartCost.gain_tokens`)."""
    return _whole_replicas_saved(_gauss_replicas(t, cal, obs, live), _gauss_replicas(t, cal, obs, target),
                                 live.replicas)


def _whole_replicas_saved(at_live: float, at_target: float, live_replicas: int) -> int:
    """:func:`_replicas_saved` from GAUSS's counts at the live flags and at the target's."""
    if math.isinf(at_live) and math.isinf(at_target):
        return 0
    if math.isinf(at_target):
        return -max(live_replicas, 1)
    if math.isinf(at_live):  # no load meets the SLO at the live flags: every replica beyond the target's
        return max(live_replicas - math.ceil(at_target), 1)
    return math.ceil(at_live) - math.ceil(at_target)


def _memory_for_replicas(t: _Tick, cal, obs: Observation, cur: manifests.EngineSettings, r: decide.Recommendation):
    """BCA's recommendation, or, where the KV cache bounds the live batch below the live cap
    (:func:`decide.kv_bound`), the live cap at the most memory a pod may reserve when GAUSS sizes
    fewer replicas for the window there than at both BCA's flags and the live ones. BCA's cap
    keeps each request's latency at the knee; where the cache, not the cap, limits a pod, the
    memory flag decides how many pods the SLO costs (a TP-2 70B on H100s holds twice the KV
    at 0.95 as at vLLM's 0.9), and the fewest pods is the aim."""
    spec = t.spec
    if spec.disaggregated or not decide.kv_bound(spec, obs, cur):
        return r
    more = decide.most_kv_settings(spec, obs, cur)
    if more is None:
        return r
    at = {name: _gauss_replicas(t, cal, obs, s) for name, s in (("live", cur), ("bca", r.settings), ("kv", more))}
    if math.isinf(at["kv"]) or math.ceil(at["kv"]) >= min(math.ceil(at["live"]), math.ceil(at["bca"])):
        return r
    return decide.recommend_at(spec, r, cal, obs, cur, more, "kv_capacity",
                               replicas_saved=_whole_replicas_saved(at["live"], at["kv"], cur.replicas))


def _flags(s: manifests.EngineSettings) -> tuple:
    return s.max_num_seqs, round(s.gpu_memory_utilization, 3), s.kv_cache_memory_bytes


def _replicas_at_held_flags(t: _Tick, d: policy.Decision, guard, base: manifests.EngineSettings, cal, obs: Observation,
                            restart_s: float, ring) -> policy.Decision:
    """The guard held the recommended flags (cooldown, a restart that does not pay, …): the pool
    keeps running at ``base``'s cap and memory, so its replicas are sized by GAUSS at those, not
    at the recommendation's (a smaller cap sustains less per pod and would ask for pods the
    live engines do not need). The replica change is guarded again on its own."""
    replicas, binding, alloc = _replicas(t, cal, obs, base.replicas, restart_s, ring, settings=base)
    if alloc:
        t.out["allocation"] = dict(alloc)
    alone = guard(policy.Proposal(dataclasses.replace(base, replicas=int(replicas)), 0.0, 0.0))
    held = f"flags held ({d.reason}): {d.message}"
    if alone.action == policy.APPLY:
        return dataclasses.replace(alone, message=f"replicas {base.replicas}->{alone.target.replicas} at the live "
                                                  f"cap {base.max_num_seqs} ({binding}); {held}",
                                   restart=d.restart)
    if d.action == policy.APPLY:  # the replicas it sized at the recommended flags are not needed at the live ones
        return policy.Decision(policy.HOLD, "NoChange", f"replicas stay {base.replicas} at the live cap "
                                                        f"{base.max_num_seqs} ({binding}); {held}", base,
                               restart=d.restart)
    return d


def _api_errors(t: _Tick) -> None:
    """The ApiError condition: True naming the first failed write of this tick (or the last
    tick's status write), with a Warning Event and the api_errors counter; False otherwise."""
    failures = list(t.g.api_failures) + ([t.g.status_write_failure] if t.g.status_write_failure else [])
    for f in t.g.api_failures:
        t.m.inc(Series.API_ERRORS, f.verb, f.resource, str(f.code))
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
            t.m.inc(Series.OBSERVATION_FAILURES, *labels, q.outcome)
    elif consecutive and main.outcome in (OBSERVED, IDLE):
        consecutive = 0
        t.out["observationFailures"] = {**fails, "consecutive": 0}
    t.m.set(Series.OBSERVATION_CONSECUTIVE_FAILURES, consecutive, *labels)

    last = dict(t.status.get("lastWindow") or {})
    if main.outcome in (OBSERVED, IDLE, UNUSABLE):
        last = status_helpers.compact({"pool": main.role, "outcome": main.outcome, "time": status_helpers.iso(now_s),
                                       "usableTime": status_helpers.iso(now_s) if main.outcome != UNUSABLE
                                       else last.get("usableTime")})
        t.out["lastWindow"] = last
    usable_s = status_helpers.parse_iso(last.get("usableTime")) if last.get("usableTime") else None
    if usable_s is not None:
        t.m.set(Series.OBSERVATION_AGE, now_s - usable_s, *labels)

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


@dataclass(frozen=True)
class StandingAdvice:
    """The last advice of an advise-mode pool (``status.advised``), while the pool still runs the
    settings it was advised from."""

    target: manifests.EngineSettings
    time_s: float
    message: str


def _standing_advice(status: dict, cur: manifests.EngineSettings, role: str) -> StandingAdvice | None:
    """The advice in force, None when there is none or the pool no longer runs the settings it
    was advised from (the user applied it, or something else). Advise mode guards the next advice
    against this one as enforce mode guards against what it applied (cooldown, hysteresis, gain),
    so the advice moves when enforce mode would have acted, not with every window's noise."""
    a = status.get("advised") or {}
    if a.get("pool", "server") != role or a.get("from") != settings_status(cur):
        return None
    try:
        want = a["target"]
        target = manifests.EngineSettings(int(want["maxNumSeqs"]), float(want["gpuMemoryUtilization"]),
                                          int(want["kvCacheMemoryBytes"]) if want.get("kvCacheMemoryBytes") else None,
                                          int(want.get("replicas", cur.replicas)))
        time_s = status_helpers.parse_iso(a["time"])
    except (KeyError, TypeError, ValueError):
        return None
    return None if time_s is None else StandingAdvice(target, time_s, str(a.get("message") or "advised"))


def _apply_primary(t: _Tick, pool: reconcile.PoolState, d: policy.Decision, cur: manifests.EngineSettings,
                   external: bool) -> None:
    role, labels = pool.pool.role, t.labels
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
    metrics += [MetricUpdate("set", Series.APPLIED_MAX_NUM_SEQS, (*labels, role), float(d.target.max_num_seqs)),
                MetricUpdate("set", Series.APPLIED_GPU_MEMORY_UTILIZATION, (*labels, role),
                             float(d.target.gpu_memory_utilization))]
    if restart:
        metrics.append(MetricUpdate("inc", Series.RESTARTS, (*labels, d.reason), 1.0))
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
            (MetricUpdate("set", Series.REPLICAS, (*labels, "prefill"), float(d.target.replicas)),
             MetricUpdate("inc", Series.DECISIONS, (*labels, "Applied"), 1.0))))
    elif d.action == policy.APPLY and advise_only:
        alloc["prefillDecision"] = {**decision, "reason": "Advised", "message": (
            f"advise only, not applied (Deployment {pre.pool.name}: {pre.adoption.why_advise_only}): {d.message}")}
    else:
        alloc["prefillDecision"] = decision


def _restart_cost(t: _Tick, pool: reconcile.PoolState, obs: Observation,
                  observations=()) -> restart.RestartCost:
    """The pool's restart cost: this tick's creation → Ready measurement (kept in
    ``status.restartCost``), else the last one kept, else the model (weights / load bandwidth +
    start-up); the window's throughput; the live Deployment's rollout; the horizon from the
    pool's window history (``observations``, oldest first: :func:`restart.workload_horizon`)."""
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
    horizon = restart.workload_horizon(list(observations), t.spec.control.interval_s, t.spec.control.window_s,
                                       t.spec.control.cooldown_s)
    return restart.RestartCost(seconds, source, obs.prompt_tok_s + obs.generation_tok_s, pool.settings.replicas,
                               horizon.seconds, restart.leaves_no_ready_pod(pool.deployment),
                               t.spec.control.released_memory_value,
                               saturated=restart.saturated(obs, pool.settings.max_num_seqs),
                               horizon_source=horizon.source, horizon_note=horizon.note)


def unserved_scale_up(rate_rps: float, missed_rps: float) -> int:
    """The pods that put the per-pod rate strictly below ``missed_rps``, a rate the pool was
    measured to miss its SLO at with requests of this length mix and has never been measured to
    serve (:func:`decide.served_rate_per_replica` found none): no hysteresis band, which would
    round back to the pods that missed (λ* is that very rate), while a pool that has served this
    mix keeps the band (a window that misses among windows that met is the quantile's own spread)."""
    return math.floor(rate_rps / missed_rps) + 1


def _budget_holds(t: _Tick, obs: Observation, restart_s: float) -> bool:
    """Whether a scale-up waits on the SLO's error budget (:mod:`~kneecap.control.slo_budget`):
    the window's queue is not building (its TTFT p95 within a declared TTFT SLO: the misses are
    a tail the pool will serve through, not a backlog that grows) and the budget absorbs the
    window's surely-missed share until a pod started now could serve. The caller asks only where
    the pool has served this length mix within the SLO (a served rate): a mix it never served is
    no tail to spend on."""
    spec = t.spec
    if not spec.slo.ttft_s or not (obs.ttft_p95_s <= spec.slo.ttft_s):
        return False
    return slo_budget.room_to_hold(t.budget, spec.slo.quantile, obs.request_rate_rps, obs.slo_missed_fraction,
                                   restart_s + spec.control.window_s)


def _replicas(t: _Tick, cal, obs: Observation, current: int, restart_s: float, ring=(), settings=None, live=None):
    """Replicas for ``settings`` (the flags the pool will run); ``live``: the flags the window ran
    with (default ``settings``), at which its tails are read against GAUSS's curves."""
    spec = t.spec
    if spec.disaggregated:
        alloc = decide.disaggregated_allocation(spec, cal, obs)
        return alloc["decodeReplicas"], "sara:" + str(alloc["binding"].get("decode", "")), alloc
    kv = decide.gauss_limits(spec, obs, settings).kv_capacity_tokens if settings is not None else None
    served = decide.served_rate_per_replica(spec, ring, obs, kv_tokens=kv)
    missed = decide.missed_rate_per_replica(spec, ring, obs, kv_tokens=kv)
    factor, _ = decide.measured_rate_factor(spec, cal, obs, live if live is not None else settings,
                                         gauss_runs=t.gauss_runs)
    n, binding, alloc = decide.colocated_replicas(spec, cal, obs, served_rps=served, missed_rps=missed,
                                                  settings=settings, gauss_runs=t.gauss_runs, measured_factor=factor)
    if alloc:  # GAUSS found λ*: outside the hysteresis band only, a scale-down stabilised (stabilised_replicas)
        band = lambda f: decide.colocated_replicas(  # noqa: E731
            spec, cal, dataclasses.replace(obs, request_rate_rps=obs.request_rate_rps * f), served_rps=served,
            missed_rps=missed, settings=settings, gauss_runs=t.gauss_runs, measured_factor=factor)[0]
        # a scale-down holds for the rate a scale-up could next serve, where the rate is rising
        down_window_s = scale_down_window_s(spec, restart_s)
        rising = rising_rate_rps(ring, t.now_s, down_window_s, restart_s + spec.control.window_s)
        ahead = max(rising / max(obs.request_rate_rps, 1e-9), 1.0) if rising is not None else 1.0
        # and for the spread of its work over the scale-down window (spec.control.scaleDownDeviations)
        ahead *= load_margin(ring, t.now_s, down_window_s, spec.control.scale_down_deviations)
        n_down = band((1.0 + spec.control.hysteresis) * ahead)
        if binding == "missed" and served is None and missed:
            n = max(n, unserved_scale_up(obs.request_rate_rps, missed))
        elif n > current:
            n = max(current, band(1.0 / (1.0 + spec.control.hysteresis)))
        if n > current and served is not None and _budget_holds(t, obs, restart_s):
            alloc = {**alloc, "errorBudgetHold": (
                f"replicas {current}->{n} held: the pool's queue is not building (TTFT p95 "
                f"{obs.ttft_p95_s:.3g}s ≤ {spec.slo.ttft_s:g}s) and the last hour's SLO error budget absorbs this "
                f"window's {obs.slo_missed_fraction:.1%} surely missed until a pod could serve "
                f"({t.budget.missed:.0f} of {t.budget.requests:.0f} requests surely missed)")}
            n, binding = current, "error_budget"
        n, t.out["scaleDownRecommendations"] = stabilised_replicas(
            n, n_down, t.status.get("scaleDownRecommendations"), current, t.now_s,
            down_window_s, spec.control.cooldown_s,
            min_recommendations=min_scale_down_recommendations(spec, restart_s))
        if n < current and not watched_long_enough(spec, ring, t.now_s):
            n = current
        # the cost of the replicas kept, each of its GPUs
        alloc = {**alloc, "replicas": n,
                 "costPerHour": round(n * spec.gpus_per_replica * max(spec.accelerator.cost_per_hour, 1e-9), 4)}
    return n, "gauss:" + str(binding), alloc
