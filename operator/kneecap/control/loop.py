"""One control-loop iteration per LLMDeployment (DESIGN §4): gather → plan → apply.

gather (reads only): the owned Deployments (and, every few ticks, Services and what to prune),
each pool's ready pods and their scrapes, turned into the window's observation once it closes:
one :class:`~kneecap.control.tick.TickInput`. plan (pure, :mod:`kneecap.control.plan`): the
writes that reconcile the owned objects; observation ring → recalibrate SLIM → BCA cap + memory
→ SARA allocation (disaggregated) or GAUSS replica count (colocated) → guards → the new status,
Events, metric updates and at most one Deployment patch per pool: one
:class:`~kneecap.control.tick.Plan`. apply (writes only): the writes in order (a failed one is
reported as plan computed for that case, never raised), the metrics and the Events; the caller
writes the returned status (:func:`write_status`).

Everything a restarted operator needs lives in the resource's status (observation ring,
calibration, failure counts) and in the Deployments' `kneecap.io/applied` record (what was
applied and when); the in-process `LoopMemory` holds each pod's scrapes of the open window,
which a restart loses (the first tick after it only re-primes the scrapes), and a status that
could not be written (merged into the next write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Container
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

import aiohttp

from kneecap.control import plan as planner, reconcile, restart, status_codec
from kneecap.control import status as status_helpers
from kneecap.control.gauss_reuse import GaussRuns
from kneecap.control.informer import ApiReads
from kneecap.control.kube import ApiError, ApiFailure, KubeClient, deployments_path
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.control.tick import (IDLE, NO_PODS, OBSERVED, OPEN, SCRAPE_FAILED, UNUSABLE, Event, Plan,
                                  PoolWindow, ReconcileWrite, TickInput)
from kneecap.observe.scrape import ParseCache, ScrapeError, Snapshot, family_filter, scrape as http_scrape
from kneecap.observe.vllm_metric_names import WINDOW_METRICS
from kneecap.observe.window import HistogramCache, NoObservation, Observation, Reason, combine, window_deltas

log = logging.getLogger("kneecap.loop")

# The metric families window_deltas reads; a scrape parses only these (a vLLM page has ~90
# families, the window needs ~20: less parsing and smaller snapshots held between ticks).
WINDOW_FAMILIES = family_filter(WINDOW_METRICS)

FULL_RECONCILE_TICKS = 10  # a full reconcile (Services, pruning) every this many control ticks

ScrapeFn = Callable[[str], Awaitable[Snapshot]]
EventFn = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)
API_EXCEPTIONS = (ApiError, aiohttp.ClientError, asyncio.TimeoutError)  # an API call that failed


@dataclass
class LoopMemory:
    """In-process state of one resource: each pod URL's scrapes since its window opened, the
    spec parsed at the generation the timer last saw, and a status write that failed."""

    snapshots: dict[str, dict[str, list[Snapshot]]] = field(default_factory=dict)  # role -> url -> scrapes
    last_tick_s: float = 0.0
    parsed_ring: dict = field(default_factory=dict)  # ring entry key -> RingEntry (see status_codec.parse_ring)
    ticks: int = 0  # control ticks run since the operator started (every FULL_RECONCILE_TICKS-th is full)
    spec: LLMDeploymentSpec | None = None  # parsed at `spec_generation` (None: that spec is invalid)
    spec_generation: int | str | None = -1
    reconcile_failed: bool = False  # the last reconcile failed: the next one is a full pass again
    unwritten_status: dict | None = None  # a status patch whose write failed (merged into the next)
    status_write_failure: ApiFailure | None = None
    # the status patches written since the resource's body (kopf's, from its watch) last moved,
    # and the resourceVersion it has had since: a tick on that body merges them in (see gather)
    written_status: dict | None = None
    written_over: str | None = None


@dataclass(frozen=True)
class LoopContext:
    kube: KubeClient
    metrics: OperatorMetrics
    event: EventFn
    now: Callable[[], float] = time.time
    scrape_timeout_s: float = 5.0
    scrape: ScrapeFn | None = None
    session: aiohttp.ClientSession | None = None  # shared by the scrapes (None: one per scrape)
    reads: ApiReads | None = None  # where Deployments, HPAs and pods are read (None: the API)
    # held while the tick reconciles: the resource's spec handlers reconcile under the same lock
    # (kopf runs them and the timer concurrently), see handlers.reconcile_lock
    reconcile_lock: asyncio.Lock | None = None
    # past GAUSS runs, reused by every resource's plan while its inputs stay within tolerance
    # (one per operator process; None: each plan searches afresh)
    gauss_runs: GaussRuns | None = None
    parse_cache: ParseCache | None = None  # the scrapes' parser's (one per operator process; None: each page alone)
    # the windows' bucket plans (one per operator process, like parse_cache; None: each window alone)
    histogram_cache: HistogramCache | None = None
    # the Deployments found in sync with the spec (one per operator process; None: compared every tick)
    sync_cache: reconcile.InSyncCache | None = None
    # True once this process must write no more: kopf stopped its timers (the operator exits or
    # pauses for a peer of higher priority, whose goodbye or keep-alive may already be out)
    stopping: Callable[[], bool] = lambda: False

    @property
    def known_in_sync(self) -> Container[tuple]:
        return () if self.sync_cache is None else self.sync_cache

    @property
    def reader(self) -> ApiReads:
        return self.reads or ApiReads(self.kube)

    async def scrape_url(self, url: str) -> Snapshot:
        if self.scrape is not None:
            return await self.scrape(url)
        return await http_scrape(url, timeout_s=self.scrape_timeout_s, keep=WINDOW_FAMILIES, session=self.session,
                                 cache=self.parse_cache)


# ---------------------------------------------------------------- gather

def trim_window(scrapes: list[Snapshot], window_s: float, max_scrapes: int) -> None:
    """Keep what the open window needs: drop the oldest scrapes while the rest still span a
    window (then at most one window's scrapes + 1 remain), and never more than ``max_scrapes``
    (a clock that stands still)."""
    while len(scrapes) > 2 and scrapes[-1].t_s - scrapes[1].t_s >= window_s * 0.999:
        del scrapes[0]
    if len(scrapes) > max_scrapes:
        del scrapes[:len(scrapes) - max_scrapes]


async def observe_window(ctx: LoopContext, mem: LoopMemory, spec: LLMDeploymentSpec, state: reconcile.PoolState,
                         urls: list[str]) -> PoolWindow:
    """Scrape the pool's pods and, once ``spec.control.window`` has passed since the window
    opened, turn it into one observation (the scrapes in between give the gauge samples
    (batch, queue, KV usage) their time average)."""
    role = state.pool.role
    snaps = mem.snapshots.setdefault(role, {})
    for gone in set(snaps) - set(urls):
        del snaps[gone]
    if not urls:
        return PoolWindow(role, state, NO_PODS, "no ready pod with an IP or a metrics URL")
    results = await asyncio.gather(*(ctx.scrape_url(u) for u in urls), return_exceptions=True)
    window_s = spec.control.window_s
    max_scrapes = 2 * math.ceil(window_s / max(spec.control.interval_s, 1e-3)) + 2
    errors = []
    for url, res in zip(urls, results):
        if isinstance(res, BaseException):
            errors.append(f"{url}: {res}" if isinstance(res, ScrapeError) else f"{url}: {res!r}")
            continue
        kept = snaps.setdefault(url, [])
        kept.append(res)
        trim_window(kept, window_s, max_scrapes)
    if errors:
        return PoolWindow(role, state, SCRAPE_FAILED, "; ".join(errors)[:900],
                                  scrape_errors=len(errors))
    series = [snaps[u] for u in urls]
    if any(len(sn) < 2 for sn in series):
        return PoolWindow(role, state, OPEN, "priming: first scrape of these pods")
    span = min(sn[-1].t_s - sn[0].t_s for sn in series)
    if span < window_s * 0.999:
        return PoolWindow(role, state, OPEN, f"window open: {span:.0f}s of {window_s:.0f}s")
    parts, excluded = [], []
    for url in urls:
        sn = snaps[url]
        d = window_deltas(sn[0], sn[-1], sn[1:-1], cache=ctx.histogram_cache)
        snaps[url] = [sn[-1]]  # the next window opens where this one closed
        if isinstance(d, NoObservation):
            excluded.append(f"{url}: {d.code}")
        else:
            parts.append(d)
    obs = combine(parts, {"ttft": spec.slo.ttft_s, "tpot": spec.slo.tpot_s, "e2e": spec.slo.e2e_s}) if parts else None
    if isinstance(obs, Observation):
        return PoolWindow(role, state, OBSERVED, "; ".join(f"left out {e}" for e in excluded), obs)
    if isinstance(obs, NoObservation) and obs.reason in (Reason.IDLE, Reason.NO_FINISHED) and not excluded:
        return PoolWindow(role, state, IDLE, obs.code)
    return PoolWindow(role, state, UNUSABLE,
                              "; ".join(excluded + ([obs.code] if obs is not None else [])))


async def observe_pool(ctx: LoopContext, mem: LoopMemory, ns: str, name: str, spec: LLMDeploymentSpec,
                       state: reconcile.PoolState) -> PoolWindow:
    """The pool's window from its ready pods' scrapes (an adopted Deployment's pods through its
    own selector and ReplicaSets, on the port its vLLM listens on), with their creation → Ready
    times (the pool's restart cost)."""
    try:
        if state.adoption is not None:
            every = await ctx.reader.deployment_pods(ns, state.deployment)
        else:
            every = await ctx.reader.pods(ns, name, state.pool.role)
    except API_EXCEPTIONS as exc:
        return PoolWindow(state.pool.role, state, NO_PODS, f"pods not read: {ApiFailure.of(exc)}")
    pods = reconcile.ready(every)
    port = state.adoption.port if state.adoption is not None else spec.engine.port
    window = await observe_window(ctx, mem, spec, state,
                                  [u for u in (reconcile.metrics_url(p, port) for p in pods) if u])
    return replace(window, start_to_ready_s=tuple(restart.start_to_ready_s(pods)),
                   unschedulable=reconcile.unschedulable(every),
                   ignored_metrics_url=reconcile.ignored_metrics_url(pods))


def _seen(ctx: LoopContext, result: reconcile.ReconcileResult) -> reconcile.ReconcileResult:
    """Remember the Deployments the comparison found in sync (the plan's comparison then skips them)."""
    if ctx.sync_cache is not None:
        ctx.sync_cache.record(result.found_in_sync)
    return result


async def read_owned(ctx: LoopContext, body: dict, spec: LLMDeploymentSpec,
                     full: bool) -> tuple[reconcile.LiveObjects | None, reconcile.ReconcileResult, ApiFailure | None]:
    """The owned (or adopted) objects as read and what they show (the pools, conflicts, missing
    targets), read only. When the read fails: no objects to reconcile from (None), the pools of
    a read of the Deployments alone (their windows still count), and the failure."""
    try:
        live = await reconcile.read_live(ctx.kube, body, spec, full=full, reads=ctx.reader)
        return live, _seen(ctx, reconcile.plan_reconcile(body, spec, live, ctx.known_in_sync)), None
    except API_EXCEPTIONS as exc:
        failure = ApiFailure.of(exc)
        log.warning("reading the objects of %s/%s failed: %s", body["metadata"]["namespace"],
                    body["metadata"]["name"], failure)
    try:
        partial = _seen(ctx, reconcile.plan_reconcile(body, spec, await reconcile.read_live(
            ctx.kube, body, spec, full=False, reads=ctx.reader), ctx.known_in_sync))
    except API_EXCEPTIONS:
        return None, reconcile.ReconcileResult(), failure
    return None, reconcile.ReconcileResult(pools=[p for p in partial.pools if not p.created]), failure


async def gather(ctx: LoopContext, body: dict, spec: LLMDeploymentSpec,
                 mem: LoopMemory) -> tuple[TickInput, dict]:
    """Read and observe, writing nothing: (what plan needs, the status it starts from: the
    resource's, with a status the last tick could not write merged in)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    status = {**(body.get("status") or {}), **(pending_status(mem, meta.get("resourceVersion")) or {}),
              **(mem.unwritten_status or {})}
    # Deployments every tick (live settings, rollouts, drift); Services and pruning every
    # FULL_RECONCILE_TICKS ticks, and after a failed reconcile (the spec handlers run a full
    # pass on every spec change)
    full = mem.ticks % FULL_RECONCILE_TICKS == 0 or mem.reconcile_failed
    mem.ticks += 1
    live, seen, failure = await read_owned(ctx, body, spec, full)
    pools = seen.pools
    windows = tuple([await observe_pool(ctx, mem, ns, name, spec, p) for p in pools])
    for role in set(mem.snapshots) - {p.pool.role for p in pools}:
        del mem.snapshots[role]
    ring = status_codec.parse_ring(status.get("observations") or [], planner.primary_role(spec), mem.parsed_ring)
    return TickInput(ns, name, meta.get("generation"), windows, ring, owner=body, live=live,
                     api_failures=(failure,) if failure else (), reconcile_failed=failure is not None,
                     status_write_failure=mem.status_write_failure,
                     conflicts=tuple(seen.conflicts), full_pass=full and live is not None,
                     missing_targets=tuple(seen.missing), known_in_sync=ctx.known_in_sync), status


# ---------------------------------------------------------------- apply

async def apply(ctx: LoopContext, g: TickInput, plan: Plan) -> tuple[dict, bool]:
    """Send the plan's writes in order, the reconcile writes first; at the first that fails,
    the status the plan computed for that case (``if_failed``) replaces its own and the rest
    are not sent. Then the metrics and the Events. Returns (the status to write, whether a
    reconcile write failed)."""
    status, events, updates = plan.status, list(plan.events), list(plan.metrics)
    changes: list[str] = []
    failed = None
    for action in plan.reconcile:
        try:
            _, changed = await reconcile.write(ctx.kube, action.write)
        except API_EXCEPTIONS as exc:
            failed = action, ApiFailure.of(exc)
            break
        changes += [action.write.change] if changed else []
    if changes:
        events.insert(0, Event("Normal", "Reconciled", ", ".join(changes)[:900]))
    for patch in plan.patches if failed is None else ():
        try:
            await ctx.kube.patch(deployments_path(g.namespace, patch.name), patch.body, patch.content_type)
        except API_EXCEPTIONS as exc:
            failed = patch, ApiFailure.of(exc)
            break
        events.extend(patch.events)
        updates.extend(patch.metrics)
    if failed is not None:
        action, failure = failed
        log.warning("a write of %s/%s failed: %s", g.namespace, g.name, failure)
        status, event, counters = action.if_failed.outcome(failure)
        events += [event] if event else []
        updates.extend(counters)
    for u in updates:
        ctx.metrics.update(u)
    for e in events:
        ctx.event(e.type, e.reason, e.message)
    return status, failed is not None and isinstance(failed[0], ReconcileWrite)


async def tick(ctx: LoopContext, body: dict, spec: LLMDeploymentSpec, mem: LoopMemory) -> dict | None:
    """One iteration: gather (reads only), plan (pure), apply (writes only). Returns the status
    patch (the caller writes it, see :func:`write_status`); None when the operator began to stop
    while the tick gathered (``ctx.stopping``): nothing is applied, another replica may lead
    already. Reads the clock once (``ctx.now``). Holds the resource's reconcile lock throughout:
    the spec handlers' reconcile passes do not interleave with a tick's reads and writes."""
    now_s = ctx.now()
    async with ctx.reconcile_lock or contextlib.nullcontext():
        g, before = await gather(ctx, body, spec, mem)
        if ctx.stopping():
            return None
        status, mem.reconcile_failed = await apply(ctx, g, planner.plan(g, before, spec, now_s, ctx.gauss_runs))
    mem.reconcile_failed = mem.reconcile_failed or g.reconcile_failed
    return status_helpers.replacing(before, status)


def pending_status(mem: LoopMemory, version: str | None) -> dict | None:
    """What this process wrote that a body at resourceVersion ``version`` may not show yet.

    The body a tick starts from is kopf's copy, kept current by its watch. While that watch is
    down (an apiserver restart: kopf reconnects with backoff, seconds after the API answers
    again) the body stands still though the ticks' status writes succeed, and a tick would build
    the next status, the whole observation ring with it, on the status from before them: the
    windows written meanwhile would be dropped from the ring. So the writes are kept until the
    body moves past the version it had when they were made (any watch event: ours come in order
    after it), and merged over a body that has not."""
    if mem.written_status is not None and (version is None or version != mem.written_over):
        mem.written_status = mem.written_over = None  # the watch has brought a newer body
    return mem.written_status


async def write_status(ctx: LoopContext, path: str, status: dict, mem: LoopMemory,
                       base_version: str | None = None) -> bool:
    """Merge-patch ``status`` (with any earlier status whose write failed) through the status
    subresource. A failure is kept for the next tick (its plan reports it in ApiError), counted
    and posted as a Warning Event; True when written. ``base_version``: the resourceVersion of
    the body the tick started from; what was written is kept for the ticks on that body
    (`pending_status`)."""
    patch = {**(mem.unwritten_status or {}), **status}
    try:
        await ctx.kube.patch_status(path, patch)
    except API_EXCEPTIONS as exc:
        failure = ApiFailure.of(exc)
        mem.unwritten_status, mem.status_write_failure = patch, failure
        ctx.metrics.inc(ctx.metrics.api_errors, failure.verb, failure.resource, str(failure.code))
        ctx.event("Warning", "StatusWriteFailed", f"status not written, retried next tick: {failure}"[:900])
        log.warning("status write failed: %s", failure)
        return False
    mem.unwritten_status = mem.status_write_failure = None
    if base_version is not None:
        earlier = pending_status(mem, base_version) or {}
        mem.written_status, mem.written_over = {**earlier, **patch}, base_version
    return True
