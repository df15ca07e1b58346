"""llm-d's SLO-aware autoscaling recipe (KEDA on the pool's latency against its SLOs), as a
replay baseline: the strongest replica autoscaler a team can install today without a custom
controller (llm-d guides/workload-autoscaling/README.slo-aware.md, "How it works — the control law").

Every ``rule_interval_s`` (15 s; the recording rules' evaluation, which the KEDA-generated HPA's
15 s sync reads):

1. signal: s_raw = max(q-TTFT / S_ttft, q-TPOT / S_tpot) over the last ``rate_window_s`` (1 min)
   of requests (TTFT when the first token came, TPOT when the request finished), 0 without
   traffic; q is the SLO quantile (the recipe's P90 is its SLO's quantile), taken exactly from
   the window's requests rather than interpolated in histogram buckets;
2. clamp and smooth: s = mean of min(s_raw, C) over the samples of the last ``smooth_s`` (45 s),
   C = 2;
3. desired replicas, with n = spec.replicas, r = Ready pods and the in-flight credit
   c = r/n when 0 < r < n (else 1)::

       d = n + ⌈n (s·c/θ_up − 1)⌉   if s > θ_up   (scale up, credited)
       d = n − ⌊n (1 − s/θ_dn)⌋     if s < θ_dn   (scale down, uncredited)
       d = n                        otherwise     (hysteresis band θ_dn … θ_up = 0.40 … 0.55)

4. the HPA KEDA creates: an External metric d with an AverageValue target of 1 (d is the replica
   count; unchanged within the HPA's 10 % tolerance), clamped to [min, max], with the recipe's
   behavior: up by max(100 %, 4 pods) per 60 s after a 30 s stabilisation window, down 1 pod per
   120 s after a 180 s one (:mod:`kneecap.sim.hpa`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kneecap.errors import InputError
from kneecap.sim.hpa import Behavior, HorizontalPodAutoscaler, HPASpec

RECIPE_BEHAVIOR = Behavior(up_pods=4, up_percent=100.0, up_period_s=60.0, down_pods=1, down_percent=None,
                           down_period_s=120.0)


@dataclass(frozen=True)
class KedaSLOSpec:
    theta_up: float = 0.55
    theta_down: float = 0.40
    clamp: float = 2.0
    rule_interval_s: float = 15.0
    rate_window_s: float = 60.0
    smooth_s: float = 45.0
    up_window_s: float = 30.0
    down_window_s: float = 180.0
    behavior: Behavior = RECIPE_BEHAVIOR

    def check(self) -> None:
        if not (0 < self.theta_down < self.theta_up < self.clamp):
            raise InputError("keda.theta", f"expected 0 < thetaDown < thetaUp < clamp, got {self.theta_down}, "
                                           f"{self.theta_up}, {self.clamp}")
        for name in ("rule_interval_s", "rate_window_s", "smooth_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"keda.{name}", f"expected a positive number of seconds, got {v!r}")


def saturation(requests, t_s: float, window_s: float, quantile: float, slo_ttft_s: float,
               slo_tpot_s: float) -> float:
    """Step 1: the worst of the window's TTFT and TPOT quantiles over their SLOs (0: no traffic)."""
    first, finish = requests.first_token_s, requests.finish_s
    with np.errstate(invalid="ignore"):
        started = (first > t_s - window_s) & (first <= t_s)
        ended = (finish > t_s - window_s) & (finish <= t_s) & (requests.output_tokens > 1) & np.isfinite(first)
    ratios = [0.0]
    if started.any():
        ttft_s = first[started] - requests.arrival_s[started]
        ratios.append(float(np.quantile(ttft_s, quantile)) / slo_ttft_s)
    if ended.any():
        tpot_s = (finish[ended] - first[ended]) / (requests.output_tokens[ended] - 1)
        ratios.append(float(np.quantile(tpot_s, quantile)) / slo_tpot_s)
    return max(ratios)


def desired_replicas(spec: KedaSLOSpec, s: float, provisioned: int, ready: int) -> int:
    """Step 3: the KEDA formula's replica count."""
    n = provisioned
    if s > spec.theta_up:
        credit = ready / n if 0 < ready < n else 1.0
        return n + math.ceil(n * (s * credit / spec.theta_up - 1.0))
    if s < spec.theta_down:
        return n - math.floor(n * (1.0 - s / spec.theta_down))
    return n


class KedaSLOAutoscaler:
    """The recording rules, the ScaledObject's formula and its HPA for one Deployment (module docstring)."""

    def __init__(self, spec: KedaSLOSpec, hpa: HPASpec, api, namespace: str, deployment: str, *, quantile: float,
                 slo_ttft_s: float, slo_tpot_s: float, steady_at: tuple[float, int] | None = None):
        spec.check()
        self.spec, self.quantile, self.slo_ttft_s, self.slo_tpot_s = spec, quantile, slo_ttft_s, slo_tpot_s
        self.hpa = HorizontalPodAutoscaler(
            replace(hpa, metric="external", target=1.0, up_window_s=spec.up_window_s,
                    down_window_s=spec.down_window_s, behavior=spec.behavior),
            api, namespace, deployment, steady_at=steady_at)
        self.samples: list[tuple[float, float]] = []  # (time, min(s_raw, C)): the recorded series

    @property
    def scales(self) -> list[dict]:
        return self.hpa.scales

    def sync(self, t_s: float, requests, pods) -> int | None:
        """One rule evaluation and HPA sync at ``t_s``; returns the new replica count when it changed."""
        raw = saturation(requests, t_s, self.spec.rate_window_s, self.quantile, self.slo_ttft_s, self.slo_tpot_s)
        self.samples.append((t_s, min(raw, self.spec.clamp)))
        self.samples = [(at_s, v) for at_s, v in self.samples if at_s > t_s - self.spec.smooth_s]
        s = sum(v for _, v in self.samples) / len(self.samples)
        current = self.hpa.current()
        if current is None:
            return None
        live = [p for p in pods if p.terminating_since_s is None and not p.failed]
        d = desired_replicas(self.spec, s, current, sum(p.ready for p in live))
        # the HPA on an External AverageValue target of 1: d replicas, outside its tolerance
        raw_replicas = current if abs(d / current - 1.0) <= self.hpa.spec.tolerance else math.ceil(d)
        return self.hpa.scale(t_s, raw_replicas)
