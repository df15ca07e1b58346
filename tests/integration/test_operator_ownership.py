"""The operator touches only what it made: a Deployment or Service of the same name that is
someone else's is reported (Conflict condition, Warning Event) and left byte-identical, and
deleting the LLMDeployment leaves it in place."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from kneecap.control import manifests as M
from kneecap.demo.clock import free_port
from kneecap.demo.kubelet import add_owned_pod
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


class CountingServer:
    """An HTTP server on 127.0.0.1 answering a minimal /metrics page; counts the requests."""

    def __init__(self):
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                hits.append(self.path)
                body = b"vllm:num_requests_running 1\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/metrics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_only_the_pools_own_pods_are_scraped_and_only_on_their_own_ip(kube):
    """A pod carrying the pool's labels but not owned through the Deployment's ReplicaSet is never
    scraped; a metrics-url annotation naming another host is ignored (the pod's IP is scraped)."""
    own, impostor, elsewhere = CountingServer(), CountingServer(), CountingServer()
    closed = free_port()  # the engine port: nothing listens there
    try:
        with operator(kube) as runner:
            kube.create(LLMD, llmd("pool", engine={"port": closed}))
            add_owned_pod(kube, "pool", "pool-0", namespace=NS, annotations={M.METRICS_URL_ANNOTATION: own.url()})
            kube.add_pod(NS, "pool-fake", M.labels("pool", "server"),  # the labels, no owner
                         annotations={M.METRICS_URL_ANNOTATION: impostor.url()})
            add_owned_pod(kube, "pool", "pool-1", namespace=NS,  # owned, but points at another host
                          annotations={M.METRICS_URL_ANNOTATION: elsewhere.url("localhost")})
            st = wait_for(lambda: (s := status(kube, "pool")) and f"127.0.0.1:{closed}" in
                          condition(s, "Degraded").get("message", "") and len(own.hits) >= 3 and s,
                          what="scrapes of the pool's pods")
    finally:
        for s in (own, impostor, elsewhere):
            s.close()
    assert runner.exit_code == 0, runner.output
    assert own.hits and set(own.hits) == {"/metrics"}
    assert impostor.hits == [] and elsewhere.hits == []
    msg = condition(st, "Degraded")["message"]
    assert own.url() not in msg and f"http://127.0.0.1:{closed}/metrics" in msg  # pool-1 on its own IP
    assert f":{impostor.port}" not in msg and f":{elsewhere.port}" not in msg
