"""Replay one request trace against serving policies in virtual time and score them alike.

Policies (all on the same arrivals, the same twin engines and the same kubelet):

* ``kneecap``: an LLMDeployment in enforce mode whose pool starts as the one that runs now (the
  defaults on ``start_replicas`` pods); the real operator sets the BCA cap, the memory that
  holds it and the GAUSS replica count (colocated);
* ``defaults``: vLLM's start-up defaults (max_num_seqs 256, gpu_memory_utilization 0.9) on a
  fixed pool sized for the peak: the fewest replicas at which the defaults meet the SLO over
  the whole trace (found by replaying it, as a load test at the peak would);
* ``defaults+hpa``: the defaults under a HorizontalPodAutoscaler (:mod:`kneecap.sim.hpa`)
  added to the same starting pool, on KV-cache usage (``hpa``);
* ``defaults+hpa-waiting``: the same on waiting requests (``hpa_waiting``: an average of 5 per
  pod, production-stack's KEDA tutorial threshold on ``vllm:num_requests_waiting``);
* ``keda-slo``: the defaults under llm-d's SLO-aware KEDA recipe (:mod:`kneecap.sim.keda_slo`),
  scaling on the pool's TTFT and TPOT quantiles against the SLOs;
* ``kneecap:replicas-only`` and ``kneecap:knobs-only`` (ablations, run when asked for): kneecap
  with its cap held at the start-up flag (``spec.batching`` min = max = 256) and its memory at
  most the start-up 0.9 (``spec.batching.maxGpuMemoryUtilization``; below it, the memory follows
  the cap, and memory released is worth nothing to pay a restart with here), or with its
  replicas held at the starting pool (``spec.topology.replicas`` min = max): the share of the
  result each lever earns;
* ``oracle``: the best single static (max_num_seqs, memory, replicas) in hindsight, from a
  sweep of the same trace: the most good requests per GPU-hour among the configurations that
  meet the SLO over the trace.

Scores: goodput (requests meeting both SLOs per second of trace), SLO attainment (fraction of
requests; fraction of windows whose quantile met both SLOs), TTFT/TPOT quantiles, GPU-hours,
good requests per GPU-hour, reserved GPU memory, restarts and the requests they cut, decisions;
for the operator's policies, what each control tick sized and why (``ticks``:
:func:`kneecap.sim.cluster.tick_summary`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from kneecap.control import manifests
from kneecap.control.kube import deployments_path
from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from kneecap.model import memory
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.cluster import (DONE, LOST, REJECTED, MissBudget, OperatorDriver, Requests, VirtualCluster,
                                 llmd_path)
from kneecap.sim.hpa import HorizontalPodAutoscaler, HPASpec
from kneecap.sim.keda_slo import KedaSLOAutoscaler, KedaSLOSpec
from kneecap.sim.engine_node import KubeletConfig
from kneecap.sim.trace import Trace, compress

DEFAULT_POLICIES = ("kneecap", "defaults", "defaults+hpa", "defaults+hpa-waiting", "keda-slo", "oracle")
ABLATIONS = ("kneecap:replicas-only", "kneecap:knobs-only")
POLICIES = DEFAULT_POLICIES + ABLATIONS
KNEECAP = ("kneecap",) + ABLATIONS  # the real operator in the loop
AUTOSCALED = ("defaults+hpa", "defaults+hpa-waiting", "keda-slo")  # the defaults under a replica autoscaler
NAME = "llm"
DEFAULT_CAP, DEFAULT_MEMORY = 256, 0.9  # vLLM's start-up defaults the baselines run
ORACLE_CAPS = (256, 192, 128, 96, 64, 48, 32, 24, 16)


@dataclass(frozen=True)
class ReplayConfig:
    """Everything a replay depends on. Durations in simulated seconds."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    architecture: str = "llama-3.1-8b"
    gpu: str = "h100-80gb"
    tensor_parallel_size: int = 1  # GPUs per replica (spec.engine.tensorParallelSize); cost counts them
    slo_ttft_s: float = 1.0
    slo_tpot_s: float = 0.05
    quantile: float = 0.95
    min_replicas: int = 1
    max_replicas: int = 8
    start_replicas: int | None = None  # the pool kneecap and the HPA start from (None: the defaults' peak-sized pool)
    cost_per_gpu_hour: float = 2.5
    seed: int = 0
    interval_s: float = 15.0  # the operator's control interval (and window)
    cooldown_s: float = 300.0
    min_observations: int = 3
    # what kneecap counts released GPU memory as against a restart (spec.control.releasedMemoryValue):
    # the replay scores good requests per GPU-hour, where memory a pod does not use earns nothing
    released_memory_value: float = 0.0
    allow_downtime: bool = False  # spec.control.allowDowntime: restart a one-replica pool
    rate_headroom: float = 1.1  # spec.control.rateHeadroom: the multiple of the observed rate pools are sized for
    hysteresis: float = 0.1  # spec.control.hysteresis: the band a replica or flag change must leave
    scale_down_deviations: float = 1.0  # spec.control.scaleDownDeviations: the work's spread a scale-down keeps
    hpa: HPASpec = field(default_factory=HPASpec)
    hpa_waiting: HPASpec = field(default_factory=lambda: HPASpec(metric="waiting", target=5.0))
    keda: KedaSLOSpec = field(default_factory=KedaSLOSpec)
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    window_s: float = 60.0  # SLO-attainment windows of the report
    sample_s: float = 10.0  # time-series resolution of the report
    drain_limit_s: float = 600.0

    def check(self) -> None:
        for name, flag in (("slo_ttft_s", "slo-ttft-s"), ("slo_tpot_s", "slo-tpot-s"), ("interval_s", "interval"),
                           ("window_s", "window_s"), ("sample_s", "sample_s"), ("drain_limit_s", "drain_limit_s")):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(flag, f"expected a positive number, got {v!r}")
        if not (isinstance(self.cooldown_s, (int, float)) and math.isfinite(self.cooldown_s) and self.cooldown_s >= 0):
            raise InputError("cooldown", f"expected a non-negative number, got {self.cooldown_s!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InputError("seed", f"expected a non-negative integer, got {self.seed!r}")
        if not 0 < self.quantile < 1:
            raise InputError("quantile", f"expected a fraction in (0, 1), got {self.quantile!r}")
        if not (isinstance(self.cost_per_gpu_hour, (int, float)) and self.cost_per_gpu_hour >= 0):
            raise InputError("cost-per-gpu-hour", f"expected a non-negative number, got {self.cost_per_gpu_hour!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise InputError("min-replicas", f"expected 1 ≤ min ≤ max, got {self.min_replicas} and {self.max_replicas}")
        if self.start_replicas is not None and not self.min_replicas <= self.start_replicas <= self.max_replicas:
            raise InputError("start-replicas", f"expected within [{self.min_replicas}, {self.max_replicas}], "
                                               f"got {self.start_replicas}")
        if self.kubelet.interrupted not in ("lost", "retried"):
            raise InputError("interrupted", f"expected lost or retried, got {self.kubelet.interrupted!r}")
        self.hpa.check()
        self.hpa_waiting.check()
        self.keda.check()
        from kneecap.model.parallel import FLAG, check_tensor_parallel_size

        check_tensor_parallel_size(get_arch(self.architecture), self.tensor_parallel_size, FLAG)
        try:
            parse_spec(llmd_spec(self))
        except InputError as exc:
            if self.tensor_parallel_size > 1 and "tensorParallelSize" in str(exc):
                raise InputError(FLAG, "this operator's LLMDeployment has no spec.engine.tensorParallelSize "
                                       f"to replay with ({exc})") from None
            raise


def llmd_spec(cfg: ReplayConfig, policy: str = "kneecap", start_replicas: int | None = None) -> dict:
    """The LLMDeployment spec the kneecap policy applies (the pods start at vLLM's defaults);
    an ablation's holds one lever (module docstring)."""
    spec = _llmd_spec(cfg)
    if policy == "kneecap:replicas-only":
        spec["batching"] = {"minMaxNumSeqs": DEFAULT_CAP, "maxMaxNumSeqs": DEFAULT_CAP,
                            "maxGpuMemoryUtilization": DEFAULT_MEMORY}
    elif policy == "kneecap:knobs-only":
        held = start_replicas or cfg.min_replicas
        spec["topology"]["replicas"] = {"min": held, "max": held}
    return spec


def _llmd_spec(cfg: ReplayConfig) -> dict:
    return {
        "model": {"name": cfg.model, "architecture": cfg.architecture},
        "accelerator": {"type": cfg.gpu, "costPerHour": cfg.cost_per_gpu_hour},
        "engine": {"image": "vllm/vllm-openai:v0.11.0", "maxNumSeqs": DEFAULT_CAP,
                   "gpuMemoryUtilization": DEFAULT_MEMORY,
                   **({"tensorParallelSize": cfg.tensor_parallel_size} if cfg.tensor_parallel_size > 1 else {})},
        "topology": {"mode": "colocated", "replicas": {"min": cfg.min_replicas, "max": cfg.max_replicas}},
        "slo": {"ttftSeconds": cfg.slo_ttft_s, "tpotSeconds": cfg.slo_tpot_s, "quantile": cfg.quantile},
        "control": {"mode": "enforce", "interval": f"{cfg.interval_s:g}s", "window": f"{cfg.interval_s:g}s",
                    "cooldown": f"{cfg.cooldown_s:g}s", "minObservations": cfg.min_observations,
                    "releasedMemoryValue": cfg.released_memory_value, "allowDowntime": cfg.allow_downtime,
                    "rateHeadroom": cfg.rate_headroom, "hysteresis": cfg.hysteresis,
                    "scaleDownDeviations": cfg.scale_down_deviations},
    }


def _cluster(cfg: ReplayConfig, with_metrics: bool) -> VirtualCluster:
    return VirtualCluster(get_arch(cfg.architecture), get_gpu(cfg.gpu), cfg.kubelet, with_metrics=with_metrics,
                          served_name=cfg.model, seed=cfg.seed)


def static_deployment(cfg: ReplayConfig, cluster: VirtualCluster, cap: int, memory_fraction: float,
                      replicas: int) -> dict:
    """The Deployment the operator would write for these settings, owned by nobody (a team's own)."""
    spec = parse_spec(llmd_spec(cfg))
    owner = {"metadata": {"name": NAME, "namespace": cluster.namespace}}
    d = manifests.deployment(owner, spec, manifests.Pool("server", NAME),
                             manifests.EngineSettings(cap, memory_fraction, None, replicas))
    d["metadata"].pop("ownerReferences")
    return d


# ------------------------------------------------------------------ one run

@dataclass
class Sample:
    t_s: float
    pods: int
    ready: int
    max_num_seqs: float | None  # mean over Ready pods
    memory_fraction: float | None  # mean over pods holding a GPU
    backlog: int


@dataclass
class Run:
    policy: str
    requests: Requests
    samples: list[Sample]
    cluster: VirtualCluster
    wall_s: float
    decisions: list[dict]
    settings: dict  # the static settings, or where the dynamic policy started
    operator_events: list[dict] = field(default_factory=list)
    ticks: list[dict] = field(default_factory=list)  # the operator's, one per control tick (tick_summary)


def _sampler(cluster: VirtualCluster, out: list[Sample]):
    def sample(t: float) -> None:
        pods = list(cluster.node.pods.values())
        ready = [p for p in pods if p.ready]
        out.append(Sample(round(t, 3), len(pods), len(ready),
                          float(np.mean([p.config.max_num_seqs for p in ready])) if ready else None,
                          float(np.mean([p.memory_fraction for p in pods])) if pods else None,
                          len(cluster.backlog)))
    return sample


def run_policy(trace: Trace, cfg: ReplayConfig, policy: str, *, static: tuple[int, float, int] | None = None,
               start_replicas: int | None = None, budget: MissBudget | None = None) -> Run:
    """Replay ``trace`` under one policy. ``static``: (cap, memory, replicas) for defaults/oracle;
    ``start_replicas``: the defaults' pool kneecap and the HPA start from (default: the minimum)."""
    start = start_replicas or cfg.start_replicas or cfg.min_replicas
    wall0 = time.process_time()
    samples: list[Sample] = []
    if policy in KNEECAP:
        cluster = _cluster(cfg, with_metrics=True)
        # the pool runs the defaults on `start` pods, as the LLMDeployment's own Deployment (kneecap
        # changes only what it made: it does not take over a Deployment it does not own)
        owner = cluster.create(llmd_path(cluster.namespace), {"apiVersion": "kneecap.io/v1alpha1",
                                                              "kind": "LLMDeployment", "metadata": {"name": NAME},
                                                              "spec": llmd_spec(cfg, policy, start)})
        cluster.create(deployments_path(cluster.namespace),
                       manifests.deployment(owner, parse_spec(owner["spec"]), manifests.Pool("server", NAME),
                                            manifests.EngineSettings(DEFAULT_CAP, DEFAULT_MEMORY, None, start)))
        op = OperatorDriver(cluster, NAME, tick_s=cfg.interval_s)
        op.created()
        cluster.prewarm()

        def control(t: float) -> None:
            op.tick(t)
            cluster.settle()
        cluster.every(cfg.interval_s, control)
        settings = {"max_num_seqs": DEFAULT_CAP, "gpu_memory_utilization": DEFAULT_MEMORY, "replicas": start}
    else:
        cap, mem, replicas = static if static is not None else (DEFAULT_CAP, DEFAULT_MEMORY, start)
        cluster = _cluster(cfg, with_metrics=False)
        cluster.create(deployments_path(cluster.namespace), static_deployment(cfg, cluster, cap, mem, replicas))
        cluster.prewarm()
        settings = {"max_num_seqs": cap, "gpu_memory_utilization": mem, "replicas": replicas}
        op = None
        if policy in ("defaults+hpa", "defaults+hpa-waiting"):
            spec = cfg.hpa if policy == "defaults+hpa" else cfg.hpa_waiting
            hpa = HorizontalPodAutoscaler(replace(spec, min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas),
                                          cluster.api, cluster.namespace, NAME, steady_at=(0.0, replicas))

            def autoscale(t: float) -> None:
                if hpa.sync(t, list(cluster.node.pods.values())) is not None:
                    cluster.settle()
            cluster.every(spec.sync_s, autoscale)
        elif policy == "keda-slo":
            hpa = KedaSLOAutoscaler(cfg.keda, replace(cfg.hpa, min_replicas=cfg.min_replicas,
                                                      max_replicas=cfg.max_replicas),
                                    cluster.api, cluster.namespace, NAME, quantile=cfg.quantile,
                                    slo_ttft_s=cfg.slo_ttft_s, slo_tpot_s=cfg.slo_tpot_s, steady_at=(0.0, replicas))

            def autoscale(t: float) -> None:
                if hpa.sync(t, cluster.requests, list(cluster.node.pods.values())) is not None:
                    cluster.settle()
            cluster.every(cfg.keda.rule_interval_s, autoscale)
    cluster.every(cfg.sample_s, _sampler(cluster, samples), start_s=0.0)
    try:
        rq = cluster.run(trace.arrival_s, trace.input_tokens, trace.output_tokens, cfg.drain_limit_s, budget=budget)
    finally:
        if op is not None:
            op.close()
    if op is not None:
        decisions = [d for d in op.decisions if d["applied"]]
        events = op.events
    elif policy in AUTOSCALED:
        decisions, events = hpa.scales, []
    else:
        decisions, events = [], []
    return Run(policy, rq, samples, cluster, time.process_time() - wall0, decisions, settings, events,
               op.ticks if op is not None else [])


# ------------------------------------------------------------------ scores

def latencies(rq: Requests) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TPOT) per request as the client saw them; inf for a request lost or rejected."""
    done = rq.state == DONE
    ttft = np.where(done, rq.first_token_s - rq.arrival_s, np.inf)
    gen = np.maximum(rq.output_tokens - 1, 1)
    tpot = np.where(done, np.where(rq.output_tokens > 1, (rq.finish_s - rq.first_token_s) / gen, 0.0), np.inf)
    return ttft, tpot


def _q(x: np.ndarray, q: float) -> float:
    """Quantile without interpolation (inverted CDF), so a lost request (inf) counts as a miss."""
    return float(np.quantile(x, q, method="inverted_cdf")) if x.size else math.nan


def slo_met(cfg: ReplayConfig, rq: Requests) -> bool:
    """Both SLO quantiles over the whole trace within target (lost requests count as misses)."""
    ttft, tpot = latencies(rq)
    return _q(ttft, cfg.quantile) <= cfg.slo_ttft_s and _q(tpot, cfg.quantile) <= cfg.slo_tpot_s


def window_table(cfg: ReplayConfig, rq: Requests, width_s: float) -> dict[str, np.ndarray]:
    """Per window of arrivals: start, requests, rate, TTFT/TPOT at the SLO quantile, met."""
    ttft, tpot = latencies(rq)
    k = (rq.arrival_s // width_s).astype(np.int64)
    n = int(k.max()) + 1 if k.size else 0
    start = np.arange(n) * width_s
    count = np.bincount(k, minlength=n)
    order = np.argsort(k, kind="stable")
    bounds = np.searchsorted(k[order], np.arange(n + 1))
    tq, pq = np.full(n, np.nan), np.full(n, np.nan)
    for w in range(n):
        idx = order[bounds[w]:bounds[w + 1]]
        if idx.size:
            tq[w], pq[w] = _q(ttft[idx], cfg.quantile), _q(tpot[idx], cfg.quantile)
    met = (count > 0) & (tq <= cfg.slo_ttft_s) & (pq <= cfg.slo_tpot_s)
    return {"start_s": start, "requests": count, "rate_rps": count / width_s, "ttft_q_s": tq, "tpot_q_s": pq,
            "met": met}


def _flaps(decisions: list[dict], start: dict, cooldown_s: float) -> int:
    """Settings revisited within the cooldown of leaving them (A → B → A faster than the cooldown)."""
    seq = [(0.0, (start["max_num_seqs"], round(start["gpu_memory_utilization"], 3), start["replicas"]))]
    for d in decisions:
        tg = d.get("target") or {}
        seq.append((d["t_s"], (tg.get("maxNumSeqs"), round(float(tg.get("gpuMemoryUtilization") or 0), 3),
                               tg.get("replicas"))))
    flaps = 0
    for k in range(1, len(seq)):
        for j in range(k - 1):
            left_at = seq[j + 1][0]
            if seq[j][1] == seq[k][1] and seq[k][0] - left_at < cooldown_s:
                flaps += 1
                break
    return flaps


def _r(x, digits=6):
    if x is None:
        return None
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def score(cfg: ReplayConfig, run: Run, span_s: float) -> dict:
    """The report of one run (module docstring); JSON-ready, deterministic."""
    rq, cl = run.requests, run.cluster
    gpu = get_gpu(cfg.gpu)
    ttft, tpot = latencies(rq)
    done = rq.state == DONE
    good = done & (ttft <= cfg.slo_ttft_s) & (tpot <= cfg.slo_tpot_s)
    n = int(rq.arrival_s.size)
    wt = window_table(cfg, rq, cfg.window_s)
    gpu_hours = cl.gpu_s / 3600.0
    mem_frac = cl.memory_s / cl.gpu_s if cl.gpu_s > 0 else None
    st = cl.node.stats
    pct = lambda x, q: _r(np.percentile(x[done], q)) if done.any() else None  # noqa: E731
    out = {
        "policy": run.policy,
        "settings": run.settings,
        "requests": n,
        "completed": int(done.sum()),
        "lost": int((rq.state == LOST).sum()),
        "rejected": int((rq.state == REJECTED).sum()),
        "good": int(good.sum()),
        "goodput_rps": _r(good.sum() / span_s),
        "slo_attainment_requests": _r(good.sum() / n) if n else None,
        "slo_attainment_windows": _r(wt["met"][wt["requests"] > 0].mean()) if n else None,
        "slo_met_over_trace": bool(slo_met(cfg, rq)),
        "ttft_s": {"p50": pct(ttft, 50), "p95": pct(ttft, 95), "p99": pct(ttft, 99)},
        "tpot_s": {"p50": pct(tpot, 50), "p95": pct(tpot, 95), "p99": pct(tpot, 99)},
        "gpu_hours": _r(gpu_hours),
        "cost": _r(gpu_hours * cfg.cost_per_gpu_hour, 4),
        "good_per_gpu_hour": _r(good.sum() / gpu_hours) if gpu_hours > 0 else None,
        "mean_replicas": _r(cl.replica_s / max(cl.t_s, 1e-9), 4),
        "mean_memory_fraction": _r(mem_frac, 4),
        "mean_memory_released_gib": (_r((DEFAULT_MEMORY - mem_frac) * gpu.memory_gib, 3) + 0.0
                                     if mem_frac is not None else None),
        "restarts": st.restarts,
        "restarts_per_replica_hour": _r(st.restarts / (cl.replica_s / 3600.0), 4) if cl.replica_s > 0 else None,
        "pods_started": st.pods_started,
        "interrupted_by_restarts": st.interrupted_restart,
        "interrupted_by_scale_down": st.interrupted_scale_down,
        "decisions": run.decisions,
        "ticks": run.ticks,
        "flaps": _flaps(run.decisions, run.settings, cfg.cooldown_s) if run.policy in KNEECAP else 0,
        "simulated_s": _r(cl.t_s, 3),
        "engine_steps": cl.engine_steps,
    }
    return out


def series(cfg: ReplayConfig, run: Run) -> dict:
    """Time series for the plot: samples and per-window latency quantiles."""
    wt = window_table(cfg, run.requests, cfg.window_s)
    return {"t_s": [s.t_s for s in run.samples], "pods": [s.pods for s in run.samples],
            "ready": [s.ready for s in run.samples], "max_num_seqs": [s.max_num_seqs for s in run.samples],
            "memory_fraction": [s.memory_fraction for s in run.samples],
            "window_start_s": wt["start_s"].tolist(), "rate_rps": wt["rate_rps"].tolist(),
            "ttft_q_s": [_r(x) for x in wt["ttft_q_s"]], "tpot_q_s": [_r(x) for x in wt["tpot_q_s"]]}


# ------------------------------------------------------------------ the static sweep

def memory_for_cap(cfg: ReplayConfig, trace: Trace, cap: int) -> float:
    """The memory fraction sized for ``cap`` at the trace's lengths (the operator's rule, DESIGN §5.3)."""
    arch, gpu = get_arch(cfg.architecture), get_gpu(cfg.gpu)
    ctx = (trace.input_tokens + trace.output_tokens).astype(float)
    kv = int(memory.kv_tokens_for_cap(cap, float(ctx.mean()), float(ctx.std())))
    try:
        u = memory.utilization_for_kv_tokens(arch, gpu, max(kv, 1), cap,
                                             tensor_parallel_size=cfg.tensor_parallel_size).gpu_memory_utilization
    except InputError:
        u = DEFAULT_MEMORY
    return float(min(u, DEFAULT_MEMORY))


def oracle_memories(cfg: ReplayConfig, trace: Trace, cap: int) -> tuple[float, ...]:
    """The memory fractions the oracle tries at ``cap``: the one sized for it (vLLM's default at
    vLLM's cap), and the most a pod may reserve (memory.UTILIZATION_BOUNDS, the operator's reach)
    where the KV cache at that one holds fewer tokens than ``cap`` sequences at the trace's mean
    context: the cache, not the cap, bounds the batch there (the operator's rule,
    kneecap.control.decide.kv_bound)."""
    arch, gpu = get_arch(cfg.architecture), get_gpu(cfg.gpu)
    mem = DEFAULT_MEMORY if cap == DEFAULT_CAP else memory_for_cap(cfg, trace, cap)
    ctx_mean = float((trace.input_tokens + trace.output_tokens).mean())
    try:
        kv = memory.memory_split(arch, gpu, mem, cap, tensor_parallel_size=cfg.tensor_parallel_size).kv_capacity_tokens
    except InputError:
        kv = 0
    most = memory.UTILIZATION_BOUNDS[1]
    return (mem, most) if kv < cap * ctx_mean and most > mem else (mem,)


@dataclass
class Sweep:
    """Static runs of one trace, each kept for reuse. A sweep run stops as soon as its SLO
    quantile can no longer be met (``aborted``); a policy's own result is always a whole run."""

    points: dict = field(default_factory=dict)  # (cap, memory, replicas) -> settings and scores
    runs: dict = field(default_factory=dict)  # (cap, memory, replicas) -> Run
    simulated_s: float = 0.0  # of every run made, stopped early or not
    cpu_s: float = 0.0

    def run(self, trace: Trace, cfg: ReplayConfig, cap: int, mem: float, replicas: int, full: bool = False) -> Run:
        key = (cap, round(mem, 4), replicas)
        r = self.runs.get(key)
        if r is None or (full and r.cluster.aborted):
            n = len(trace)
            budget = None if full else MissBudget(cfg.slo_ttft_s, cfg.slo_tpot_s, n - math.ceil(cfg.quantile * n))
            r = self.runs[key] = run_policy(trace, cfg, "static", static=(cap, mem, replicas), budget=budget)
            self.simulated_s += r.cluster.t_s
            self.cpu_s += r.wall_s
            s = score(cfg, r, max(trace.span_s, 1e-9))
            whole = not r.cluster.aborted
            self.points[key] = {"max_num_seqs": cap, "gpu_memory_utilization": round(mem, 4), "replicas": replicas,
                                "slo_met": s["slo_met_over_trace"], "stopped_early": not whole,
                                "good_per_gpu_hour": s["good_per_gpu_hour"] if whole else None,
                                "slo_attainment_requests": s["slo_attainment_requests"] if whole else None}
        return r

    def smallest_feasible(self, trace: Trace, cfg: ReplayConfig, cap: int, mem: float, start: int) -> int | None:
        """Fewest replicas ≥ ``start`` meeting the SLO (feasibility taken as monotone in replicas)."""
        for r in range(max(start, cfg.min_replicas), cfg.max_replicas + 1):
            if slo_met(cfg, self.run(trace, cfg, cap, mem, r).requests):
                return r
        return None


def peak_sized_replicas(trace: Trace, cfg: ReplayConfig, sweep: Sweep) -> int:
    """The defaults' fixed pool: the fewest replicas meeting the SLO over the trace (else the max)."""
    r = sweep.smallest_feasible(trace, cfg, DEFAULT_CAP, DEFAULT_MEMORY, cfg.min_replicas)
    return r if r is not None else cfg.max_replicas


MAX_COMPRESSION = 1024


def compression_for_peak(trace: Trace, cfg: ReplayConfig, replicas: int) -> int:
    """The least whole factor at which the defaults' peak-sized pool (:func:`peak_sized_replicas`)
    has at least ``replicas`` pods: the defaults on ``replicas − 1`` pods no longer meet the SLO.
    The least such factor keeps the trace's time scale closest to the physical ones that do not
    compress (model load, the HPA's and the operator's windows). Feasibility is taken as
    monotone in the factor: doubling finds a bracket, bisection the edge."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InputError("peak-replicas", f"expected a positive integer, got {replicas!r}")
    if replicas > cfg.max_replicas:
        raise InputError("peak-replicas", f"expected at most --max-replicas ({cfg.max_replicas}), got {replicas}")
    if replicas <= cfg.min_replicas:
        return 1
    cache: dict[int, bool] = {}

    def needs(k: int) -> bool:  # the defaults on replicas − 1 pods miss the SLO at ×k
        if k not in cache:
            part = compress(trace, k)
            n = len(part)
            budget = MissBudget(cfg.slo_ttft_s, cfg.slo_tpot_s, n - math.ceil(cfg.quantile * n))
            run = run_policy(part, cfg, "static", static=(DEFAULT_CAP, DEFAULT_MEMORY, replicas - 1), budget=budget)
            cache[k] = not slo_met(cfg, run.requests)
        return cache[k]

    hi = 1
    while not needs(hi):
        if hi >= MAX_COMPRESSION:
            raise InputError("peak-replicas", f"even ×{MAX_COMPRESSION} the defaults serve the trace's peak on "
                                              f"{replicas - 1} replica(s); ask for fewer")
        hi *= 2
    lo = hi // 2  # needs(lo) is False (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if needs(mid) else (mid, hi)
    return hi


def oracle(trace: Trace, cfg: ReplayConfig, sweep: Sweep, peak: int) -> tuple[int, float, int]:
    """The static (cap, memory, replicas) with the most good requests per GPU-hour that meets the
    SLO over the trace (none meets it: the highest request attainment), memories from
    :func:`oracle_memories`. A static pool's GPU-hours grow with its replicas, so each cap is
    tried from ⌈peak/2⌉ replicas up to the best count found so far (``peak``: the defaults' own
    count)."""
    best = None
    limit = cfg.max_replicas
    lo = max(cfg.min_replicas, math.ceil(peak / 2))
    for cap in ORACLE_CAPS:
        for mem in oracle_memories(cfg, trace, cap):
            for r in range(lo, limit + 1):
                run = sweep.run(trace, cfg, cap, mem, r)
                if not slo_met(cfg, run.requests):
                    continue
                g = score(cfg, run, max(trace.span_s, 1e-9))["good_per_gpu_hour"] or 0.0
                if best is None or g > best[0]:
                    best = (g, (cap, mem, r))
                limit = min(limit, r)
                break
    if best is None:  # nothing meets the SLO: the most replicas at the defaults
        return DEFAULT_CAP, DEFAULT_MEMORY, cfg.max_replicas
    return best[1]


def replay(trace: Trace, cfg: ReplayConfig, policies=DEFAULT_POLICIES) -> dict:
    """Run the policies (module docstring); returns the report and the runs behind it."""
    cfg.check()
    if len(trace) == 0:
        raise InputError("trace", "no requests to replay")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise InputError("policy", f"unknown {unknown}; expected some of {', '.join(POLICIES)}")
    span = max(trace.span_s, 1e-9)
    sweep = Sweep()
    out: dict = {"config": _config_json(cfg), "trace": _trace_json(trace), "policies": {}}
    runs: dict[str, Run] = {}
    peak = cfg.start_replicas
    if peak is None or "defaults" in policies or "oracle" in policies:
        peak = peak_sized_replicas(trace, cfg, sweep)
    start = cfg.start_replicas or peak
    out["start_replicas"] = start
    for p in policies:
        if p in KNEECAP:
            runs[p] = run_policy(trace, cfg, p, start_replicas=start)
        elif p == "defaults":
            runs[p] = sweep.run(trace, cfg, DEFAULT_CAP, DEFAULT_MEMORY, peak, full=True)
        elif p in AUTOSCALED:
            runs[p] = run_policy(trace, cfg, p, start_replicas=start)
        else:
            cap, mem, r = oracle(trace, cfg, sweep, peak)
            runs[p] = sweep.run(trace, cfg, cap, mem, r, full=True)
    for p, r in runs.items():
        s = score(cfg, r, span)
        s["policy"] = p
        out["policies"][p] = s
    if sweep.points:
        out["sweep"] = list(sweep.points.values())
    own = [r for p, r in runs.items() if p in KNEECAP or p in AUTOSCALED]  # the rest are sweep runs
    out["simulated_s"] = _r(sweep.simulated_s + sum(r.cluster.t_s for r in own), 3)
    return {"report": out, "runs": runs, "wall_s": sweep.cpu_s + sum(r.wall_s for r in own)}


def _config_json(cfg: ReplayConfig) -> dict:
    return asdict(cfg)


def _trace_json(trace: Trace) -> dict:
    from pathlib import Path

    return {"source": Path(trace.source).name, "requests": len(trace), "span_s": _r(trace.span_s, 3),
            "mean_rate_rps": _r(len(trace) / max(trace.span_s, 1e-9), 4),
            "input_tokens_mean": _r(trace.input_tokens.mean(), 2),
            "output_tokens_mean": _r(trace.output_tokens.mean(), 2)}
