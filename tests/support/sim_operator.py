"""The control loop on the real control plane, on the twins' clock.

The operator runs in process (`kopf.testing.KopfRunner` with `build_registry`) as the chart's
ServiceAccount, connected to the real kube-apiserver or to a `FaultProxy` in front of it, with
`TwinTime` as its clock and scrape (tests/support/twins.py): every rate, window and cooldown is
in the twins' seconds however far they lag. The Deployment controller, the scheduler and kwok
make the pods; `SimPods` starts a `kneecap twin` on each Running pod's own IP and engine port,
with the cap the pod's container asks for (``--max-num-seqs``), on the same clock, and a load
on it, so the operator scrapes pods exactly as in a cluster and a restarted pod comes back with
the new cap, as vLLM does.
"""

from __future__ import annotations

import time

import kopf
from kopf.testing import KopfRunner

from kneecap.control import vllm_args
from kneecap.control.handlers import OperatorConfig, build_registry, operator_settings
from tests.support.control_plane import ControlPlane, KubeClient
from tests.support.twins import Twin, TwinTime

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
SCALE = 10.0
MODEL, ARCH, GPU = "facebook/opt-1.3b", "opt-1.3b", "h100-64gb"
ENGINE_PORT = 8000  # spec.engine.port's default
PHASES = [(0.6, 25.0), (6.0, 60.0)]  # low then high load: two batch levels (SLIM needs more than one)
TWIN_START_S = 120.0  # a hang bound on a twin's start (its /health answering)


def resource(ns: str, name: str, mode: str, cooldown: str = "600s", control: dict | None = None, **over) -> dict:
    """One pod of OPT-1.3B with a cap of 8 (far below its knee); a restart is downtime, which
    these resources allow."""
    spec = {"model": {"name": MODEL}, "accelerator": {"type": GPU},
            "engine": {"image": "vllm/vllm-openai:v0.11.0", "maxNumSeqs": 8, "extraArgs": []},
            "control": {"mode": mode, "interval": "5s", "window": "5s", "cooldown": cooldown, "minObservations": 3,
                        "maxFitError": 0.5, "allowDowntime": True, **(control or {})}}
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def sim_operator(url: str, plane: ControlPlane, token: str, ns: str, config: OperatorConfig) -> KopfRunner:
    """`kneecap run --standalone --namespace NS` in process, on `url` (the apiserver or a proxy)
    with `token` (the chart's ServiceAccount's)."""
    config.connection = kopf.ConnectionInfo(server=url, ca_path=str(plane.pki.ca), token=token)
    settings = operator_settings([ns])
    settings.watching.server_timeout = 10
    return KopfRunner(["run", "--standalone", "--namespace", ns, "--verbose"],
                      registry=build_registry(config), settings=settings, timeout=60)


def wait_for(fn, timeout_s: float = 60.0, what: str = "condition", every_s: float = 0.1, explain=None):
    """`fn()` once truthy; on a timeout the error carries `explain()` (the state that was seen)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}"
                         + (f"; {explain()}" if explain else ""))


def status(admin: KubeClient, ns: str, name: str) -> dict:
    return (admin.get(LLMD, ns, name) or {}).get("status") or {}


def condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def events(admin: KubeClient, ns: str, reason: str | None = None, name: str | None = None) -> list[dict]:
    return [e for e in admin.list("v1/events", ns) if (reason is None or e.get("reason") == reason)
            and (name is None or e.get("involvedObject", {}).get("name") == name)]


def writes_to(plane: ControlPlane, user: str, resource: str, name: str, verbs: tuple[str, ...] = ("patch",),
              since_line: int = 0) -> list[dict]:
    """The audit log's successful `verbs` requests by `user` on the named object of `resource`
    (``deployments``), its subresources aside."""
    return [e for e in plane.audit(user, since_line=since_line)
            if e.get("verb") in verbs and e["objectRef"].get("resource") == resource
            and e["objectRef"].get("name") == name and not e["objectRef"].get("subresource")
            and 200 <= e["responseStatus"].get("code", 0) < 300]


def templates(admin: KubeClient, ns: str, deployment: str) -> int:
    """How many pod templates the Deployment has had: its ReplicaSets (one per template, kept by
    revisionHistoryLimit), so a restart of its pods is one more and a scale none."""
    return sum(1 for rs in admin.list("apps/v1/replicasets", ns)
               if any(o.get("name") == deployment for o in rs["metadata"].get("ownerReferences") or []))


def container(admin: KubeClient, ns: str, deployment: str) -> dict:
    return admin.get(DEPLOY, ns, deployment)["spec"]["template"]["spec"]["containers"][0]


class SimPods:
    """A twin on `sim`'s clock for each Running pod of one pool (module docstring), each under
    its own `sim.load` of `phases` ((rate/s, seconds) on the twin's clock). `sync()` starts what
    a new pod needs, stops the twins of pods that are gone, and returns the twins by pod name."""

    def __init__(self, admin: KubeClient, sim: TwinTime, ns: str, deployment: str,
                 phases: list[tuple[float, float]] | None = None, gpu: str = GPU, seed: int = 1):
        self.admin, self.sim, self.ns, self.deployment = admin, sim, ns, deployment
        self.phases, self.gpu, self.seed = phases, gpu, seed
        self.twins: dict[str, Twin] = {}
        self.caps: dict[str, int] = {}  # by pod name: the cap its twin runs with
        self.loads: list = []

    def _pods(self) -> dict[str, tuple[str, int]]:
        """Running pods of the Deployment's ReplicaSets: name -> (IP, the container's cap)."""
        sets = {rs["metadata"]["name"] for rs in self.admin.list("apps/v1/replicasets", self.ns)
                if any(o.get("name") == self.deployment for o in rs["metadata"].get("ownerReferences") or [])}
        out = {}
        for p in self.admin.list("v1/pods", self.ns):
            owners = {o.get("name") for o in p["metadata"].get("ownerReferences") or []}
            if owners & sets and p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP") \
                    and not p["metadata"].get("deletionTimestamp"):
                cap = int(vllm_args.container_flag(p["spec"]["containers"][0], "--max-num-seqs"))
                out[p["metadata"]["name"]] = (p["status"]["podIP"], cap)
        return out

    def sync(self) -> dict[str, Twin]:
        pods = self._pods()
        for name in set(self.twins) - set(pods):
            self.twins.pop(name).stop()
            self.caps.pop(name)
        for name, (ip, cap) in pods.items():
            if name not in self.twins:
                self.caps[name] = cap
                # registered before it starts: a start that times out still leaves a process to stop
                twin = self.twins[name] = Twin(MODEL, ARCH, self.gpu, max_num_seqs=cap, time_scale=SCALE, host=ip,
                                               port=ENGINE_PORT)
                # several twins and a control plane share the machine's cores: a start can be slow
                twin.start_timeout_s = TWIN_START_S
                self.sim.start(twin)
                if self.phases:
                    self.loads.append(self.sim.load(twin.url, self.phases, seed=self.seed))
        return dict(self.twins)

    def stop_loads(self) -> None:
        for p in self.loads:
            if p.poll() is None:
                p.terminate()
            p.wait(10)
        self.loads.clear()

    def replace_engines(self, gpu: str, phases: list[tuple[float, float]] | None) -> dict[str, Twin]:
        """Each pod's engine replaced by one on `gpu` (same pod, IP and port), under `phases`."""
        self.stop_loads()
        for twin in self.twins.values():
            twin.stop()
        self.twins.clear()
        self.caps.clear()
        self.gpu, self.phases = gpu, phases
        return self.sync()

    def rolled(self) -> dict[str, Twin] | None:
        """The twins once the Deployment's rollout is complete (every pod of its current
        template, none of an older one) and each of its pods has one; else None."""
        d = self.admin.get(DEPLOY, self.ns, self.deployment)
        st = d.get("status") or {}
        done = (st.get("observedGeneration") == d["metadata"]["generation"]
                and st.get("updatedReplicas") == st.get("replicas") == st.get("readyReplicas") == d["spec"]["replicas"])
        twins = self.sync()
        return twins if done and len(twins) == d["spec"]["replicas"] else None

    def wait(self, timeout_s: float = 120.0) -> dict[str, Twin]:
        """The twins, once at least one pod runs one."""
        return wait_for(self.sync, timeout_s, f"a Running pod of {self.ns}/{self.deployment}", every_s=0.2)

    def stop(self) -> None:
        self.stop_loads()
        for twin in self.twins.values():
            twin.stop()
        self.twins.clear()
        self.caps.clear()

