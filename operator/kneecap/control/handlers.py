"""kopf handlers: each is a guard and one call into reconcile/loop (STYLE: thin handlers).

`build_registry(config)` returns a fresh kopf registry, so `kneecap run` and the tests (which
point the operator at an emulated API) register the same handlers with different settings.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp
import kopf

from kneecap.control import loop, reconcile as reconciler, status as status_helpers, status_codec
from kneecap.control.auth import Credentials, CredentialsError
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.informer import CachedReads
from kneecap.control.kube import KubeClient, configmaps_path, resource_path
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import GROUP, PLURAL, VERSION, LLMDeploymentSpec, check_name, config_map_ref, parse_spec
from kneecap.errors import InputError
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
    now: Callable[[], float] = time.time
    scrape: loop.ScrapeFn | None = None
    # leader election (kopf peering; used when the operator runs with --peering): None picks
    # oldest_first_priority(), so exactly one replica is active and a new one never preempts it
    peering_priority: int | None = None
    peering_lifetime_s: int = PEERING_LIFETIME_S


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


def _invalid(body, exc: InputError, now_s: float) -> dict:
    gen = body["metadata"].get("generation")
    conds = status_helpers.set_condition((body.get("status") or {}).get("conditions"), status_helpers.READY, False,
                                         "InvalidSpec", str(exc), gen, now_s)
    return {"observedGeneration": gen, "phase": status_helpers.phase_of(conds, invalid=True), "conditions": conds,
            "invalidField": exc.field}


async def _parse(body, patch, logger, config: OperatorConfig, kube: KubeClient, *,
                 emit: bool) -> LLMDeploymentSpec | None:
    """The spec, or None after recording an InvalidSpec condition (and an Event when `emit`).
    A `spec.model.configMapRef` is read from the API first (a missing ConfigMap is an invalid
    spec; any other failed read raises, so the caller retries)."""
    ref = config_map_ref(body.get("spec"))
    config_map = (await kube.get(configmaps_path(body["metadata"]["namespace"], ref.name))
                  if ref is not None else None)
    try:
        check_name(body["metadata"]["name"])
        return parse_spec(body.get("spec"), config_map=config_map)
    except InputError as exc:
        patch.status.update(_invalid(body, exc, config.now()))
        if emit:
            kopf.warn(body, reason="InvalidSpec", message=str(exc))
        logger.info("invalid spec: %s", exc)  # (the InvalidSpec condition and Event carry it)
        return None


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


def build_registry(config: OperatorConfig | None = None) -> kopf.OperatorRegistry:
    config = config or OperatorConfig()
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_):
        creds = await _connection(config, fresh=True)
        return creds if isinstance(creds, kopf.ConnectionInfo) else creds.connection_info()

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, logger, **_):
        settings.persistence.finalizer = "kneecap.io/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kneecap.io")
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
        # one client session for every scrape; a connection per scrape (force_close): vLLM's
        # server drops idle keep-alive connections after 5 s, an interval is longer
        memo.scrape_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_):
        reads = getattr(memo, "reads", None)
        if reads is not None:
            await reads.close()
        kube = getattr(memo, "kube", None)
        if kube is not None:
            await kube.close()
        session = getattr(memo, "scrape_session", None)
        if session is not None:
            await session.close()

    @kopf.on.resume(*RESOURCE, id="reconcile", registry=registry)
    @kopf.on.create(*RESOURCE, id="reconcile", registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", id="reconcile", registry=registry)
    async def reconcile(body, patch, memo, logger, reason, **_):
        spec = await _parse(body, patch, logger, config, memo.kube, emit=True)
        if spec is None:
            return
        async with reconcile_lock(memo):
            result = await reconciler.reconcile(memo.kube, dict(body), spec)
        now = config.now()
        gen = body["metadata"].get("generation")
        conds = (body.get("status") or {}).get("conditions")
        done = lambda p: ("adopted" if p.adoption else "created" if p.created  # noqa: E731
                          else "patched" if p.patched else "in sync")
        conds = status_helpers.set_condition(conds, status_helpers.READY, *status_helpers.ready(
            [p.deployment for p in result.pools], missing=result.missing,
            conflict=any(c.kind == "Deployment" for c in result.conflicts),
            detail=", ".join([f"{p.pool.name}: {done(p)}" for p in result.pools]
                             + [f"{c.name}: {c.kind} not owned" for c in result.conflicts])), gen, now)
        conds = status_helpers.set_conflict(conds, result.conflicts, gen, now)
        patch.status.update({"observedGeneration": gen, "conditions": conds, "phase": status_helpers.phase_of(conds),
                             "invalidField": None, "ownership": status_codec.ownership_status(result.pools)})
        for c in result.conflicts:
            kopf.warn(body, reason="Conflict", message=c.message)
        for m in result.missing:
            kopf.warn(body, reason="TargetMissing", message=m)
        if result.changed:
            kopf.event(body, type="Normal", reason="Reconciled", message=f"{reason}: " + ", ".join(
                [f"{p.pool.name} {'created' if p.created else 'patched'}" for p in result.pools
                 if p.created or p.patched] + [f"{d} deleted" for d in result.deleted]))

    @kopf.timer(*RESOURCE, interval=config.tick_s, initial_delay=config.tick_s, id="control", registry=registry)
    async def control(body, patch, memo, logger, **_):
        mem: loop.LoopMemory = memo.setdefault("loop", loop.LoopMemory())
        now = config.now()
        gen = body["metadata"].get("generation")
        gen = gen if gen is not None else repr(body.get("spec"))  # an API server without generations
        # due when the interval has passed, to within half a tick (timer wake-ups jitter)
        due = lambda: not mem.last_tick_s or now - mem.last_tick_s >= mem.spec.control.interval_s - config.tick_s / 2  # noqa: E731
        if mem.spec_generation == gen and (mem.spec is None or not due()):
            return  # not due, or a spec already reported invalid (the spec handler reported it)
        fresh = False  # read the API, not the caches: the spec handler may have just patched a pool
        if mem.spec_generation != gen:  # parsed once per generation, not on every tick
            try:
                mem.spec = await _parse(body, patch, logger, config, memo.kube, emit=False)
            except loop.API_EXCEPTIONS as exc:  # the model's ConfigMap not read: retried next tick
                logger.warning("spec.model.configMapRef not read: %s", exc)
                return
            mem.spec_generation = gen
            fresh = True
            if mem.spec is None or not due():
                return
        spec = mem.spec
        mem.last_tick_s = now
        ctx = loop.LoopContext(kube=memo.kube, metrics=memo.metrics, now=config.now,
                               scrape_timeout_s=config.scrape_timeout_s, scrape=config.scrape,
                               session=getattr(memo, "scrape_session", None),
                               reads=None if fresh else getattr(memo, "reads", None),
                               reconcile_lock=reconcile_lock(memo), gauss_runs=getattr(memo, "gauss_runs", None),
                               parse_cache=getattr(memo, "parse_cache", None),
                               event=lambda etype, reason, message: kopf.event(body, type=etype, reason=reason,
                                                                               message=message))
        seen = dict(body)  # (kopf's body is live: the watch may replace it during the tick)
        status = await loop.tick(ctx, seen, spec, mem)
        # written directly (one merge patch on the status subresource, the object not read
        # back): kopf's patch would re-check the whole returned object on every tick
        meta = seen["metadata"]
        await loop.write_status(ctx, resource_path(f"{GROUP}/{VERSION}", PLURAL, meta["namespace"], meta["name"]),
                                status, mem, base_version=meta.get("resourceVersion"))

    @kopf.on.delete(*RESOURCE, id="delete", registry=registry)
    async def delete(body, memo, logger, **_):
        gone = await reconciler.delete_owned(memo.kube, dict(body))
        memo.metrics.forget(body["metadata"]["namespace"], body["metadata"]["name"])
        logger.info("deleted owned objects: %s", ", ".join(gone) or "none left")

    return registry
