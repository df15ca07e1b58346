"""Watch-backed reads (kneecap.control.informer) against the emulated API.

The informer lists once and follows the watch: objects created, changed, relabelled and deleted
after the list show up in its cache; a watch that expires (410 Gone, as a real API server
answers a too-old resourceVersion) is listed again; a watch the API refuses (RBAC without
`watch`) leaves reads going to the API. The operator's ticks then read Deployments, pods and
HPAs from the caches: no per-tick API reads, and an HPA created between ticks still takes the
replicas at the next tick.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import parse_qs

import aiohttp.web
import attrs
import pytest

from kneecap.control import manifests as M
from kneecap.control.informer import CachedReads, Informer, pod_essentials, pool_key
from kneecap.control.kube import KubeClient, pods_path
from kneecap.demo.kubelet import add_owned_pod
from tests.support.kmock_api import LLMD, KubeAPI, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, llmd, operator, status, wait_for

HPA = "autoscaling/v2/horizontalpodautoscalers"


async def eventually(fn, timeout_s: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}; last: {fn()!r}")


def pool_pod(kube, name: str, instance: str = "a", role: str = "server", **kw) -> dict:
    """A ready pod of the pool's Deployment (made here when no operator made it), through a ReplicaSet."""
    deploy = kube.get(DEPLOY, NS, M.pool_name(instance, role)) or kube.create(DEPLOY, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": M.pool_name(instance, role), "namespace": NS, "labels": M.labels(instance, role)},
        "spec": {"selector": {"matchLabels": M.selector(instance, role)},
                 "template": {"metadata": {"labels": M.labels(instance, role)},
                              "spec": {"containers": [{"name": "vllm", "image": "x"}]}}}})
    return add_owned_pod(kube, deploy, name, **kw)


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


async def test_informer_follows_creates_changes_relabels_and_deletes(kube):
    pool_pod(kube, "a-0")
    kube.add_pod(NS, "other", {"app": "unrelated"})  # no role label: not a pool pod
    client = KubeClient(kube.url)
    inf = Informer(client, pods_path(NS), "kneecap.io/role", index=pool_key, transform=pod_essentials)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        assert [p["metadata"]["name"] for p in inf.indexed(("a", "server"))] == ["a-0"]
        assert inf.get("other") is None  # (this API ignores selectors on watches: filtered here)
        assert "spec" not in inf.get("a-0")  # only what the loop reads is kept

        pool_pod(kube, "a-1", ready=False)
        pool_pod(kube, "b-0", instance="b", role="decode")
        await eventually(lambda: inf.get("a-1") and inf.get("b-0"), what="pods created after the list")
        assert sorted(p["metadata"]["name"] for p in inf.indexed(("a", "server"))) == ["a-0", "a-1"]
        assert [p["metadata"]["name"] for p in inf.indexed(("b", "decode"))] == ["b-0"]

        kube.patch("v1/pods", NS, "a-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                   sub="status")
        await eventually(lambda: inf.get("a-1")["status"]["conditions"][0]["status"] == "True", what="ready")

        kube.patch("v1/pods", NS, "b-0", {"metadata": {"labels": {"kneecap.io/role": None}}})
        await eventually(lambda: inf.get("b-0") is None, what="a pod relabelled out of the selector")
        assert inf.indexed(("b", "decode")) == []

        assert kube.delete("v1/pods", NS, "a-0") == 200
        await eventually(lambda: inf.get("a-0") is None, what="a deleted pod gone")
        assert [p["metadata"]["name"] for p in inf.indexed(("a", "server"))] == ["a-1"]
        assert inf.lists == 1 and inf.error is None  # one list, the rest came from the watch
    finally:
        await inf.stop()
        await client.close()


async def test_a_silent_watch_is_watched_again_without_a_relist(kube):
    """This API never ends a watch (a real one does after timeoutSeconds, with bookmarks in
    between): a stream silent past the timeout is over, and the informer watches again from
    where it was, without listing again or reporting an error."""
    pool_pod(kube, "a-0")
    client = KubeClient(kube.url)
    inf = Informer(client, pods_path(NS), "kneecap.io/role", index=pool_key, watch_timeout_s=0.5)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        await asyncio.sleep(3.0)  # ~2 silent streams (each ends after 1.55 s)
        pool_pod(kube, "a-1")
        await eventually(lambda: inf.get("a-1"), what="a pod created after silent streams")
        assert inf.lists == 1 and inf.error is None and inf.synced
    finally:
        await inf.stop()
        await client.close()


@attrs.define(kw_only=True)
class ExpiringKubeAPI(KubeAPI):
    """Answers the first `expire` watches of pods with 410 Gone, as an API server does when the
    resourceVersion a watch asks for has been compacted away."""

    expire: int = 1

    async def __call__(self, raw_request):
        q = parse_qs(raw_request.query_string)
        if q.get("watch") == ["true"] and raw_request.path.endswith("/pods") and self.expire > 0:
            self.expire -= 1
            resp = aiohttp.web.StreamResponse()
            await resp.prepare(raw_request)
            await resp.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                "message": "too old resource version"}}).encode() + b"\n")
            await resp.write_eof()
            return resp
        return await super().__call__(raw_request)


async def test_an_expired_watch_lists_again_and_loses_nothing():
    with KubeAPIThread(api_class=ExpiringKubeAPI, expire=2) as kube:
        kube.add_namespace(NS)
        pool_pod(kube, "a-0")
        client = KubeClient(kube.url)
        inf = Informer(client, pods_path(NS), "kneecap.io/role", index=pool_key)
        inf.start()
        try:
            await eventually(lambda: inf.lists >= 3 and inf.synced, what="two relists after two 410s")
            pool_pod(kube, "a-1")
            await eventually(lambda: inf.get("a-1"), what="a pod created after the relists")
            assert sorted(p["metadata"]["name"] for p in inf.indexed(("a", "server"))) == ["a-0", "a-1"]
            assert inf.error is None
        finally:
            await inf.stop()
            await client.close()


@attrs.define(kw_only=True)
class NoWatchKubeAPI(KubeAPI):
    """RBAC that grants list but not watch on pods (403 on every pod watch)."""

    async def __call__(self, raw_request):
        if parse_qs(raw_request.query_string).get("watch") == ["true"] and raw_request.path.endswith("/pods"):
            return aiohttp.web.json_response({"kind": "Status", "status": "Failure", "code": 403,
                                              "reason": "Forbidden", "message": 'pods is forbidden: cannot "watch"'},
                                             status=403)
        return await super().__call__(raw_request)


async def test_reads_fall_back_to_the_api_when_the_watch_is_forbidden():
    with KubeAPIThread(api_class=NoWatchKubeAPI) as kube:
        kube.add_namespace(NS)
        pool_pod(kube, "a-0")
        client = KubeClient(kube.url)
        reads = CachedReads(client, sync_timeout_s=1.0)
        try:
            assert [p["metadata"]["name"] for p in await reads.pods(NS, "a", "server")] == ["a-0"]
            inf = reads.informers["pods", NS]
            await eventually(lambda: inf.error, what="the informer's error")
            assert "403" in inf.error and not inf.synced
            pool_pod(kube, "a-1")  # still seen at once: the read went to the API
            assert sorted(p["metadata"]["name"] for p in await reads.pods(NS, "a", "server")) == ["a-0", "a-1"]
        finally:
            await reads.close()
            await client.close()


@attrs.define(kw_only=True)
class RecordingKubeAPI(KubeAPI):
    """Records (method, path, watch?) of the operator's requests (not the test's urllib ones)."""

    recorded: list = attrs.field(factory=list)

    async def __call__(self, raw_request):
        if not raw_request.headers.get("User-Agent", "").startswith("Python-urllib"):
            watch = parse_qs(raw_request.query_string).get("watch") == ["true"]
            self.recorded.append((raw_request.method, raw_request.path, watch, time.monotonic()))
        return await super().__call__(raw_request)


def test_ticks_read_from_the_caches_and_see_a_new_hpa():
    with KubeAPIThread(api_class=RecordingKubeAPI) as kube:
        kube.add_namespace(NS)
        with operator(kube) as runner:
            kube.create(LLMD, llmd("llama", control={"interval": "1s", "window": "1s"}))
            wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="deployment")
            pool_pod(kube, "llama-0", instance="llama")
            wait_for(lambda: status(kube, "llama").get("ownership"), what="a tick's status")
            time.sleep(3.0)  # ticks at 1 s
            t0 = time.monotonic()
            time.sleep(3.0)
            reads = [(m, p) for m, p, w, t in kube.api.recorded if t >= t0 and m == "GET" and not w
                     and any(k in p for k in ("/deployments", "/replicasets", "/pods", "/horizontalpodautoscalers"))]
            status_writes = [p for m, p, w, t in kube.api.recorded if t >= t0 and m == "PATCH" and p.endswith("/status")]
            kube.create(HPA, {"metadata": {"name": "llama-hpa", "namespace": NS},
                              "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                          "name": "llama"}, "minReplicas": 1, "maxReplicas": 4}})
            st = wait_for(lambda: (lambda o: o if o["server"]["replicas"] == "hpa/llama-hpa" else None)(
                status(kube, "llama")["ownership"]), timeout_s=5, what="the HPA seen by a tick")
        watches = {p for m, p, w, t in kube.api.recorded if w}
    assert runner.exit_code == 0, runner.output
    assert len(status_writes) >= 2  # ticks ran in the measured 3 s ...
    assert reads == []  # ... and read no Deployment, ReplicaSet, pod or HPA from the API
    assert {f"/apis/apps/v1/namespaces/{NS}/deployments", f"/api/v1/namespaces/{NS}/pods",
            f"/apis/apps/v1/namespaces/{NS}/replicasets",
            f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"} <= watches
    assert "only recommends" in st["server"]["message"]
