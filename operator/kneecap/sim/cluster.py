"""A whole serving cluster in virtual time: arrivals, router, pods, controllers and the operator.

One discrete-event loop advances one simulated clock; nothing reads the wall clock, starts a
thread or sleeps, so the same inputs give byte-identical results on any machine, however
busy. The parts:

* the in-memory Kubernetes API (:mod:`kneecap.emulation.store`) with Deployment and
  ReplicaSet controllers and a node (:mod:`kneecap.sim.engine_node`: the emulations' kubelet)
  whose pods run the twin engine (:mod:`kneecap.sim.engine`) in process;
* a router (a Service with a least-outstanding-requests balancer) over the Ready pods; a
  request that finds no Ready pod waits at the router;
* the real operator: the functions its kopf handlers call (:mod:`kneecap.control.lifecycle`),
  ``on_spec`` when the LLMDeployment is created, then ``on_timer`` (a
  ``kneecap.control.loop.tick`` every ``spec.control.interval``) with ``now`` = the virtual
  clock and a scrape that parses (``kneecap.observe.scrape``) the ``/metrics`` text the pod's
  engine renders (``kneecap.sim.metrics``);
* periodic callbacks (an HPA, samplers) on the same clock.

Engines advance in steps: before an event at time T every engine steps until its clock
reaches T (the last step may end a few milliseconds after T).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kneecap.control import lifecycle, loop
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.kube import resource_path
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.reconcile import InSyncCache
from kneecap.control.replica_stabilisation import read_recommendations
from kneecap.control.spec import GROUP, PLURAL, VERSION
from kneecap.emulation.controllers import DeploymentController, ReplicaSetController
from kneecap.emulation.store import Store
from kneecap.errors import InputError
from kneecap.model.arch import ModelArch
from kneecap.model.hardware import GPU
from kneecap.observe.histogram import HistogramCache
from kneecap.observe.scrape import ParseCache, ScrapeConnectionError, parse_metrics
from kneecap.sim.engine_node import EngineNode, KubeletConfig, PodRuntime
from kneecap.sim.metrics import render_metrics

EPOCH_S = 1_700_000_000.0  # what the virtual clock's 0 reads as (epoch seconds, 2023-11-14T22:13:20Z)
PENDING, DONE, LOST, REJECTED = 0, 1, 2, 3


def llmd_path(ns: str, name: str | None = None) -> str:
    return resource_path(f"{GROUP}/{VERSION}", PLURAL, ns, name)


@dataclass(frozen=True)
class MissBudget:
    """Stop a run once more than ``max_misses`` requests missed the TTFT (or the TPOT) target:
    its SLO quantile can no longer be met (a sweep needs no more of it)."""

    ttft_s: float
    tpot_s: float
    max_misses: int


@dataclass
class Requests:
    """What the clients saw, one entry per trace request (times in run seconds, NaN: never)."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    state: np.ndarray = field(init=False)
    attempts: np.ndarray = field(init=False)

    def __post_init__(self):
        n = self.arrival_s.size
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.state = np.zeros(n, dtype=np.int8)
        self.attempts = np.zeros(n, dtype=np.int32)


class OperatorDriver:
    """The operator's spec handler and control timer for one LLMDeployment, in virtual time: the
    same :mod:`kneecap.control.lifecycle` functions the kopf handlers call, with the virtual
    clock, a scrape of the pods' rendered metrics and the in-memory API. ``tick_s``: the period
    the caller calls :meth:`tick` at (the timer's wake-ups)."""

    def __init__(self, cluster: "VirtualCluster", name: str, *, tick_s: float):
        self.cluster, self.name = cluster, name
        self.mem = loop.LoopMemory()
        self.metrics = OperatorMetrics()
        self.events: list[dict] = []
        self.decisions: list[dict] = []
        self.ticks: list[dict] = []
        self.operator = lifecycle.Operator(kube=cluster.api, metrics=self.metrics, now=cluster.now, tick_s=tick_s,
                                           scrape=self.scrape, gauss_runs=cluster.gauss_runs,
                                           histogram_cache=cluster.histogram_cache, sync_cache=cluster.sync_cache)
        self._aio = asyncio.new_event_loop()
        self.lock = asyncio.Lock()  # (the resource's reconcile lock; nothing here runs concurrently)
        self.logger = logging.getLogger(f"kneecap.sim.operator.{name}")

    def close(self) -> None:
        self._aio.close()

    def _run(self, coro):
        return self._aio.run_until_complete(coro)

    def _event(self, etype: str, reason: str, message: str) -> None:
        self.events.append({"t_s": round(self.cluster.t_s, 3), "type": etype, "reason": reason, "message": message})

    async def scrape(self, url: str):
        host = url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
        rt = self.cluster.node.by_ip.get(host)
        if rt is None or not rt.ready or rt.metrics is None:
            raise ScrapeConnectionError(url, "connection refused (pod not serving)")
        text = render_metrics(rt.metrics, rt.engine)
        return parse_metrics(text, url=url, t_s=self.cluster.now(), keep=loop.WINDOW_FAMILIES,
                             cache=self.cluster.parse_cache)

    def _write_status(self, status: dict) -> None:
        """What kopf does with a handler's status patch once the handler returns."""
        if status:
            self.cluster.api.patch_now(llmd_path(self.cluster.namespace, self.name) + "/status", {"status": status})

    def created(self) -> None:
        """The create handler (lifecycle.on_spec): parse the spec, reconcile the owned objects, write status."""
        body = self.cluster.api.get_now(llmd_path(self.cluster.namespace, self.name))
        status: dict = {}
        self._run(lifecycle.on_spec(self.operator, body, self.lock, "create",
                                    lifecycle.Sink(status, self._event, self.logger)))
        self._write_status(status)

    def tick(self, t_s: float) -> None:
        """The control timer's wake-up (lifecycle.on_timer); an applied decision is recorded."""
        body = self.cluster.api.get_now(llmd_path(self.cluster.namespace, self.name))
        if body is None:
            return
        invalid: dict = {}
        status = self._run(lifecycle.on_timer(self.operator, body, self.mem, self.lock,
                                              lifecycle.Sink(invalid, self._event, self.logger)))
        self._write_status(invalid)
        if status is None:
            return
        d = status.get("lastDecision") or {}
        self.decisions.append({"t_s": round(t_s, 3), "reason": d.get("reason"), "action": d.get("action"),
                               "target": d.get("target"), "applied": d.get("reason") == "Applied"})
        self.ticks.append(tick_summary(t_s, status))


def tick_summary(t_s: float, status: dict) -> dict:
    """What one control tick's status says about the pool's size and flags: its decision and the
    target it weighed, the flags and replicas live after it, the replicas GAUSS sized (before the
    spec's bounds) and why (λ* per replica, the measured floor and ceiling on it, the rate it
    sized for), the fewest replicas the scale-down stabilisation lets the pool shrink to, and the
    calibration's error; a field is None where the tick wrote none."""
    alloc = status.get("allocation") or {}
    decision = status.get("lastDecision") or {}
    return {"t_s": round(t_s, 3), "decision": decision.get("reason"), "target": _flags(decision.get("target")),
            "live": _flags(status.get("applied")), "replicas_sized": alloc.get("replicas"),
            "replicas_binding": alloc.get("binding"),
            "scale_down_floor": _scale_down_floor(status.get("scaleDownRecommendations")),
            "sustainable_rps_per_replica": alloc.get("sustainableRequestsPerSecondPerReplica"),
            "served_rps_per_replica": alloc.get("servedRequestsPerSecondPerReplica"),
            "missed_rps_per_replica": alloc.get("missedRequestsPerSecondPerReplica"),
            "measured_rate_factor": alloc.get("measuredRateFactor"),
            "observed_rps": alloc.get("observedRequestsPerSecond"),
            "calibration_error_pct": (status.get("calibration") or {}).get("meanErrorPercent")}


def _scale_down_floor(history) -> int | None:
    """The highest recommendation kept in status.scaleDownRecommendations (a scale-up's included,
    kept for the cooldown): a pool shrinks to no fewer (replica_stabilisation.stabilised_replicas)."""
    return max((n for _, n, _ in read_recommendations(history)), default=None)


def _flags(settings: dict | None) -> dict | None:
    return {k: settings.get(k) for k in ("maxNumSeqs", "gpuMemoryUtilization", "replicas")} if settings else None


class VirtualCluster:
    """One namespace of a cluster serving one model on one GPU type (module docstring)."""

    def __init__(self, arch: ModelArch, gpu: GPU, kubelet: KubeletConfig, *, namespace: str = "replay",
                 with_metrics: bool = False, served_name: str = "model", seed: int = 0):
        self.arch, self.gpu, self.namespace = arch, gpu, namespace
        self.t_s = 0.0
        self.api = Store(self.now)
        self.deployments = DeploymentController(self.api, namespace)
        self.replicasets = ReplicaSetController(self.api, namespace)
        self.node = EngineNode(self.api, namespace, arch, gpu, kubelet, with_metrics=with_metrics,
                               served_name=served_name)
        self.kubelet_config = kubelet
        self.rng = np.random.default_rng(seed)
        self._timers: list = []
        self._seq = 0
        self.backlog: deque[int] = deque()
        self.requests: Requests | None = None
        self.draining: list[PodRuntime] = []
        self.gpu_s = 0.0  # ∫ GPUs the pods hold dt (a TP pod holds TP)
        self.replica_s = 0.0  # ∫ pods dt
        self.memory_s = 0.0  # ∫ Σ reserved memory fraction dt
        self.engine_steps = 0
        self.resolved = 0  # requests done, lost or rejected
        self.in_flight = 0  # sent by the clients and not resolved
        self.max_in_flight: int | None = None
        self.held: deque[int] = deque()  # requests the clients hold back (max_in_flight reached)
        self.budget: MissBudget | None = None
        self.misses_ttft = self.misses_tpot = 0
        self.aborted = False  # stopped early: the miss budget ran out
        self.gauss_runs = GaussRuns()  # the operator's λ* reuse, one per run (as one per operator process)
        self.parse_cache = ParseCache()  # the operator's scrape parser's, likewise
        self.histogram_cache = HistogramCache()  # the operator's windows' bucket plans, likewise
        self.sync_cache = InSyncCache()  # the Deployments the operator found in sync, likewise

    def now(self) -> float:
        return EPOCH_S + self.t_s

    # ------------------------------------------------------------ setup
    def create(self, path: str, obj: dict) -> dict:
        out = self.api.create_now(path, obj)
        self.settle()
        return out

    def every(self, period_s: float, fn: Callable[[float], None], start_s: float | None = None) -> None:
        """Call ``fn(t)`` every ``period_s`` from ``start_s`` (default: one period in)."""
        def fire(t):
            fn(t)
            self.at(t + period_s, fire)
        self.at(period_s if start_s is None else start_s, fire)

    def at(self, t_s: float, fn: Callable[[float], None]) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (t_s, self._seq, fn))

    def prewarm(self) -> None:
        """Pods that exist before the run starts are already Ready at 0 (a running service)."""
        self.settle()
        for rt in list(self.node.pods.values()):
            if rt.engine is None:
                self.node.make_ready(rt, self.t_s, prewarmed=True)
        self.settle()

    def settle(self) -> None:
        """Run the controllers and the kubelet until the API stops changing."""
        for _ in range(20):
            before = self.api.writes
            self.deployments.sync()
            self.replicasets.sync()
            for rt in self.node.sync(self.t_s):
                self._terminate(rt)
            for rt in self.node.pods.values():
                if rt.engine is None and not rt.failed and not rt.scheduled:
                    rt.scheduled = True
                    self.at(rt.ready_at_s, lambda t, rt=rt: self._ready(rt, t))
            if self.api.writes == before:
                return

    # ------------------------------------------------------------ pods
    def ready_pods(self) -> list[PodRuntime]:
        return [rt for rt in self.node.pods.values() if rt.ready]

    def _ready(self, rt: PodRuntime, t: float) -> None:
        if self.node.make_ready(rt, t):
            self.settle()
            while self.backlog:
                self._route(self.backlog.popleft(), t)

    def _terminate(self, rt: PodRuntime) -> None:
        """Out of the Service now; runs what it holds for the grace period, then stops."""
        if rt.engine is None:
            self.node.remove(rt)
            return
        self.draining.append(rt)
        self.at(rt.terminating_since_s + self.kubelet_config.termination_grace_s, lambda t, rt=rt: self._stop(rt, t))

    def _stop(self, rt: PodRuntime, t: float) -> None:
        if rt not in self.draining:
            return
        self.draining.remove(rt)
        self.node.remove(rt)
        eng = rt.engine
        cut = list(eng.running) + list(eng.waiting) + [e[2] for e in eng._future]
        for req in cut:
            eng.abort(req)
        if rt.restart:
            self.node.stats.interrupted_restart += len(cut)
        else:
            self.node.stats.interrupted_scale_down += len(cut)
        for req in cut:
            i = int(req.request_id)
            if self.kubelet_config.interrupted == "retried":
                self._route(i, t)
            else:
                self._resolve(i, LOST, t)

    # ------------------------------------------------------------ requests
    def _resolve(self, i: int, state: int, t: float) -> None:
        rq = self.requests
        rq.state[i] = state
        rq.finish_s[i] = t
        self.resolved += 1
        if self.budget is not None:
            if state != DONE:
                self.misses_ttft += 1
                self.misses_tpot += 1
            else:
                first = rq.first_token_s[i]
                self.misses_ttft += first - rq.arrival_s[i] > self.budget.ttft_s
                out = rq.output_tokens[i]
                self.misses_tpot += out > 1 and (t - first) / (out - 1) > self.budget.tpot_s
        self.in_flight -= 1
        if self.held:  # a client slot freed: the next held request is sent now
            j = self.held.popleft()
            self.requests.arrival_s[j] = t
            self._send(j, t)

    def _send(self, i: int, t: float) -> None:
        """A client sends request ``i`` (held back while ``max_in_flight`` are in flight)."""
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            self.held.append(i)
            return
        self.in_flight += 1
        self._route(i, t)

    def _route(self, i: int, t: float) -> None:
        pods = self.ready_pods()
        if not pods:
            self.backlog.append(i)
            return
        load = np.array([len(p.engine.running) + len(p.engine.waiting) + len(p.engine._future) for p in pods])
        best = np.flatnonzero(load == load.min())
        rt = pods[int(best[0] if best.size == 1 else self.rng.choice(best))]
        rq = self.requests
        rq.attempts[i] += 1
        try:
            req = rt.engine.add_request(int(rq.input_tokens[i]), int(rq.output_tokens[i]), arrival_s=t,
                                        request_id=str(i))
        except InputError:  # HTTP 400: longer than the model or the KV cache can ever hold
            self._resolve(i, REJECTED, t)
            return
        if rt.metrics is not None:
            rt.metrics.on_request(req)

    def _advance(self, t: float) -> None:
        """Every engine (serving or draining) steps to ``t``; GPU time and memory integrate to ``t``."""
        dt = t - self.t_s
        if dt > 0:
            self.gpu_s += sum(rt.gpus for rt in self.node.pods.values()) * dt
            self.replica_s += len(self.node.pods) * dt
            self.memory_s += sum(rt.memory_fraction * rt.gpus for rt in self.node.pods.values()) * dt
        rq = self.requests
        for rt in self.node.pods.values():
            eng = rt.engine
            if eng is None:
                continue
            m = rt.metrics
            while eng.now_s < t and (eng.running or eng.waiting or eng._future):
                r = eng.step()
                if r is None:
                    break
                self.engine_steps += 1
                if m is not None:
                    m.on_step(r)
                for req in r.finished:
                    i = int(req.request_id)
                    rq.first_token_s[i] = req.first_token_s
                    self._resolve(i, DONE, req.finish_s)
            if eng.now_s < t:
                eng.now_s = t
        self.t_s = max(self.t_s, t)
        for rt in list(self.draining):
            if rt.engine is not None and not rt.engine.has_work():
                self._stop(rt, t)

    # ------------------------------------------------------------ the run
    def run(self, arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
            drain_limit_s: float = 600.0, max_in_flight: int | None = None,
            budget: MissBudget | None = None) -> Requests:
        """Serve every request; returns what the clients saw. Stops when every request is done,
        lost or rejected, or ``drain_limit_s`` after the last arrival (what is left is lost).
        ``max_in_flight``: the clients keep at most this many requests in flight and send a held
        one when another ends (its ``arrival_s`` becomes the time it was sent). ``budget``: stop
        early (``aborted``) once the SLO quantile cannot be met any more."""
        self.max_in_flight, self.budget = max_in_flight, budget
        self.requests = rq = Requests(np.array(arrival_s, dtype=float), np.maximum(np.asarray(input_tokens), 1),
                                      np.maximum(np.asarray(output_tokens), 1))
        n, i = rq.arrival_s.size, 0
        end = (float(rq.arrival_s[-1]) if n else 0.0) + drain_limit_s
        while True:
            t_arr = float(rq.arrival_s[i]) if i < n else math.inf
            t_tim = self._timers[0][0] if self._timers else math.inf
            t = min(t_arr, t_tim)
            if i >= n and self.resolved >= n:
                break
            if budget is not None and max(self.misses_ttft, self.misses_tpot) > budget.max_misses:
                self.aborted = True
                break
            if t > end:
                self._advance(end)
                break
            self._advance(t)
            if t_arr <= t_tim:
                self._send(i, t)
                i += 1
            else:
                _, _, fn = heapq.heappop(self._timers)
                fn(t)
        left = rq.state == PENDING
        rq.state[left] = LOST
        rq.finish_s[left] = self.t_s
        return rq
