"""The emulations' kubelet: which pods to run and what to report about them, for one namespace.

Level-triggered over the store's synchronous verbs (:class:`kneecap.emulation.store.Store`, or
the demo's :class:`kneecap.emulation.kubeapi.HttpStore`), as the real kubelet reconciles:

* ``sync()`` lists the pods of the namespace's Deployments (through their controller
  ownerReferences: pod → ReplicaSet → Deployment, made by :mod:`kneecap.emulation.controllers`)
  and returns the pods it has not seen (:class:`PodAdded`) and the ones gone from the API
  (:class:`PodDeleted`); a pod whose ReplicaSet's template is no longer its Deployment's was
  replaced by a rollout: a restart;
* ``report_started`` and ``report_ready`` write what a kubelet writes to a pod's status
  (Running with an IP, then the Ready condition) and the annotations it is given.

What runs in a pod is the node's, as a container runtime's is the real kubelet's: the demo's
``kneecap twin`` processes (:mod:`kneecap.demo.twin_node`), virtual time's in-process engines
(:mod:`kneecap.sim.engine_node`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kneecap.control.informer import controller_uid
from kneecap.control.kube import ApiError, deployments_path, pods_path, replicasets_path
from kneecap.emulation.store import Store
from kneecap.emulation.workloads import HASH_LABEL, template_hash


@dataclass(frozen=True)
class PodAdded:
    """A pod the kubelet has not run yet, with the ReplicaSet and Deployment that own it."""

    pod: dict
    replicaset: dict
    deployment: dict

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def template(self) -> str:
        """The pod-template-hash it runs."""
        return self.replicaset["metadata"]["labels"][HASH_LABEL]


@dataclass(frozen=True)
class PodDeleted:
    """A pod gone from the API; ``restart``: a rollout of its Deployment's new template replaced it."""

    name: str
    deployment: str
    restart: bool


class Kubelet:
    """Pods to run and their status, for one namespace (module docstring). ``deployment_selector``:
    only the pods of the Deployments it selects (None: every Deployment's)."""

    def __init__(self, api: Store, namespace: str, *, deployment_selector: str | None = None):
        self.api, self.ns, self.deployment_selector = api, namespace, deployment_selector
        self.running: dict[str, tuple[str, str, str]] = {}  # pod -> its Deployment's uid and name, its template hash

    def sync(self) -> tuple[list[PodAdded], list[PodDeleted]]:
        """New pods (in the API's order) and deleted ones since the last pass."""
        deploys = {d["metadata"]["uid"]: d
                   for d in self.api.list_now(deployments_path(self.ns), self.deployment_selector, copy_items=False)}
        replicasets = {r["metadata"]["uid"]: r for r in self.api.list_now(replicasets_path(self.ns), copy_items=False)}
        added, live = [], set()
        for pod in self.api.list_now(pods_path(self.ns), copy_items=False):
            rs = replicasets.get(controller_uid(pod))
            deploy = deploys.get(controller_uid(rs)) if rs is not None else None
            if deploy is None:
                continue
            name = pod["metadata"]["name"]
            live.add(name)
            if name not in self.running:
                found = PodAdded(pod, rs, deploy)
                self.running[name] = (deploy["metadata"]["uid"], deploy["metadata"]["name"], found.template)
                added.append(found)
        deleted = []
        for name, (uid, deployment, template) in list(self.running.items()):
            if name not in live:
                del self.running[name]
                deploy = deploys.get(uid)
                rolled_out = deploy is not None and template_hash(deploy["spec"]["template"]) != template
                deleted.append(PodDeleted(name, deployment, rolled_out))
        return added, deleted

    def forget(self, name: str) -> None:
        """The pod did not start: the next ``sync`` offers it again."""
        self.running.pop(name, None)

    def report_started(self, name: str, ip: str) -> bool:
        """Scheduled and Running at ``ip``, not Ready yet (its containers start); False when the pod
        is no longer in the API (deleted since the pass that found it)."""
        try:
            self.api.patch_now(pods_path(self.ns, name) + "/status", {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def report_ready(self, name: str, *, since: str | None = None, annotations: dict | None = None) -> bool:
        """The Ready condition (``since``: its lastTransitionTime) and ``annotations``; False when the
        pod is no longer in the API."""
        path = pods_path(self.ns, name)
        ready = {"type": "Ready", "status": "True", **({"lastTransitionTime": since} if since else {})}
        try:
            if annotations:
                self.api.patch_now(path, {"metadata": {"annotations": annotations}})
            self.api.patch_now(path + "/status", {"status": {"conditions": [
                {"type": "PodScheduled", "status": "True"}, ready]}})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True
