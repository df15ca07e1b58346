"""The fault-injecting proxy on the real apiserver: a proxied request is the client's own (stored,
audited as its user), a watch streams through event by event, and a rule answers its Status the
number of times it was given, then the request passes through again."""

from __future__ import annotations

import threading
import time

import pytest

from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT
from tests.support.control_plane import ControlPlane, KubeClient

NS = "fault-proxy"
SERVICE = "v1/services"
DEPLOY = "apps/v1/deployments"


@pytest.fixture()
def proxied(control_plane: ControlPlane, chart_installed: dict, ns: str, fault_proxy) -> KubeClient:
    """The chart's ServiceAccount, through the proxy."""
    token = control_plane.token(RELEASE_NS, SERVICE_ACCOUNT)
    return KubeClient(fault_proxy.url, control_plane.pki.ca, token=token, user=OPERATOR_USER)


def service(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"ports": [{"port": 8000}], "selector": {"app": name}}}


def test_a_proxied_request_is_stored_and_audited_as_the_clients_user(control_plane, proxied, fault_proxy):
    mark = control_plane.audit_mark()
    created = proxied.create(SERVICE, service("through"))
    stored = control_plane.admin.get(SERVICE, NS, "through")
    assert stored["metadata"]["uid"] == created["metadata"]["uid"] and stored["spec"]["ports"][0]["port"] == 8000
    creates = [e for e in control_plane.audit(OPERATOR_USER, since_line=mark)
               if e["verb"] == "create" and e["objectRef"].get("name") == "through"]
    assert [e["responseStatus"]["code"] for e in creates] == [201]
    assert [(s.method, s.code, s.faulted) for s in fault_proxy.seen if s.path.endswith("/services")] == [
        ("POST", 201, False)]


def test_a_rule_answers_its_code_once_then_the_request_passes_through(control_plane, proxied, fault_proxy):
    proxied.create(SERVICE, service("flaky"))
    fault_proxy.fault("PATCH", r"/services/flaky$", 500, "etcdserver: request timed out", body='"tier"')
    path = proxied.path(SERVICE, NS, "flaky")
    mark = control_plane.audit_mark()
    other = proxied.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}})  # no body match
    first = proxied.request("PATCH", path, {"metadata": {"labels": {"tier": "gold"}}})
    labels_after_fault = control_plane.admin.get(SERVICE, NS, "flaky")["metadata"]["labels"]
    second = proxied.request("PATCH", path, {"metadata": {"labels": {"tier": "gold"}}})
    assert other[0] == 200
    assert first[0] == 500 and first[1] == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                            "status": "Failure", "message": "etcdserver: request timed out",
                                            "reason": "InternalError", "code": 500}
    assert labels_after_fault == {"team": "a"}  # the faulted patch never reached the apiserver
    assert second[0] == 200 and control_plane.admin.get(SERVICE, NS, "flaky")["metadata"]["labels"] == {
        "team": "a", "tier": "gold"}
    patches = [e["responseStatus"]["code"] for e in control_plane.audit(OPERATOR_USER, since_line=mark)
               if e["verb"] == "patch" and e["objectRef"].get("name") == "flaky"]
    assert patches == [200, 200]  # the apiserver saw the two forwarded patches only
    assert [(s.method, s.code) for s in fault_proxy.faulted()] == [("PATCH", 500)]


def test_an_armed_rule_starts_after_its_trigger(control_plane, proxied, fault_proxy):
    from tests.support.fault_proxy import Match, Rule

    proxied.create(SERVICE, service("armed"))
    path = proxied.path(SERVICE, NS, "armed")
    fault_proxy.arm("PATCH", r"/services/armed$", [Rule(Match("GET", r"/services/armed$"), 503, "busy", 2)],
                    body='"go"')
    before = proxied.request("GET", path)[0]
    trigger = proxied.request("PATCH", path, {"metadata": {"labels": {"go": "yes"}}})[0]
    after = [proxied.request("GET", path)[0] for _ in range(3)]
    assert (before, trigger, after) == (200, 200, [503, 503, 200])


def deployment(name: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def test_a_watch_streams_through_event_by_event(control_plane, proxied, fault_proxy):
    version = proxied.list_version(DEPLOY, NS)
    got: list[tuple[str, str]] = []
    opened = time.monotonic()

    def watch():
        for kind, obj in proxied.watch(DEPLOY, NS, resource_version=version, timeout_s=60):
            got.append((kind, obj["metadata"]["name"]))
            return

    reader = threading.Thread(target=watch)
    reader.start()
    control_plane.admin.create(DEPLOY, deployment("watched"))
    reader.join(70)
    # the event came while the 60 s watch was open: the proxy wrote the chunk as it arrived
    assert got == [("ADDED", "watched")] and time.monotonic() - opened < 30
    watches = [s for s in fault_proxy.seen if "watch=1" in s.query]
    assert [(s.method, s.code) for s in watches] == [("GET", 200)]
