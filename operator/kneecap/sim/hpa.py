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
* rate limits (default behaviour): up by at most max(100 %, 4 pods) and down by at most 100 %
  per 15 s; the result is clamped to [min, max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kneecap.control.kube import deployments_path
from kneecap.errors import InputError
from kneecap.emulation.store import Store

METRICS = ("kv", "waiting")


@dataclass(frozen=True)
class HPASpec:
    metric: str = "kv"  # "kv" | "waiting"
    target: float = 0.5  # average per pod (KV usage fraction, or waiting requests)
    min_replicas: int = 1
    max_replicas: int = 8
    sync_s: float = 15.0
    tolerance: float = 0.1
    up_window_s: float = 0.0
    down_window_s: float = 300.0

    def check(self) -> None:
        if self.metric not in METRICS:
            raise InputError("hpa.metric", f"expected one of {', '.join(METRICS)}, got {self.metric!r}")
        if not (math.isfinite(self.target) and self.target > 0):
            raise InputError("hpa.target", f"expected a positive number, got {self.target!r}")


def pod_metric(engine, metric: str) -> float:
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

    def sync(self, t_s: float, pods) -> int | None:
        """One evaluation over the Deployment's pods (runtime objects with ``engine``/``ready``);
        returns the new replica count when it changed."""
        d = self.api.peek(deployments_path(self.ns, self.deployment))
        if d is None:
            return None
        current = int(d["spec"].get("replicas", 1))
        live = [p for p in pods if p.terminating_since_s is None and not p.failed]
        values = [pod_metric(p.engine, self.spec.metric) for p in live if p.ready]
        raw = desired_replicas(self.spec, current, values, sum(not p.ready for p in live))
        raw = max(self.spec.min_replicas, min(self.spec.max_replicas, raw))
        self.recommendations.append((t_s, raw))
        keep = max(self.spec.up_window_s, self.spec.down_window_s)
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= t_s - keep]
        up = min(r for t, r in self.recommendations if t >= t_s - self.spec.up_window_s)
        down = max(r for t, r in self.recommendations if t >= t_s - self.spec.down_window_s)
        new = up if up > current else down if down < current else current
        new = min(new, max(2 * current, current + 4))  # scale-up limit per period
        new = max(self.spec.min_replicas, min(self.spec.max_replicas, new))
        if new == current:
            return None
        self.api.patch_now(deployments_path(self.ns, self.deployment), {"spec": {"replicas": new}})
        self.scales.append({"t_s": round(t_s, 3), "from": current, "to": new})
        return new
