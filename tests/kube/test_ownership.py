"""Objects kneecap did not create are not its own, on the real API: a Deployment that already
holds a pool's name is refused (Conflict in status) and left exactly as its owner wrote it."""

from __future__ import annotations

import copy

from tests.kube.conftest import OPERATOR_USER
from tests.support.control_plane import ControlPlane
from tests.support.examples import ROOT, documents, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
NS = "ownership"


def test_a_deployment_that_holds_the_pools_name_is_not_taken_over(control_plane: ControlPlane, operator):
    admin = control_plane.admin
    name = "taken"
    (theirs,) = [d for d in documents(ROOT / "examples" / "adopt-production-stack.yaml") if d["kind"] == "Deployment"]
    theirs = copy.deepcopy(theirs)
    theirs["metadata"] = {"name": name, "namespace": NS, "labels": {"team": "search"}}
    pod = theirs["spec"]["template"]["spec"]
    pod.pop("volumes")
    pod["containers"][0].pop("volumeMounts")
    pod["containers"][0].pop("env")
    before = admin.create(DEPLOY, theirs)
    mark = control_plane.audit_mark()
    obj = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    obj["metadata"] = {"name": name, "namespace": NS}
    obj["spec"]["control"]["interval"] = "1s"
    admin.create(LLMD, obj)

    def conflict():
        st = (admin.get(LLMD, NS, name) or {}).get("status") or {}
        cond = next((c for c in st.get("conditions") or [] if c["type"] == "Conflict"), {})
        return st if cond.get("status") == "True" else None

    status = control_plane.wait_for(conflict, 60, f"{name} Conflict")
    cond = next(c for c in status["conditions"] if c["type"] == "Conflict")
    assert cond["reason"] == "NotOwned" and f"Deployment {NS}/{name} exists and is not owned" in cond["message"], cond
    assert status["phase"] == "Conflict"
    # several ticks later: the Deployment is still exactly its owner's
    control_plane.wait_for(lambda: sum(1 for e in control_plane.audit(OPERATOR_USER, since_line=mark)
                                       if e["objectRef"].get("subresource") == "status") >= 5, 60, "5 ticks")
    after = admin.get(DEPLOY, NS, name)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["metadata"]["labels"] == {"team": "search"} and not after["metadata"].get("ownerReferences")
    writes = [(e["verb"], e["requestURI"]) for e in control_plane.audit(OPERATOR_USER, since_line=mark)
              if e["objectRef"].get("resource") == "deployments" and e["objectRef"].get("name") == name
              and e["verb"] in ("patch", "update", "delete", "create")]
    assert writes == [], writes
