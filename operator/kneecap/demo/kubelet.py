"""A kubelet shim: runs one `kneecap twin` process per pod of each kneecap-owned Deployment (and,
given `unowned`, of every other Deployment in the namespace: a user's that kneecap adopts).

What a cluster would do for the demo, on one machine. The Deployment and ReplicaSet controllers
are virtual time's (:mod:`kneecap.emulation.controllers`), run each poll over the emulated API
through :class:`HttpStore`: they make the ReplicaSet of each pod template, roll a changed template
out as a RollingUpdate (with one replica: the new pod starts, turns Ready, then the old one is
deleted), write the Deployment's status (the API is run without kmock's instant rollouts, so the
operator's rollout guard holds while a pod restarts) and create and delete the Pods. The kubelet
starts a twin process per Pod whose argv is the vLLM container's args (the twin takes vLLM's
flags) plus the owner's model shape and GPU, the demo's time scale and the demo's clock to start
on; once it answers /health it marks the Pod Running and Ready with the
``kneecap.io/metrics-url`` annotation, so the operator finds and scrapes it, and adds it to the
Service. A deleted Pod leaves the Service, drains its in-flight requests and stops; one deleted
because its ReplicaSet's template is no longer its Deployment's counts as a restart.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp

from kneecap.control import manifests
from kneecap.control.kube import ApiError, deployments_path, pods_path
from kneecap.demo.clock import free_port
from kneecap.demo.kubeapi import LLMD, KubeAPIThread
from kneecap.emulation.controllers import DeploymentController, ReplicaSetController
from kneecap.emulation.workloads import (HASH_LABEL, controller_ref, pod_path, replicaset_for, replicasets_path,
                                         template_hash)

DEPLOY = "apps/v1/deployments"
REPLICASETS = "apps/v1/replicasets"
PODS = "v1/pods"
STRIP_FLAGS = ("--port", "--host")


class HttpStore:
    """The synchronous verbs of :class:`kneecap.emulation.store.Store` over the emulated HTTP API,
    so the emulation's controllers run on the demo's API as they run on virtual time's store."""

    def __init__(self, kube: KubeAPIThread):
        self.kube = kube

    def _call(self, method: str, path: str, body=None, content_type: str = "application/merge-patch+json"):
        code, answer = self.kube.request(method, path, body, content_type)
        if code >= 300:
            raise ApiError(code, answer, f"{method} {path}")
        return answer

    def list_now(self, path: str, label_selector: str | None = None, *, copy_items: bool = True) -> list[dict]:
        query = f"?labelSelector={urllib.parse.quote(label_selector)}" if label_selector else ""
        return self._call("GET", path + query)["items"]

    def peek(self, path: str) -> dict | None:
        code, answer = self.kube.request("GET", path)
        return answer if code == 200 else None

    get_now = peek

    def create_now(self, path: str, obj: dict) -> dict:
        return self._call("POST", path, obj)

    def patch_now(self, path: str, patch: dict) -> dict:
        return self._call("PATCH", path, patch)

    def delete_now(self, path: str) -> bool:
        code, answer = self.kube.request("DELETE", path)
        if code not in (200, 404):
            raise ApiError(code, answer, f"DELETE {path}")
        return code == 200


def replicaset_of(kube: KubeAPIThread, deploy: dict) -> dict:
    """The Deployment's ReplicaSet for its current pod template, created as the Deployment
    controller does (``<deployment>-<pod-template-hash>``, controlled by the Deployment)."""
    body = replicaset_for(deploy, int(deploy["spec"].get("replicas", 1)))
    ns = deploy["metadata"]["namespace"]
    body["metadata"]["namespace"] = ns
    return kube.get(REPLICASETS, ns, body["metadata"]["name"]) or kube.create(REPLICASETS, body)


def add_owned_pod(kube: KubeAPIThread, deploy: dict | str, name: str, ip: str = "127.0.0.1", port: int = 8000,
                  annotations: dict | None = None, ready: bool = True, namespace: str | None = None,
                  timeout_s: float = 15.0) -> dict:
    """A running pod of a Deployment's current ReplicaSet, as a kubelet reports it. `deploy`: the
    Deployment, or its name in `namespace` (waited for up to `timeout_s`: the operator makes it)."""
    if isinstance(deploy, str):
        deadline = time.monotonic() + timeout_s
        while (found := kube.get(DEPLOY, namespace, deploy)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Deployment {namespace}/{deploy} after {timeout_s} s")
            time.sleep(0.05)
        deploy = found
    rs = replicaset_of(kube, deploy)
    return kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": rs["metadata"]["namespace"], "labels": rs["metadata"]["labels"],
                     "annotations": annotations or {}, "ownerReferences": [controller_ref(rs)]},
        "spec": {"containers": [{"name": manifests.CONTAINER, "image": "x", "ports": [{"containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


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
        return f"http://127.0.0.1:{self.port}"


def controller_name(obj: dict) -> str | None:
    """The name its controller ownerReference gives."""
    return next((r["name"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


@dataclass
class Kubelet:
    """Runs the controllers and the twin processes of one namespace (module docstring)."""

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

    def __post_init__(self) -> None:
        self._store = HttpStore(self.kube)
        self._deployments = DeploymentController(self._store, self.namespace)
        self._replicasets = ReplicaSetController(self._store, self.namespace)

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

    def _reconcile(self) -> tuple[dict[str, dict], dict[str, tuple[dict, dict]]]:
        """One pass of the controllers, then what the kubelet runs: the Deployments by name and
        each of their Pods with its ReplicaSet."""
        self._deployments.sync()
        self._replicasets.sync()
        selector = None if self.unowned else f"app.kubernetes.io/managed-by={manifests.MANAGER}"
        deploys = {d["metadata"]["name"]: d for d in self._store.list_now(deployments_path(self.namespace), selector)}
        replicasets = {r["metadata"]["name"]: r for r in self._store.list_now(replicasets_path(self.namespace))}
        pods = {}
        for pod in self._store.list_now(pods_path(self.namespace)):
            rs = replicasets.get(controller_name(pod) or "")
            if rs is not None and controller_name(rs) in deploys:
                pods[pod["metadata"]["name"]] = (pod, rs)
        return deploys, pods

    async def sync(self) -> None:
        deploys, pods = await asyncio.to_thread(self._reconcile)
        for pod in [p for p in self.pods.values() if p.name not in pods]:
            d = deploys.get(pod.deployment)
            if d is not None and template_hash(d["spec"]["template"]) != pod.template:
                self.restarts[pod.deployment] = self.restarts.get(pod.deployment, 0) + 1
                self.events.append({"event": "restart", "deployment": pod.deployment, "old": pod.name,
                                    "template": template_hash(d["spec"]["template"])})
            await self._retire(pod)
        await asyncio.gather(*(self._start(pod, rs, deploys[controller_name(rs)])
                               for name, (pod, rs) in pods.items() if name not in self.pods))

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

    async def _start(self, api_pod: dict, rs: dict, d: dict) -> PodProc | None:
        """Start the Pod's twin; once it answers, the Pod is Running and Ready in the API and in the Service."""
        name, pod_name = d["metadata"]["name"], api_pod["metadata"]["name"]
        tmpl = rs["metadata"]["labels"][HASH_LABEL]
        arch, gpu = await self._owner(d)
        port = free_port()
        argv = twin_argv(manifests.vllm_container(rs), arch, gpu, port, self.time_scale,
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
            pod = PodProc(pod_name, name, tmpl, port, proc, argv)
            self.pods[pod_name] = pod
            self.started[name] = self.started.get(name, 0) + 1
            ready = await self._wait_ready(pod)
        finally:
            if self.clock is not None:
                self.clock.release()
        if ready:
            try:
                await asyncio.to_thread(self._mark_ready, pod)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                self.pods.pop(pod_name, None)  # deleted while it started
                await self._stop_proc(pod)
                return None
        if not ready:  # the next sync starts the Pod's twin again
            self.events.append({"event": "failed", "deployment": name, "pod": pod_name, "rc": proc.returncode})
            await self._stop_proc(pod)
            self.pods.pop(pod_name, None)
            return None
        pod.ready = True
        self.events.append({"event": "ready", "deployment": name, "pod": pod_name, "template": tmpl,
                            "argv": argv})
        self.on_endpoints(name, self.urls(name))
        return pod

    def _mark_ready(self, pod: PodProc) -> None:
        """The Pod's metrics URL, then its Running and Ready status, as a kubelet reports them."""
        path = pod_path(self.namespace, pod.name)
        self._store.patch_now(path, {"metadata": {"annotations": {
            manifests.METRICS_URL_ANNOTATION: pod.url + "/metrics", "kneecap.io/template-hash": pod.template}}})
        self._store.patch_now(path + "/status", {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})

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
