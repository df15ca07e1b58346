"""What the real controller-manager and scheduler do with what kneecap writes: a template change
rolled out by the Deployment controller one pod at a time (maxSurge 0), the garbage collector
deleting what an LLMDeployment owns and nothing it adopted, and the scheduler leaving a pod that
does not tolerate the GPU taint Pending, which kneecap's status explains."""

from __future__ import annotations

import copy
import threading


from tests.kube.conftest import OPERATOR_USER, OperatorProcess
from tests.support.control_plane import ControlPlane
from tests.support.examples import ROOT, colocated, documents, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
NS = "controllers"
DEPLOY = "apps/v1/deployments"


def _llmd(name: str, **spec) -> dict:
    return colocated(name, NS, **spec)


def _condition(admin, name: str, type_: str) -> dict:
    st = (admin.get(LLMD, NS, name) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def _wait_ready(plane: ControlPlane, op: OperatorProcess, name: str) -> None:
    try:
        plane.wait_for(lambda: _condition(plane.admin, name, "Ready").get("status") == "True", 120, f"{name} Ready")
    except Exception:
        raise AssertionError(f"{name}: {_condition(plane.admin, name, 'Ready')}\n{op.tail()}") from None


def test_a_template_change_rolls_out_one_pod_at_a_time(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    name = "rollout"
    admin.create(LLMD, _llmd(name, topology={"replicas": {"min": 3, "max": 3}}))
    _wait_ready(control_plane, operator, name)
    control_plane.wait_for(lambda: (admin.get(DEPLOY, NS, name).get("status") or {}).get("readyReplicas") == 3,
                           60, "3 ready replicas")
    selector = f"app.kubernetes.io/instance={name}"
    version = admin.list_version("apps/v1/replicasets", NS, selector)
    seen: list[dict] = []

    def watch():  # every ReplicaSet change after the list, none sampled away
        for _, rs in admin.watch("apps/v1/replicasets", NS, selector, version, timeout_s=90):
            seen.append({"name": rs["metadata"]["name"], "replicas": rs["spec"]["replicas"],
                         "ready": (rs.get("status") or {}).get("readyReplicas", 0)})
            latest = {}
            for s in seen:
                latest[s["name"]] = s
            if len(latest) == 2 and all(s["replicas"] == (3 if s["name"] != first else 0) for s in latest.values()) \
                    and sum(s["ready"] for s in latest.values()) == 3:
                return

    (first,) = [rs["metadata"]["name"] for rs in admin.list("apps/v1/replicasets", NS, selector)]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # a flag the user changes: the pool's template changes, the Deployment controller rolls it out
    admin.patch(LLMD, NS, name, {"spec": {"engine": {"extraArgs": ["--max-model-len=4096"]}}})
    watcher.join(100)
    assert not watcher.is_alive(), f"the rollout did not finish; ReplicaSet changes seen: {seen}"
    deployment = admin.get(DEPLOY, NS, name)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert "--max-model-len=4096" in " ".join(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    # replay the ReplicaSets' desired replicas change by change: never above 3 (maxSurge 0), the
    # new one growing one pod at a time
    latest: dict[str, int] = {}
    totals, new_steps = [], []
    for s in seen:
        latest[s["name"]] = s["replicas"]
        totals.append(sum(latest.values()))
        if s["name"] != first:
            new_steps.append(s["replicas"])
    assert max(totals) <= 3, totals
    assert {1, 2, 3} <= set(new_steps) and all(0 <= b - a <= 1 for a, b in zip(new_steps, new_steps[1:])), new_steps
    rollers = {e["user"]["username"] for e in control_plane.audit()
               if e["objectRef"].get("resource") == "replicasets" and e["verb"] in ("update", "patch")
               and e["objectRef"].get("name") == first}
    assert "system:serviceaccount:kube-system:deployment-controller" in rollers, rollers
    assert OPERATOR_USER not in rollers


def test_deleting_an_llmdeployment_collects_what_it_owns_not_what_it_adopted(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    owned = "owned"
    admin.create(LLMD, _llmd(owned))
    _wait_ready(control_plane, operator, owned)
    # an adopted target: the team's own Deployment (examples/adopt-production-stack.yaml's)
    path = ROOT / "examples" / "adopt-production-stack.yaml"
    (target,) = [d for d in documents(path) if d["kind"] == "Deployment"]
    target["metadata"]["namespace"] = NS
    target["spec"]["template"]["spec"].pop("volumes")
    target["spec"]["template"]["spec"]["containers"][0].pop("volumeMounts")
    target["spec"]["template"]["spec"]["containers"][0].pop("env")
    admin.create(DEPLOY, target)
    adopter = copy.deepcopy(llmdeployment(path))
    adopter["metadata"] = {"name": "adopter", "namespace": NS}
    admin.create(LLMD, adopter)
    _wait_ready(control_plane, operator, "adopter")
    uid = admin.get(LLMD, NS, owned)["metadata"]["uid"]
    target_before = admin.get(DEPLOY, NS, target["metadata"]["name"])
    mark = control_plane.audit_mark()

    for name in (owned, "adopter"):
        assert admin.delete(LLMD, NS, name, propagation="Background") == 200
    control_plane.wait_for(lambda: admin.get(LLMD, NS, owned) is None and admin.get(LLMD, NS, "adopter") is None,
                           60, "both LLMDeployments gone")
    selector = f"app.kubernetes.io/instance={owned}"
    control_plane.wait_for(lambda: not admin.list(DEPLOY, NS, selector) and not admin.list("v1/services", NS, selector)
                           and not admin.list("apps/v1/replicasets", NS, selector)
                           and not admin.list("v1/pods", NS, selector), 90, "the owned objects collected")
    # the real garbage collector removed the pool's ReplicaSet and pods (owned through the Deployment)
    deleters = {(e["objectRef"]["resource"], e["user"]["username"]) for e in control_plane.audit(since_line=mark)
                if e["verb"] == "delete" and e["responseStatus"]["code"] == 200}
    assert ("replicasets", "system:serviceaccount:kube-system:generic-garbage-collector") in deleters, deleters
    # the adopted Deployment is the team's: still there, unchanged, no ownerReference to kneecap
    target_after = admin.get(DEPLOY, NS, target["metadata"]["name"])
    assert target_after["metadata"]["uid"] == target_before["metadata"]["uid"]
    assert target_after["metadata"]["generation"] == target_before["metadata"]["generation"]
    assert uid not in [o["uid"] for o in target_after["metadata"].get("ownerReferences") or []]
    assert int(target_after["status"].get("readyReplicas", 0)) == target["spec"]["replicas"]


def test_a_pod_without_the_gpu_toleration_stays_pending_and_status_says_why(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    name = "no-toleration"
    # selects the tainted H100 nodes without tolerating their taint
    admin.create(LLMD, _llmd(name, engine={"podTemplate": {"spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}}))

    def unschedulable():
        cond = _condition(admin, name, "Ready")
        return cond if cond.get("reason") == "PodsUnschedulable" else None

    cond = control_plane.wait_for(unschedulable, 90, f"{name} Ready=False/PodsUnschedulable")
    assert cond["status"] == "False"
    assert "cannot be scheduled" in cond["message"] and "untolerated taint" in cond["message"], cond["message"]
    (pod,) = admin.list("v1/pods", NS, selector=f"app.kubernetes.io/instance={name}")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert (admin.get(LLMD, NS, name)["status"]["phase"]) == "Pending"
    # tolerating the taint schedules it; Ready follows
    admin.patch(LLMD, NS, name, {"spec": {"engine": {"podTemplate": {"spec": {"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}}})
    _wait_ready(control_plane, operator, name)
    (pod,) = [p for p in admin.list("v1/pods", NS, selector=f"app.kubernetes.io/instance={name}")
              if not p["metadata"].get("deletionTimestamp")]
    assert pod["spec"]["nodeName"].startswith("gpu-node-") and pod["spec"]["nodeName"] != "gpu-node-c"
