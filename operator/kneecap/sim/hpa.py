"""A HorizontalPodAutoscaler (autoscaling/v2) on a per-pod vLLM metric, as teams set one up today.

The replica rule and its guards follow the HPA controller (Kubernetes docs, "Horizontal Pod
Autoscaling", algorithm details):

* every ``sync_s`` (15 s) it reads the metric of each pod (the instant value a metrics adapter
  serves): ``kv`` = ``vllm:kv_cache_usage_perc``, ``waiting`` = ``vllm:num_requests_waiting``;
* ratio = mean over Ready pods / target; within the tolerance (|ratio − 1| ≤ 0.1) nothing moves;
* desired = ⌈current × ratio⌉, where a pod not Ready yet counts as 0 on a scale-up and as the
  target on a scale-down (the controller's conservative treatment of missing metrics; if that
  reverses the direction, nothing moves);
* stabilisation: a scale-up takes the lowest recommendation of the last ``up_window_s`` (0 s),
  a scale-down the highest of the last ``down_window_s`` (300 s);
* rate limits (:class:`Behavior`, the HPA's ``behavior`` block; its defaults are Kubernetes'):
  against the replicas at the start of the period (the current ones less what the scale events
  of the last ``period_s`` added, or plus what they removed), up to the most any policy allows
  (Pods: + n; Percent: ⌈start × (1 + p/100)⌉; selectPolicy Max), down to the least (Pods: − n;
  Percent: ⌊start × (1 − p/100)⌋): by default up max(100 %, 4 pods) and down 100 % per 15 s;
  the result is clamped to [min, max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kneecap.control.kube import deployments_path
from kneecap.errors import InputError
from kneecap.emulation.store import Store

METRICS = ("kv", "waiting", "external")  # external: a replica count the caller computes (KEDA's), to scale()


@dataclass(frozen=True)
class Behavior:
    """The HPA's scale-up and scale-down rate policies (``spec.behavior``, selectPolicy Max);
    None: that policy is absent. The defaults are Kubernetes' own."""

    up_pods: int | None = 4
    up_percent: float | None = 100.0
    up_period_s: float = 15.0
    down_pods: int | None = None
    down_percent: float | None = 100.0
    down_period_s: float = 15.0


@dataclass(frozen=True)
class HPASpec:
    metric: str = "kv"  # "kv" | "waiting" | "external"
    target: float = 0.5  # average per pod (KV usage fraction, or waiting requests)
    min_replicas: int = 1
    max_replicas: int = 8
    sync_s: float = 15.0
    tolerance: float = 0.1
    up_window_s: float = 0.0
    down_window_s: float = 300.0
    behavior: Behavior = Behavior()

    def check(self) -> None:
        if self.metric not in METRICS:
            raise InputError("hpa.metric", f"expected one of {', '.join(METRICS)}, got {self.metric!r}")
        if not (math.isfinite(self.target) and self.target > 0):
            raise InputError("hpa.target", f"expected a positive number, got {self.target!r}")


def pod_metric(engine, metric: str) -> float:
    if metric == "external":
        raise ValueError("an external metric is not read from the pods: pass its replica count to scale()")
    return engine.kv_usage if metric == "kv" else float(len(engine.waiting))


def desired_replicas(spec: HPASpec, current: int, ready_values: list[float], unready: int) -> int:
    """The HPA's raw recommendation (module docstring) before stabilisation and rate limits."""
    if not ready_values:
        return current
    ratio = sum(ready_values) / len(ready_values) / spec.target
    if abs(ratio - 1.0) <= spec.tolerance:
        return current
    n = len(ready_values) + unready
    fill = 0.0 if ratio > 1.0 else spec.target  # missing metrics of unready pods
    new_ratio = (sum(ready_values) + unready * fill) / (n * spec.target)
    if abs(new_ratio - 1.0) <= spec.tolerance or (new_ratio > 1.0) != (ratio > 1.0):
        return current
    return math.ceil(n * new_ratio)


def scale_limits(behavior: Behavior, changes: list[tuple[float, int]], t_s: float, current: int) -> tuple[int, int]:
    """(the most, the least) replicas the rate policies allow at ``t_s`` (module docstring),
    given the scale events so far as (time, replicas added or, negative, removed)."""
    def moved(period_s: float, up: bool) -> int:
        return sum(abs(delta) for at_s, delta in changes if at_s > t_s - period_s + 1e-6 and (delta > 0) == up)
    start_up = current - moved(behavior.up_period_s, True)
    ups = ([start_up + behavior.up_pods] if behavior.up_pods is not None else []) + (
        [math.ceil(start_up * (1.0 + behavior.up_percent / 100.0))] if behavior.up_percent is not None else [])
    start_down = current + moved(behavior.down_period_s, False)
    downs = ([start_down - behavior.down_pods] if behavior.down_pods is not None else []) + (
        [math.floor(start_down * (1.0 - behavior.down_percent / 100.0))] if behavior.down_percent is not None else [])
    return (max(ups) if ups else current), (min(downs) if downs else current)


class HorizontalPodAutoscaler:
    """Scales one Deployment through the API (module docstring)."""

    def __init__(self, spec: HPASpec, api: Store, namespace: str, deployment: str,
                 steady_at: tuple[float, int] | None = None):
        """``steady_at``: (time, replicas) an HPA that has been running recommended up to then
        (a scale-down waits a whole window after it); None: a new HPA, with no history."""
        spec.check()
        self.spec, self.api, self.ns, self.deployment = spec, api, namespace, deployment
        self.recommendations: list[tuple[float, int]] = [steady_at] if steady_at else []
        self.scales: list[dict] = []
        self._changes: list[tuple[float, int]] = []  # (time, replicas added) of each scale, for the rate limits

    def sync(self, t_s: float, pods) -> int | None:
        """One evaluation over the Deployment's pods (runtime objects with ``engine``/``ready``);
        returns the new replica count when it changed."""
        current = self.current()
        if current is None:
            return None
        live = [p for p in pods if p.terminating_since_s is None and not p.failed]
        values = [pod_metric(p.engine, self.spec.metric) for p in live if p.ready]
        return self.scale(t_s, desired_replicas(self.spec, current, values, sum(not p.ready for p in live)))

    def current(self) -> int | None:
        """The Deployment's spec.replicas (None: no Deployment)."""
        d = self.api.peek(deployments_path(self.ns, self.deployment))
        return None if d is None else int(d["spec"].get("replicas", 1))

    def scale(self, t_s: float, raw: int) -> int | None:
        """Stabilise a raw recommendation, limit its rate and write it (module docstring);
        returns the new replica count when it changed."""
        current = self.current()
        if current is None:
            return None
        raw = max(self.spec.min_replicas, min(self.spec.max_replicas, raw))
        self.recommendations.append((t_s, raw))
        keep = max(self.spec.up_window_s, self.spec.down_window_s)
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= t_s - keep]
        up = min(r for t, r in self.recommendations if t >= t_s - self.spec.up_window_s)
        down = max(r for t, r in self.recommendations if t >= t_s - self.spec.down_window_s)
        new = up if up > current else down if down < current else current
        most, least = scale_limits(self.spec.behavior, self._changes, t_s, current)
        new = min(new, most) if new > current else max(new, least) if new < current else new
        new = max(self.spec.min_replicas, min(self.spec.max_replicas, new))
        if new == current:
            return None
        self.api.patch_now(deployments_path(self.ns, self.deployment), {"spec": {"replicas": new}})
        self.scales.append({"t_s": round(t_s, 3), "from": current, "to": new})
        self._changes.append((t_s, new - current))
        return new
