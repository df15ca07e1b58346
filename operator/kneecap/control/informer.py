"""What the control loop reads of the cluster each tick, from watch-backed caches (informers).

A tick needs each pool's Deployment, the namespace's HPAs and the pool's ready pods. A pool's
pods are the pods of its Deployment's ReplicaSets (pod -> ReplicaSet -> Deployment, each by
its controller ownerReference), not whatever pod carries the pool's labels: anyone who can
create a pod in the namespace could otherwise feed the control loop made-up metrics. Read from
the API, that is four requests (and their JSON) per LLMDeployment and interval. An `Informer`
lists a collection once and then follows its watch, as client-go's informers do, so a tick reads
memory. Reads fall back to the API while an informer is not in sync (starting, relisting after
an expired watch, or not allowed to watch), so a cached read is late by at most the watch
latency, and an outage of the watch costs only the requests it saved.

`ApiReads` and `CachedReads` answer the same questions; the spec handlers use `ApiReads`
(a spec change is rare and must see an HPA created a moment before it), the ticks `CachedReads`.
Cached objects are shared: callers must not mutate them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Hashable

from kneecap.control.kube import (ApiError, KubeClient, deployments_path, hpas_path, pods_path, replicasets_path,
                                  selector_matches)
from kneecap.control.manifests import INSTANCE_LABEL, MANAGER, MANAGER_LABEL, ROLE_LABEL, pool_name, pool_selector

log = logging.getLogger("kneecap.informer")


class _Expired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): list again."""


class Informer:
    """One collection (a path and a label selector) listed once and kept current by its watch.

    ``index``: a key per object (e.g. its pool), so `indexed(key)` is a dict lookup rather than
    a scan. ``transform``: what of an object to keep (e.g. a pod without its spec)."""

    def __init__(self, kube: KubeClient, path: str, label_selector: str | None = None, *,
                 index: Callable[[dict], Hashable] | None = None, transform: Callable[[dict], dict] | None = None,
                 watch_timeout_s: float = 300.0, retry_s: float = 2.0, max_retry_s: float = 60.0):
        self.kube, self.path, self.label_selector = kube, path, label_selector
        self._index_fn, self._transform = index, transform
        self.watch_timeout_s, self.retry_s, self.max_retry_s = watch_timeout_s, retry_s, max_retry_s
        self._objects: dict[str, dict] = {}
        self._index: dict[Hashable, dict[str, dict]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.error: str | None = None  # why the informer is not in sync (None while it is)
        self.lists = 0  # LIST requests made (1 + relists)
        self._delay_s = retry_s  # the wait before the next retry after a failure (doubles)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer {self.path}")

    async def wait_synced(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._synced.wait(), timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        return self.synced

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._synced.clear()

    def get(self, name: str) -> dict | None:
        return self._objects.get(name)

    def items(self) -> list[dict]:
        return list(self._objects.values())

    def indexed(self, key: Hashable) -> list[dict]:
        return list(self._index.get(key, {}).values())

    # ------------------------------------------------------------ the list/watch loop

    async def _run(self) -> None:
        expired, started = 0, time.monotonic()
        while True:
            try:
                items, rv = await self.kube.list_versioned(self.path, self.label_selector)
                self.lists += 1
                self._replace(items)
                if self.error is None:
                    self._synced.set()
                # else in sync once a watch is accepted (_watching): a watch that keeps failing
                # (not allowed, say) leaves reads on the API and the relists backing off
                while True:
                    started = time.monotonic()
                    rv = await self._follow(rv)
                    if time.monotonic() - started < 1.0:  # a server that ends watches at once
                        await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except _Expired:
                self._synced.clear()  # reads go to the API until the relist is in
                log.info("informer %s: watch expired, listing again", self.path)
                expired = expired + 1 if time.monotonic() - started < 1.0 else 1
                if expired > 1:  # a fresh list's version expired at once too: do not spin
                    await asyncio.sleep(min(self.retry_s * expired, self.max_retry_s))
            except Exception as exc:  # noqa: BLE001 - any failure: reads fall back to the API
                self._synced.clear()
                error = f"{type(exc).__name__}: {exc}"
                if error != self.error:
                    log.warning("informer %s: %s; reads go to the API, retrying", self.path, error)
                self.error = error
                await asyncio.sleep(self._delay_s)
                self._delay_s = min(self._delay_s * 2, self.max_retry_s)

    def _watching(self) -> None:
        """The server accepted a watch from the cache's resourceVersion: the cache is current."""
        if self.error is not None:
            self.error, self._delay_s = None, self.retry_s
        self._synced.set()

    async def _follow(self, rv: str | None) -> str | None:
        """Apply one watch stream's events from `rv`; the resourceVersion it ended at."""
        try:
            async for event in self.kube.watch(self.path, self.label_selector, rv, self.watch_timeout_s,
                                               opened=self._watching):
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiError(int(obj.get("code") or 500), obj, f"WATCH {self.path}")
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if etype == "DELETED":
                    self._remove((obj.get("metadata") or {}).get("name"))
                elif etype in ("ADDED", "MODIFIED"):
                    self._put(obj)
        except ApiError as exc:
            if exc.status == 410:
                raise _Expired() from exc
            raise
        return rv

    def _replace(self, items: list[dict]) -> None:
        self._objects, self._index = {}, {}
        for obj in items:
            self._put(obj)

    def _put(self, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if name is None:
            return
        self._remove(name)
        if not selector_matches(self.label_selector, meta.get("labels")):
            return  # relabelled out of the selector, or an API that ignores it on watches
        obj = self._transform(obj) if self._transform else obj
        self._objects[name] = obj
        if self._index_fn is not None:
            self._index.setdefault(self._index_fn(obj), {})[name] = obj

    def _remove(self, name: str | None) -> None:
        old = self._objects.pop(name, None) if name is not None else None
        if old is not None and self._index_fn is not None:
            bucket = self._index.get(self._index_fn(old))
            if bucket is not None:
                bucket.pop(name, None)
                if not bucket:
                    del self._index[self._index_fn(old)]


def pool_key(obj: dict) -> tuple[str | None, str | None]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(INSTANCE_LABEL), labels.get(ROLE_LABEL)


def pod_essentials(pod: dict) -> dict:
    """What the loop reads of a pod or ReplicaSet (labels, annotations, owners, deletion, phase,
    conditions, IP); the spec and managedFields are most of a real pod's size."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": meta, "status": pod.get("status") or {}}


def controller_uid(obj: dict) -> str | None:
    """uid of the object's controller (the ownerReference with controller: true)."""
    return next((r.get("uid") for r in (obj.get("metadata") or {}).get("ownerReferences") or []
                 if r.get("controller")), None)


def pods_of(deployment: dict | None, replicasets: list[dict], pods: list[dict]) -> list[dict]:
    """The pods whose controller is a ReplicaSet whose controller is `deployment`."""
    if deployment is None:
        return []
    uid = deployment["metadata"].get("uid")
    rs_uids = {rs["metadata"].get("uid") for rs in replicasets if controller_uid(rs) == uid}
    return [p for p in pods if controller_uid(p) in rs_uids]


class ApiReads:
    """The loop's reads, straight from the API."""

    def __init__(self, kube: KubeClient):
        self.kube = kube

    async def deployment(self, ns: str, name: str) -> dict | None:
        return await self.kube.get(deployments_path(ns, name))

    async def hpas(self, ns: str) -> list[dict]:
        return await self.kube.list(hpas_path(ns))

    async def replicasets(self, ns: str, instance: str, role: str) -> list[dict]:
        return await self.kube.list(replicasets_path(ns), pool_selector(instance, role))

    async def pods(self, ns: str, instance: str, role: str) -> list[dict]:
        """The pool's pods: labelled as the pool's and owned through its Deployment's ReplicaSets."""
        return pods_of(await self.deployment(ns, pool_name(instance, role)),
                       await self.replicasets(ns, instance, role), await self._labelled_pods(ns, instance, role))

    async def _labelled_pods(self, ns: str, instance: str, role: str) -> list[dict]:
        return await self.kube.list(pods_path(ns), pool_selector(instance, role))

    async def deployment_pods(self, ns: str, deploy: dict) -> list[dict]:
        """The pods of any Deployment (an adopted one, which carries none of kneecap's labels):
        listed by its selector's matchLabels, kept when owned through its ReplicaSets. Read from
        the API (the caches hold kneecap's own pools only)."""
        match = ((deploy.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(match.items())) or None
        return pods_of(deploy, await self.kube.list(replicasets_path(ns), selector),
                       await self.kube.list(pods_path(ns), selector))

    async def close(self) -> None:
        pass


class CachedReads(ApiReads):
    """The same reads from informers, one per namespace and kind, started on first use: the
    owned Deployments (kneecap's label), pool ReplicaSets and pods (the role label) and HPAs. A read waits for
    a new informer's first list up to `sync_timeout_s` once; a read from an informer not in
    sync goes to the API."""

    def __init__(self, kube: KubeClient, *, sync_timeout_s: float = 5.0, watch_timeout_s: float = 300.0):
        super().__init__(kube)
        self.sync_timeout_s, self.watch_timeout_s = sync_timeout_s, watch_timeout_s
        self.informers: dict[tuple[str, str], Informer] = {}
        self._waited: set[tuple[str, str]] = set()

    def _new(self, kind: str, ns: str) -> Informer:
        kw = {"watch_timeout_s": self.watch_timeout_s}
        if kind == "deployments":
            return Informer(self.kube, deployments_path(ns), f"{MANAGER_LABEL}={MANAGER}", **kw)
        if kind == "pods":
            return Informer(self.kube, pods_path(ns), ROLE_LABEL, index=pool_key, transform=pod_essentials, **kw)
        if kind == "replicasets":
            return Informer(self.kube, replicasets_path(ns), ROLE_LABEL, index=pool_key, transform=pod_essentials,
                            **kw)
        return Informer(self.kube, hpas_path(ns), **kw)

    async def _synced(self, kind: str, ns: str) -> Informer | None:
        key = (kind, ns)
        inf = self.informers.get(key)
        if inf is None:
            inf = self.informers[key] = self._new(kind, ns)
            inf.start()
        if not inf.synced and key not in self._waited:
            self._waited.add(key)
            await inf.wait_synced(self.sync_timeout_s)
        return inf if inf.synced else None

    async def deployment(self, ns: str, name: str) -> dict | None:
        inf = await self._synced("deployments", ns)
        obj = inf.get(name) if inf is not None else None
        # not cached: not there, not yet seen, or not labelled as ours: ask the API
        return obj if obj is not None else await super().deployment(ns, name)

    async def hpas(self, ns: str) -> list[dict]:
        inf = await self._synced("hpas", ns)
        return inf.items() if inf is not None else await super().hpas(ns)

    async def replicasets(self, ns: str, instance: str, role: str) -> list[dict]:
        inf = await self._synced("replicasets", ns)
        return inf.indexed((instance, role)) if inf is not None else await super().replicasets(ns, instance, role)

    async def _labelled_pods(self, ns: str, instance: str, role: str) -> list[dict]:
        inf = await self._synced("pods", ns)
        return inf.indexed((instance, role)) if inf is not None else await super()._labelled_pods(ns, instance, role)

    async def close(self) -> None:
        await asyncio.gather(*(inf.stop() for inf in self.informers.values()))
        self.informers.clear()
