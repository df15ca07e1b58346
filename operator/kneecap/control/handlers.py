"""kopf handlers: each is one call into kneecap.control.lifecycle (STYLE: thin handlers), whose
plain functions the virtual-time cluster (kneecap.sim.cluster) calls too.

`build_registry(config)` returns a fresh kopf registry, so `kneecap run` and the tests (which
point the operator at an emulated API) register the same handlers with different settings.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp
import kopf

from kneecap.control import fleet, heap, lifecycle, loop
from kneecap.control.auth import Credentials, CredentialsError
from kneecap.control.drain import Drain
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.informer import CachedReads
from kneecap.control.kube import KubeClient
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.reconcile import InSyncCache
from kneecap.control.shard import LabelSelector, finalizer, kopf_filters, release_other_finalizers
from kneecap.control.spec import GROUP, PLURAL, VERSION
from kneecap.observe.histogram import HistogramCache
from kneecap.observe.scrape import ParseCache

RESOURCE = (GROUP, VERSION, PLURAL)
# a replica that dies without saying so is presumed dead this long after its last keep-alive
# (kopf sends one every lifetime - 5..10 s); a clean exit hands over at once
PEERING_LIFETIME_S = 30


@dataclass
class OperatorConfig:
    """How the operator connects and paces itself."""

    connection: kopf.ConnectionInfo | None = None  # fixed credentials (the emulated API); None: `credentials`
    credentials: Credentials | None = None  # None: loaded at login (in-cluster service account, else kubeconfig)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    tick_s: float = 10.0  # how often timers wake to check whether spec.control.interval elapsed
    scrape_timeout_s: float = 5.0
    # resources whose tick or spec pass may run at once (`kneecap run --max-concurrent-reconciles`,
    # kneecap.control.lifecycle.reconcile_slot); None: unbounded
    max_concurrent_reconciles: int | None = lifecycle.MAX_CONCURRENT_RECONCILES
    now: Callable[[], float] = time.time
    scrape: loop.ScrapeFn | None = None
    # leader election (kopf peering; used when the operator runs with --peering): None picks
    # oldest_first_priority(), so exactly one replica is active and a new one never preempts it
    peering_priority: int | None = None
    peering_lifetime_s: int = PEERING_LIFETIME_S
    # how often each LLMDeployment's fleet timer reads the operator-wide fleet advice (the packing
    # itself reruns only when the fleet's inputs change: kneecap.control.fleet.FleetAdvisor)
    fleet_s: float = 60.0
    # the GPUs the fleet advice may pack onto (`kneecap run --fleet-inventory`: packing.GpuOffer
    # tuples, as `kneecap pack --gpus`); None: the GPU types the fleet holds today
    fleet_inventory: tuple | None = None
    # the fleet advice's CPU bounds (`kneecap run --fleet-cpu-share/--fleet-max-evaluations`,
    # kneecap.control.fleet.FleetAdvisor): reruns for workload drift at most this share of a
    # core on average, and at most this many GAUSS tails per packing
    fleet_cpu_share: float = fleet.CPU_SHARE
    fleet_max_evaluations: int | None = fleet.MAX_EVALUATIONS
    # a label-selector shard (`kneecap run --selector`): the handlers see only the LLMDeployments
    # it matches (kneecap.control.shard); None: all of them
    selector: LabelSelector | None = None
    # the graceful stop (`kneecap run` installs it on SIGTERM/SIGINT): handlers run inside its
    # work(), and the timers start no tick once it began (kneecap.control.drain)
    drain: Drain = field(default_factory=Drain)


def oldest_first_priority(now_s: float | None = None) -> int:
    """A kopf peering priority that is higher the earlier this replica started (ms), with a
    random tie-break: kopf pauses every operator, itself included, while another of the same
    priority is alive, and the highest one alone runs."""
    now_s = time.time() if now_s is None else now_s
    return -int(now_s * 1000) * 1000 - random.randrange(1000)


def reconcile_lock(memo: kopf.Memo) -> asyncio.Lock:
    """The resource's reconcile lock (kopf's `memo` in a resource handler is that resource's own).
    kopf runs the spec handlers and the control timer of one resource concurrently; both
    reconcile, and a tick that coincides with a create or a spec change would otherwise read
    the Deployment before the handler's write lands and send the same write again (a second
    POST refused with 409 Conflict, a second identical PATCH). Under the lock the later one
    reads what the earlier one wrote and writes nothing."""
    lock = memo.get("reconcile_lock")
    if lock is None:
        lock = memo["reconcile_lock"] = asyncio.Lock()
    return lock


async def _connection(config: OperatorConfig, *, fresh: bool) -> kopf.ConnectionInfo | Credentials:
    """The credentials kopf and the owned-object client share: the fixed ConnectionInfo, else the
    `kubernetes` package's (kneecap.control.auth), loaded on first use and, when `fresh`, anew
    (kopf logs in again after a 401 or at the credential's expiration: a new exec token, a
    rotated token file)."""
    if config.connection is not None:
        return config.connection
    try:
        if config.credentials is None:
            config.credentials = await asyncio.to_thread(Credentials.from_environment)
        elif fresh:
            await config.credentials.reload()
    except CredentialsError as exc:
        raise kopf.PermanentError(f"no Kubernetes credentials: {exc.detail}") from None
    return config.credentials


def _operator(config: OperatorConfig, memo: kopf.Memo) -> lifecycle.Operator:
    """The lifecycle functions' view of the operator: the clients and caches startup put in the
    memo (a test's memo may hold only kube and metrics), and the config's pacing and clock."""
    return lifecycle.Operator(kube=memo.kube, metrics=memo.metrics, now=config.now, tick_s=config.tick_s,
                              scrape_timeout_s=config.scrape_timeout_s, scrape=config.scrape,
                              reads=getattr(memo, "reads", None), session=getattr(memo, "scrape_session", None),
                              gauss_runs=getattr(memo, "gauss_runs", None),
                              parse_cache=getattr(memo, "parse_cache", None),
                              histogram_cache=getattr(memo, "histogram_cache", None),
                              sync_cache=getattr(memo, "sync_cache", None),
                              reconcile_slots=getattr(memo, "reconcile_slots", None))


def _sink(body, patch: kopf.Patch | dict, logger) -> lifecycle.Sink:
    """The handler's status goes into kopf's patch (or a dict), its Events through kopf's poster."""
    status = patch.status if isinstance(patch, kopf.Patch) else patch.setdefault("status", {})
    return lifecycle.Sink(status, lambda etype, reason, message: kopf.event(
        body, type=etype, reason=reason, message=message), logger)


class SpecDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base with kopf's essence (spec, labels, annotations), built
    without first deep-copying what the essence drops: kopf copies the whole object on every
    watch event, and the status (observation ring) and managedFields are most of it."""

    def build(self, *, body, extra_fields=None):
        extra_fields = list(extra_fields or [])
        if any(f and f[0] in ("status", "metadata") for f in extra_fields):  # what the lean copy drops
            return super().build(body=body, extra_fields=extra_fields)
        meta = body.get("metadata") or {}
        lean = {k: v for k, v in body.items() if k not in ("status", "metadata")}
        lean["metadata"] = {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
        return super().build(body=kopf.Body(lean), extra_fields=extra_fields)


class SpecProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage whose ``clear`` copies only what it changes (the
    metadata and its annotations): kopf deep-copies the essence, spec included, twice per watch
    event, and every status write brings one. The essences it gets are built afresh per event."""

    def clear(self, *, essence):
        meta = essence.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        out = dict(essence)
        if "metadata" in essence:
            out["metadata"] = dict(meta)
            if "annotations" in meta:
                out["metadata"]["annotations"] = {k: v for k, v in annotations.items()
                                                  if not (self.prefix and k.startswith(f"{self.prefix}/"))}
        self.remove_empty_stanzas(out)
        return out


# a deleted resource keeps its finalizer until its control timer's current tick ends; kopf checks
# for that again after this many seconds (its default, 60 s, held every such deletion a minute)
TIMER_EXIT_POLL_S = 1.0
# a namespace's exact name (an RFC 1123 label); anything else is one of kopf's patterns
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def operator_settings(namespaces: list[str] | tuple[str, ...] = (), *, clusterwide: bool = False,
                      settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf's settings for `kneecap run` (and the tests that run it in process).

    A namespaced operator whose namespaces are all exact names (no glob, no negation) does not
    list or watch Namespaces: there is nothing to match, and an install scoped to its own
    namespaces need not grant a cluster-wide read (kopf would otherwise retry the forbidden list
    for about a minute before serving anything). CRDs are still discovered once at start."""
    settings = settings or kopf.OperatorSettings()
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S
    if not clusterwide and namespaces and all(NAMESPACE_NAME.fullmatch(ns) for ns in namespaces):
        settings.scanning.disabled = True
    return settings


def build_registry(config: OperatorConfig | None = None) -> kopf.OperatorRegistry:
    config = config or OperatorConfig()
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_):
        creds = await _connection(config, fresh=True)
        return creds if isinstance(creds, kopf.ConnectionInfo) else creds.connection_info()

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, logger, **_):
        settings.persistence.finalizer = finalizer(config.selector)  # a shard's own (kneecap.control.shard)
        settings.persistence.progress_storage = SpecProgressStorage(prefix="kneecap.io")
        settings.persistence.diffbase_storage = SpecDiffBaseStorage(
            prefix="kneecap.io", key="last-handled-configuration")
        # kopf's own handler failures (logged at ERROR on the object's logger) become Warning/Error
        # Events; the handlers' explicit Events (kopf.event, kopf.warn) are posted as they are
        settings.posting.loggers = True
        settings.posting.level = logging.WARNING
        # one peering object for the whole install (ClusterKopfPeering, the chart makes it),
        # whether the operator watches all namespaces or some
        settings.peering.clusterwide = True
        settings.peering.lifetime = config.peering_lifetime_s
        settings.peering.priority = (config.peering_priority if config.peering_priority is not None
                                     else oldest_first_priority())
        creds = await _connection(config, fresh=False)
        memo.kube = (KubeClient.from_connection_info(creds) if isinstance(creds, kopf.ConnectionInfo)
                     else KubeClient(credentials=creds))
        # the ticks read Deployments, HPAs and pods from watch-backed caches (the spec handlers
        # read the API: they must see an HPA created just before a spec change)
        memo.reads = CachedReads(memo.kube)
        memo.metrics = config.metrics
        memo.gauss_runs = GaussRuns()  # shared by every resource's plan (LoopContext.gauss_runs)
        memo.parse_cache = ParseCache()  # shared by every scrape (LoopContext.parse_cache)
        memo.histogram_cache = HistogramCache()  # shared by every window (LoopContext.histogram_cache)
        memo.sync_cache = InSyncCache()  # shared by every resource (LoopContext.sync_cache)
        memo.reconcile_slots = (asyncio.Semaphore(config.max_concurrent_reconciles)
                                if config.max_concurrent_reconciles else None)
        # the one fleet advice, shared by every resource's fleet timer
        memo.fleet_advisor = fleet.FleetAdvisor(inventory=config.fleet_inventory, recheck_s=config.fleet_s / 2,
                                                cpu_share=config.fleet_cpu_share,
                                                max_evaluations=config.fleet_max_evaluations)
        # one client session for every scrape; a connection per scrape (force_close): vLLM's
        # server drops idle keep-alive connections after 5 s, an interval is longer
        memo.scrape_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
        # what the planning bursts freed goes back to the OS once per tick (kneecap.control.heap)
        memo.heap_release = asyncio.create_task(heap.release_periodically(config.tick_s))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_):
        heap_release = getattr(memo, "heap_release", None)
        if heap_release is not None:
            heap_release.cancel()
        reads = getattr(memo, "reads", None)
        if reads is not None:
            await reads.close()
        kube = getattr(memo, "kube", None)
        if kube is not None:
            await kube.close()
        session = getattr(memo, "scrape_session", None)
        if session is not None:
            await session.close()

    shard = kopf_filters(config.selector)  # every LLMDeployment handler: this shard's resources only

    @kopf.on.resume(*RESOURCE, id="reconcile", registry=registry, **shard)
    @kopf.on.create(*RESOURCE, id="reconcile", registry=registry, **shard)
    @kopf.on.update(*RESOURCE, field="spec", id="reconcile", registry=registry, **shard)
    async def reconcile(body, patch, memo, logger, reason, **_):
        release_other_finalizers(finalizer(config.selector), body, patch)  # a split or merge of shards
        async with config.drain.work():
            await lifecycle.on_spec(_operator(config, memo), body, reconcile_lock(memo), reason,
                                    _sink(body, patch, logger))

    @kopf.timer(*RESOURCE, interval=config.tick_s, initial_delay=config.tick_s, id="control", registry=registry,
                **shard)
    async def control(body, patch, memo, logger, stopped: kopf.DaemonStopped, **_):
        async with config.drain.work():
            await lifecycle.on_timer(_operator(config, memo), body, memo.setdefault("loop", loop.LoopMemory()),
                                     reconcile_lock(memo), _sink(body, patch, logger),
                                     stopping=lambda: stopped.is_set() or config.drain.draining)

    # every LLMDeployment of this shard: its spec and the status the fleet advice reads, kept by the
    # watch (a shard packs its own fleet)
    @kopf.index(*RESOURCE, id="llmdeployments", registry=registry, **shard)
    def llmdeployments(body, namespace, name, **_):
        return {(namespace, name): fleet.index_entry(body)}

    @kopf.timer(*RESOURCE, interval=config.fleet_s, initial_delay=config.fleet_s, id="fleet", registry=registry,
                **shard)
    async def fleet_advice(body, memo, logger, llmdeployments: kopf.Index, stopped: kopf.DaemonStopped, **_):
        async with config.drain.work():
            await fleet.advise_resource(_operator(config, memo), body, (e for store in llmdeployments.values()
                                                                        for e in store),
                                        memo.fleet_advisor, memo.setdefault("fleet", {}), _sink(body, {}, logger),
                                        stopping=lambda: stopped.is_set() or config.drain.draining)

    @kopf.on.delete(*RESOURCE, id="delete", registry=registry, **shard)
    async def delete(body, memo, logger, **_):
        async with config.drain.work():
            await lifecycle.on_delete(_operator(config, memo), body, logger)

    return registry
