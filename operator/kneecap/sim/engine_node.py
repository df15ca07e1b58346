"""A node of a virtual-time run: the emulations' kubelet (:mod:`kneecap.emulation.kubelet`) with
in-process engines as its container runtime, over the emulation's store, whose pods the
Deployment and ReplicaSet controllers (:mod:`kneecap.emulation.controllers`) make.

It runs as a level-triggered ``sync(t_s)``: each new pod gets a unique ``status.podIP`` and
loads the model: it is Running but not Ready for ``weights / load bandwidth + start-up``
seconds, then its engine (:class:`kneecap.sim.engine.Engine`, configured from the container's
vLLM flags) serves and the pod turns Ready. A deleted pod leaves the Service at once, finishes
what it runs for at most ``termination_grace_s`` and then its remaining requests are lost or
retried (``interrupted``), as configured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kneecap.control import manifests
from kneecap.control import vllm_args
from kneecap.control.status import iso
from kneecap.emulation.kubelet import Kubelet, PodAdded
from kneecap.emulation.store import Store
from kneecap.errors import InputError
from kneecap.model.arch import GIB, ModelArch
from kneecap.model.hardware import GPU
from kneecap.model.memory import memory_split
from kneecap.sim.engine import Engine, EngineConfig, engine_config
from kneecap.sim.metrics import TwinMetrics, buffered_metrics


@dataclass(frozen=True)
class KubeletConfig:
    """How pods start and stop. A pod loads ``weights / load_gib_s`` plus ``startup_s`` (CUDA
    graphs, warm-up) before it is Ready; a deleted pod runs at most ``termination_grace_s`` more
    before its unfinished requests are ``interrupted``: "lost" (the client gets an error) or
    "retried" (sent again through the router, the client's clock still running)."""

    load_gib_s: float = 2.0
    startup_s: float = 30.0
    termination_grace_s: float = 30.0
    interrupted: str = "lost"  # "lost" | "retried"

    def load_delay_s(self, arch: ModelArch) -> float:
        return arch.weight_bytes / GIB / self.load_gib_s + self.startup_s


@dataclass(eq=False)
class PodRuntime:
    """One pod on a node: loading, serving or terminating."""

    name: str
    ip: str
    ready_at_s: float
    engine: Engine | None = None
    metrics: TwinMetrics | None = None
    config: EngineConfig | None = None
    memory_fraction: float = 0.0  # GPU memory the engine reserves (gpu_memory_utilization or its equivalent)
    gpus: int = 1  # GPUs the pod holds: its engine's --tensor-parallel-size
    failed: str | None = None  # why vLLM would not start with these flags
    terminating_since_s: float | None = None
    restart: bool = False  # deleted because its Deployment rolled out a new template
    scheduled: bool = False  # its Ready event is on the clock

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.terminating_since_s is None


@dataclass
class NodeStats:
    pods_started: int = 0
    restarts: int = 0  # pods replaced by a rollout of a new template
    interrupted_restart: int = 0  # requests cut by a restart
    interrupted_scale_down: int = 0  # requests cut by a scale-down or another deletion
    events: list = field(default_factory=list)


class EngineNode:
    """Runs the pods of one namespace (module docstring). ``served_name``: the model name of the metrics."""

    def __init__(self, api: Store, namespace: str, arch: ModelArch, gpu: GPU, config: KubeletConfig,
                 *, with_metrics: bool, served_name: str):
        self.api, self.arch, self.gpu, self.config = api, arch, gpu, config
        self.kubelet = Kubelet(api, namespace)
        self.with_metrics, self.served_name = with_metrics, served_name
        self.pods: dict[str, PodRuntime] = {}
        self.by_ip: dict[str, PodRuntime] = {}
        self.stats = NodeStats()
        self._ips = 0
        self._configs: dict[tuple, EngineConfig] = {}

    def sync(self, t_s: float) -> list[PodRuntime]:
        """Start new pods, retire deleted ones (``t_s``: run time). Returns the pods that started
        terminating (the caller drains them)."""
        added, deleted = self.kubelet.sync()
        for pod in added:
            self._start(pod, t_s)
        gone = []
        for pod in deleted:
            rt = self.pods[pod.name]
            rt.terminating_since_s = t_s
            rt.restart = pod.restart
            if rt.restart:
                self.stats.restarts += 1
            self.stats.events.append({"t_s": round(t_s, 3), "event": "restart" if rt.restart else "stop",
                                      "pod": pod.name})
            gone.append(rt)
        return gone

    def _engine_config(self, pod: dict):
        """The engine a pod's vLLM flags describe (cached per distinct flags)."""
        cs = pod["spec"]["containers"]
        c = next((x for x in cs if x.get("name") == manifests.CONTAINER), cs[0])
        key = tuple(vllm_args.container_flag(c, f)
                    for f in (manifests.MAX_NUM_SEQS, manifests.GPU_MEMORY_UTILIZATION,
                              manifests.KV_CACHE_MEMORY_BYTES, "--max-num-batched-tokens",
                              "--max-model-len", "--tensor-parallel-size"))
        cfg = self._configs.get(key)
        if cfg is None:
            num = lambda v, f: f(v) if v is not None else None  # noqa: E731
            cfg = engine_config(self.arch, self.gpu, max_num_seqs=num(key[0], int),
                                gpu_memory_utilization=num(key[1], float) or 0.9,
                                kv_cache_memory_bytes=num(key[2], int), max_num_batched_tokens=num(key[3], int),
                                max_model_len=num(key[4], int), tensor_parallel_size=num(key[5], int) or 1)
            self._configs[key] = cfg
        if key[2] is not None:  # the kvCacheMemoryBytes knob: weights + reserve + KV, of the whole GPU
            split = memory_split(self.arch, self.gpu, 0.9, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                 tensor_parallel_size=cfg.tensor_parallel_size)
            fraction = (split.weights_bytes + split.reserve_bytes + cfg.kv_cache_memory_bytes) / split.total_bytes
        else:
            fraction = cfg.gpu_memory_utilization
        return cfg, fraction

    def _start(self, added: PodAdded, t_s: float) -> None:
        self._ips += 1
        n = self._ips
        ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
        rt = PodRuntime(added.name, ip, t_s + self.config.load_delay_s(self.arch))
        try:
            rt.config, rt.memory_fraction = self._engine_config(added.pod)
            rt.gpus = rt.config.tensor_parallel_size
        except InputError as exc:  # vLLM would exit at start-up: the pod never turns Ready
            rt.failed = str(exc)
            rt.ready_at_s = math.inf
        self.pods[rt.name] = rt
        self.by_ip[ip] = rt
        self.stats.pods_started += 1
        self.kubelet.report_started(rt.name, ip)
        self.stats.events.append({"t_s": round(t_s, 3), "event": "failed" if rt.failed else "start", "pod": rt.name,
                                  **({"error": rt.failed} if rt.failed else {})})

    def make_ready(self, rt: PodRuntime, t_s: float, prewarmed: bool = False) -> bool:
        """The model is loaded: the engine serves and the pod turns Ready (a pod that ran before
        the run, ``prewarmed``, has no start to measure: no lastTransitionTime)."""
        if rt.engine is not None or rt.failed or rt.terminating_since_s is not None:
            return False
        if not self.kubelet.report_ready(rt.name, since=None if prewarmed else iso(self.api.now_s())):
            return False
        rt.engine = Engine(rt.config)
        rt.engine.now_s = t_s
        if self.with_metrics:
            rt.metrics = buffered_metrics(TwinMetrics(self.served_name, rt.config))
        self.stats.events.append({"t_s": round(t_s, 3), "event": "ready", "pod": rt.name,
                                  "max_num_seqs": rt.config.max_num_seqs,
                                  "gpu_memory_utilization": round(rt.memory_fraction, 4),
                                  **({"prewarmed": True} if prewarmed else {})})
        return True

    def remove(self, rt: PodRuntime) -> None:
        self.pods.pop(rt.name, None)
        self.by_ip.pop(rt.ip, None)
