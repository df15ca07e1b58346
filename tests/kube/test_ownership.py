"""Objects kneecap did not create are not its own, on the real API: a Deployment or Service that
already holds a pool's name is refused (Conflict in status, a Warning Event) and left exactly as
its owner wrote it, through the ticks and the LLMDeployment's deletion (the audit log: no write
of the operator's user to it); only the pool's own pods are scraped, each on its own kwok IP."""

from __future__ import annotations

import copy

from tests.kube.conftest import OPERATOR_USER, wait_ticks
from tests.support.control_plane import ControlPlane, audit_writes, free_port
from tests.support.counting_server import CountingServer
from tests.support.examples import ROOT, colocated, condition, documents, status_of

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
NS = "ownership"


def _llmd(name: str, **spec) -> dict:
    return colocated(name, NS, **spec)


def _status(admin, name: str) -> dict:
    return status_of(admin, LLMD, NS, name)



def _conflict(admin, name: str) -> dict | None:
    st = _status(admin, name)
    return st if condition(st, "Conflict").get("status") == "True" else None


def _writes_to(plane: ControlPlane, since: int, resource: str, name: str) -> list[tuple]:
    return [(e["verb"], e["requestURI"]) for e in audit_writes(plane.audit(OPERATOR_USER, since_line=since))
            if e["objectRef"].get("resource") == resource and e["objectRef"].get("namespace") == NS
            and e["objectRef"].get("name") == name]


def _theirs_deployment(name: str) -> dict:
    (theirs,) = [d for d in documents(ROOT / "examples" / "adopt-production-stack.yaml") if d["kind"] == "Deployment"]
    theirs = copy.deepcopy(theirs)
    theirs["metadata"] = {"name": name, "namespace": NS, "labels": {"team": "search"}}
    pod = theirs["spec"]["template"]["spec"]
    pod.pop("volumes")
    pod["containers"][0].pop("volumeMounts")
    pod["containers"][0].pop("env")
    return theirs


def _theirs_service(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS, "labels": {"team": "pay"}},
            "spec": {"selector": {"app": name}, "ports": [{"port": 443, "targetPort": 8443}]}}


def _delete(plane: ControlPlane, name: str) -> None:
    plane.admin.delete(LLMD, NS, name)
    plane.wait_for(lambda: plane.admin.get(LLMD, NS, name) is None, 60, f"{name} deleted")


def test_a_deployment_and_service_that_hold_the_pools_name_are_not_taken_over(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    name = "taken"
    before = admin.create(DEPLOY, _theirs_deployment(name))
    svc = admin.create(SERVICE, _theirs_service(name))
    mark = control_plane.audit_mark()
    admin.create(LLMD, _llmd(name))
    status = control_plane.wait_for(lambda: _conflict(admin, name), 60, f"{name} Conflict")
    cond = condition(status, "Conflict")
    assert cond["reason"] == "NotOwned" and f"Deployment {NS}/{name} exists and is not owned" in cond["message"], cond
    assert "Service" not in cond["message"]  # nothing at all is made or checked for a pool that is not ours
    assert status["phase"] == "Conflict" and condition(status, "Ready")["status"] == "False"
    warned = control_plane.wait_for(lambda: [e for e in admin.list("v1/events", NS) if e.get("reason") == "Conflict"
                                             and e["involvedObject"]["name"] == name], 30, "a Conflict Event")
    assert warned[0]["type"] == "Warning" and f"Deployment {NS}/{name}" in warned[0]["message"]
    wait_ticks(control_plane, mark, 5, [(NS, name)])
    _delete(control_plane, name)
    # through the ticks and the delete: still exactly its owner's
    after = admin.get(DEPLOY, NS, name)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["metadata"]["labels"] == {"team": "search"} and not after["metadata"].get("ownerReferences")
    assert admin.get(SERVICE, NS, name)["metadata"]["resourceVersion"] == svc["metadata"]["resourceVersion"]
    assert _writes_to(control_plane, mark, "deployments", name) == []
    assert _writes_to(control_plane, mark, "services", name) == []


def test_a_service_that_holds_the_pools_name_does_not_block_its_deployment(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    name = "ledger"
    svc = admin.create(SERVICE, _theirs_service(name))
    mark = control_plane.audit_mark()
    owner = admin.create(LLMD, _llmd(name))
    status = control_plane.wait_for(lambda: _conflict(admin, name), 60, f"{name} Conflict")
    msg = condition(status, "Conflict")["message"]
    assert f"Service {NS}/{name}" in msg and f"Deployment {NS}" not in msg, msg
    ours = admin.get(DEPLOY, NS, name)
    assert ours["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kneecap"
    assert [o["uid"] for o in ours["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    wait_ticks(control_plane, mark, 5, [(NS, name)])
    _delete(control_plane, name)
    # its own Deployment goes with it (the operator's cleanup or the garbage collector); the Service stays
    control_plane.wait_for(lambda: admin.get(DEPLOY, NS, name) is None, 60, f"{name}'s own Deployment gone")
    assert admin.get(SERVICE, NS, name)["metadata"]["resourceVersion"] == svc["metadata"]["resourceVersion"]
    assert _writes_to(control_plane, mark, "services", name) == []
    assert [v for v, _ in _writes_to(control_plane, mark, "deployments", name)] in (["create"], ["create", "delete"])


def _running(admin, selector: str, n: int) -> list[dict]:
    pods = admin.list("v1/pods", NS, selector=selector)
    ok = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")
          and not p["metadata"].get("deletionTimestamp")]
    return ok if len(ok) == n else []


def test_only_the_pools_own_pods_are_scraped_and_only_on_their_own_ip(control_plane: ControlPlane, operator):
    """A pod with the pool's labels that its ReplicaSet does not own is never scraped; a pod's
    metrics-url annotation naming another host is ignored (MetricsURLIgnored) and its own IP is
    scraped instead."""
    admin = control_plane.admin
    name, port = "scraped", free_port()
    admin.create(LLMD, _llmd(name, engine={"port": port}, topology={"replicas": {"min": 2, "max": 2}}))
    deploy = control_plane.wait_for(lambda: admin.get(DEPLOY, NS, name), 60, "the pool's Deployment")
    labels = deploy["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    a, b = control_plane.wait_for(lambda: _running(admin, selector, 2), 90, "the pool's 2 pods Running")
    # the pool's labels, no owner (not the ReplicaSet's: no pod-template-hash), a kwok IP of its own
    admin.create("v1/pods", {"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": f"{name}-lookalike", "namespace": NS, "labels": labels},
                             "spec": deploy["spec"]["template"]["spec"]})
    pods = control_plane.wait_for(lambda: _running(admin, selector, 3), 90, "the lookalike Running")
    (fake,) = [p for p in pods if p["metadata"]["name"] == f"{name}-lookalike"]
    assert not fake["metadata"].get("ownerReferences")
    servers = {p["metadata"]["name"]: CountingServer(p["status"]["podIP"], port) for p in (a, b, fake)}
    elsewhere = CountingServer("127.0.0.1", 0)
    try:
        own_a, own_b, impostor = (servers[p["metadata"]["name"]] for p in (a, b, fake))
        control_plane.wait_for(lambda: len(own_a.hits) >= 3 and len(own_b.hits) >= 3, 60, "scrapes of both pods")
        admin.patch("v1/pods", NS, b["metadata"]["name"],
                    {"metadata": {"annotations": {"kneecap.io/metrics-url": elsewhere.url()}}})
        st = control_plane.wait_for(lambda: (s := _status(admin, name))
                                    and condition(s, "MetricsURLIgnored").get("status") == "True" and s, 60,
                                    "MetricsURLIgnored")
        seen_b = len(own_b.hits)
        control_plane.wait_for(lambda: len(own_b.hits) >= seen_b + 3, 60, "more scrapes of the annotated pod's IP")
    finally:
        for s in (*servers.values(), elsewhere):
            s.close()
    assert set(own_a.hits) == set(own_b.hits) == {"/metrics"}
    assert impostor.hits == [] and elsewhere.hits == []
    ignored = condition(st, "MetricsURLIgnored")
    assert ignored["reason"] == "ForeignHost" and b["metadata"]["name"] in ignored["message"]
    assert elsewhere.url() in ignored["message"]
    _delete(control_plane, name)
    admin.delete("v1/pods", NS, f"{name}-lookalike")
