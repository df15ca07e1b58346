"""Watch-backed reads (kneecap.control.informer) on the real kube-apiserver.

The informer lists once and follows the watch: pods created, scheduled and run (kube-scheduler,
kwok), annotated, relabelled out of the selector and deleted show up in its cache. A watch the
server ends (timeoutSeconds) is watched again from where it was, without a relist. A watch from a
resourceVersion etcd has compacted away is answered 410 Gone and the informer lists again
(PodTemplates bypass the watch cache: tests/support/control_plane.UNCACHED_WATCHES). A watch RBAC
refuses (a Role with get/list but not watch) leaves reads on the API, the relists backing off.
The operator's ticks (`kneecap run` as the chart's ServiceAccount) read Deployments, ReplicaSets,
pods and HPAs from the caches: no LIST of them in the audit log over several ticks, and an HPA
created meanwhile takes the replicas at a following tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
import logging
import ssl
import time

import pytest

from kneecap.control import manifests
from kneecap.control.informer import CachedReads, Informer, pod_essentials, pool_key
from kneecap.control.kube import KubeClient, pods_path, resource_path
from tests.kube.conftest import OPERATOR_USER
from tests.support.control_plane import ControlPlane, audit_time
from tests.support.examples import ROOT, llmdeployment

NS = "informer"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
HPA = "autoscaling/v2/horizontalpodautoscalers"
DEPLOY = "apps/v1/deployments"
READ_ALL = ["get", "list", "watch"]


async def eventually(fn, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {fn()!r}")


def namespace(plane: ControlPlane, name: str) -> str:
    plane.admin.add_namespace(name)
    return name


def grant(plane: ControlPlane, ns: str, sa: str, rules: list[dict]) -> str:
    """A ServiceAccount in ``ns`` bound to a Role of ``rules``; its audit user name."""
    admin = plane.admin
    admin.create("v1/serviceaccounts", {"metadata": {"name": sa, "namespace": ns}})
    admin.create("rbac.authorization.k8s.io/v1/roles", {"metadata": {"name": sa, "namespace": ns}, "rules": rules})
    admin.create("rbac.authorization.k8s.io/v1/rolebindings", {
        "metadata": {"name": sa, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    return f"system:serviceaccount:{ns}:{sa}"


@contextlib.asynccontextmanager
async def client_as(plane: ControlPlane, ns: str, sa: str):
    """kneecap's own client (kneecap.control.kube) with a TokenRequest token of ``ns/sa``."""
    ctx = ssl.create_default_context(cafile=str(plane.pki.ca))
    kube = KubeClient(plane.url, token=plane.token(ns, sa), ssl_context=ctx)
    try:
        yield kube
    finally:
        await kube.close()


def bare_pod(name: str, instance: str, role: str | None) -> dict:
    labels = {manifests.INSTANCE_LABEL: instance, **({manifests.ROLE_LABEL: role} if role else {})}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}],
                     "terminationGracePeriodSeconds": 0}}


def names(objs: list[dict]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def requests_of(plane: ControlPlane, user: str, since: int, verb: str, resource: str,
                stages=("ResponseComplete",)) -> list[dict]:
    return [e for e in plane.audit(user, since_line=since, stages=stages)
            if e["verb"] == verb and e["objectRef"].get("resource") == resource]


async def test_informer_follows_creates_changes_relabels_and_deletes(control_plane):
    plane, admin = control_plane, control_plane.admin
    ns = namespace(plane, "informer-follow")
    user = grant(plane, ns, "reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": READ_ALL}])
    mark = plane.audit_mark()
    admin.create("v1/pods", bare_pod("a-0", "a", "server"), ns)
    admin.create("v1/pods", bare_pod("other", "a", None), ns)  # no role label: not a pool pod
    async with client_as(plane, ns, "reader") as kube:
        inf = Informer(kube, pods_path(ns), manifests.ROLE_LABEL, index=pool_key, transform=pod_essentials)
        inf.start()
        try:
            assert await inf.wait_synced(30)
            assert names(inf.indexed(("a", "server"))) == ["a-0"] and inf.get("other") is None
            assert "spec" not in inf.get("a-0")  # only what the loop reads is kept

            admin.create("v1/pods", bare_pod("a-1", "a", "server"), ns)
            admin.create("v1/pods", bare_pod("b-0", "b", "decode"), ns)
            await eventually(lambda: inf.get("a-1") and inf.get("b-0"), what="pods created after the list")
            assert names(inf.indexed(("a", "server"))) == ["a-0", "a-1"]
            assert names(inf.indexed(("b", "decode"))) == ["b-0"]

            # the scheduler binds a-1, kwok runs it and gives it an IP: the cache follows the status
            running = await eventually(lambda: (inf.get("a-1") or {}).get("status", {}).get("podIP"),
                                       what="a-1 Running with an IP")
            stored = admin.get("v1/pods", ns, "a-1")
            assert running == stored["status"]["podIP"]
            assert ipaddress.ip_address(running) in ipaddress.ip_network(plane.pod_cidr)
            admin.patch("v1/pods", ns, "a-1", {"metadata": {"annotations": {"kneecap.io/note": "changed"}}})
            await eventually(lambda: inf.get("a-1")["metadata"].get("annotations", {}).get("kneecap.io/note"),
                             what="an annotation change")

            # out of the selector: the server's watch says DELETED
            admin.patch("v1/pods", ns, "b-0", {"metadata": {"labels": {manifests.ROLE_LABEL: None}}})
            await eventually(lambda: inf.get("b-0") is None, what="a pod relabelled out of the selector")
            assert inf.indexed(("b", "decode")) == [] and admin.get("v1/pods", ns, "b-0") is not None

            assert admin.delete("v1/pods", ns, "a-0") == 200
            await eventually(lambda: inf.get("a-0") is None, what="a deleted pod gone")
            await eventually(lambda: admin.get("v1/pods", ns, "a-0") is None, what="a-0 gone from the API")
            assert names(inf.indexed(("a", "server"))) == ["a-1"]
            assert inf.lists == 1 and inf.error is None
        finally:
            await inf.stop()
    # one LIST in the audit log; everything after it came from the watch
    assert len(requests_of(plane, user, mark, "list", "pods")) == 1


async def test_a_watch_the_server_ends_is_watched_again_without_a_relist(control_plane):
    """The server ends each watch after its timeoutSeconds (1 s here): the informer watches
    again from the resourceVersion it reached, without listing again or reporting an error."""
    plane, admin = control_plane, control_plane.admin
    ns = namespace(plane, "informer-rewatch")
    user = grant(plane, ns, "reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": READ_ALL}])
    mark = plane.audit_mark()
    admin.create("v1/pods", bare_pod("a-0", "a", "server"), ns)
    async with client_as(plane, ns, "reader") as kube:
        inf = Informer(kube, pods_path(ns), manifests.ROLE_LABEL, index=pool_key, watch_timeout_s=1)
        inf.start()
        try:
            assert await inf.wait_synced(30)
            ended = await eventually(lambda: len(requests_of(plane, user, mark, "watch", "pods")) >= 3 and
                                     requests_of(plane, user, mark, "watch", "pods"), what="3 watches ended")
            admin.create("v1/pods", bare_pod("a-1", "a", "server"), ns)
            await eventually(lambda: inf.get("a-1"), what="a pod created after the ended watches")
            assert inf.lists == 1 and inf.error is None and inf.synced
        finally:
            await inf.stop()
    assert all(e["responseStatus"]["code"] == 200 for e in ended)
    # each watch after the first resumed at a resourceVersion (not a fresh watch: that would miss events)
    assert all("resourceVersion=" in e["requestURI"] for e in ended)
    assert len(requests_of(plane, user, mark, "list", "pods")) == 1


async def test_an_expired_watch_lists_again_and_loses_nothing(control_plane, caplog):
    """etcd compacted past the informer's resourceVersion (as kube-apiserver does every
    --etcd-compaction-interval): its next watch is answered 410 Gone, it lists again, and its
    cache then holds exactly what the API holds, following the watch again."""
    plane, admin = control_plane, control_plane.admin
    ns = namespace(plane, "informer-expired")
    user = grant(plane, ns, "reader", [{"apiGroups": [""], "resources": ["podtemplates"], "verbs": READ_ALL}])
    labels = {manifests.INSTANCE_LABEL: "a", manifests.ROLE_LABEL: "server"}
    template = lambda name: {"metadata": {"name": name, "labels": labels},  # noqa: E731
                             "template": {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}}
    admin.create("v1/podtemplates", template("t-0"), ns)
    path = resource_path("v1", "podtemplates", ns)
    caplog.set_level(logging.INFO, logger="kneecap.informer")
    async with client_as(plane, ns, "reader") as kube:
        inf = Informer(kube, path, manifests.ROLE_LABEL, index=pool_key, watch_timeout_s=1)
        inf.start()
        try:
            assert await inf.wait_synced(30)
            admin.create("v1/podtemplates", template("t-1"), ns)
            await eventually(lambda: inf.get("t-1"), what="t-1 from the watch")
            seen_rv = int(inf.get("t-1")["metadata"]["resourceVersion"])
            for i in range(2):  # writes elsewhere move etcd's revision past the informer's
                admin.create("v1/configmaps", {"metadata": {"name": f"bump-{i}"}}, ns)
            mark = plane.audit_mark()
            compacted = plane.compact_etcd()
            assert compacted >= seen_rv + 2
            await eventually(lambda: inf.lists == 2 and inf.synced, what="a relist after the 410")
            admin.create("v1/podtemplates", template("t-2"), ns)
            await eventually(lambda: inf.get("t-2"), what="t-2 from the watch after the relist")
            stored = admin.list("v1/podtemplates", ns, selector=manifests.ROLE_LABEL)
            assert names(inf.items()) == names(stored) == ["t-0", "t-1", "t-2"]
            assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in inf.items()} == {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in stored}
            assert inf.error is None and inf.lists == 2
        finally:
            await inf.stop()
    assert any("watch expired, listing again" in r.getMessage() for r in caplog.records)
    # the refused watch asked for a revision older than the compaction; the relist came after it
    watches = requests_of(plane, user, mark, "watch", "podtemplates")
    asked = [int(e["requestURI"].split("resourceVersion=")[1].split("&")[0]) for e in watches]
    assert any(rv < compacted for rv in asked), asked
    assert len(requests_of(plane, user, mark, "list", "podtemplates")) == 1


def pool_deployment(ns: str, instance: str, role: str, replicas: int) -> dict:
    labels = manifests.labels(instance, role)
    return {"metadata": {"name": manifests.pool_name(instance, role), "namespace": ns, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": manifests.selector(instance, role)},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}],
                                           "terminationGracePeriodSeconds": 0}}}}


async def test_reads_fall_back_to_the_api_when_the_watch_is_forbidden(control_plane):
    """A Role that grants get/list on pods but not watch: the pods informer's watch is refused
    (403), its reads go to the API and see a pod the moment the API has it, and its relists
    back off (2 s, then 4 s) rather than repeat every 2 s."""
    plane, admin = control_plane, control_plane.admin
    ns = namespace(plane, "informer-nowatch")
    user = grant(plane, ns, "no-watch", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": READ_ALL}])
    admin.create(DEPLOY, pool_deployment(ns, "a", "server", 1))
    pool_pods = lambda: [p for p in admin.list("v1/pods", ns,  # noqa: E731
                                               selector=manifests.pool_selector("a", "server"))
                         if not p["metadata"].get("deletionTimestamp")]
    first = plane.wait_for(lambda: pool_pods(), 60, "the Deployment's pod (controller-manager)")
    mark = plane.audit_mark()
    async with client_as(plane, ns, "no-watch") as kube:
        reads = CachedReads(kube, sync_timeout_s=1.0)
        try:
            assert names(await reads.pods(ns, "a", "server")) == names(first)
            inf = reads.informers["pods", ns]
            await eventually(lambda: inf.error, what="the pods informer's error")
            assert "403" in inf.error and "watch" in inf.error and not inf.synced
            admin.patch(DEPLOY, ns, "a", {"spec": {"replicas": 2}})
            two = plane.wait_for(lambda: len(pool_pods()) == 2 and pool_pods(), 60, "a second pod")
            assert names(await reads.pods(ns, "a", "server")) == names(two)  # at once: read from the API
            await eventually(lambda: inf.lists >= 3, timeout_s=30, what="two relists")
            assert not inf.synced and "403" in inf.error
        finally:
            await reads.close()
    # the informer lists by the role label alone; the reads by the pool's selector (instance too)
    informer_lists = [e for e in requests_of(plane, user, mark, "list", "pods") if "instance" not in e["requestURI"]]
    refused = requests_of(plane, user, mark, "watch", "pods")
    assert refused and {e["responseStatus"]["code"] for e in refused} == {403}
    at = [audit_time(e) for e in informer_lists]
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert len(gaps) >= 2 and gaps[0] >= 2.0 and gaps[1] >= 4.0, gaps


# ------------------------------------------------------------------ the operator's ticks


@pytest.fixture()
def ticking(control_plane, chart_installed, ns, operator):
    """The module's operator (tests/kube/conftest.operator) with examples/colocated.yaml as
    ``llama``, a 1 s interval and window."""
    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    doc["metadata"] = {"name": "llama", "namespace": NS}
    doc["spec"]["control"].update(interval="1s", window="1s")
    control_plane.admin.create(LLMD, doc)
    yield operator
    control_plane.admin.delete(LLMD, NS, "llama")
    control_plane.wait_for(lambda: control_plane.admin.get(LLMD, NS, "llama") is None, 60, "llama deleted")


def test_ticks_read_from_the_caches_and_see_a_new_hpa(control_plane, ticking):
    plane, admin = control_plane, control_plane.admin
    cached = ("deployments", "replicasets", "pods", "horizontalpodautoscalers")

    def in_ns(events):
        return [e for e in events if e["objectRef"].get("namespace") == NS]

    def status_writes(since):
        return [e for e in in_ns(plane.audit(OPERATOR_USER, since_line=since)) if e["verb"] == "patch"
                and e["objectRef"].get("resource") == "llmdeployments"
                and e["objectRef"].get("subresource") == "status"]

    def open_watches():
        started = in_ns(plane.audit(OPERATOR_USER, stages=("ResponseStarted",)))
        return {e["objectRef"]["resource"] for e in started if e["verb"] == "watch"} >= set(cached)

    try:
        plane.wait_for(lambda: (admin.get(LLMD, NS, "llama").get("status") or {}).get("ownership"), 60,
                       "the reconcile's status")
        plane.wait_for(open_watches, 60, "the operator's watches of the four collections")
        warm = plane.audit_mark()
        plane.wait_for(lambda: len(status_writes(warm)) >= 2, 60, "two ticks with the caches open")
        mark = plane.audit_mark()
        plane.wait_for(lambda: len(status_writes(mark)) >= 4, 60, "four more ticks")
        measured = in_ns(plane.audit(OPERATOR_USER, since_line=mark))
        admin.create(HPA, {"metadata": {"name": "llama-hpa", "namespace": NS},
                           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                                    "minReplicas": 1, "maxReplicas": 4}})
        owned = plane.wait_for(lambda: (lambda o: o if o.get("server", {}).get("replicas") == "hpa/llama-hpa"
                                        else None)((admin.get(LLMD, NS, "llama").get("status") or {})
                                                   .get("ownership") or {}), 30, "the HPA seen by a tick")
    except Exception:
        raise AssertionError(f"operator log:\n{ticking.tail()}") from None
    reads = [(e["verb"], e["objectRef"]["resource"]) for e in measured
             if e["verb"] in ("get", "list") and e["objectRef"].get("resource") in cached]
    assert len([e for e in measured if e["verb"] == "patch" and e["objectRef"].get("subresource") == "status"]) >= 4
    assert reads == []  # four ticks read no Deployment, ReplicaSet, pod or HPA from the API
    assert "only recommends" in owned["server"]["message"]
