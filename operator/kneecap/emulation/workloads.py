"""What a cluster's Deployment and ReplicaSet controllers write, as the demo's kubelet
(:mod:`kneecap.demo.kubelet`) and virtual time's (:mod:`kneecap.sim.kubelet_virtual`) both
write it: ReplicaSets named and labelled by the pod template's hash, controller
ownerReferences from pod to ReplicaSet to Deployment, the Ready condition."""

from __future__ import annotations

import hashlib
import json

from kneecap.control.kube import resource_path

HASH_LABEL = "pod-template-hash"


def template_hash(template: dict) -> str:
    """A stable short hash of a pod template (what the pod-template-hash label stands for)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def controller_ref(owner: dict) -> dict:
    """The ownerReference a controller puts on what it makes (``controller: true``)."""
    meta = owner["metadata"]
    return {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind", ""), "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def owned_by(obj: dict, uid: str) -> bool:
    """Whether `obj`'s controller ownerReference names `uid`."""
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


def is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def replicasets_path(ns: str, name: str | None = None) -> str:
    return resource_path("apps/v1", "replicasets", ns, name)


def pod_path(ns: str, name: str) -> str:
    return resource_path("v1", "pods", ns, name)
