"""A node of the demo: the emulations' kubelet (:mod:`kneecap.emulation.kubelet`) with one
`kneecap twin` process per pod as its container runtime, for each kneecap-owned Deployment (and,
given `unowned`, every other Deployment in the namespace: a user's that kneecap adopts).

What a cluster would do for the demo, on one machine. Each poll runs the emulation's Deployment
and ReplicaSet controllers (:mod:`kneecap.emulation.controllers`) over the emulated API through
:class:`kneecap.emulation.kubeapi.HttpStore`: they make the ReplicaSet of each pod template, roll a
changed template out as a RollingUpdate (with one replica: the new pod starts, turns Ready, then
the old one is deleted), write the Deployment's status (the API is run without kmock's instant
rollouts, so the operator's rollout guard holds while a pod restarts) and create and delete the
Pods. Then the kubelet's pass: a new Pod is Running at once and a twin process starts whose argv
is the vLLM container's args (the twin takes vLLM's flags) plus the owner's model shape and GPU,
the demo's time scale and the demo's clock to start on; once it answers /health the Pod turns
Ready with the ``kneecap.io/metrics-url`` annotation, so the operator finds and scrapes it, and
joins the Service. A deleted Pod leaves the Service, drains its in-flight requests and stops; one
a rollout replaced counts as a restart.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp

from kneecap.control import manifests
from kneecap.demo.clock import free_port
from kneecap.emulation.kubeapi import LLMD, HttpStore, KubeAPIThread
from kneecap.emulation.controllers import DeploymentController, ReplicaSetController
from kneecap.emulation.kubelet import Kubelet, PodAdded, PodDeleted

STRIP_FLAGS = ("--port", "--host")
POD_IP = "127.0.0.1"  # every twin listens here, each on its own port


def twin_argv(container: dict, arch: str, gpu: str, port: int, time_scale: float,
              sim_clock_anchor: str | None = None) -> list[str]:
    """`kneecap twin` argv from a vLLM container: its args without --port/--host, plus the twin's
    (and the clock it starts on, when given)."""
    args, skip = [], False
    for tok in container.get("args") or []:
        if skip:
            skip = False
            continue
        name = tok.split("=", 1)[0]
        if name in STRIP_FLAGS:
            skip = "=" not in tok
            continue
        args.append(tok)
    return [*args, "--host", "127.0.0.1", "--port", str(port), "--arch", arch, "--gpu", gpu,
            "--time-scale", f"{time_scale:g}",
            *(["--sim-clock-anchor", sim_clock_anchor] if sim_clock_anchor else [])]


@dataclass
class PodProc:
    """One pod: its twin process and where it listens."""

    name: str
    deployment: str
    template: str
    port: int
    proc: asyncio.subprocess.Process
    argv: list[str]
    ready: bool = False

    @property
    def url(self) -> str:
        return f"http://{POD_IP}:{self.port}"


@dataclass
class TwinNode:
    """Runs the controllers, the kubelet and the twin processes of one namespace (module docstring)."""

    kube: KubeAPIThread
    namespace: str
    time_scale: float
    on_endpoints: Callable[[str, list[str]], None] = lambda deployment, urls: None  # Service endpoints
    drain: Callable[[str], "asyncio.Future"] | None = None  # awaits a backend's in-flight requests
    poll_s: float = 0.2
    start_timeout_s: float = 60.0
    log_dir: Path | None = None
    clock: Callable | None = None  # a kneecap.demo.clock.TwinClock: twins start on it; it holds while they do
    # (model shape, GPU) of the pods of Deployments no LLMDeployment owns (a user's, which kneecap
    # adopts through spec.targetRef); None: only kneecap's own Deployments run
    unowned: tuple[str, str] | None = None
    pods: dict[str, PodProc] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # deployment -> pods replaced
    started: dict[str, int] = field(default_factory=dict)  # deployment -> twin processes started
    events: list[dict] = field(default_factory=list)  # what happened, for the summary
    _owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    _store: HttpStore = field(init=False)
    _deployments: DeploymentController = field(init=False)
    _replicasets: ReplicaSetController = field(init=False)
    _kubelet: Kubelet = field(init=False)

    def __post_init__(self) -> None:
        self._store = HttpStore(self.kube)
        self._deployments = DeploymentController(self._store, self.namespace)
        self._replicasets = ReplicaSetController(self._store, self.namespace)
        selector = None if self.unowned else f"app.kubernetes.io/managed-by={manifests.MANAGER}"
        self._kubelet = Kubelet(self._store, self.namespace, deployment_selector=selector)

    # ------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until `stop` is set, then stop every twin."""
        try:
            while not stop.is_set():
                await self.sync()
                try:
                    await asyncio.wait_for(stop.wait(), self.poll_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await asyncio.gather(*(self._stop_proc(p) for p in list(self.pods.values())), return_exceptions=True)

    def _reconcile(self) -> tuple[list[PodAdded], list[PodDeleted]]:
        """One pass of the controllers, then the kubelet's: new pods reported Running, deleted ones."""
        self._deployments.sync()
        self._replicasets.sync()
        added, deleted = self._kubelet.sync()
        return [pod for pod in added if self._kubelet.report_started(pod.name, POD_IP)], deleted

    async def sync(self) -> None:
        added, deleted = await asyncio.to_thread(self._reconcile)
        for gone in deleted:
            if gone.restart:
                self.restarts[gone.deployment] = self.restarts.get(gone.deployment, 0) + 1
                self.events.append({"event": "restart", "deployment": gone.deployment, "old": gone.name})
            if gone.name in self.pods:
                await self._retire(self.pods[gone.name])
        await asyncio.gather(*(self._start(pod) for pod in added))

    def urls(self, deployment: str) -> list[str]:
        return [p.url for p in self.pods.values() if p.deployment == deployment and p.ready]

    # ------------------------------------------------------------ one pod
    async def _owner(self, d: dict) -> tuple[str, str]:
        ref = next((r for r in d["metadata"].get("ownerReferences") or [] if r.get("kind") == "LLMDeployment"), None)
        if ref is None and self.unowned is not None:
            return self.unowned
        if ref is None:
            raise RuntimeError(f"Deployment {d['metadata']['name']} has no LLMDeployment owner")
        if ref["uid"] not in self._owners:
            owner = await asyncio.to_thread(self.kube.get, LLMD, self.namespace, ref["name"])
            spec = (owner or {}).get("spec") or {}
            from kneecap.control.spec import parse_spec

            s = parse_spec(spec, config_map=await self._config_map(spec))
            self._owners[ref["uid"]] = (s.model.architecture.key, s.accelerator.type)
        return self._owners[ref["uid"]]

    async def _config_map(self, spec: dict) -> dict | None:
        """The ConfigMap `spec.model.configMapRef` names (None: no reference, or not found)."""
        from kneecap.control.spec import config_map_ref

        ref = config_map_ref(spec)
        if ref is None:
            return None
        return await asyncio.to_thread(self.kube.get, "v1/configmaps", self.namespace, ref.name)

    async def _start(self, added: PodAdded) -> PodProc | None:
        """Start the Pod's twin; once it answers, the Pod is Ready in the API and in the Service."""
        name, pod_name = added.deployment["metadata"]["name"], added.name
        arch, gpu = await self._owner(added.deployment)
        port = free_port()
        argv = twin_argv(manifests.vllm_container(added.replicaset), arch, gpu, port, self.time_scale,
                         self.clock.anchor() if self.clock is not None else None)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the source tree, for an uninstalled checkout
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        err = open(self.log_dir / f"{pod_name}.log", "ab") if self.log_dir else asyncio.subprocess.DEVNULL
        if self.clock is not None:
            self.clock.hold()  # the process start is this machine's time, not the pod's
        try:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kneecap", "twin", *argv,
                                                        stdout=asyncio.subprocess.DEVNULL, stderr=err, env=env)
            if self.log_dir:
                err.close()
            pod = PodProc(pod_name, name, added.template, port, proc, argv)
            self.pods[pod_name] = pod
            self.started[name] = self.started.get(name, 0) + 1
            ready = await self._wait_ready(pod)
        finally:
            if self.clock is not None:
                self.clock.release()
        if ready and not await asyncio.to_thread(self._kubelet.report_ready, pod_name, annotations={
                manifests.METRICS_URL_ANNOTATION: pod.url + "/metrics", "kneecap.io/template-hash": pod.template}):
            self.pods.pop(pod_name, None)  # deleted while it started
            await self._stop_proc(pod)
            return None
        if not ready:  # the next sync starts the Pod's twin again
            self.events.append({"event": "failed", "deployment": name, "pod": pod_name, "rc": proc.returncode})
            await self._stop_proc(pod)
            self.pods.pop(pod_name, None)
            self._kubelet.forget(pod_name)
            return None
        pod.ready = True
        self.events.append({"event": "ready", "deployment": name, "pod": pod_name, "template": pod.template,
                            "argv": argv})
        self.on_endpoints(name, self.urls(name))
        return pod

    async def _wait_ready(self, pod: PodProc) -> bool:
        """The readiness probe: GET /health until it answers 200."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline:
                if pod.proc.returncode is not None:
                    return False
                try:
                    async with session.get(pod.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            return True
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        return False

    async def _retire(self, pod: PodProc) -> None:
        """Out of the Service, drain, stop (a deleted pod's graceful termination)."""
        pod.ready = False
        self.on_endpoints(pod.deployment, self.urls(pod.deployment))
        if self.drain is not None:
            await self.drain(pod.url)
        await self._stop_proc(pod)
        self.pods.pop(pod.name, None)

    @staticmethod
    async def _stop_proc(pod: PodProc) -> None:
        if pod.proc.returncode is None:
            pod.proc.terminate()
            try:
                await asyncio.wait_for(pod.proc.wait(), 10)
            except asyncio.TimeoutError:
                pod.proc.kill()
                await pod.proc.wait()
