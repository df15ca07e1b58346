"""What a cluster's Deployment and ReplicaSet controllers do, as level-triggered ``sync()`` passes
over the store's synchronous verbs (:class:`kneecap.emulation.store.Store`, or any object with
its ``list_now``/``peek``/``create_now``/``patch_now``/``delete_now``):

* Deployment controller: one ReplicaSet per pod template (``<deployment>-<pod-template-hash>``,
  a controller ownerReference to the Deployment, the ``pod-template-hash`` label), a
  RollingUpdate bounded by ``maxSurge``/``maxUnavailable`` (Kubernetes' defaults 25%/25%,
  surge rounded up, unavailable down), and the Deployment's status (observedGeneration,
  replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas);
* ReplicaSet controller: creates or deletes pods (controller ownerReference to the ReplicaSet,
  the template's labels, deterministic names) to match ``spec.replicas``, deleting not-ready
  pods first.

The kubelet (:mod:`kneecap.emulation.kubelet`) then runs the pods they make, on virtual time's
node (:mod:`kneecap.sim.engine_node`) or the demo's (:mod:`kneecap.demo.twin_node`).
"""

from __future__ import annotations

import json

from kneecap.control.kube import deployments_path, pods_path, replicasets_path
from kneecap.control.restart import rolling_update
from kneecap.emulation.store import Store
from kneecap.emulation.workloads import HASH_LABEL, controller_ref, is_ready, owned_by, replicaset_for, template_hash


class DeploymentController:
    """Deployments → ReplicaSets, with rolling updates (module docstring)."""

    def __init__(self, api: Store, namespace: str):
        self.api, self.ns = api, namespace

    def sync(self) -> None:
        pods = self.api.list_now(pods_path(self.ns), copy_items=False)
        for d in self.api.list_now(deployments_path(self.ns), copy_items=False):
            self._sync_one(d, pods)

    def _sync_one(self, d: dict, pods: list[dict]) -> None:
        api, ns = self.api, self.ns
        desired = int(d["spec"].get("replicas", 1))
        h = template_hash(d["spec"]["template"])
        rss = [r for r in api.list_now(replicasets_path(self.ns), copy_items=False)
               if owned_by(r, d["metadata"]["uid"])]
        new = next((r for r in rss if r["metadata"]["labels"].get(HASH_LABEL) == h), None)
        old = [r for r in rss if r is not new]
        if new is None:
            api.create_now(replicasets_path(ns), replicaset_for(d, desired if not old else 0))
            new = api.peek(replicasets_path(ns, f"{d['metadata']['name']}-{h}"))

        def rs_pods(rs):
            return [p for p in pods if owned_by(p, rs["metadata"]["uid"])]

        def scale(rs, n):
            if int(rs["spec"]["replicas"]) != n:
                api.patch_now(replicasets_path(ns, rs["metadata"]["name"]), {"spec": {"replicas": int(n)}})

        if not old:
            scale(new, desired)
        else:
            surge, unavailable = rolling_update(d)
            old_total = sum(int(r["spec"]["replicas"]) for r in old)
            # scale the new ReplicaSet up within desired + maxSurge pods in all
            scale(new, max(int(new["spec"]["replicas"]), min(desired, desired + surge - old_total)))
            new = api.peek(replicasets_path(ns, new["metadata"]["name"]))
            # scale old ones down while at least desired − maxUnavailable pods stay available
            available = sum(is_ready(p) for r in [new, *old] for p in rs_pods(r))
            room = available - (desired - unavailable)
            for r in old:
                n = int(r["spec"]["replicas"])
                unready = sum(not is_ready(p) for p in rs_pods(r))
                cut = min(n, unready + max(room, 0))  # unready pods go first, at no cost
                room -= max(cut - unready, 0)
                scale(r, n - cut)
        all_pods = [p for r in [new, *old] for p in rs_pods(r)]
        new_pods = rs_pods(new)
        ready = sum(is_ready(p) for p in all_pods)
        st = {"observedGeneration": d["metadata"].get("generation", 1), "replicas": len(all_pods),
              "updatedReplicas": len(new_pods), "readyReplicas": ready, "availableReplicas": ready,
              "unavailableReplicas": max(desired - ready, 0)}
        if (d.get("status") or {}) != st:
            api.patch_now(deployments_path(ns, d["metadata"]["name"]) + "/status", {"status": st})


class ReplicaSetController:
    """ReplicaSets → Pods (module docstring). Pod names are deterministic."""

    def __init__(self, api: Store, namespace: str):
        self.api, self.ns = api, namespace
        self._seq = 0

    def sync(self) -> None:
        pods = self.api.list_now(pods_path(self.ns), copy_items=False)
        for rs in self.api.list_now(replicasets_path(self.ns), copy_items=False):
            mine = [p for p in pods if owned_by(p, rs["metadata"]["uid"])]
            want = int(rs["spec"]["replicas"])
            for _ in range(want - len(mine)):
                self._seq += 1
                tmpl = rs["spec"]["template"]
                self.api.create_now(pods_path(self.ns), {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{rs['metadata']['name']}-{self._seq:05d}",
                                 "labels": dict(tmpl["metadata"].get("labels") or {}),
                                 "annotations": dict(tmpl["metadata"].get("annotations") or {}),
                                 "ownerReferences": [controller_ref(rs)]},
                    "spec": json.loads(json.dumps(tmpl["spec"])),
                    "status": {"phase": "Pending"}})
            if len(mine) > want:
                # not-ready first, then the newest (the ReplicaSet controller's ranking, simplified)
                order = sorted(mine, key=lambda p: (is_ready(p), p["metadata"]["name"]))
                order = [p for p in order if not is_ready(p)] + sorted(
                    [p for p in order if is_ready(p)], key=lambda p: p["metadata"]["name"], reverse=True)
                for p in order[:len(mine) - want]:
                    self.api.delete_now(pods_path(self.ns, p["metadata"]["name"]))
