"""What a cluster's Deployment and ReplicaSet controllers write
(:mod:`kneecap.emulation.controllers`, and the benchmark's canned pods,
:func:`kneecap.emulation.kubeapi.add_owned_pod`): ReplicaSets named and labelled by the pod template's hash, controller
ownerReferences from pod to ReplicaSet to Deployment, the Ready condition."""

from __future__ import annotations

import copy
import hashlib
import json


HASH_LABEL = "pod-template-hash"


def template_hash(template: dict) -> str:
    """A stable short hash of a pod template (what the pod-template-hash label stands for)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def controller_ref(owner: dict) -> dict:
    """The ownerReference a controller puts on what it makes (``controller: true``)."""
    meta = owner["metadata"]
    return {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind", ""), "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def replicaset_for(deploy: dict, replicas: int) -> dict:
    """The ReplicaSet the Deployment controller makes for a Deployment's current pod template:
    ``<deployment>-<pod-template-hash>``, the template's labels plus the hash on it, its pods and
    its selector, controlled by the Deployment."""
    h = template_hash(deploy["spec"]["template"])
    template = copy.deepcopy(deploy["spec"]["template"])
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[HASH_LABEL] = h
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{deploy['metadata']['name']}-{h}", "labels": dict(labels),
                         "ownerReferences": [controller_ref(deploy)]},
            "spec": {"replicas": int(replicas),
                     "selector": {"matchLabels": {**deploy["spec"]["selector"]["matchLabels"], HASH_LABEL: h}},
                     "template": template}}


def owned_by(obj: dict, uid: str) -> bool:
    """Whether `obj`'s controller ownerReference names `uid`."""
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


def is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])

