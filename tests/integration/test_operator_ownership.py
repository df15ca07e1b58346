"""The operator touches only what it made: a Deployment or Service of the same name that is
someone else's is reported (Conflict condition, Warning Event) and left byte-identical, and
deleting the LLMDeployment leaves it in place."""

from __future__ import annotations

import copy
import time

import pytest

from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, SERVICE, condition, events, llmd, operator, status, wait_for


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


def victim_deployment(name: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "api", "image": "payments:1.4"}]}}}}


def victim_service(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "ports": [{"port": 443, "targetPort": 8443}]}}


def test_same_named_deployment_and_service_of_someone_else_are_never_touched(kube):
    dep = kube.create(DEPLOY, victim_deployment("payments"))
    svc = kube.create(SERVICE, victim_service("payments"))
    only_svc = kube.create(SERVICE, victim_service("ledger"))  # the ledger Deployment is free
    with operator(kube) as runner:
        kube.create(LLMD, llmd("payments"))
        kube.create(LLMD, llmd("ledger"))
        st = wait_for(lambda: (s := status(kube, "payments")) and condition(s, "Conflict") and s,
                      what="Conflict condition on payments")
        led = wait_for(lambda: (s := status(kube, "ledger")) and condition(s, "Conflict") and s,
                       what="Conflict condition on ledger")
        ledger_dep = wait_for(lambda: kube.get(DEPLOY, NS, "ledger"), what="ledger's own Deployment")
        time.sleep(2.0)  # control ticks (0.2 s) keep running against the conflict
        warnings = events(kube, "Conflict")
        kube.delete(LLMD, NS, "payments")
        kube.delete(LLMD, NS, "ledger")
        wait_for(lambda: kube.get(LLMD, NS, "payments") is None and kube.get(LLMD, NS, "ledger") is None,
                 what="both LLMDeployments gone")
        time.sleep(0.5)
    assert runner.exit_code == 0, runner.output

    c = condition(st, "Conflict")
    assert (c["status"], c["reason"]) == ("True", "NotOwned")
    assert "Deployment serving/payments exists and is not owned" in c["message"]
    assert "Service" not in c["message"]  # nothing at all is made or checked for a pool that is not ours
    assert st["phase"] == "Conflict"
    assert condition(st, "Ready")["status"] == "False"
    # a Service conflict does not block the pool's own Deployment
    assert "Service serving/ledger" in condition(led, "Conflict")["message"]
    assert "Deployment serving" not in condition(led, "Conflict")["message"]
    assert ledger_dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kneecap"
    assert {(e["type"], e["involvedObject"]["name"]) for e in warnings} >= {("Warning", "payments"),
                                                                          ("Warning", "ledger")}
    assert any("Deployment serving/payments" in e["message"] for e in warnings)

    # the victims: still there after the delete, one stored version each, byte-identical
    for res, before in ((DEPLOY, dep), (SERVICE, svc), (SERVICE, only_svc)):
        name = before["metadata"]["name"]
        assert kube.history(res, NS, name) == [before], f"{res} {name} was written"
        assert kube.get(res, NS, name) == before
    # ledger's own Deployment went with its owner
    assert kube.get(DEPLOY, NS, "ledger") is None
