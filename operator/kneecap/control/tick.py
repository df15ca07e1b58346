"""The types one control tick passes between its stages (DESIGN §4): gather → plan → apply;
pure data.

gather reads the pools, their pods and scrapes into one :class:`TickInput` (a :class:`PoolWindow`
per pool, the owned objects as read); plan turns it, the resource's status and spec into one
:class:`Plan` (the status to write, Events, metric updates, the writes that reconcile the owned
objects and the decision's Deployment patches, each write with the status to write instead
should it fail); apply sends the writes and reports what happened.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Literal

from kneecap.control import policy, reconcile, status as status_helpers
from kneecap.control.kube import MERGE, ApiFailure
from kneecap.control.metric_series import Series
from kneecap.observe.observation import Observation

# What a tick saw of a pool's window.
OBSERVED = "Observed"  # a window closed with an observation
IDLE = "Idle"  # a window closed with no traffic (usable: nothing to decide)
OPEN = "WindowOpen"  # no window closed (first scrapes of a pod, or the window is still open)
NO_PODS = "NoReadyPods"
UNUSABLE = "MetricsUnusable"  # a window closed, its metrics unusable (the message names why)
SCRAPE_FAILED = "ScrapeFailed"
FAILED = (UNUSABLE, SCRAPE_FAILED)
STALE = "ObservationStale"

APPLY_FAILED = "ApplyFailed"  # the decision reason when a Deployment patch of the plan failed
RECONCILE_FAILED = "ReconcileFailed"  # ... when a reconcile write (or read) failed


@dataclass(frozen=True)
class PoolWindow:
    """One pool at this tick: its live state and what its window gave."""

    role: str
    state: reconcile.PoolState
    outcome: str  # OBSERVED | IDLE | OPEN | NO_PODS | UNUSABLE | SCRAPE_FAILED
    message: str = ""
    observation: Observation | None = None
    scrape_errors: int = 0  # failed scrapes this tick
    start_to_ready_s: tuple[float, ...] = ()  # the Ready pods' creation → Ready times (restart.start_to_ready_s)
    unschedulable: str = ""  # why the scheduler leaves a pod of the pool Pending (reconcile.unschedulable)
    ignored_metrics_url: str = ""  # pods whose metrics-url annotation names another host (reconcile.ignored_metrics_url)


@dataclass(frozen=True)
class TickInput:
    """What the gather stage of a tick read and tried: the plan's only view of the world."""

    namespace: str
    name: str
    generation: int | str | None
    pools: tuple[PoolWindow, ...]
    ring: tuple[tuple[dict, status_helpers.RingEntry | None], ...] = ()  # status.observations, each with its parse
    # (None: another pool's entry, or unreadable); see status_codec.parse_ring
    owner: dict | None = None  # the LLMDeployment's apiVersion, kind and metadata (what owned objects point to)
    live: reconcile.LiveObjects | None = None  # the owned objects as read (None: not read, or read failed)
    api_failures: tuple[ApiFailure, ...] = ()  # reads refused while gathering (reconcile's)
    reconcile_failed: bool = False  # the owned objects could not be read (one of api_failures)
    status_write_failure: ApiFailure | None = None  # the previous tick's status write failed
    conflicts: tuple[reconcile.Conflict, ...] = ()  # owned objects that are not kneecap's
    full_pass: bool = False  # reconcile checked every owned object (Services too): no conflict means none
    missing_targets: tuple[str, ...] = ()  # spec.targetRef Deployments not found (nothing is created for them)
    # the Deployments known in sync with the spec (the loop's InSyncCache, read only): not compared again
    known_in_sync: Container[tuple] = ()


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class MetricUpdate:
    """One change to an OperatorMetrics series: set (a gauge), inc (a counter) or drop (either)
    the label set ``labels`` of ``series``."""

    op: Literal["set", "inc", "drop"]
    series: Series
    labels: tuple[str, ...]
    value: float | None = None

    def __post_init__(self):
        fits = {"set": ("gauge",), "inc": ("counter",), "drop": ("gauge", "counter")}.get(self.op)
        if fits is None or self.series.kind not in fits:
            raise ValueError(f"MetricUpdate: {self.op!r} does not apply to the {self.series.kind} {self.series.name}")


def decision_status(action: str, reason: str, message: str, now_s: float, target: dict | None = None,
                    restart: dict | None = None) -> dict:
    """``status.lastDecision``: what the tick decided, why, when (the one place it is built)."""
    return status_helpers.compact({"action": action, "reason": reason, "message": message[:900],
                                   "time": status_helpers.iso(now_s), "target": target, "restart": restart})


@dataclass(frozen=True)
class FailedWrite:
    """What a tick reports instead of its plan when one of its writes fails, computed by plan:
    the status without the changes of that write and the ones after it (they are not sent),
    which :meth:`outcome` completes with the API's answer (ApiError, a held decision)."""

    status: dict
    generation: int | str | None
    now_s: float
    labels: tuple[str, str]  # (namespace, name) of the LLMDeployment
    reason: str = APPLY_FAILED  # the held decision's reason
    what: str = "the Deployment patch failed, nothing applied"  # its message, before the API's answer

    def outcome(self, failure: ApiFailure) -> tuple[dict, Event | None, tuple[MetricUpdate, ...]]:
        """(the status to write, a Warning Event unless ApiError already said the same, the counters)."""
        reason, text = f"{failure.verb.capitalize()}Failed", str(failure)[:900]
        conds = self.status.get("conditions")
        prev = status_helpers.get_condition(conds, status_helpers.API_ERROR) or {}
        conds = status_helpers.set_condition(conds, status_helpers.API_ERROR, True, reason, text, self.generation,
                                             self.now_s)
        message = f"{self.what}: {failure}"
        status = {**self.status, "conditions": conds, "phase": status_helpers.phase_of(conds),
                  "lastDecision": decision_status(policy.HOLD, self.reason, message, self.now_s)}
        repeated = prev.get("status") == "True" and prev.get("message") == text
        return status, None if repeated else Event("Warning", reason, message[:900]), (
            MetricUpdate("inc", Series.API_ERRORS, (failure.verb, failure.resource, str(failure.code)), 1.0),
            MetricUpdate("inc", Series.DECISIONS, (*self.labels, self.reason), 1.0))


@dataclass(frozen=True)
class ReconcileWrite:
    """A write that brings an owned object to the spec (reconcile.plan_reconcile), sent before
    the decision's patches; a failure holds the tick (``if_failed``) and makes the next
    reconcile a full pass."""

    write: reconcile.ObjectWrite
    if_failed: FailedWrite | None = None  # set by plan for every write it returns


@dataclass(frozen=True)
class DeploymentPatch:
    """A merge patch of one pool's Deployment, with what depends on it succeeding."""

    role: str
    name: str  # the Deployment
    body: dict
    rollback: dict  # status keys as they were before this change (plan folds them into if_failed)
    events: tuple[Event, ...] = ()  # posted once it succeeded
    metrics: tuple[MetricUpdate, ...] = ()  # applied once it succeeded
    content_type: str = MERGE  # an adopted Deployment: a strategic merge patch of its container (target.py)
    if_failed: FailedWrite | None = None  # set by plan for every patch it returns


@dataclass(frozen=True)
class Plan:
    """The decision of one tick: what to write, post and count, and the patches to send."""

    status: dict  # the status patch to write (the ring only when it changed)
    events: tuple[Event, ...]
    metrics: tuple[MetricUpdate, ...]
    patches: tuple[DeploymentPatch, ...]  # at most one per pool, the primary pool's first
    reconcile: tuple[ReconcileWrite, ...] = ()  # sent first, in order
