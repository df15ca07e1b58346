"""The embedded cluster, end to end: API + node (kubelet, twin processes) + router + load + operator.

`run_demo(DemoConfig(...))` starts the emulated Kubernetes API (kneecap.emulation.kubeapi), the
operator (kneecap.control's kopf registry, `kopf.operator` in a thread, enforce mode), creates
one LLMDeployment, lets the emulated node run its pods as `kneecap twin` processes behind a
Service-like router, drives the router with Poisson load (kneecap.sim.loadgen.run_load) and
records one `IntervalRow` per control decision, read back from the LLMDeployment's status and
the Deployment's args. Time is simulated: the twins and the operator's clock run
`time_scale` times faster than the wall clock, so every duration here is simulated seconds.
On a busy machine the twins fall behind; the demo then follows their clock (`TwinClock`:
the operator's `now`, the load's pacing and the rows go at the slowest twin's pace, scrapes
carry the twin's own time, and the clock holds while a twin or load process starts), so rates
stay right and the run takes longer; it warns once (`on_warning`) and the summary gives the
ratio of twin time to `time_scale` × wall time.

The load has two phases: a light warm-up (`warmup_intervals` at `warmup_rate_fraction` of the
rate), so SLIM sees more than one batch level (DESIGN §4.3), then the full rate, capped at
`max_concurrency` requests in flight (a Poisson stream that keeps the server busy without an
unbounded backlog).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp

from kneecap.control import vllm_args
from kneecap.control.manifests import GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS, pool_name, vllm_container
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.status import parse_iso
from kneecap.demo.clock import TwinClock, twin_time_scrape
# the emulated API (kmock, the `demo` extra) is imported where a run starts: DemoConfig and
# `kneecap demo --help` work without it
from kneecap.demo.report import BEHIND_RATIO
from kneecap.demo.pd_router import PDRouter
from kneecap.demo.router import Router
from kneecap.errors import InputError
from kneecap.sim.server import SIM_TIME_HEADER

NS = "demo"
NAME = "opt"
USER_DEPLOYMENT = "opt-serving"  # --adopt: the Deployment a user's chart made, which kneecap tunes
GIB = 1024**3
TWIN_POLL_S = 0.1  # wall seconds between reads of each twin's clock
LOAD_START_S = 300.0  # wall seconds a load process may take to start (a busy machine is slow)


@dataclass(frozen=True)
class DemoConfig:
    """Everything a demo run depends on. Durations, rates and latencies in simulated seconds."""

    model: str = "facebook/opt-1.3b"
    architecture: str | None = None  # catalog key; None: guessed from the model name
    gpu: str = "h100-64gb"
    rate_rps: float = 60.0
    input_mean: float = 200.0
    output_mean: float = 200.0
    input_cv: float = 0.3
    output_cv: float = 0.3
    duration_s: float = 600.0
    time_scale: float = 4.0
    interval_s: float = 15.0
    cooldown_s: float = 120.0  # the least time between changes (a restart pays over the workload's horizon)
    warmup_intervals: int = 3
    warmup_rate_fraction: float = 0.05
    max_concurrency: int = 320  # requests in flight from the load generator
    max_num_seqs: int = 256  # where the pods start
    gpu_memory_utilization: float = 0.9
    efficiency_floor: float = 0.25  # ε of eq. 13
    slo_tpot_s: float | None = 0.05  # decode-latency SLO (ITL p95); queue-independent
    slo_e2e_s: float | None = None  # SLIM batch E2E SLO for BCA (vLLM's e2e histogram includes queueing)
    min_observations: int = 6  # warm-up windows + three at full load before the first change
    observation_history: int = 40
    seed: int = 0
    tick_s: float = 0.25  # wall seconds between the operator's timer wake-ups
    adopt: bool = False  # tune a user's existing Deployment (spec.targetRef) instead of running kneecap's own
    disaggregated: bool = False  # a prefill and a decode pool behind the P/D router (demo.pd_router)

    @property
    def pool(self) -> str:
        """The Deployment whose cap the demo follows: the one pool, or the decode pool."""
        return pool_name(NAME, "decode" if self.disaggregated else "server")

    def check(self) -> None:
        for name in ("rate_rps", "input_mean", "output_mean", "duration_s", "time_scale", "interval_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(name, f"expected a positive number, got {v!r}")
        for name in ("input_cv", "output_cv", "cooldown_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(name, f"expected a non-negative number, got {v!r}")
        if self.adopt and self.disaggregated:
            raise InputError("adopt", "the adopt demo tunes one colocated Deployment; drop --disaggregated")
        if self.duration_s < (self.warmup_intervals + 2) * self.interval_s:
            raise InputError("duration_s", f"expected at least {(self.warmup_intervals + 2) * self.interval_s:g}s "
                                           f"(warm-up of {self.warmup_intervals} intervals + 2 intervals), "
                                           f"got {self.duration_s:g}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InputError("gpu_memory_utilization",
                             f"expected a fraction in (0, 1], got {self.gpu_memory_utilization}")
        from kneecap.control.spec import parse_spec

        parse_spec(llmdeployment(self)["spec"])  # model, GPU, caps: the CRD's own checks

    @property
    def warmup_s(self) -> float:
        return self.warmup_intervals * self.interval_s

    def phase_of(self, t_s: float) -> str:
        """The load phase of the window that ends at ``t_s``: the warm-up's while most of it lies
        before the steady load (a light window must not count as the start-up flags' throughput)."""
        return "warmup" if t_s - self.interval_s / 2 < self.warmup_s else "steady"


def served_deployment(cfg: DemoConfig) -> str:
    """The Deployment whose cap the demo follows: the user's (--adopt), else kneecap's pool (the
    decode pool when disaggregated)."""
    return USER_DEPLOYMENT if cfg.adopt else cfg.pool


def user_deployment(cfg: DemoConfig, namespace: str = NS) -> dict:
    """--adopt: a plain vLLM Deployment as a user's Helm chart would make it (its own labels, a
    GPU toleration, a model-cache volume, its own args with its own --max-num-seqs), made
    before kneecap is told about it."""
    selector = {"app": "opt", "release": USER_DEPLOYMENT}
    labels = {**selector, "chart": "vllm-0.3.1", "heritage": "Helm"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": USER_DEPLOYMENT, "namespace": namespace, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": selector}, "template": {
            "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true"}},
            "spec": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "volumes": [{"name": "model-cache", "emptyDir": {"sizeLimit": "40Gi"}}],
                "containers": [{
                    "name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve"],
                    "args": [cfg.model, "--port", "8000", "--max-num-seqs", str(cfg.max_num_seqs),
                             "--gpu-memory-utilization", f"{cfg.gpu_memory_utilization:g}", "--seed", str(cfg.seed)],
                    "env": [{"name": "HF_HOME", "value": "/models"}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def llmdeployment(cfg: DemoConfig, name: str = NAME, namespace: str = NS) -> dict:
    """The one LLMDeployment the demo applies (enforce mode, one replica): kneecap's own pods, or
    with --adopt the user's Deployment (spec.targetRef). The window is a little shorter than the
    interval, so every control tick closes one (one observation per interval)."""
    slo = {k: v for k, v in (("tpotSeconds", cfg.slo_tpot_s), ("e2eSeconds", cfg.slo_e2e_s)) if v}
    model = {"name": cfg.model, **({"architecture": cfg.architecture} if cfg.architecture else {})}
    pods = ({"targetRef": {"name": USER_DEPLOYMENT}} if cfg.adopt else
            {"engine": {"image": "vllm/vllm-openai:v0.11.0", "maxNumSeqs": cfg.max_num_seqs,
                        "gpuMemoryUtilization": cfg.gpu_memory_utilization, "extraArgs": []}})
    return {
        "apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": model,
            "accelerator": {"type": cfg.gpu},
            **pods,
            "topology": ({"mode": "disaggregated", "prefill": {"min": 1, "max": 1}, "decode": {"min": 1, "max": 1},
                          "kvTransfer": {"connector": "NixlConnector"}} if cfg.disaggregated
                         else {"mode": "colocated", "replicas": {"min": 1, "max": 1}}),
            "slo": slo,
            "batching": {"efficiencyFloor": cfg.efficiency_floor},
            "control": {"mode": "enforce", "allowDowntime": True,  # one twin pod: a restart is downtime
                        "interval": f"{cfg.interval_s:g}s", "window": f"{0.9 * cfg.interval_s:g}s",
                        "cooldown": f"{cfg.cooldown_s:g}s", "minObservations": cfg.min_observations,
                        "observationHistory": cfg.observation_history},
        },
    }


# ------------------------------------------------------------------ operator in a thread

class OperatorThread:
    """The real operator (kneecap.control.handlers' kopf registry) in a background thread."""

    def __init__(self, kube_url: str, namespace: str, clock: Callable[[], float] | None = None,
                 tick_s: float = 0.25, metrics: OperatorMetrics | None = None, scrape=None):
        import kopf

        from kneecap.control.handlers import OperatorConfig, build_registry, operator_settings

        self.metrics = metrics or OperatorMetrics()
        self.config = OperatorConfig(tick_s=tick_s, metrics=self.metrics,
                                     connection=kopf.ConnectionInfo(server=kube_url))
        if clock is not None:
            self.config.now = clock
        if scrape is not None:
            self.config.scrape = scrape
        self.registry = build_registry(self.config)
        self.settings = operator_settings([namespace])
        self.settings.watching.server_timeout = 10
        self.namespace = namespace
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kneecap-operator", daemon=True)

    def _main(self) -> None:
        import kopf

        try:
            asyncio.run(kopf.operator(registry=self.registry, settings=self.settings, standalone=True,
                                      namespaces=[self.namespace], stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
            self._ready.set()

    def start(self, timeout_s: float = 30.0) -> "OperatorThread":
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the operator did not become ready")
        if self.error is not None:
            raise self.error
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error


# ------------------------------------------------------------------ records

@dataclass(frozen=True)
class IntervalRow:
    """One control decision as the status and the Deployment showed it."""

    t_s: float  # simulated seconds since the load started, when the operator decided
    obs_t_end_s: float | None  # end of the observation window behind the numbers (repeats when none closed)
    max_num_seqs: int  # live in the Deployment's args
    gpu_memory_utilization: float
    throughput_tok_s: float | None  # prompt + generated tokens/s over the window (status.workload)
    batch: float | None
    ttft_p95_s: float | None
    itl_p95_s: float | None
    e2e_p95_s: float | None
    slo_met: bool | None  # the SLOMet condition after this decision
    decision: str
    message: str
    recommended_max_num_seqs: int | None
    recommended_gpu_memory_utilization: float | None
    restarts: int  # pods the node had replaced by then
    phase: str  # "warmup" | "steady"


@dataclass
class DemoResult:
    config: DemoConfig
    rows: list[IntervalRow]
    llmd: dict  # the LLMDeployment as the API held it at the end
    deployment: dict  # its Deployment at the end
    deployment_history: list[dict]  # every stored version of the Deployment
    kubelet_restarts: int
    kubelet_started: int
    kubelet_events: list[dict]
    load: dict  # the steady phase's `kneecap load --json` report ({"stopped": True} if cut at the end)
    wall_s: float
    operator_metrics: str
    twin_time_ratio: float  # twin seconds per time_scale × wall second while the load ran (1: on time)
    twin_behind_s: float  # simulated seconds the twins lost against time_scale × the wall clock
    routed_prefill_decode: int = 0  # requests the P/D router sent through a prefill then a decode twin
    summary: dict = field(default_factory=dict)
    user_deployment: dict | None = None  # --adopt: the user's Deployment as created, before kneecap saw it
    objects: dict = field(default_factory=dict)  # names of the Deployments and Services at the end

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "summary": self.summary, "rows": [asdict(r) for r in self.rows],
                "kubelet_events": self.kubelet_events, "load": self.load, "wall_s": self.wall_s,
                "twin_time_ratio": self.twin_time_ratio, "twin_behind_s": self.twin_behind_s}


def _flags(deploy: dict) -> tuple[int, float]:
    c = vllm_container(deploy)
    return int(vllm_args.container_flag(c, MAX_NUM_SEQS)), float(vllm_args.container_flag(c, GPU_MEMORY_UTILIZATION))


def _row(t_s: float, st: dict, deploy: dict, restarts: int, phase: str) -> IntervalRow:
    cap, gmu = _flags(deploy)
    w = st.get("workload") or {}
    thr = (w.get("promptTokensPerSecond", 0.0) + w.get("generationTokensPerSecond", 0.0)) if w else None
    slo = next((c for c in st.get("conditions") or [] if c["type"] == "SLOMet"), None)
    rec = st.get("recommendation") or {}
    d = st.get("lastDecision") or {}
    return IntervalRow(
        t_s=round(t_s, 3), obs_t_end_s=w.get("windowEndUnixSeconds"), max_num_seqs=cap, gpu_memory_utilization=gmu,
        throughput_tok_s=thr,
        batch=w.get("meanBatchLittle") or w.get("meanBatch"), ttft_p95_s=w.get("ttftP95Seconds"),
        itl_p95_s=w.get("itlP95Seconds"), e2e_p95_s=w.get("e2eP95Seconds"),
        slo_met=None if slo is None or slo.get("status") == "Unknown" else slo["status"] == "True",
        decision=d.get("reason", ""), message=d.get("message", ""),
        recommended_max_num_seqs=rec.get("maxNumSeqs"),
        recommended_gpu_memory_utilization=rec.get("gpuMemoryUtilization"),
        restarts=restarts, phase=phase)


# ------------------------------------------------------------------ the run

def _load_argv(cfg: DemoConfig, url: str, rate_rps: float, duration_s: float, seed: int,
               start_at_s: float) -> list[str]:
    return [sys.executable, "-m", "kneecap", "load", url, "--rate", f"{rate_rps:g}", "--duration", f"{duration_s:g}",
            "--start-at", repr(start_at_s),
            "--input-mean", f"{cfg.input_mean:g}", "--input-cv", f"{cfg.input_cv:g}",
            "--output-mean", f"{cfg.output_mean:g}", "--output-cv", f"{cfg.output_cv:g}", "--seed", str(seed),
            "--max-concurrency", str(cfg.max_concurrency), "--model", cfg.model, "--timeout", "3600",
            "--time-scale", f"{cfg.time_scale:g}", "--sim-clock", "--no-stream", "--json"]


async def _until(clock: TwinClock, t_s: float) -> None:
    """Wait until the demo's clock reads `t_s`."""
    while (ahead := t_s - clock()) > 0:
        await asyncio.sleep(min(ahead / clock.scale, TWIN_POLL_S))


async def _load(cfg: DemoConfig, url: str, clock: TwinClock, t0: float, started: asyncio.Event) -> dict:
    """Warm-up then steady Poisson load, each a `kneecap load` process (its own CPU, not the
    operator's) paced on the demo's clock through the router, both started now, each sending
    from its phase's start on that clock; both stop when the run's duration is over on it. The
    clock holds until both processes have read it (`started` is set then): on a busy machine a
    process takes seconds to start, which must not eat the warm-up. Returns the steady phase's
    report, or {"stopped": True} when it was still busy at the end (requests left in flight)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    spawn = lambda argv: asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,  # noqa: E731
                                                        stderr=asyncio.subprocess.PIPE, env=env)
    clock.hold()
    held = True
    procs = []
    steady = end = None
    try:
        procs = [await spawn(_load_argv(cfg, url, cfg.rate_rps * cfg.warmup_rate_fraction, cfg.warmup_s, cfg.seed,
                                        t0)),
                 await spawn(_load_argv(cfg, url, cfg.rate_rps, cfg.duration_s - cfg.warmup_s, cfg.seed + 1,
                                        t0 + cfg.warmup_s))]
        try:
            lines = await asyncio.wait_for(asyncio.gather(*(p.stderr.readline() for p in procs)), LOAD_START_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"the load processes did not start within {LOAD_START_S:g} s") from None
        for line, p in zip(lines, procs):
            if not line.startswith(b"kneecap load:"):
                rest = await p.stderr.read() if p.returncode is not None else b""
                raise RuntimeError(f"a load process failed to start: {(line + rest).decode()[-2000:]}")
        clock.release()
        held = False
        started.set()
        steady = asyncio.create_task(procs[1].communicate())
        end = asyncio.create_task(_until(clock, t0 + cfg.duration_s))
        await asyncio.wait({steady, end}, return_when=asyncio.FIRST_COMPLETED)
        if steady.done():
            return json.loads(steady.result()[0].decode() or "{}")
        return {"stopped": True}
    finally:
        if held:
            clock.release()
        for task in (steady, end):
            if task is not None:
                task.cancel()
        for p in procs:
            if p.returncode is None:
                p.terminate()
                await p.wait()


async def _follow_twins(clock: TwinClock, router: Router, stop: asyncio.Event) -> None:
    """Read each serving twin's clock (the `X-Kneecap-Sim-Time` header of its /health) into the
    demo's clock, every TWIN_POLL_S wall seconds, until `stop`."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            urls = list(router.endpoints)
            clock.keep_only(urls)
            for url in urls:
                try:
                    async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                        sim = r.headers.get(SIM_TIME_HEADER)
                    if sim is not None:
                        clock.heard(url, float(sim), time.time())
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    pass  # a twin going away; the kubelet decides what that means
            try:
                await asyncio.wait_for(stop.wait(), TWIN_POLL_S)
            except asyncio.TimeoutError:
                pass


class _LagWatch:
    """Twin time against time_scale × wall time since the load started (less the time the clock
    was held for process starts); warns once."""

    def __init__(self, cfg: DemoConfig, clock: TwinClock, on_warning: Callable[[str], None]):
        self.cfg, self.clock, self.on_warning = cfg, clock, on_warning
        self.sim0 = clock()
        self.wall0, self.held0 = time.time(), clock.held_wall_s
        self.warned = False

    def ratio_behind(self) -> tuple[float, float]:
        sim = self.clock() - self.sim0
        full = (time.time() - self.wall0 - (self.clock.held_wall_s - self.held0)) * self.cfg.time_scale
        return (sim / full if full > 0 else 1.0), max(full - sim, 0.0)

    def check(self) -> None:
        ratio, behind = self.ratio_behind()
        if not self.warned and ratio < BEHIND_RATIO and behind >= self.cfg.interval_s:
            self.warned = True
            self.on_warning(f"WARNING: the twins fell behind the wall clock (running at {ratio:.2f} of "
                            f"{self.cfg.time_scale:g}x, {behind:.0f} simulated s lost): the machine is busy; "
                            "the demo follows the twins' clock, so rates stay right and the run takes longer")


async def _main(cfg: DemoConfig, kube: "KubeAPIThread", clock: TwinClock,
                on_row: Callable[[IntervalRow], None], on_warning: Callable[[str], None], log_dir: Path | None,
                on_endpoints: Callable[[list[str]], None] = lambda urls: None):
    from kneecap.emulation.kubeapi import DEPLOY, LLMD
    from kneecap.demo.twin_node import TwinNode

    from kneecap.control.spec import parse_spec

    if cfg.disaggregated:
        router = await PDRouter(clock=clock).start()
        route = router.on_endpoints
    else:
        router = await Router(clock=clock).start()
        route = lambda _d, urls: router.set_endpoints(urls)  # noqa: E731

    def endpoints(deployment: str, urls: list[str]) -> None:
        route(deployment, urls)
        on_endpoints(urls)

    spec = parse_spec(llmdeployment(cfg)["spec"])
    node = TwinNode(kube, NS, cfg.time_scale, on_endpoints=endpoints,
                    drain=router.drain, log_dir=log_dir, clock=clock,
                    unowned=(spec.model.architecture.key, spec.accelerator.type) if cfg.adopt else None)
    stop = asyncio.Event()
    node_task = asyncio.create_task(node.run(stop))
    follow_task = asyncio.create_task(_follow_twins(clock, router, stop))
    rows: list[IntervalRow] = []
    user = None
    try:
        if cfg.adopt:  # the user's Deployment serves first; kneecap is pointed at it once it does
            user = await asyncio.to_thread(kube.create, DEPLOY, user_deployment(cfg))
        else:
            await asyncio.to_thread(kube.create, LLMD, llmdeployment(cfg))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while not router.endpoints:  # the first pod (of each pool) is up
            if node_task.done():
                node_task.result()
            if loop.time() > deadline:
                raise RuntimeError(f"no pod became ready: {node.events}")
            await asyncio.sleep(0.1)
        if cfg.adopt:
            await asyncio.to_thread(kube.create, LLMD, llmdeployment(cfg))
        t0 = clock()
        started = asyncio.Event()
        lag = None
        load_task = asyncio.create_task(_load(cfg, router.url, clock, t0, started))
        last = None
        while not load_task.done():
            if lag is None and started.is_set():
                lag = _LagWatch(cfg, clock, on_warning)
            if lag is not None:
                lag.check()
            st_obj, dep = await asyncio.gather(asyncio.to_thread(kube.get, LLMD, NS, NAME),
                                               asyncio.to_thread(kube.get, DEPLOY, NS, served_deployment(cfg)))
            st = (st_obj or {}).get("status") or {}
            stamp = (st.get("lastDecision") or {}).get("time"), len(st.get("observations") or [])
            if st.get("lastDecision") and dep and stamp != last:
                last = stamp
                decided = parse_iso(stamp[0])  # the operator's clock when it decided (this loop may notice late)
                t = max((decided if decided is not None else clock()) - t0, 0.0)
                row = _row(t, st, dep, sum(node.restarts.values()), cfg.phase_of(t))
                rows.append(row)
                on_row(row)
            await asyncio.sleep(min(0.25, cfg.interval_s / cfg.time_scale / 4))
        report = load_task.result()
        ratio, behind = lag.ratio_behind() if lag is not None else (1.0, 0.0)
    finally:
        stop.set()
        await node_task
        await follow_task
        await router.stop()
    return rows, report, node, ratio, behind, user, len(getattr(router, "routed", ()))


def run_demo(cfg: DemoConfig, on_row: Callable[[IntervalRow], None] = lambda row: None,
             log_dir: Path | None = None, quiet_operator: bool = True,
             on_warning: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
             metrics: OperatorMetrics | None = None,
             on_endpoints: Callable[[list[str]], None] = lambda urls: None) -> DemoResult:
    """Run the whole loop once (module docstring) and return what it recorded. `metrics`: the
    operator's registry (to serve it while the demo runs); `on_endpoints`: called with the ready
    twins' base URLs whenever they change."""
    cfg.check()
    if quiet_operator:
        logging.getLogger("kopf").setLevel(logging.ERROR)  # e.g. "OS signals are ignored" (it runs in a thread)
        for name in ("aiohttp", "kneecap"):
            logging.getLogger(name).setLevel(logging.WARNING)
    from kneecap.emulation.kubeapi import DEPLOY, LLMD, KubeAPIThread

    wall0 = time.monotonic()
    clock = TwinClock(cfg.time_scale, lead_wall_s=2 * TWIN_POLL_S)
    with KubeAPIThread(instant_rollouts=False) as kube:
        kube.add_namespace(NS)
        op = OperatorThread(kube.url, NS, clock=clock, tick_s=cfg.tick_s, metrics=metrics,
                            scrape=twin_time_scrape(clock)).start()
        try:
            rows, report, node, ratio, behind, user, routed = asyncio.run(
                _main(cfg, kube, clock, on_row, on_warning, log_dir, on_endpoints))
        finally:
            op.stop()
        llmd_obj = kube.get(LLMD, NS, NAME)
        deploy = kube.get(DEPLOY, NS, served_deployment(cfg))
        history = [v for v in kube.history(DEPLOY, NS, served_deployment(cfg)) if v is not None]
        objects = {r: sorted(o["metadata"]["name"] for o in kube.list(r, NS)) for r in (DEPLOY, "v1/services")}
    load = {k: v for k, v in report.items() if k != "records"}
    res = DemoResult(cfg, rows, llmd_obj, deploy, history, sum(node.restarts.values()),
                     sum(node.started.values()), copy.deepcopy(node.events), load,
                     time.monotonic() - wall0, op.metrics.exposition().decode(), ratio, behind, routed,
                     user_deployment=user, objects=objects)
    from kneecap.demo.report import summarize

    res.summary = summarize(res)
    return res
