"""What the operator does for one LLMDeployment, as plain functions of explicit arguments.

The kopf handlers (:mod:`kneecap.control.handlers`) are short wrappers around these, and the
virtual-time cluster (:mod:`kneecap.sim.cluster`) calls the same ones, so a replay runs the
operator's own spec handler and control timer: the spec parsed once per generation, the same
rule for when a tick is due, the same status writes. Nothing here imports kopf: what kopf hands
a handler in its kwargs arrives as an :class:`Operator` (what the whole process shares), the
resource's :class:`~kneecap.control.loop.LoopMemory` and reconcile lock, and a :class:`Sink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, MutableMapping

import aiohttp

from kneecap.control import fleet, loop, reconcile, status as status_helpers, status_codec
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.informer import ApiReads
from kneecap.control.kube import KubeClient, configmaps_path, resource_path
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import GROUP, PLURAL, VERSION, LLMDeploymentSpec, check_name, config_map_ref, parse_spec
from kneecap.errors import InputError
from kneecap.observe.histogram import HistogramCache
from kneecap.observe.scrape import ParseCache


MAX_CONCURRENT_RECONCILES = 4  # default reconcile slots (:func:`reconcile_slot`)


@dataclass(frozen=True)
class Operator:
    """What every resource's handlers share: the API client, the metrics, the clock, the
    control timer's pacing and the process-wide caches."""

    kube: KubeClient
    metrics: OperatorMetrics
    now: Callable[[], float] = time.time
    tick_s: float = 10.0  # how often the control timer wakes to check whether spec.control.interval elapsed
    scrape_timeout_s: float = 5.0
    scrape: loop.ScrapeFn | None = None  # None: HTTP
    reads: ApiReads | None = None  # the ticks' watch-backed caches (None: the API)
    session: aiohttp.ClientSession | None = None  # shared by the scrapes (None: one per scrape)
    gauss_runs: GaussRuns | None = None  # GAUSS's λ* reuse (LoopContext.gauss_runs)
    parse_cache: ParseCache | None = None  # the scrapes' parser's (LoopContext.parse_cache)
    histogram_cache: HistogramCache | None = None  # the windows' bucket plans (LoopContext.histogram_cache)
    sync_cache: reconcile.InSyncCache | None = None  # Deployments found in sync (LoopContext.sync_cache)
    reconcile_slots: asyncio.Semaphore | None = None  # bounds the ticks and spec passes under way (None: unbounded)


@dataclass(frozen=True)
class Sink:
    """Where a handler's output goes besides the API: the status patch its caller writes once it
    returns (kopf's ``patch.status``, or a dict), Events about the resource, and its log."""

    status: MutableMapping
    event: loop.EventFn  # (type Normal|Warning, reason, message)
    logger: logging.Logger | logging.LoggerAdapter


def status_path(body: dict) -> str:
    meta = body["metadata"]
    return resource_path(f"{GROUP}/{VERSION}", PLURAL, meta["namespace"], meta["name"])


def _invalid(body: dict, exc: InputError, now_s: float) -> dict:
    gen = body["metadata"].get("generation")
    conds = status_helpers.set_condition((body.get("status") or {}).get("conditions"), status_helpers.READY, False,
                                         "InvalidSpec", str(exc), gen, now_s)
    return {"observedGeneration": gen, "phase": status_helpers.phase_of(conds, invalid=True), "conditions": conds,
            "invalidField": exc.field}


async def parse(operator: Operator, body: dict, sink: Sink, *, emit: bool) -> LLMDeploymentSpec | None:
    """The spec, or None after recording an InvalidSpec condition in ``sink.status`` (and an
    Event when ``emit``). A ``spec.model.configMapRef`` is read from the API first (a missing
    ConfigMap is an invalid spec; any other failed read raises, so the caller retries)."""
    ref = config_map_ref(body.get("spec"))
    config_map = (await operator.kube.get(configmaps_path(body["metadata"]["namespace"], ref.name))
                  if ref is not None else None)
    try:
        check_name(body["metadata"]["name"])
        return parse_spec(body.get("spec"), config_map=config_map)
    except InputError as exc:
        sink.status.update(_invalid(body, exc, operator.now()))
        if emit:
            sink.event("Warning", "InvalidSpec", str(exc))
        sink.logger.info("invalid spec: %s", exc)  # (the InvalidSpec condition and Event carry it)
        return None


def _done(pool: reconcile.PoolState) -> str:
    return ("adopted" if pool.adoption else "created" if pool.created
            else "patched" if pool.patched else "in sync")


async def on_spec(operator: Operator, body: dict, lock: asyncio.Lock, reason: str, sink: Sink) -> None:
    """Create, resume or a spec change (``reason``): a full reconcile of the owned objects read
    from the API, under the resource's reconcile lock (the control timer reconciles too); the
    Ready and Conflict conditions and the ownership go to ``sink.status``, Events for conflicts,
    missing targets and what changed."""
    spec = await parse(operator, body, sink, emit=True)
    if spec is None:
        return
    spec = fleet.effective_spec(body, spec)  # a shared GPU where spec.placement and the fleet advice say so
    async with reconcile_slot(operator), lock:
        result = await reconcile.reconcile(operator.kube, dict(body), spec, sync_cache=operator.sync_cache)
    now = operator.now()
    gen = body["metadata"].get("generation")
    conds = (body.get("status") or {}).get("conditions")
    conds = status_helpers.set_condition(conds, status_helpers.READY, *status_helpers.ready(
        [p.deployment for p in result.pools], conflicts=result.conflicts, missing=result.missing,
        detail=", ".join([f"{p.pool.name}: {_done(p)}" for p in result.pools]
                         + [f"{c.name}: {c.kind} not owned" for c in result.conflicts])), gen, now)
    conds = status_helpers.set_conflict(conds, result.conflicts, gen, now)
    sink.status.update({"observedGeneration": gen, "conditions": conds, "phase": status_helpers.phase_of(conds),
                        "invalidField": None, "ownership": status_codec.ownership_status(result.pools)})
    for c in result.conflicts:
        sink.event("Warning", "Conflict", c.message)
    for m in result.missing:
        sink.event("Warning", "TargetMissing", m)
    if result.changed:
        sink.event("Normal", "Reconciled", f"{reason}: " + ", ".join(
            [f"{p.pool.name} {'created' if p.created else 'patched'}" for p in result.pools
             if p.created or p.patched] + [f"{d} deleted" for d in result.deleted]))


async def on_timer(operator: Operator, body: dict, mem: loop.LoopMemory, lock: asyncio.Lock,
                   sink: Sink, stopping: Callable[[], bool] = lambda: False) -> dict | None:
    """The control timer's wake-up: one control tick (``loop.tick``) when spec.control.interval
    has passed since the last, to within half a timer period (wake-ups jitter), its status
    written straight to the status subresource. The spec is parsed once per generation; an
    invalid one goes to ``sink.status`` once and no tick runs until the spec changes. Returns
    the status the tick wrote, None when none ran. ``stopping``: True once kopf has stopped the
    timer (the operator exits, or pauses for a peer): no tick starts, and one under way writes
    nothing more once it has gathered."""
    if stopping():
        return None
    now = operator.now()
    gen = body["metadata"].get("generation")
    gen = gen if gen is not None else repr(body.get("spec"))  # an API server without generations
    due = lambda: (not mem.last_tick_s  # noqa: E731
                   or now - mem.last_tick_s >= mem.spec.control.interval_s - operator.tick_s / 2)
    if mem.spec_generation == gen and (mem.spec is None or not due()):
        return None  # not due, or a spec already reported invalid
    fresh = False  # read the API, not the caches: the spec handler may have just patched a pool
    if mem.spec_generation != gen:  # parsed once per generation, not on every tick
        try:
            mem.spec = await parse(operator, body, sink, emit=False)
        except loop.API_EXCEPTIONS as exc:  # the model's ConfigMap not read: retried next tick
            sink.logger.warning("spec.model.configMapRef not read: %s", exc)
            return None
        mem.spec_generation = gen
        fresh = True
        if mem.spec is None or not due():
            return None
    mem.last_tick_s = now
    async with reconcile_slot(operator):
        if stopping():  # began while the tick waited for its slot
            return None
        return await _tick(operator, body, mem, lock, sink, stopping, fresh)


def reconcile_slot(operator: Operator):
    """One of the operator's reconcile slots (``kneecap run --max-concurrent-reconciles``), held
    while a resource's tick or spec pass talks to the API. The event loop is one thread: past a
    few resources at once, a tick's plan (CPU) delays every other's replies until their requests
    time out, and each failure costs a retry and an Event; a slot makes the rest wait their turn,
    as controller-runtime's MaxConcurrentReconciles does. The fleet timer's status write takes
    one too."""
    return getattr(operator, "reconcile_slots", None) or contextlib.nullcontext()


async def _tick(operator: Operator, body: dict, mem: loop.LoopMemory, lock: asyncio.Lock, sink: Sink,
                stopping: Callable[[], bool], fresh: bool) -> dict | None:
    ctx = loop.LoopContext(kube=operator.kube, metrics=operator.metrics, now=operator.now,
                           scrape_timeout_s=operator.scrape_timeout_s, scrape=operator.scrape,
                           session=operator.session, reads=None if fresh else operator.reads,
                           reconcile_lock=lock, gauss_runs=operator.gauss_runs,
                           parse_cache=operator.parse_cache, histogram_cache=operator.histogram_cache,
                           sync_cache=operator.sync_cache,
                           event=sink.event, stopping=stopping)
    seen = dict(body)  # (a caller's body may be live: kopf's watch may replace it during the tick)
    status = await loop.tick(ctx, seen, fleet.effective_spec(seen, mem.spec), mem)
    if status is None or stopping():
        return None
    # written directly (one merge patch on the status subresource, the object not read back):
    # kopf's patch would re-check the whole returned object on every tick
    await loop.write_status(ctx, status_path(seen), status, mem, base_version=seen["metadata"].get("resourceVersion"))
    return status


async def on_delete(operator: Operator, body: dict, logger: logging.Logger | logging.LoggerAdapter) -> list[str]:
    """The resource is being deleted: delete what it owns and forget its metric series.
    Returns the objects deleted."""
    gone = await reconcile.delete_owned(operator.kube, dict(body))
    operator.metrics.forget(body["metadata"]["namespace"], body["metadata"]["name"])
    logger.info("deleted owned objects: %s", ", ".join(gone) or "none left")
    return gone
