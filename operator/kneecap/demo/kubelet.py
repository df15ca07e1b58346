"""A kubelet shim: runs one `kneecap twin` process per pod of each kneecap-owned Deployment (and,
given `unowned`, of every other Deployment in the namespace: a user's that kneecap adopts).

What a cluster would do for the demo, on one machine: for every Deployment labelled
``app.kubernetes.io/managed-by=kneecap`` it keeps ``spec.replicas`` twin processes whose
argv is the vLLM container's args (the twin takes vLLM's flags) plus the owner's model shape
and GPU, the demo's time scale and the demo's clock to start on. A changed pod template (new
``--max-num-seqs``, memory flag) is rolled out like a Deployment's default RollingUpdate with
one replica: the new pod starts, becomes Ready, joins the Service, then the old pod leaves it,
drains its in-flight requests and stops. Each such replacement counts as one restart. Pods are
written into the emulated API (Ready, with the ``kneecap.io/metrics-url`` annotation) owned by a
ReplicaSet of the Deployment, as the Deployment controller makes them (`add_owned_pod`), so the
operator finds and scrapes them,
and the Deployment's status says how far the rollout is (the API is run without kmock's
instant rollouts), so the operator's rollout guard holds while a pod restarts.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp

from kneecap.control import manifests
from kneecap.demo.clock import free_port
from kneecap.demo.kubeapi import LLMD, KubeAPIThread
from kneecap.emulation.workloads import HASH_LABEL, controller_ref, template_hash

DEPLOY = "apps/v1/deployments"
REPLICASETS = "apps/v1/replicasets"
PODS = "v1/pods"
STRIP_FLAGS = ("--port", "--host")


def replicaset_of(kube: KubeAPIThread, deploy: dict) -> dict:
    """The Deployment's ReplicaSet for its current pod template, created as the Deployment
    controller does (``<deployment>-<pod-template-hash>``, controlled by the Deployment)."""
    meta, h = deploy["metadata"], template_hash(deploy["spec"]["template"])
    name, ns = f"{meta['name']}-{h}", meta["namespace"]
    rs = kube.get(REPLICASETS, ns, name)
    if rs is not None:
        return rs
    labels = {**(deploy["spec"]["template"]["metadata"].get("labels") or {}), HASH_LABEL: h}
    return kube.create(REPLICASETS, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
                     "ownerReferences": [controller_ref(deploy)]},
        "spec": {"replicas": int(deploy["spec"].get("replicas", 1)),
                 "selector": {"matchLabels": {**deploy["spec"]["selector"]["matchLabels"], HASH_LABEL: h}},
                 "template": {**deploy["spec"]["template"],
                              "metadata": {**deploy["spec"]["template"]["metadata"], "labels": labels}}}})


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
    in_api: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Kubelet:
    """Reconciles twin processes with the Deployments in one namespace (module docstring)."""

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
    _seq: int = 0
    _owners: dict[str, tuple[str, str]] = field(default_factory=dict)

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

    async def sync(self) -> None:
        deploys = await asyncio.to_thread(self.kube.list, DEPLOY, self.namespace,
                                          None if self.unowned else f"app.kubernetes.io/managed-by={manifests.MANAGER}")
        live = {d["metadata"]["name"] for d in deploys}
        for d in deploys:
            await self._sync_deployment(d)
        for pod in [p for p in self.pods.values() if p.deployment not in live]:
            await self._retire(pod)

    def urls(self, deployment: str) -> list[str]:
        return [p.url for p in self.pods.values() if p.deployment == deployment and p.ready]

    # ------------------------------------------------------------ one Deployment
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

    async def _sync_deployment(self, d: dict) -> None:
        name = d["metadata"]["name"]
        want = int(d["spec"].get("replicas", 1))
        tmpl = template_hash(d["spec"]["template"])
        mine = [p for p in self.pods.values() if p.deployment == name]
        current = [p for p in mine if p.template == tmpl]
        stale = [p for p in mine if p.template != tmpl]
        if len(current) < want:  # surge: start the missing pods of the new template first
            arch, gpu = await self._owner(d)
            new = await asyncio.gather(*(self._start(d, tmpl, arch, gpu) for _ in range(want - len(current))))
            current += [p for p in new if p is not None]
            for _ in new:
                if stale:  # one old pod leaves for each new one that is Ready
                    old = stale.pop(0)
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    self.events.append({"event": "restart", "deployment": name, "old": old.name,
                                        "template": tmpl})
                    await self._retire(old)
        for old in stale if len(current) >= want else []:
            await self._retire(old)
        for extra in current[want:]:  # scaled down
            await self._retire(extra)
        await self._write_status(name, d)

    async def _write_status(self, name: str, d: dict) -> None:
        """The Deployment's status as its controller would report it (the operator's rollout guard reads it)."""
        tmpl = template_hash(d["spec"]["template"])
        pods = [p for p in self.pods.values() if p.deployment == name]
        ready = [p for p in pods if p.ready]
        updated = [p for p in ready if p.template == tmpl]
        want = int(d["spec"].get("replicas", 1))
        st = {"observedGeneration": d["metadata"].get("generation", 1), "replicas": len(pods),
              "updatedReplicas": len(updated), "readyReplicas": len(ready), "availableReplicas": len(ready),
              "unavailableReplicas": max(want - len(updated), 0)}
        if (d.get("status") or {}) != st:
            await asyncio.to_thread(self.kube.patch, DEPLOY, self.namespace, name, {"status": st}, "status")

    async def _start(self, d: dict, tmpl: str, arch: str, gpu: str) -> PodProc | None:
        name = d["metadata"]["name"]
        self._seq += 1
        pod_name = f"{name}-{tmpl[:6]}-{self._seq}"
        port = free_port()
        argv = twin_argv(manifests.vllm_container(d), arch, gpu, port, self.time_scale,
                         self.clock.anchor() if self.clock is not None else None)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the source tree, for an uninstalled checkout
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        err = open(self.log_dir / f"{pod_name}.log", "wb") if self.log_dir else asyncio.subprocess.DEVNULL
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
        if not ready:
            self.events.append({"event": "failed", "deployment": name, "pod": pod_name, "rc": proc.returncode})
            await self._stop_proc(pod)
            self.pods.pop(pod_name, None)
            return None
        await asyncio.to_thread(add_owned_pod, self.kube, d, pod_name, "127.0.0.1", port,
                                {manifests.METRICS_URL_ANNOTATION: pod.url + "/metrics",
                                 "kneecap.io/template-hash": tmpl})
        pod.ready = pod.in_api = True
        self.events.append({"event": "ready", "deployment": name, "pod": pod_name, "template": tmpl,
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
        """Out of the Service and the API, drain, stop (a pod's graceful termination)."""
        pod.ready = False
        self.on_endpoints(pod.deployment, self.urls(pod.deployment))
        if pod.in_api:
            await asyncio.to_thread(self.kube.delete, PODS, self.namespace, pod.name)
            pod.in_api = False
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
